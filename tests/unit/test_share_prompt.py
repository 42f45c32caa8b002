"""learner.share_prompt: a group's samples in one forward row give the per-sample layout's numbers.

The forward of shared-prompt rows (prompt once, each response after its own copy of the prompt's
last token, a 4D mask, per-segment position ids) must give every response token the log-prob and
entropy it has in its own row; through the learner's real step, the loss and every gradient must
match; packing must place every sample exactly once and fall back to smaller rows where a group does
not fit; and the token counts must be those the forward processes.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from stream_dapo.config import Config
from stream_dapo.errors import ConfigError
from stream_dapo.learner.packing import (
    MicroBatch,
    TrainSequence,
    pack_micro_batches,
    plan_rows,
    scatter_to_sequences,
    sequences_from_groups,
    shared_prompt_attention,
)
from stream_dapo.learner.trainer import Learner, check_share_prompt
from stream_dapo.testing.learner import BackwardOnlyEngine
from stream_dapo.testing.services import random_group
from stream_dapo.transport.messages import Group

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def tiny_qwen2_gqa(attn: str = "sdpa") -> PreTrainedModel:
    """Qwen2 with grouped-query attention (4 query heads, 2 key/value heads)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        # Taken through **kwargs, which the strict dataclass signature does not show.
        attn_implementation=attn,  # type: ignore[call-arg]
    )
    return Qwen2ForCausalLM(cfg).float()


def tiny_llama(attn: str = "sdpa") -> PreTrainedModel:
    """Llama with plain multi-head attention and an untied output embedding."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        tie_word_embeddings=False,
        # Taken through **kwargs, which the strict dataclass signature does not show.
        attn_implementation=attn,  # type: ignore[call-arg]
    )
    return LlamaForCausalLM(cfg).float()


MODELS: dict[str, Callable[[], PreTrainedModel]] = {
    "qwen2-gqa-sdpa": lambda: tiny_qwen2_gqa("sdpa"),
    "qwen2-gqa-eager": lambda: tiny_qwen2_gqa("eager"),
    "llama-sdpa": lambda: tiny_llama("sdpa"),
}


def make_cfg(share: bool, chunk: int = 5, budget: int = 64, **algo: Any) -> Config:
    return Config.model_validate(
        {
            "model": {"max_prompt_len": 16, "path": "unused"},
            "algo": {"group_size": 5, "max_response_len": 32, "overlong_cache_len": 4, **algo},
            "learner": {
                "mini_batch_samples": 10,
                "rollout_batch_prompts": 2,
                "micro_batch_tokens": budget,
                "logprob_chunk_tokens": chunk,
                "share_prompt": share,
            },
        }
    )


def make_groups(seed: int, group_size: int) -> list[Group]:
    """Three groups: prompts of 9, 4 and 1 token(s) (the last has an empty shared prefix), responses
    of different lengths, one overlong-filtered sample (loss_weight 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for gid, prompt_len in (("a", 9), ("b", 4), ("c", 1)):
        lengths = rng.integers(1, 21, group_size).tolist()
        advantages = rng.normal(size=group_size).round(2).tolist()
        weights = [0.0 if gid == "b" and i == 0 else 1.0 for i in range(group_size)]
        out.append(random_group(rng, gid, prompt_len, lengths, advantages, weights))
    return out


def learner_for(model: str, share: bool, **kw: Any) -> Learner:
    return Learner(make_cfg(share, **kw), MODELS[model](), make_engine=BackwardOnlyEngine)


# --------------------------------------------------------------------------------------------------
# (1) The forward: per-token log-probs and entropies
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [0, 5])
@pytest.mark.parametrize("group_size", [1, 2, 5])
@pytest.mark.parametrize("model", MODELS)
def test_shared_rows_give_each_token_its_per_sample_logprob_and_entropy(
    model: str, group_size: int, chunk: int
) -> None:
    groups = make_groups(seed=group_size, group_size=group_size)
    stats = {}
    for share in (False, True):
        learner = learner_for(model, share, chunk=chunk, budget=512)
        batch = learner.prepare(groups)
        shared = [mb for mb in batch.micro_batches if mb.unpack is not None]
        # G = 1 has nothing to share: the layout stays per-sample.
        assert bool(shared) == (share and group_size > 1)
        pairs = learner.compute_token_stats(batch.micro_batches)
        n = sum(len(g.samples) for g in groups)
        stats[share] = [scatter_to_sequences(batch.micro_batches, [p[i] for p in pairs], n) for i in (0, 1)]
    for which in (0, 1):  # log-probs, entropies
        for per_sample, shared_values in zip(stats[False][which], stats[True][which], strict=True):
            assert np.isfinite(shared_values).all()
            np.testing.assert_allclose(shared_values, per_sample, rtol=0, atol=1e-5)


