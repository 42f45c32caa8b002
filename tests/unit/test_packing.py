"""Packing of sequences into micro-batches, against hand-built expectations."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stream_dapo.learner.packing import (
    TrainSequence,
    pack_micro_batches,
    packing_efficiency,
    placeholder_micro_batch,
    scatter_to_sequences,
    sequences_from_groups,
)
from stream_dapo.transport.messages import Group, Sample


def _seq(
    prompt: list[int],
    response: list[int],
    lp: list[float] | None = None,
    versions: list[int] | None = None,
    advantage: float = 1.0,
    loss_weight: float = 1.0,
) -> TrainSequence:
    n = len(response)
    return TrainSequence(
        prompt=np.array(prompt, dtype=np.int32),
        response=np.array(response, dtype=np.int32),
        behaviour_logprobs=np.array(lp if lp is not None else [-0.5] * n, dtype=np.float32),
        versions=np.array(versions if versions is not None else [0] * n, dtype=np.int32),
        advantage=advantage,
        loss_weight=loss_weight,
    )


@pytest.fixture
def three() -> list[TrainSequence]:
    return [
        _seq([1, 2, 3], [4, 5], lp=[-0.5, -0.6], versions=[3, 4], advantage=-1.0),  # A: length 5
        _seq(
            [6, 7], [8, 9, 10, 11], lp=[-0.1, -0.2, -0.3, -0.4], versions=[7, 7, 8, 8], advantage=2.0
        ),  # B: 6
        _seq([12], [13], lp=[-0.7], versions=[1], advantage=0.5),  # C: length 2
    ]


def test_hand_example_layout_alignment_and_efficiency(three: list[TrainSequence]) -> None:
    # Budget 12: longest first B(6); B+A pads to 2 x 6 = 12 fits; adding C would need 3 x 6 = 18.
    mbs = pack_micro_batches(three, token_budget=12, pad_id=0)
    assert len(mbs) == 2
    first, second = mbs
    assert first.seq_index.tolist() == [1, 0]
    # start = shortest prompt (B, 2) - 1 = 1: column c is logit position 1 + c, predicting token 2 + c.
    assert first.start == 1
    assert first.logits_to_keep == 5
    assert first.input_ids.tolist() == [[6, 7, 8, 9, 10, 11], [1, 2, 3, 4, 5, 0]]
    assert first.attention_mask.tolist() == [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
    assert first.targets.tolist() == [[8, 9, 10, 11], [3, 4, 5, 0]]
    assert first.response_mask.tolist() == [[True, True, True, True], [False, True, True, False]]
    assert first.mask.tolist() == [[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]]
    torch.testing.assert_close(
        first.behaviour_logprobs, torch.tensor([[-0.1, -0.2, -0.3, -0.4], [0.0, -0.5, -0.6, 0.0]])
    )
    assert first.versions.tolist() == [[7, 7, 8, 8], [-1, 3, 4, -1]]
    assert first.advantages.tolist() == [2.0, -1.0]
    assert first.real_tokens == 11 and first.padded_tokens == 12

    assert second.seq_index.tolist() == [2]
    assert second.start == 0
    assert second.input_ids.tolist() == [[12, 13]]
    assert second.targets.tolist() == [[13]]
    assert second.mask.tolist() == [[1.0]]
    # Real tokens 5 + 6 + 2 = 13; processed 2 x 6 + 1 x 2 = 14.
    assert packing_efficiency(mbs) == pytest.approx(13 / 14)


def test_targets_are_the_tokens_after_each_logit_position(three: list[TrainSequence]) -> None:
    for mb in pack_micro_batches(three, token_budget=12):
        torch.testing.assert_close(mb.targets, mb.input_ids[:, mb.start + 1 :])
        # Every response token is predicted exactly once, and only response tokens are.
        for row, idx in enumerate(mb.seq_index.tolist()):
            assert mb.targets[row][mb.response_mask[row]].tolist() == three[idx].response.tolist()


def test_zero_loss_weight_keeps_response_mask_but_drops_loss_tokens() -> None:
    seqs = [_seq([1, 2], [3, 4, 5], loss_weight=0.0), _seq([1, 2], [6, 7, 8])]
    (mb,) = pack_micro_batches(seqs, token_budget=64)
    assert mb.response_mask.sum().item() == 6
    assert mb.mask.tolist() == [[0.0, 0.0, 0.0], [1.0, 1.0, 1.0]]
    assert mb.loss_weight.tolist() == [0.0, 1.0]


def test_budget_respected_and_each_sequence_in_exactly_one_micro_batch() -> None:
    rng = np.random.default_rng(0)
    seqs = [
        _seq(
            rng.integers(0, 50, rng.integers(1, 20)).tolist(),
            rng.integers(0, 50, rng.integers(1, 40)).tolist(),
        )
        for _ in range(57)
    ]
    budget = 150
    mbs = pack_micro_batches(seqs, token_budget=budget)
    seen = [i for mb in mbs for i in mb.seq_index.tolist()]
    assert sorted(seen) == list(range(len(seqs)))
    for mb in mbs:
        assert mb.padded_tokens <= budget
        assert mb.input_ids.shape[1] == max(len(seqs[i]) for i in mb.seq_index.tolist())
    real = sum(len(s) for s in seqs)
    assert packing_efficiency(mbs) == pytest.approx(real / sum(mb.padded_tokens for mb in mbs))
    # Length-sorted packing leaves little padding on this spread of lengths.
    assert packing_efficiency(mbs) > 0.8
    # Deterministic: the same input packs the same way.
    again = pack_micro_batches(seqs, token_budget=budget)
    assert [mb.seq_index.tolist() for mb in again] == [mb.seq_index.tolist() for mb in mbs]


def test_sequence_longer_than_budget_names_the_setting() -> None:
    with pytest.raises(ValueError, match="learner.micro_batch_tokens"):
        pack_micro_batches([_seq([1] * 10, [2] * 10)], token_budget=16)


def test_scatter_to_sequences_inverts_packing(three: list[TrainSequence]) -> None:
    mbs = pack_micro_batches(three, token_budget=12)
    back = scatter_to_sequences(mbs, [mb.behaviour_logprobs for mb in mbs], len(three))
    for seq, values in zip(three, back, strict=True):
        np.testing.assert_array_equal(values, seq.behaviour_logprobs)


def test_placeholder_contributes_nothing_and_is_excluded_from_efficiency(three: list[TrainSequence]) -> None:
    ph = placeholder_micro_batch()
    assert ph.mask.sum().item() == 0 and ph.placeholder
    mbs = pack_micro_batches(three, token_budget=12)
    assert packing_efficiency([*mbs, ph]) == packing_efficiency(mbs)


def test_sequences_from_groups_keeps_order_and_fields() -> None:
    samples = [
        Sample(
            tokens=np.array([5, 6], dtype=np.int32),
            logprobs=np.array([-1.0, -2.0], dtype=np.float32),
            versions=np.array([2, 3], dtype=np.int32),
            reward=1.0,
            correct=True,
            truncated=False,
            advantage=0.7,
        ),
        Sample(
            tokens=np.array([7], dtype=np.int32),
            logprobs=np.array([-3.0], dtype=np.float32),
            versions=np.array([3], dtype=np.int32),
            reward=-1.0,
            correct=False,
            truncated=True,
            advantage=-0.7,
            loss_weight=0.0,
        ),
    ]
    group = Group(
        group_id="g1",
        prompt_id="p",
        generator_id="gen",
        gold="1",
        prompt_tokens=np.array([1, 2, 3], dtype=np.int32),
        created_at=0.0,
        samples=samples,
    )
    a, b = sequences_from_groups([group])
    assert a.prompt.tolist() == [1, 2, 3] and a.response.tolist() == [5, 6] and len(a) == 5
    assert a.versions.tolist() == [2, 3] and a.advantage == pytest.approx(0.7)
    assert (b.group_id, b.sample_index, b.loss_weight, b.trained) == ("g1", 1, 0.0, False)


def test_mismatched_per_token_arrays_are_rejected() -> None:
    with pytest.raises(ValueError, match="one entry per response token"):
        TrainSequence(
            prompt=np.array([1], np.int32),
            response=np.array([2, 3], np.int32),
            behaviour_logprobs=np.zeros(1, np.float32),
            versions=np.zeros(2, np.int32),
            advantage=0.0,
        )
