"""The word-problem source: every worked solution's arithmetic holds and ends at the graded answer,
the template split is disjoint, files are written once per setting, and the config wires the source
(and [sft]'s choice of worked solutions) with errors that name the fix."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from stream_dapo.config import WordProblemsConfig, load_config
from stream_dapo.data.word_problems import (
    PROBE_PER_TEMPLATE,
    PROBE_TEMPLATES,
    TEMPLATES,
    WIDE_TEMPLATES,
    ensure_word_problem_data,
    render,
    split_names,
)
from stream_dapo.errors import ConfigError

EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": lambda a, b: a / b}


@pytest.mark.parametrize("template", TEMPLATES + WIDE_TEMPLATES + PROBE_TEMPLATES, ids=lambda t: t.name)
def test_every_solution_computes_the_graded_answer_in_its_stated_steps(template) -> None:
    rng = random.Random(7)
    for _ in range(200):
        row = render(template, rng, "boxed")
        solution = row["extra_info"]["solution"]
        equations = EQUATION.findall(solution)
        assert len(equations) == template.steps, solution
        for a, op, b, result in equations:
            assert OPS[op](int(a), int(b)) == int(result), solution
            assert int(result) <= 300, solution  # small intermediate values too
        gold = row["reward_model"]["ground_truth"]
        assert equations[-1][3] == gold, solution
        assert solution.endswith(f"The answer is \\boxed{{{gold}}}.")
        assert int(gold) >= 0
        question = row["prompt"][0]["content"].split("\n\n", 1)[1]
        numbers = [int(n) for n in re.findall(r"\d+", question)]
        assert numbers and max(numbers) <= 100, question  # small numbers: the point of the source


def test_the_answer_format_sets_instruction_and_final_line() -> None:
    row = render(TEMPLATES[0], random.Random(0), "answer")
    assert '"Answer: $Answer"' in row["prompt"][0]["content"]
    assert row["extra_info"]["solution"].endswith(f"Answer: {row['reward_model']['ground_truth']}")


def test_the_split_is_disjoint_seeded_and_keeps_the_step_limit() -> None:
    cfg = WordProblemsConfig(eval_templates=6, seed=3)
    train, held = split_names(cfg)
    assert not set(train) & set(held) and len(held) == 6 and len(train) + len(held) == len(TEMPLATES)
    assert split_names(WordProblemsConfig(eval_templates=6, seed=3)) == (train, held)
    one_step = WordProblemsConfig(eval_templates=2, max_steps=1)
    names = {t.name for t in TEMPLATES if t.steps == 1}
    train1, held1 = split_names(one_step)
    assert set(train1) | set(held1) == names
    with pytest.raises(ConfigError, match=r"eval_templates = 12 .* choose 1\.\.11"):
        split_names(WordProblemsConfig(eval_templates=12, max_steps=1))


def test_files_are_written_once_with_template_disjoint_rows(tmp_path: Path) -> None:
    cfg = WordProblemsConfig(dir=str(tmp_path), per_template=5, eval_per_template=3, eval_templates=4)
    files = ensure_word_problem_data(cfg)
    train = [json.loads(line) for line in files.train.read_text().splitlines()]
    held = [json.loads(line) for line in files.eval.read_text().splitlines()]
    assert len(train) == 5 * (len(TEMPLATES) - 4) and len(held) == 3 * 4
    assert {r["extra_info"]["template"] for r in train}.isdisjoint(
        {r["extra_info"]["template"] for r in held}
    )
    assert len({r["prompt"][0]["content"] for r in train}) == len(train), "instances are distinct"
    stamp = files.train.stat().st_mtime_ns
    again = ensure_word_problem_data(cfg)
    assert again.info == files.info and again.train.stat().st_mtime_ns == stamp


def test_the_config_points_the_run_at_the_word_problems_and_sft_at_gsm_symbolic(tmp_path: Path) -> None:
    cfg = load_config(overrides=[f'data.word_problems.dir="{tmp_path}"'], environ={})
    assert cfg.data.word_problems is not None
    folder = cfg.data.word_problems.folder()
    assert cfg.data.train_path == str(folder / "train.jsonl") and cfg.data.eval_path == str(
        folder / "eval.jsonl"
    )
    from stream_dapo.model.sft import sft_data

    with pytest.raises(
        ConfigError, match=r'needs a \[data.gsm_symbolic\] section; add one or set sft.data = "train"'
    ):
        sft_data(
            load_config(
                overrides=[f'data.word_problems.dir="{tmp_path}"', 'sft.data="gsm_symbolic"'], environ={}
            )
        )
    assert sft_data(cfg) == folder / "train.jsonl"


def test_the_wide_set_has_new_names_twelve_of_each_step_count() -> None:
    names = [t.name for t in WIDE_TEMPLATES]
    assert len(set(names)) == 24 and not set(names) & {t.name for t in TEMPLATES}
    assert sorted(t.steps for t in WIDE_TEMPLATES) == [1] * 12 + [2] * 12


def test_wide_adds_the_new_templates_to_train_and_keeps_the_eval_file_bit_for_bit(tmp_path: Path) -> None:
    settings = {"per_template": 3, "eval_per_template": 20}
    base = ensure_word_problem_data(WordProblemsConfig(dir=str(tmp_path), **settings))
    wide = ensure_word_problem_data(WordProblemsConfig(dir=str(tmp_path), train_templates="wide", **settings))
    assert wide.eval.read_bytes() == base.eval.read_bytes() and wide.eval != base.eval
    held = ["change", "give", "half_then_give", "price", "teams", "twice_then_more"]
    assert base.info["eval_templates"] == held == wide.info["eval_templates"]
    added = set(wide.info["train_templates"]) - set(base.info["train_templates"])
    assert added == {t.name for t in WIDE_TEMPLATES}
    assert set(base.info["train_templates"]) <= set(wide.info["train_templates"])
    train = [json.loads(line) for line in wide.train.read_text().splitlines()]
    assert len(train) == 3 * (18 + 24)  # per_template applies to every train template
    one_step = WordProblemsConfig(max_steps=1, eval_templates=2, train_templates="wide")
    assert set(split_names(one_step)[0]) >= {t.name for t in WIDE_TEMPLATES if t.steps == 1}
    assert not set(split_names(one_step)[0]) & {t.name for t in WIDE_TEMPLATES if t.steps == 2}


def test_the_default_cache_key_is_unchanged_and_wide_has_its_own() -> None:
    """The key of the default settings predates train_templates: base leaves it out, so the cached
    files (and the runs and warm models built on them) keep their key."""
    assert WordProblemsConfig().cache_key() == "169fa7a1194151fe"
    assert WordProblemsConfig(train_templates="base").settings() == WordProblemsConfig().model_dump(
        mode="json", exclude={"train_templates"}
    )
    wide = WordProblemsConfig(train_templates="wide")
    assert wide.cache_key() != "169fa7a1194151fe" and wide.settings()["train_templates"] == "wide"


def test_the_wide_recipe_differs_from_the_words_recipe_only_in_train_templates() -> None:
    configs = Path(__file__).resolve().parents[2] / "configs"
    words = load_config([configs / "smollm2-words-cpu.toml"], environ={}).model_dump(mode="json")
    wide = load_config([configs / "smollm2-words-wide-cpu.toml"], environ={}).model_dump(mode="json")
    assert wide["data"]["word_problems"]["train_templates"] == "wide"
    assert wide["sft"] == words["sft"] and wide["learner"] == words["learner"]  # the warm model is reused
    for cfg in (words, wide):
        cfg["data"]["word_problems"].pop("train_templates")
        cfg["data"].pop("train_path"), cfg["data"].pop("eval_path")  # the folder is keyed
        cfg["run"].pop("out_dir")
    assert wide == words


def test_the_probe_set_is_in_no_split_and_is_added_to_an_existing_folder_untouched(tmp_path: Path) -> None:
    names = [t.name for t in PROBE_TEMPLATES]
    assert len(set(names)) == 24 and not set(names) & {t.name for t in TEMPLATES + WIDE_TEMPLATES}
    assert sorted(t.steps for t in PROBE_TEMPLATES) == [1] * 12 + [2] * 12
    cfg = WordProblemsConfig(dir=str(tmp_path), per_template=3, eval_per_template=2, train_templates="wide")
    files = ensure_word_problem_data(cfg)
    assert files.probe is not None
    probe = [json.loads(line) for line in files.probe.read_text().splitlines()]
    assert len(probe) == 24 * PROBE_PER_TEMPLATE == 120  # all of them under eval.max_prompts = 128
    assert [r["extra_info"]["template"] for r in probe] == [
        n for n in names for _ in range(PROBE_PER_TEMPLATE)
    ]
    for path in (files.train, files.eval):
        used = {json.loads(line)["extra_info"]["template"] for line in path.read_text().splitlines()}
        assert not used & set(names)
    # a folder written before the probe set existed: the probe file is added, the splits stay as they were
    stamps = {p: p.stat().st_mtime_ns for p in (files.train, files.eval)}
    text = files.probe.read_text()
    files.probe.unlink()
    again = ensure_word_problem_data(cfg)
    assert again.probe is not None and again.probe.read_text() == text  # seeded: the same instances
    assert {p: p.stat().st_mtime_ns for p in (files.train, files.eval)} == stamps
    one_step = ensure_word_problem_data(WordProblemsConfig(dir=str(tmp_path), max_steps=1, eval_templates=2))
    assert (
        one_step.probe is not None and len(one_step.probe.read_text().splitlines()) == 12 * PROBE_PER_TEMPLATE
    )


def test_prepare_model_writes_the_files_the_warm_up_trains_on_first(tmp_path: Path, monkeypatch) -> None:
    """`stream-dapo ablate` calls prepare_model without check_data: on a fresh machine the warm-up
    on the train templates' solutions found no train.jsonl (FileNotFoundError before any cell)."""
    import stream_dapo.model.sft as sft_module
    from stream_dapo.tools.launch import prepare_model

    cfg = load_config(
        overrides=[
            f'data.word_problems.dir="{tmp_path / "data"}"',
            "data.word_problems.per_template=2",
            "sft.enabled=true",
            'sft.data="train"',
            f'model.path="{tmp_path / "warm"}"',
        ],
        environ={},
    )
    assert cfg.data.train_path is not None and cfg.data.word_problems is not None
    train = Path(cfg.data.train_path)
    assert not train.exists()
    seen: list[int] = []
    monkeypatch.setattr(
        sft_module, "ensure_sft_model", lambda c: seen.append(len(train.read_text().splitlines()))
    )
    prepare_model(cfg)
    assert seen == [2 * len(split_names(cfg.data.word_problems)[0])]