def test_the_mask_lets_a_token_see_the_prefix_and_its_own_segment_only() -> None:
    # One row: prefix of 2, segments of 2 and 3 tokens, then 2 padding positions.
    segments = torch.tensor([[0, 0, 1, 1, 2, 2, 2, -1, -1]])
    allowed = shared_prompt_attention(segments)
    assert allowed.shape == (1, 1, 9, 9) and allowed.dtype == torch.bool
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 1, 0],  # padding: never a fully masked row (sdpa would give NaN)
        [1, 1, 0, 0, 0, 0, 0, 1, 1],
    ]
    assert allowed[0, 0].int().tolist() == expected


# --------------------------------------------------------------------------------------------------
# (2) The step: loss and gradients through the learner
# --------------------------------------------------------------------------------------------------

CORRECTIONS = {
    "dapo": {},
    "sequence-tis": {"is_level": "sequence"},
    "gspo": {"ratio_level": "sequence", "agg_mode": "seq-mean-token-mean"},
    "kl+entropy": {"kl_coef": 0.1, "entropy_coef": 0.003, "ratio_mode": "behaviour"},
}


def float64_step(model: str, share: bool, chunk: int, algo: dict[str, Any]) -> tuple[dict, dict, Any]:
    """One accumulate_gradients in float64 (so layout differences are rounding only), with proximal
    log-probs off the current ones (a sample-dependent shift), so ratios and clips are not trivial."""
    learner = learner_for(model, share, chunk=chunk, **algo)
    learner.engine.module.double()  # in place: Parameters (and a tie) are kept
    if learner.ref_model is not None:
        learner.ref_model.double()
        with torch.no_grad():  # a reference that differs from the policy, so the KL term is not 0
            for p in learner.ref_model.parameters():
                p.mul_(0.9)
    batch = learner.prepare(make_groups(seed=7, group_size=5))
    prox = [
        lp + 0.05 * mb.behaviour_logprobs.double()
        for lp, mb in zip(learner.compute_logprobs(batch.micro_batches), batch.micro_batches, strict=True)
    ]
    acc = learner.accumulate_gradients(batch, prox)
    sums = {**acc.sums, **acc.weighted, "contributing": acc.contributing, "given": acc.given}
    grads = {n: p.grad.clone() for n, p in learner.engine.module.named_parameters()}
    return sums, grads, batch


