"""The eval's figures from per-sample outcomes, by hand (no engine): stream_dapo.tools.evaluate.summarise."""

from __future__ import annotations

import pytest

from stream_dapo.tools.evaluate import length_quantiles, summarise

# 3 prompts x n=2 samples, prompt-major: prompt 0 right/wrong, prompt 1 wrong/wrong, prompt 2 right/right.
CORRECT = [True, False, False, False, True, True]
ANSWERED = [True, True, False, True, True, True]
LENGTHS = [10, 20, 30, 40, 50, 60]


def test_overall_figures_by_hand():
    out = summarise(CORRECT, ANSWERED, LENGTHS, 1, k=1, n=2)
    assert out["avg_at_k"] == pytest.approx(3 / 6)
    # pass@1 from n=2 is c/2 per prompt: (1/2 + 0 + 1) / 3.
    assert out["pass_at_k"] == pytest.approx(0.5)
    assert out["answered_rate"] == pytest.approx(5 / 6)
    assert out["accuracy_when_answered"] == pytest.approx(3 / 5)
    assert out["mean_response_len"] == pytest.approx(35.0)
    assert out["truncation_rate"] == pytest.approx(1 / 6)
    assert (out["num_prompts"], out["num_samples"], out["k"], out["n"]) == (3, 6, 1, 2)
    assert "by_group" not in out


def test_by_group_splits_prompts_by_template_and_sums_back_to_the_whole():
    out = summarise(CORRECT, ANSWERED, LENGTHS, 0, k=2, n=2, groups=["add", "share", "add"])
    add, share = out["by_group"]["add"], out["by_group"]["share"]
    assert add["prompts"] == 2 and share["prompts"] == 1
    assert add["avg_at_k"] == pytest.approx(3 / 4)
    assert add["pass_at_k"] == pytest.approx(1.0)  # both "add" prompts have a right sample
    assert add["answered_rate"] == pytest.approx(4 / 4)
    assert add["accuracy_when_answered"] == pytest.approx(3 / 4)
    assert share["avg_at_k"] == 0.0 and share["pass_at_k"] == 0.0
    assert share["answered_rate"] == pytest.approx(1 / 2)
    assert share["accuracy_when_answered"] == 0.0
    # Prompt-weighted group figures add back up to the overall ones.
    total = sum(g["prompts"] * g["avg_at_k"] for g in out["by_group"].values()) / out["num_prompts"]
    assert total == pytest.approx(out["avg_at_k"])


def test_outcomes_not_a_multiple_of_n_or_wrong_group_count_are_refused():
    with pytest.raises(ValueError, match="multiple of n=4"):
        summarise(CORRECT, ANSWERED, LENGTHS, 0, k=1, n=4)
    with pytest.raises(ValueError, match="2 group names for 3 prompts"):
        summarise(CORRECT, ANSWERED, LENGTHS, 0, k=1, n=2, groups=["a", "b"])


def test_length_quantiles_are_nearest_rank_by_hand():
    # 6 lengths: p50 is the 3rd smallest (ceil(3.0)), p90 the 6th (ceil(5.4)), p99 the 6th.
    assert summarise(CORRECT, ANSWERED, LENGTHS, 0, k=1, n=2)["response_len_quantiles"] == {
        "p50": 30,
        "p90": 60,
        "p99": 60,
        "max": 60,
    }
    # 100 lengths 1..100, shuffled: the p-th quantile is p itself (rank p of 100).
    lengths = [(i * 37) % 100 + 1 for i in range(100)]
    assert sorted(lengths) == list(range(1, 101))
    assert length_quantiles(lengths) == {"p50": 50, "p90": 90, "p99": 99, "max": 100}
    # 10 lengths: p90 is rank 9 (9 of 10 at or below it), not the max.
    assert length_quantiles([5, 1, 4, 2, 3, 10, 9, 8, 7, 6])["p90"] == 9
    assert length_quantiles([7]) == {"p50": 7, "p90": 7, "p99": 7, "max": 7}
    with pytest.raises(ValueError, match="no response lengths"):
        length_quantiles([])
