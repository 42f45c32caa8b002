"""Configuration: layering, validation messages that name the fix, shipped configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_dapo.config import Config, config_docs, config_to_toml, load_config
from stream_dapo.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def test_every_shipped_config_loads() -> None:
    assert {p.name for p in CONFIGS} >= {
        "tiny-cpu.toml",
        "dapo-qwen2.5-32b.toml",
        "dapo-qwen2.5-7b-1node.toml",
    }
    for path in CONFIGS:
        assert isinstance(load_config([path], environ={}), Config)


def test_paper_recipe_values() -> None:
    cfg = load_config([p for p in CONFIGS if p.name == "dapo-qwen2.5-32b.toml"], environ={})
    assert cfg.algo.eps_low == 0.2 and cfg.algo.eps_high == 0.28
    assert cfg.algo.max_response_len == 20480 and cfg.algo.overlong_cache_len == 4096
    assert cfg.algo.group_size == 16 and cfg.learner.rollout_batch_prompts == 512
    assert cfg.learner.lr == 1e-6 and cfg.learner.warmup_steps == 20 and cfg.learner.weight_decay == 0.1
    assert cfg.algo.kl_coef == 0.0 and cfg.algo.dual_clip_c == 10.0
    # 512 prompts x 16 samples / 512-sample mini-batches = 16 gradient steps per rollout step.
    assert cfg.admission.steps_per_rollout == 16
    assert (cfg.eval.k, cfg.eval.temperature, cfg.eval.top_p) == (32, 1.0, 0.7)


def test_layers_apply_in_order(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("[algo]\neps_high = 0.3\ngroup_size = 4\n[learner]\nmini_batch_samples = 32\n")
    b.write_text("[algo]\neps_high = 0.35\n")
    assert load_config([a], environ={}).algo.eps_high == 0.3
    assert load_config([a, b], environ={}).algo.eps_high == 0.35
    env = {"STREAM_DAPO__ALGO__EPS_HIGH": "0.4", "STREAM_DAPO__DATA__SYNTHETIC__MAX_OPS": "5"}
    cfg = load_config([a, b], environ=env)
    assert cfg.algo.eps_high == 0.4 and cfg.data.synthetic.max_ops == 5 and cfg.algo.group_size == 4
    cfg = load_config([a, b], ["algo.eps_high=0.45", "run.out_dir=runs/x"], environ=env)
    assert cfg.algo.eps_high == 0.45 and cfg.run.out_dir == "runs/x"


@pytest.mark.parametrize(
    ("override", "nearest"),
    [
        ("algo.eps_hgh=0.3", "algo.eps_high"),
        ("learner.lr_rate=1e-5", "learner.lr"),
        ("algo.groupsize=4", "algo.group_size"),
        ("generatr.temperature=1.0", "generator.temperature"),
    ],
)
def test_typo_names_the_nearest_key(override: str, nearest: str) -> None:
    with pytest.raises(ConfigError, match=f"did you mean '{nearest}'"):
        load_config(overrides=[override], environ={})


def test_env_typo_is_rejected_too() -> None:
    with pytest.raises(ConfigError, match="did you mean 'algo.eps_high'"):
        load_config(environ={"STREAM_DAPO__ALGO__EPS_HIHG": "0.3"})


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo.eps_high=0.1"], "set algo.eps_high to at least algo.eps_low"),
        (["learner.mini_batch_samples=60"], "multiple of algo.group_size"),
        (["learner.mini_batch_samples=48"], "must divide the rollout batch"),
        (["algo.max_staleness=2"], "set algo.max_staleness >= 3"),
        (["algo.overlong_cache_len=96"], "must be < algo.max_response_len"),
        (["data.synthetic.min_ops=5", "data.synthetic.max_ops=2"], "set data.synthetic.max_ops >= min_ops"),
        (["transport.batches_port=5555"], "ports must differ"),
        (["algo.group_size=1"], "greater than or equal to 2"),
        (["generator.temperature=0"], r"greedy decoding.*set generator.temperature > 0"),
        (["generator.top_k=-1"], "generator.top_k must be >= 0"),
    ],
)
def test_cross_field_errors_name_the_fix(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides, environ={})


def test_admission_capacity_formula() -> None:
    # (max_staleness - S - (sync_every - 1) + 1) * B_v with S = 16*8/64 = 2 and B_v = 64/8 = 8.
    cfg = load_config(overrides=["algo.max_staleness=4"], environ={})
    assert cfg.admission.steps_per_rollout == 2 and cfg.admission.groups_per_version == 8
    assert cfg.admission.capacity == (4 - 2 - 0 + 1) * 8 == 24
    cfg = load_config(overrides=["algo.max_staleness=6", "learner.sync_every=2"], environ={})
    assert cfg.admission.capacity == (6 - 2 - 1 + 1) * 8 == 32


def test_preset_expands_but_explicit_keys_win() -> None:
    cfg = load_config(overrides=["algo.preset=naive-grpo"], environ={})
    assert cfg.algo.eps_high == 0.2 and cfg.algo.agg_mode == "seq-mean-token-mean"
    assert cfg.algo.dynamic_sampling is False and cfg.algo.soft_overlong is False
    cfg = load_config(overrides=["algo.preset=naive-grpo", "algo.eps_high=0.3"], environ={})
    assert cfg.algo.eps_high == 0.3
    dapo = load_config(overrides=["algo.preset=dapo"], environ={})
    assert dapo.algo.eps_high == 0.28 and dapo.algo.dynamic_sampling and dapo.algo.agg_mode == "token-mean"


def test_bad_preset_and_missing_file_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="algo.preset"):
        load_config(overrides=["algo.preset=grpo"], environ={})
    with pytest.raises(ConfigError, match="not found; pass an existing TOML file"):
        load_config([tmp_path / "nope.toml"], environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[algo\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config([bad], environ={})
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(overrides=["algo.eps_high"], environ={})


def test_toml_round_trip_and_docs(tmp_path: Path) -> None:
    cfg = load_config(overrides=["algo.eps_high=0.31", "data.synthetic.max_ops=4"], environ={})
    path = tmp_path / "resolved.toml"
    path.write_text(config_to_toml(cfg))
    assert load_config([path], environ={}) == cfg
    docs = config_docs()
    assert "`algo.eps_high`" in docs and "Clip-Higher" in docs and "`data.synthetic.max_ops`" in docs


def test_committed_config_reference_is_current() -> None:
    """docs/config.md is generated: regenerate with `stream-dapo config docs > docs/config.md`."""
    committed = (Path(__file__).resolve().parents[2] / "docs" / "config.md").read_text()
    assert committed.strip() == config_docs().strip()


def test_a_preset_shadowed_by_explicit_keys_warns_naming_them(caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    with caplog.at_level(logging.WARNING, logger="stream_dapo.config"):
        cfg = load_config(overrides=["algo.preset=naive-grpo", "algo.eps_high=0.28"], environ={})
    assert cfg.algo.eps_high == 0.28 and cfg.algo.dynamic_sampling is False  # the rest of the preset
    assert "algo.eps_high = 0.28 (preset: 0.2)" in caplog.text
    assert "dynamic_sampling" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stream_dapo.config"):
        load_config(overrides=["algo.preset=naive-grpo"], environ={})
    assert caplog.text == ""


def test_rollout_sampling_settings_become_the_learners_policy_and_leave_eval_alone() -> None:
    cfg = load_config(
        overrides=["generator.temperature=0.7", "generator.top_p=0.9", "generator.top_k=20"], environ={}
    )
    policy = cfg.generator.sampling_policy()
    assert (policy.temperature, policy.top_p, policy.top_k, policy.min_p) == (0.7, 0.9, 20, 0.0)
    assert policy.truncates and not policy.is_identity
    # Evaluation samples with its own settings (the paper: temperature 1.0, top-p 0.7).
    assert (cfg.eval.temperature, cfg.eval.top_p, cfg.eval.top_k, cfg.eval.min_p) == (1.0, 0.7, 0, 0.0)
    assert load_config(environ={}).generator.sampling_policy().is_identity


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # The generator's RewardShaping refused these at start-up while the config accepted them.
        (
            ["algo.soft_overlong=false", "algo.overlong_cache_len=200"],
            r"algo.overlong_cache_len must be in \[0, ",
        ),
        (["algo.overlong_cache_len=0"], "set algo.overlong_cache_len > 0"),
        (["algo.kl_coef=nan"], "algo.kl_coef must be a finite number"),
        (["algo.dual_clip_c=1"], "algo.dual_clip_c must be > 1"),
    ],
)
def test_algo_bounds_are_the_parameter_objects_own(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=overrides, environ={})


def test_algo_builds_the_loss_and_shaping_parameters_from_its_keys() -> None:
    import dataclasses

    algo = load_config(overrides=["algo.eps_high=0.3", "algo.overlong_factor=0.5"], environ={}).algo
    for params in (algo.loss_params, algo.shaping):
        for f in dataclasses.fields(params):
            assert getattr(params, f.name) == getattr(algo, f.name)
    assert algo.loss_params.eps_high == 0.3 and algo.shaping.overlong_factor == 0.5


def test_the_loss_implements_exactly_the_modes_the_config_accepts() -> None:
    from typing import get_args

    from stream_dapo.core.loss import (
        AGGREGATIONS,
        IS_LEVELS,
        IS_MODES,
        RATIO_LEVELS,
        RATIO_MODES,
        SURROGATES,
    )
    from stream_dapo.core.loss_params import AggMode, IsLevel, IsMode, RatioLevel, RatioMode, Surrogate

    assert set(RATIO_MODES) == set(get_args(RatioMode))
    assert set(IS_MODES) == set(get_args(IsMode))
    assert set(IS_LEVELS) == set(get_args(IsLevel))
    assert set(RATIO_LEVELS) == set(get_args(RatioLevel))
    assert set(SURROGATES) == set(get_args(Surrogate))
    assert set(AGGREGATIONS) == set(get_args(AggMode))


def test_off_policy_correction_keys_are_checked_once_with_their_algo_names() -> None:
    algo = load_config(
        overrides=[
            "algo.is_level=geometric",
            "algo.is_mode=icepop",
            "algo.surrogate=cispo",
            "algo.eps_low=1",
        ],
        environ={},
    ).algo
    assert (algo.loss_params.is_level, algo.loss_params.is_mode, algo.loss_params.surrogate) == (
        "geometric",
        "icepop",
        "cispo",
    )
    with pytest.raises(ValueError, match=r"algo\.icepop_low < 1 < algo\.icepop_high"):
        load_config(overrides=["algo.icepop_high=0.9"], environ={})
    with pytest.raises(ValueError, match=r"set algo\.ratio_mode 'decoupled'"):
        load_config(overrides=["algo.ratio_mode=behaviour", "algo.is_level=sequence"], environ={})
