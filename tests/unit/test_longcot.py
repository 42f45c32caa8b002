"""The long chain-of-thought task: its reduction, its length distribution, its rows and its config."""

from __future__ import annotations

import math
import random
import statistics

import pytest
from pydantic import ValidationError

from stream_dapo.config import ConfigError, DataConfig, SyntheticTaskConfig, load_config
from stream_dapo.data.longcot import MAX_VALUE, ChainProblem, reduce_chain, sample_chain
from stream_dapo.data.synthetic import ensure_synthetic_data, generate_split, synthetic_task_key
from stream_dapo.verifier import verify

CHAIN = SyntheticTaskConfig(kind="chain", min_ops=5, max_ops=32, num_train=300, num_eval=50)


def test_each_line_folds_the_first_operation_and_rewrites_the_rest() -> None:
    problem = ChainProblem(3, ("+", "+", "-"), (5, 2, 4))
    assert problem.question == "Compute 3+5+2-4."
    assert problem.lines == ("8+2-4", "10-4", "6")
    assert problem.solution == "8+2-4\n10-4\n6\nAnswer: 6"
    assert problem.answer == 6


def test_a_malformed_chain_is_an_error() -> None:
    with pytest.raises(ValueError, match="as many operators as terms"):
        reduce_chain(1, ("+",), (1, 2))
    with pytest.raises(ValueError, match="uses \\+ and -"):
        reduce_chain(1, ("*",), (2,))


def test_solution_length_grows_with_the_square_of_the_chain() -> None:
    """n operations make n lines; line i holds the n - 1 - i terms still to fold (plus its value)."""
    rng = random.Random(3)
    for n in (5, 12, 30):
        problem = sample_chain(rng, n, n)
        assert len(problem.ops) == n and len(problem.lines) == n
        for i, line in enumerate(problem.lines):
            assert line.count("+") + line.count("-") == n - 1 - i
        # every term is two characters (an operator and a digit), every value one or two
        chars = sum(len(line) for line in problem.lines)
        assert n * (n - 1) <= chars <= n * (n - 1) + 2 * n


def test_running_values_stay_in_range_and_the_answer_is_the_chain_evaluated() -> None:
    rng = random.Random(0)
    for _ in range(500):
        p = sample_chain(rng, 5, 32)
        value = p.start
        for op, term in zip(p.ops, p.terms, strict=True):
            value = value + term if op == "+" else value - term
            assert 0 <= value <= MAX_VALUE
            assert 1 <= term <= 9
        assert p.answer == value


def test_chain_lengths_are_log_uniform_so_long_chains_are_the_tail() -> None:
    rng = random.Random(1)
    lengths = [len(sample_chain(rng, 5, 32).ops) for _ in range(4000)]
    assert min(lengths) == 5 and max(lengths) == 32
    # log-uniform on [5, 33): median sqrt(5 * 33) = 12.8; P(n >= 22) = ln(33/22) / ln(33/5) = 0.214
    assert 11 <= statistics.median(lengths) <= 14
    share = sum(n >= 22 for n in lengths) / len(lengths)
    assert abs(share - math.log(33 / 22) / math.log(33 / 5)) < 0.03


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
        assert row["extra_info"]["num_ops"] == row["extra_info"]["solution"].count("\n")


def test_the_arith_cache_key_does_not_change_with_the_new_kind_knob() -> None:
    arith = DataConfig()
    assert synthetic_task_key(arith) == synthetic_task_key(
        DataConfig(synthetic=SyntheticTaskConfig(kind="arith"))
    )
    assert synthetic_task_key(arith) != synthetic_task_key(DataConfig(synthetic=CHAIN))


def test_long_arith_is_refused_naming_the_chain_task() -> None:
    with pytest.raises(ValidationError, match='kind = "chain"'):
        SyntheticTaskConfig(kind="arith", max_ops=12)


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
    with pytest.raises(ConfigError, match="set warmup.context_len >= 928"):
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
