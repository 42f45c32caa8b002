"""Log-probs of the sampled tokens and entropies without the full [N, V] logits.

The loss needs two numbers per token: log p(token) and the entropy of the next-token distribution.
Computing them from the full logits keeps N x V values alive (in float32: 20,480 x 151,936 x 4
bytes = 12 GiB for one of the paper's responses), plus a probability tensor for the entropy, plus
their gradients. `chunked_logprobs_entropy` instead projects the hidden states through the lm_head
weight ``chunk`` tokens at a time, keeps only the two [N] results, and in the backward pass
recomputes each chunk's logits to form its gradient. Peak memory of the loss path is then a few
``chunk x V`` tensors, whatever N is; the price is a second lm_head matmul per chunk (the forward
one, redone in backward).

Why a custom autograd function and not a fused kernel: the fused linear + cross-entropy kernels
in the field (Liger's, Apple's cut-cross-entropy) are Triton/CUDA kernels that compute the gradient
in the forward pass, for a loss whose upstream gradient is known there; ours is not (the DAPO
surrogate's gradient depends on clipping decided after the log-probs), they do not give the
entropy, and none runs on the pinned CPU stack (torch 2.13 CPU, no Triton). Plain torch per chunk
runs everywhere the learner does.

Gradients, per row with logits z, p = softmax(z), target y:
    d log p_y / dz = onehot(y) - p
    d H / dz      = -p * (log p + H)          (H = logsumexp(z) - sum p z)

With a sampling policy (`stream_dapo.core.sampling`), each chunk's logits become the sampling
distribution's, z' = z / T with the truncated tokens at -inf, before the log-softmax, exactly as
``sampling_logits`` does on full logits. The truncated tokens have p = 0 and get no gradient; a
target outside the kept set has log p = -inf, a constant (no gradient); the chain rule through
z / T divides the gradient by T.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from stream_dapo.core.sampling import SamplingPolicy, truncation_mask

__all__ = ["chunked_logprobs_entropy", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of log-probs and entropies: float32 at least (float64 stays float64), like
    `stream_dapo.core.loss.token_logprobs` on full logits."""
    return torch.promote_types(dtype, torch.float32)


def _chunk_logits(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, policy: SamplingPolicy | None
) -> tuple[Tensor, Tensor | None]:
    """The lm_head of one chunk in the model dtype (as the model computes it), then promoted, and
    turned into the sampling distribution's logits; with the truncation mask (None: nothing cut)."""
    z = F.linear(hidden, weight, bias)
    z = z.to(compute_dtype(z.dtype))
    if policy is None or policy.is_identity:
        return z, None
    if policy.temperature != 1.0:
        z = z.div_(policy.temperature)  # z is this function's own tensor
    if not policy.truncates:
        return z, None
    with torch.no_grad():
        mask = truncation_mask(z, policy)
    return z.masked_fill_(mask, -math.inf), mask


