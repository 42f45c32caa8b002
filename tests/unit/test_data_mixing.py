"""Several sources in one run: the mix follows the weights exactly, routes rows, and survives restarts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from stream_dapo.config import load_config
from stream_dapo.config.sources import data_sources
from stream_dapo.data.dataset import LazyPrompts, PromptItem, SchemaError, StreamState
from stream_dapo.data.mixing import MixedStream, MixState, WeightedInterleave
from stream_dapo.errors import ConfigError
from stream_dapo.generator.prompts import MixCursor, ShardLayout


def items(prefix: str, n: int) -> list[PromptItem]:
    return [
        PromptItem(f"{prefix}{i}", [{"role": "user", "content": f"{prefix}{i}"}], [i + 1], str(i), prefix)
        for i in range(n)
    ]


def test_integer_weights_are_exact_over_every_window() -> None:
    interleave = WeightedInterleave([3, 1])
    assert [interleave.next() for _ in range(8)] == [0, 0, 1, 0, 0, 0, 1, 0]
    rng = random.Random(0)
    for _ in range(200):
        weights = [rng.randint(1, 9) for _ in range(rng.randint(2, 5))]
        total = sum(weights)
        mix = WeightedInterleave(weights)
        for n in range(1, 6 * total + 1):
            mix.next()
            assert all(abs(c - n * w / total) <= 1 + 1e-9 for c, w in zip(mix.counts, weights, strict=True))
            if n % total == 0:
                assert mix.counts == [w * n // total for w in weights]


def test_real_weights_stay_within_about_one_prompt_of_their_share() -> None:
    rng = random.Random(1)
    for _ in range(100):
        weights = [rng.uniform(0.01, 10) for _ in range(rng.randint(2, 6))]
        mix = WeightedInterleave(weights)
        for n in range(1, 2001):
            mix.next()
            assert max(abs(c - n * p) for c, p in zip(mix.counts, mix.shares, strict=True)) < 1.25


def test_resumed_counts_continue_the_same_order() -> None:
    whole = WeightedInterleave([2, 5, 1])
    order = [whole.next() for _ in range(40)]
    first = WeightedInterleave([2, 5, 1])
    head = [first.next() for _ in range(17)]
    resumed = WeightedInterleave([2, 5, 1], counts=first.counts)
    assert head + [resumed.next() for _ in range(23)] == order


def test_bad_weights_are_refused() -> None:
    for weights in ([], [1, 0], [1, -2], [float("nan")]):
        with pytest.raises(ValueError):
            WeightedInterleave(weights)


def _cursor(path: Path, sizes: dict[str, int], num_shards: int = 1, index: int = 0) -> MixCursor:
    return MixCursor(path, {name: ShardLayout.of(name, n, 0, num_shards, index) for name, n in sizes.items()})


def test_a_mixed_stream_stamps_each_prompt_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    prompts = {"words": items("w", 6), "concise": items("c", 4)}
    weights, budgets = {"words": 2.0, "concise": 1.0}, {"words": None, "concise": 48}
    path = tmp_path / "g.sources.json"
    sizes = {"words": 6, "concise": 4}
    stream = _cursor(path, sizes).stream(prompts, weights, budgets)
    head = [next(stream) for _ in range(10)]
    assert [p.source for p in head] == ["words", "concise", "words"] * 3 + ["words"]
    assert {p.max_response_len for p in head if p.source == "concise"} == {48}
    assert {p.max_response_len for p in head if p.source == "words"} == {None}
    assert all(p.prompt_id.startswith("c" if p.source == "concise" else "w") for p in head)
    _cursor(path, sizes).save(stream.state, force=True)
    doc = json.loads(path.read_text())
    assert doc["counts"] == {"words": 7, "concise": 3}

    resumed = _cursor(path, sizes).stream(prompts, weights, budgets)
    uninterrupted = _cursor(tmp_path / "other.json", sizes).stream(prompts, weights, budgets)
    whole = [next(uninterrupted).prompt_id for _ in range(25)]
    assert [next(resumed).prompt_id for _ in range(15)] == whole[10:]


def test_a_source_whose_data_changed_restarts_alone(tmp_path: Path) -> None:
    prompts = {"words": items("w", 6), "concise": items("c", 4)}
    weights, budgets = {"words": 1.0, "concise": 1.0}, {}
    path = tmp_path / "g.sources.json"
    stream = _cursor(path, {"words": 6, "concise": 4}).stream(prompts, weights, budgets)
    for _ in range(6):
        next(stream)
    _cursor(path, {"words": 6, "concise": 4}).save(stream.state, force=True)
    prompts["concise"] = items("c", 5)  # the concise file grew: its saved position no longer fits
    state = _cursor(path, {"words": 6, "concise": 5}).load()
    assert state == MixState(counts={"words": 3, "concise": 3}, streams={"words": StreamState(0, 3)})
    path.write_text("{broken")
    assert _cursor(path, {"words": 6, "concise": 5}).load() is None


def test_a_mixed_stream_needs_matching_sources() -> None:
    with pytest.raises(ValueError, match="different sources"):
        MixedStream({}, {"a": 1.0})


def _write_rows(path: Path, rows: list[tuple[str, str]]) -> Path:
    with path.open("w") as f:
        for i, (data_source, gold) in enumerate(rows):
            f.write(
                json.dumps(
                    {
                        "data_source": data_source,
                        "prompt": [{"role": "user", "content": f"q{i}"}],
                        "reward_model": {"ground_truth": gold},
                    }
                )
                + "\n"
            )
    return path


class CharTokenizer:
    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: object) -> str:
        return conversation[-1]["content"]

    def __call__(self, text: str, **kwargs: object) -> dict[str, list[int]]:
        return {"input_ids": [ord(c) for c in text]}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_route_to_their_source_by_data_source(tmp_path: Path, suffix: str) -> None:
    rows = [("gsm8k", "1"), ("math", "2"), ("gsm8k", "3"), ("math", "4"), ("gsm8k", "5")]
    path = _write_rows(tmp_path / "mixed.jsonl", rows)
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([json.loads(line) for line in path.read_text().splitlines()])
        path = tmp_path / "mixed.parquet"
        pq.write_table(table, path)
    gsm = LazyPrompts(path, CharTokenizer(), 64, data_sources=["gsm8k"])
    other = LazyPrompts(path, CharTokenizer(), 64, data_sources=["math"])
    assert [gsm[i].gold for i in range(len(gsm))] == ["1", "3", "5"]  # type: ignore[union-attr]
    assert [other[i].gold for i in range(len(other))] == ["2", "4"]  # type: ignore[union-attr]
    assert {gsm[i].data_source for i in range(len(gsm))} == {"gsm8k"}  # type: ignore[union-attr]
    with pytest.raises(SchemaError, match="no row has data_source in \\['aime'\\]"):
        LazyPrompts(path, CharTokenizer(), 64, data_sources=["aime"])


def test_sources_resolve_with_their_rewards_and_one_source_configs_are_unchanged(tmp_path: Path) -> None:
    config = tmp_path / "mix.toml"
    config.write_text(
        """
