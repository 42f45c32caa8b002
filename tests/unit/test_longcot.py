"""The long chain-of-thought task: its reduction, its length distribution, its rows and its config."""

from __future__ import annotations

import math
import random
import re
import statistics

import pytest
from pydantic import ValidationError

from stream_dapo.config import DataConfig, SyntheticTaskConfig, load_config
from stream_dapo.data.longcot import LABELS, MAX_VALUE, ChainProblem, draw_slips, sample_chain, work_chain
from stream_dapo.data.synthetic import ensure_synthetic_data, generate_split, synthetic_task_key
from stream_dapo.errors import ConfigError
from stream_dapo.verifier import verify

CHAIN = SyntheticTaskConfig(kind="chain", min_ops=5, max_ops=26, num_train=300, num_eval=50)


def test_each_term_is_worked_forward_then_undone_back_to_the_start() -> None:
    problem = ChainProblem(3, ("+", "-", "+"), (5, 2, 7))
    assert problem.question == "Compute 3\na+5\nb-2\nc+7"
    assert problem.lines == (
        "a+5: 3+5=8",
        "b-2: 8-2=6",
        "c+7: 6+7=13",
        "Check:",
        "c+7: 13-7=6",
        "b-2: 6+2=8",
        "a+5: 8-5=3",
        "Back at 3.",
    )
    assert problem.solution.endswith("Back at 3.\nAnswer: 13")
    assert problem.answer == 13


def test_a_slip_carries_into_the_answer_and_the_check_lands_off_the_start() -> None:
    problem = ChainProblem(3, ("+", "-", "+"), (5, 2, 7))
    assert problem.worked({1: +1}).splitlines() == [
        "a+5: 3+5=8",
        "b-2: 8-2=7",  # the slip: 8-2 is 6
        "c+7: 7+7=14",  # carried on from the slipped value
        "Check:",
        "c+7: 14-7=7",
        "b-2: 7+2=9",
        "a+5: 9-5=4",
        "Back at 4.",  # one away from the start, as the slip was
        "Answer: 14",
    ]
    assert problem.worked({}) == problem.worked(None) == problem.solution
    two = problem.worked({0: -1, 2: -1})
    assert two.endswith("Back at 1.\nAnswer: 11") and not verify(two, str(problem.answer)).correct


def test_slips_come_at_their_rate_and_keep_every_value_in_range() -> None:
    rng = random.Random(0)
    problems = [sample_chain(rng, 5, 26) for _ in range(400)]
    lines = slipped = 0
    for problem in problems:
        slips = draw_slips(problem, rng, 0.1)
        assert set(slips.values()) <= {-1, 1}
        lines += len(problem.ops)
        slipped += len(slips)
        text = problem.worked(slips)
        numbers = [int(n) for line in text.splitlines()[:-1] for n in re.findall(r"\d+", line)]
        assert all(0 <= n <= MAX_VALUE for n in numbers)
        assert verify(text, str(problem.answer)).correct == (sum(slips.values()) == 0)  # slips may cancel
    # 4,000+ lines at rate 0.1: the binomial's 5-sigma band is about +-0.023
    assert 0.077 < slipped / lines < 0.1 + 0.023
    assert draw_slips(problems[0], rng, 0.0) == {}
    with pytest.raises(ValueError, match="probability"):
        draw_slips(problems[0], rng, 1.0)


def test_a_question_parses_back_to_its_problem_after_the_instruction() -> None:
    rng = random.Random(1)
    for _ in range(50):
        problem = sample_chain(rng, 1, 26)
        assert ChainProblem.parse(f"Solve step by step.\n\n{problem.question}") == problem
    with pytest.raises(ValueError, match="not a chain question"):
        ChainProblem.parse("What is 2+2?")
    with pytest.raises(ValueError, match="labelled a, b, c"):
        ChainProblem.parse("Compute 3\na+5\nc-2")


def test_slip_rate_is_refused_outside_the_chain_task() -> None:
    with pytest.raises(ConfigError, match="set warmup.slip_rate = 0"):
        load_config([], ["warmup.slip_rate=0.05"], environ={})
    with pytest.raises(ConfigError, match="slip_rate"):
        load_config([], ["data.synthetic.kind=chain", "warmup.slip_rate=0.6"], environ={})