def assert_grad_close(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Equal to float32 rounding of the gradient's scale. The models' RMSNorm computes in float32
    even in a float64 model, so the backward through it rounds the gradient, whose sums run in a
    different order in the two layouts, at float32 precision: about 1e-8 of the largest entry below
    the last layer (one row per sample with sdpa and with eager attention differ as much). A wrong
    mask or position is off by orders of magnitude more."""
    scale = float(expected.abs().max())
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6 * scale, msg=f"grad of {name}")


@pytest.mark.parametrize("chunk", [0, 5])
@pytest.mark.parametrize("algo", CORRECTIONS.values(), ids=CORRECTIONS.keys())
def test_loss_metrics_and_every_gradient_equal_the_per_sample_step(algo: dict[str, Any], chunk: int) -> None:
    ref_sums, ref_grads, ref_batch = float64_step("qwen2-gqa-sdpa", False, chunk, algo)
    sums, grads, batch = float64_step("qwen2-gqa-sdpa", True, chunk, algo)
    # The budget of 64 splits group "a" (8 + 5 x (1 + L) tokens) into rows that fit, over several
    # micro-batches: the fallback and accumulation are in the comparison too.
    assert len(batch.micro_batches) > 1
    assert any(mb.unpack is not None for mb in batch.micro_batches)
    assert batch.global_tokens == ref_batch.global_tokens and batch.global_seqs == ref_batch.global_seqs
    assert ref_sums["loss"] != 0.0
    for name, value in ref_sums.items():
        assert sums[name] == pytest.approx(value, rel=1e-10, abs=1e-13), name
    for name, g in ref_grads.items():
        assert g.abs().max() > 0, name
        assert_grad_close(grads[name], g, name)


def test_llama_eager_step_equals_the_per_sample_step() -> None:
    """Eager attention takes the mask as an additive float tensor (sdpa a boolean one). Its softmax
    runs in float32 even in a float64 model, hence the loss agrees to float32 rounding here."""
    MODELS["llama-eager"] = lambda: tiny_llama("eager")
    try:
        ref_sums, ref_grads, _ = float64_step("llama-eager", False, 0, {})
        sums, grads, _ = float64_step("llama-eager", True, 0, {})
    finally:
        del MODELS["llama-eager"]
    assert sums["loss"] == pytest.approx(ref_sums["loss"], rel=1e-6)
    for name, g in ref_grads.items():
        assert_grad_close(grads[name], g, name)


# --------------------------------------------------------------------------------------------------
# (3) Packing
# --------------------------------------------------------------------------------------------------


def _seq(prompt: list[int], response: list[int], loss_weight: float = 1.0) -> TrainSequence:
    n = len(response)
    return TrainSequence(
        prompt=np.array(prompt, dtype=np.int32),
        response=np.array(response, dtype=np.int32),
        behaviour_logprobs=-0.1 * np.arange(1, n + 1, dtype=np.float32),
        versions=np.zeros(n, dtype=np.int32),
        advantage=1.0,
        loss_weight=loss_weight,
    )


def test_hand_example_shared_layout() -> None:
    # Group one: prompt [1, 2, 3], responses [4, 5] and [6]; group two: prompt [7], response [8, 9, 10].
    seqs = [_seq([1, 2, 3], [4, 5]), _seq([1, 2, 3], [6]), _seq([7], [8, 9, 10])]
    (mb,) = pack_micro_batches(seqs, token_budget=64, share_prompt=True)
    # Rows: [1, 2 | 3, 4, 5 | 3, 6] (7 tokens) and [| 7, 8, 9, 10] (4 tokens), longest first.
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 3, 6], [7, 8, 9, 10, 0, 0, 0]]
    assert mb.attention_mask.tolist() == [[1] * 7, [1, 1, 1, 1, 0, 0, 0]]
    assert mb.position_ids is not None and mb.segments is not None and mb.unpack is not None
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 2, 3], [0, 1, 2, 3, 0, 0, 0]]
    assert mb.segments.tolist() == [[0, 0, 1, 1, 1, 2, 2], [1, 1, 1, 1, -1, -1, -1]]
    # start = shortest prompt (1) - 1 = 0: the forward window is every position but the last.
    assert mb.start == 0 and mb.logits_to_keep == 7
    assert mb.targets.tolist() == [[2, 3, 4, 5, 3, 6], [8, 9, 10, 0, 0, 0]]
    # The per-sample view is the per-sample layout of the samples in row order (start 0, W = 4).
    assert mb.seq_index.tolist() == [0, 1, 2]
    assert mb.response_mask.int().tolist() == [[0, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 0]]
    # Response token j of a sample -> its forward logit column, flattened over rows of width 6.
    assert mb.unpack.tolist() == [[-1, -1, 2, 3], [-1, -1, 5, -1], [6, 7, 8, -1]]
    assert mb.real_tokens == 7 + 4 and mb.padded_tokens == 2 * 7


def check_invariants(seqs: list[TrainSequence], mbs: list[MicroBatch], budget: int) -> None:
    seen = [i for mb in mbs for i in mb.seq_index.tolist()]
    assert sorted(seen) == list(range(len(seqs)))
    for mb in mbs:
        assert mb.padded_tokens <= budget
        assert torch.equal(mb.targets, mb.input_ids[:, mb.start + 1 :])
        assert mb.real_tokens == int(mb.attention_mask.sum())
        flat_targets = mb.targets.reshape(-1)
        for row, idx in enumerate(mb.seq_index.tolist()):
            rmask = mb.response_mask[row]
            # The view's response columns are exactly the response tokens...
            assert int(rmask.sum()) == len(seqs[idx].response)
            assert torch.equal(mb.mask[row] > 0, rmask & bool(seqs[idx].loss_weight > 0))
            if mb.unpack is None:
                assert mb.targets[row][rmask].tolist() == seqs[idx].response.tolist()
                continue
            # ... and unpack points each at the forward column predicting that token.
            assert torch.equal(mb.unpack[row] >= 0, rmask)
            assert flat_targets[mb.unpack[row][rmask]].tolist() == seqs[idx].response.tolist()


def random_groups_of_sequences(rng: np.random.Generator, n_groups: int) -> list[TrainSequence]:
    seqs = []
    for _ in range(n_groups):
        prompt = rng.integers(1, 50, rng.integers(1, 20)).tolist()
        for _ in range(rng.integers(1, 9)):
            seqs.append(
                _seq(prompt, rng.integers(1, 50, rng.integers(1, 40)).tolist(), rng.choice([0.0, 1.0]))
            )
    return seqs


@pytest.mark.parametrize("budget", [64, 150, 1000])
def test_every_sample_once_masks_on_responses_and_budget_respected(budget: int) -> None:
    seqs = random_groups_of_sequences(np.random.default_rng(budget), 12)
    mbs = pack_micro_batches(seqs, token_budget=budget, share_prompt=True)
    check_invariants(seqs, mbs, budget)
    assert any(mb.unpack is not None for mb in mbs)
    # Deterministic: the same input packs the same way.
    again = pack_micro_batches(seqs, token_budget=budget, share_prompt=True)
    assert [mb.seq_index.tolist() for mb in again] == [mb.seq_index.tolist() for mb in mbs]
    # Sharing never costs tokens: P - 1 + sum(1 + L) <= sum(P + L).
    plain = pack_micro_batches(seqs, token_budget=budget)
    assert sum(mb.real_tokens for mb in mbs) <= sum(mb.real_tokens for mb in plain)


def test_off_is_one_row_per_sample_as_before() -> None:
    seqs = random_groups_of_sequences(np.random.default_rng(3), 5)
    assert plan_rows(seqs, 1000) == [[i] for i in range(len(seqs))]
    for mb in pack_micro_batches(seqs, token_budget=1000):
        assert mb.unpack is None and mb.segments is None and mb.position_ids is None


def test_a_group_that_does_not_fit_splits_in_order_into_rows_that_do() -> None:
    # P = 10, responses of 20: the whole row would be 9 + 4 x 21 = 93 tokens; 64 holds 9 + 2 x 21.
    prompt = list(range(1, 11))
    seqs = [_seq(prompt, [11 + i] * 20) for i in range(4)] + [_seq([5, 6], [7])]
    assert plan_rows(seqs, 64, share_prompt=True) == [[0, 1], [2, 3], [4]]
    # Only one sample of 30 fits in 40 with P = 10 (9 + 31 = 40; two would need 71): per-sample rows.
    long = [_seq(prompt, [1] * 30) for _ in range(3)]
    assert plan_rows(long, 40, share_prompt=True) == [[0], [1], [2]]
    check_invariants(long, pack_micro_batches(long, token_budget=40, share_prompt=True), 40)
    # Different prompts never share a row, even next to each other.
    assert plan_rows([_seq([1, 2], [3]), _seq([1, 4], [3])], 64, share_prompt=True) == [[0], [1]]
    # A sample longer than the budget on its own is refused, naming the setting.
    with pytest.raises(ValueError, match="learner.micro_batch_tokens"):
        pack_micro_batches([_seq(prompt, [1] * 60)], token_budget=64, share_prompt=True)


def test_ranks_get_whole_shared_rows() -> None:
    learner = learner_for("qwen2-gqa-sdpa", True, budget=1000)
    seqs = sequences_from_groups(make_groups(seed=2, group_size=5))
    shares = []
    for rank in (0, 1):
        learner.rank, learner.world_size = rank, 2
        shares.append(learner.shard(seqs))
    assert sorted(shares[0] + shares[1]) == list(range(len(seqs)))
    for mine in shares:  # groups of 5 consecutive samples are never split across ranks
        assert {i // 5 for i in mine}.isdisjoint({i // 5 for i in range(len(seqs)) if i not in mine})


# --------------------------------------------------------------------------------------------------
# (4) Token counts and validation
# --------------------------------------------------------------------------------------------------


def test_tokens_count_what_the_forward_processes() -> None:
    rng = np.random.default_rng(0)
    groups = [
        random_group(rng, "a", 6, [3, 5, 2], [1.0, -1.0, 0.5], [1.0, 1.0, 1.0]),
        random_group(rng, "b", 4, [7], [1.0], [1.0]),
    ]
    per_sample = learner_for("qwen2-gqa-sdpa", False, budget=1000).prepare(groups)
    shared = learner_for("qwen2-gqa-sdpa", True, budget=1000).prepare(groups)
    # Per sample: (6 + 3) + (6 + 5) + (6 + 2) + (4 + 7) = 39 tokens, padded to 4 rows x 11.
    assert per_sample.global_real_tokens == 39
    assert per_sample.packing_efficiency == pytest.approx(39 / 44)
    # Shared: group a is 5 + (1 + 3) + (1 + 5) + (1 + 2) = 18 tokens; b is 11; rows of 18, padded to 2 x 18.
    assert shared.global_real_tokens == 18 + 11
    assert shared.packing_efficiency == pytest.approx(29 / 36)
    # The loss counts are the same: they are per sample.
    assert shared.global_tokens == per_sample.global_tokens == 17
    assert shared.global_seqs == per_sample.global_seqs == 4


def test_attention_that_ignores_a_4d_mask_is_refused_naming_the_fix() -> None:
    def stub(**config: Any) -> Any:
        return SimpleNamespace(config=SimpleNamespace(**config))

    with pytest.raises(ConfigError, match="set learner.share_prompt = false"):
        check_share_prompt(stub(_attn_implementation="flash_attention_2"))
    with pytest.raises(ConfigError, match="sliding_attention"):
        check_share_prompt(
            stub(_attn_implementation="sdpa", layer_types=["full_attention", "sliding_attention"])
        )
    check_share_prompt(stub(_attn_implementation="eager", layer_types=["full_attention"]))
    # The learner checks at construction.
    model = tiny_qwen2_gqa()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="flash_attention_2"):
        Learner(make_cfg(True), model, make_engine=BackwardOnlyEngine)
    model.config._attn_implementation = "sdpa"
    Learner(make_cfg(False), tiny_qwen2_gqa(), make_engine=BackwardOnlyEngine)