[algo]
max_response_len = 96
[verifier]
timeout_s = 7.0
[[data.sources]]
name = "words"
train_path = "w.jsonl"
eval_path = "w-eval.jsonl"
weight = 3
[[data.sources]]
name = "concise"
train_path = "w.jsonl"
reward = "examples/rewards/length_budget.py:compute_score"
max_response_len = 48
failure_score = -2.0
[[data.sources]]
name = "code"
train_path = "h.jsonl"
reward = "code"
partial_credit = true
"""
    )
    words, concise, code = data_sources(load_config([config], []))
    assert (words.name, words.weight, words.reward.kind, words.reward.timeout_s) == (
        "words",
        3.0,
        "math",
        7.0,
    )
    assert (concise.reward.kind, concise.reward.function, concise.reward.failure_score) == (
        "python",
        "compute_score",
        -2.0,
    )
    assert concise.max_response_len == 48 and concise.reward.setting == "data.sources[concise].reward"
    assert code.reward.partial_credit and code.reward.timeout_s == 10.0 * 16 + 5.0
    (default,) = data_sources(load_config([], []))
    assert (default.name, default.reward.kind, default.train_path) == ("default", "math", None)


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["data.train_path=x.jsonl"], "data.sources is set, and so is data.train_path"),
        (["algo.max_response_len=32"], "is above algo.max_response_len"),
    ],
)
def test_source_configs_that_cannot_work_name_the_fix(tmp_path: Path, sets: list[str], message: str) -> None:
    config = tmp_path / "mix.toml"
    config.write_text('[[data.sources]]\nname = "a"\ntrain_path = "a.jsonl"\nmax_response_len = 40\n')
    with pytest.raises(ConfigError, match=message):
        load_config([config], sets)


def test_source_names_and_rewards_are_checked(tmp_path: Path) -> None:
    config = tmp_path / "mix.toml"
    for body, message in (
        ('name = "a b"\ntrain_path = "a.jsonl"', "use 1-63 letters"),
        ('name = "a"\ntrain_path = "a.jsonl"\nreward = "nope"', "names no reward"),
        (
            'name = "a"\ntrain_path = "a.jsonl"\npartial_credit = true',
            "partial_credit is for reward = 'code'",
        ),
    ):
        config.write_text(f"[[data.sources]]\n{body}\n")
        with pytest.raises(ConfigError, match=message):
            load_config([config], [])
    config.write_text(
        '[[data.sources]]\nname = "a"\ntrain_path = "a.jsonl"\n[[data.sources]]\nname = "a"\ntrain_path = "b.jsonl"\n'
    )
    with pytest.raises(ConfigError, match="must be unique"):
        load_config([config], [])


def test_a_config_with_sources_round_trips_through_its_toml(tmp_path: Path) -> None:
    """The launcher hands every service the resolved config as TOML: sources are an array of tables."""
    from stream_dapo.config import config_to_toml

    cfg = load_config([Path(__file__).resolve().parents[2] / "configs" / "smollm2-words-mix-cpu.toml"], [])
    written = tmp_path / "config.toml"
    written.write_text(config_to_toml(cfg))
    assert written.read_text().count("[[data.sources]]") == 2
    assert load_config([written], []) == cfg