class _ChunkedLogprobsEntropy(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        chunk: int,
        policy: SamplingPolicy | None,
    ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        cd = compute_dtype(torch.promote_types(hidden.dtype, weight.dtype))
        logp = hidden.new_empty(n, dtype=cd)
        entropy = hidden.new_empty(n, dtype=cd)
        for s in range(0, n, chunk):
            # Two chunk x V tensors at a time: the logits, turned into log-probs in place, and p.
            logp_all, mask = _chunk_logits(hidden[s : s + chunk], weight, bias, policy)
            lse = torch.logsumexp(logp_all, dim=-1, keepdim=True)
            logp_all -= lse
            logp[s : s + chunk] = logp_all.gather(-1, targets[s : s + chunk, None]).squeeze(-1)
            probs = torch.exp(logp_all)
            if mask is not None:
                logp_all.masked_fill_(mask, 0.0)  # p = 0 there: no share of the entropy (not 0 * -inf)
            entropy[s : s + chunk] = -(probs.mul_(logp_all)).sum(dim=-1)
            del logp_all, probs, mask
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        ctx.chunk = chunk
        ctx.policy = policy
        ctx.set_materialize_grads(False)  # an unused output (the entropy metric) gets None: skip its term
        return logp, entropy

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_logp: Tensor | None, grad_entropy: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(hidden) if need_h else None
        # Accumulated over chunks in float32 at least, cast to the weight's dtype once at the end.
        acc = compute_dtype(weight.dtype)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        if grad_logp is None and grad_entropy is None:
            return grad_h, grad_w, grad_b, None, None, None
        chunk, policy = ctx.chunk, ctx.policy
        temperature = 1.0 if policy is None else policy.temperature
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s : s + chunk]
            t = targets[s : s + chunk, None]
            # d loss / dz' = -p * (g_logp + g_ent (log p + H)) + onehot(y) g_logp, built in place in
            # two chunk x V tensors (log p, then the bracket; p, then the gradient).
            bracket, mask = _chunk_logits(h, weight, bias, policy)
            bracket -= torch.logsumexp(bracket, dim=-1, keepdim=True)  # log p
            grad_z = torch.exp(bracket)  # p (0 where truncated)
            g_logp = None if grad_logp is None else grad_logp[s : s + chunk, None]
            if mask is not None:
                bracket.masked_fill_(mask, 0.0)  # finite where p = 0, so -p * bracket is 0 there
                if g_logp is not None:  # a target outside the kept set has a constant log p
                    g_logp = g_logp.masked_fill(mask.gather(-1, t), 0.0)
            if grad_entropy is not None:
                g_ent = grad_entropy[s : s + chunk, None]
                bracket += entropy[s : s + chunk, None]
                bracket *= g_ent
                if g_logp is not None:
                    bracket += g_logp
            else:
                assert g_logp is not None
                bracket = g_logp.expand_as(grad_z)
            grad_z *= bracket
            grad_z.neg_()
            del bracket, mask
            if g_logp is not None:
                grad_z.scatter_add_(-1, t, g_logp)
            if temperature != 1.0:
                grad_z /= temperature  # z' = z / T
            # The gradient of the promotion casts back to the logits' dtype, as autograd would.
            grad_z = grad_z.to(weight.dtype)
            if grad_h is not None:
                grad_h[s : s + chunk] = grad_z @ weight
            if grad_w is not None:
                grad_w += (grad_z.t() @ h).to(acc)
            if grad_b is not None:
                grad_b += grad_z.sum(dim=0).to(acc)
            del grad_z
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
        )


def chunked_logprobs_entropy(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    chunk_tokens: int,
    bias: Tensor | None = None,
    policy: SamplingPolicy | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-prob of each target token and the entropy at each position, ``chunk_tokens`` at a time.

    The same values and gradients as ``token_logprobs(F.linear(hidden, weight, bias), targets)`` and
    ``token_entropy(...)`` of those logits, without ever holding more than a chunk of the logits.

    Args:
        hidden: [..., H] final hidden states (after the model's last norm), model dtype.
        weight: [V, H] lm_head weight (the input embedding where the model ties them).
        targets: [...] integer token ids in [0, V), aligned with ``hidden``.
        chunk_tokens: rows projected at once (>= 1); peak memory of the loss path is about two
            ``chunk_tokens x V`` float32 tensors (three in the model dtype's matmul output, if lower).
        bias: optional [V] lm_head bias.
        policy: the generators' sampling settings: log-probs and entropies are then those of
            ``sampling_logits(logits, policy)`` (temperature, truncation); None: the raw logits.

    Returns:
        (logp, entropy), each shaped like ``targets``, float32 (float64 for float64 inputs). Both
        carry gradients; an output that does not reach the loss costs nothing in backward.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets must have shape {tuple(hidden.shape[:-1])} to match hidden {tuple(hidden.shape)}, "
            f"got {tuple(targets.shape)}"
        )
    if weight.ndim != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight must be [V, {hidden.shape[-1]}], got {tuple(weight.shape)}")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    vocab = weight.shape[0]
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        raise ValueError(
            f"token ids must lie in [0, {vocab}) (the lm_head's vocabulary size), got range "
            f"[{int(targets.min())}, {int(targets.max())}]; check that tokenizer and model vocab sizes agree"
        )
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1).long()
    logp, entropy = _ChunkedLogprobsEntropy.apply(flat_h, weight, bias, flat_t, int(chunk_tokens), policy)
    return logp.view(shape), entropy.view(shape)