def test_a_malformed_chain_is_an_error() -> None:
    with pytest.raises(ValueError, match="as many operators as terms"):
        work_chain(1, ("+",), (1, 2))
    with pytest.raises(ValueError, match="uses \\+ and -"):
        work_chain(1, ("*",), (2,))
    with pytest.raises(ValueError, match="at most 26 terms"):
        work_chain(1, ("+",) * 27, (1,) * 27)
    with pytest.raises(ValueError, match="max_ops <= 26"):
        sample_chain(random.Random(0), 5, 27)


def test_solution_length_grows_with_the_chain_two_lines_per_term() -> None:
    rng = random.Random(3)
    for n in (5, 12, 26):
        problem = sample_chain(rng, n, n)
        assert len(problem.ops) == n and len(problem.lines) == 2 * n + 2
        forward, back = problem.lines[:n], problem.lines[n + 1 : 2 * n + 1]
        assert problem.lines[n] == "Check:"
        assert [line[0] for line in forward] == list(LABELS[:n])
        assert [line[0] for line in back] == list(reversed(LABELS[:n]))
        # the check lands on the start, and each line starts from the previous line's result
        assert back[-1].endswith(f"={problem.start}") and problem.lines[-1] == f"Back at {problem.start}."
        question_lines = problem.question.splitlines()[1:]
        for i, line in enumerate(forward):
            assert line.split(": ")[0] == question_lines[i], "a line starts with its term as asked"
        for prev, line in zip(forward, forward[1:], strict=False):
            assert line.split(": ")[1].startswith(prev.split("=")[1])


def test_running_values_stay_in_range_and_the_answer_is_the_chain_evaluated() -> None:
    rng = random.Random(0)
    for _ in range(500):
        p = sample_chain(rng, 4, 26)
        value = p.start
        for op, term in zip(p.ops, p.terms, strict=True):
            value = value + term if op == "+" else value - term
            assert 0 <= value <= MAX_VALUE
            assert 1 <= term <= 9
        assert p.answer == value


def test_chain_lengths_are_log_uniform_so_long_chains_are_the_tail() -> None:
    rng = random.Random(1)
    lengths = [len(sample_chain(rng, 5, 26).ops) for _ in range(4000)]
    assert min(lengths) == 5 and max(lengths) == 26
    # log-uniform on [5, 27): median sqrt(5 * 27) = 11.6; P(n >= 18) = ln(27/18) / ln(27/5) = 0.240
    assert 10 <= statistics.median(lengths) <= 13
    share = sum(n >= 18 for n in lengths) / len(lengths)
    assert abs(share - math.log(27 / 18) / math.log(27 / 5)) < 0.03


def test_chain_splits_are_disjoint_deterministic_and_verify(tmp_path) -> None:
    data = DataConfig(synthetic=CHAIN)
    train, eval_ = ensure_synthetic_data(data, tmp_path)
    again = generate_split(CHAIN, seed=0, split="eval", count=50)
    import json

    eval_rows = [json.loads(line) for line in eval_.read_text().splitlines()]
    train_rows = [json.loads(line) for line in train.read_text().splitlines()]
    assert [r["prompt"][0]["content"].split("\n\n")[-1] for r in eval_rows] == [p.question for p in again]
    questions = {r["prompt"][0]["content"] for r in train_rows}
    assert len(questions) == 300 and not questions & {r["prompt"][0]["content"] for r in eval_rows}
    for row in eval_rows + train_rows:
        assert verify(row["extra_info"]["solution"], row["reward_model"]["ground_truth"]).correct
        assert 2 * row["extra_info"]["num_ops"] + 2 == row["extra_info"]["solution"].count("\n")


def test_the_arith_cache_key_does_not_change_with_the_new_kind_knob() -> None:
    arith = DataConfig()
    assert synthetic_task_key(arith) == synthetic_task_key(
        DataConfig(synthetic=SyntheticTaskConfig(kind="arith"))
    )
    assert synthetic_task_key(arith) != synthetic_task_key(DataConfig(synthetic=CHAIN))


def test_long_arith_is_refused_naming_the_chain_task() -> None:
    with pytest.raises(ValidationError, match='kind = "chain"'):
        SyntheticTaskConfig(kind="arith", max_ops=12)
    with pytest.raises(ValidationError, match="chain task's 26"):
        SyntheticTaskConfig(kind="chain", max_ops=30)


def test_the_longcot_recipe_loads_and_its_context_fits_the_tiny_model() -> None:
    from pathlib import Path

    from stream_dapo.model.warmup import check_context, is_default_model_path, tiny_spec

    recipe = Path(__file__).resolve().parents[2] / "configs" / "tiny-longcot-cpu.toml"
    cfg = load_config([recipe], environ={})
    assert cfg.data.synthetic.kind == "chain" and is_default_model_path(cfg.model.path)
    spec = tiny_spec(cfg)
    assert spec.max_position_embeddings == 2048
    check_context(cfg, spec)
    short = load_config([recipe], ["warmup.context_len=512"], environ={})
    with pytest.raises(ConfigError, match="set warmup.context_len >= 832"):
        check_context(short, tiny_spec(short))


def test_warmup_batches_by_default_follow_the_seeded_permutation_epoch_by_epoch() -> None:
    """The default order must stay what it was (it determines the embedded default's weights)."""
    import itertools

    import torch

    from stream_dapo.model.warmup import _batches

    lengths = list(range(10))
    got = list(itertools.islice(_batches(lengths, 3, torch.Generator().manual_seed(5), by_length=False), 6))
    gen = torch.Generator().manual_seed(5)
    first, second = torch.randperm(10, generator=gen).tolist(), torch.randperm(10, generator=gen).tolist()
    assert got == [first[0:3], first[3:6], first[6:9], second[0:3], second[3:6], second[6:9]]


def test_warmup_batches_by_length_cover_an_epoch_once_with_less_padding() -> None:
    import itertools

    import torch

    from stream_dapo.model.warmup import _batches

    rng = random.Random(0)
    lengths = [int(math.exp(rng.uniform(math.log(40), math.log(1200)))) for _ in range(1000)]
    per_epoch = 1000 // 8

    def padded(by_length: bool) -> tuple[int, list[list[int]]]:
        batches = list(
            itertools.islice(
                _batches(lengths, 8, torch.Generator().manual_seed(1), by_length=by_length), per_epoch
            )
        )
        return sum(8 * max(lengths[i] for i in b) for b in batches), batches

    random_pad, _ = padded(False)
    sorted_pad, batches = padded(True)
    flat = [i for b in batches for i in b]
    assert len(flat) == len(set(flat)) == per_epoch * 8, "each example at most once per epoch"
    assert all(len(b) == 8 for b in batches)
    assert sorted_pad < 0.7 * random_pad


def test_every_label_is_the_same_token_in_the_question_and_the_solution() -> None:
    """Regression: with labels after a space, the tokenizer folded some into other tokens (" b" vs
    "b"), and the warm model could not look terms up (it did each line's arithmetic, on wrong terms)."""
    from stream_dapo.data.synthetic import build_prompt
    from stream_dapo.model.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    problem = sample_chain(random.Random(2), 26, 26)

    def label_tokens(text: str) -> dict[str, set[int]]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        newline = tokenizer.convert_tokens_to_ids("Ċ")
        found: dict[str, set[int]] = {}
        for prev, tok in zip(ids, ids[1:], strict=False):
            piece = tokenizer.decode([tok])
            assert isinstance(piece, str)  # one sequence decodes to one string
            if prev == newline and piece in LABELS:
                found.setdefault(piece, set()).add(tok)
        return found

    in_question = label_tokens(build_prompt(problem.question)[0]["content"])
    in_solution = label_tokens("\n" + problem.solution)
    assert sorted(in_question) == sorted(in_solution) == list(LABELS)
    assert in_question == in_solution and all(len(ids) == 1 for ids in in_question.values())
