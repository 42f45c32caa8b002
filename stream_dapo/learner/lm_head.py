"""An lm_head that can return per-token (log-prob, entropy) instead of logits.

`ChunkedLMHead` replaces a causal LM's output projection (same weight Parameter, so tied
embeddings stay tied and state-dict keys do not change). Called as usual it is the plain
``nn.Linear``. Inside ``with head.scoring(targets, chunk_tokens):`` a forward of the whole model
returns, in place of ``logits`` [B, K, V], a [B, K, 2] tensor of (log p(target), entropy) computed
by `stream_dapo.core.chunked_logprobs.chunked_logprobs_entropy`.

Why inside the module's forward and not on ``model.lm_head.weight`` from outside: under ZeRO-3 a
parameter is gathered only while its module runs (forward, and backward through the module's
outputs); computing in the head's own forward keeps DeepSpeed's hooks in charge, at every stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from stream_dapo.core.chunked_logprobs import chunked_logprobs_entropy
from stream_dapo.core.sampling import SamplingPolicy
from stream_dapo.errors import ConfigError

__all__ = ["ChunkedLMHead", "install_chunked_head"]


class ChunkedLMHead(torch.nn.Linear):
    """``nn.Linear`` whose forward scores given target tokens while `scoring` is active."""

    _targets: Tensor | None = None
    _chunk_tokens: int = 0
    _policy: SamplingPolicy | None = None

    @classmethod
    def sharing(cls, linear: torch.nn.Linear) -> ChunkedLMHead:
        """A head holding ``linear``'s own weight and bias Parameters (nothing is copied)."""
        head = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        head.weight = linear.weight
        head.bias = linear.bias
        return head

    @contextmanager
    def scoring(
        self, targets: Tensor, chunk_tokens: int, policy: SamplingPolicy | None = None
    ) -> Iterator[None]:
        """While active, forward(hidden [B, K, H]) returns [B, K, 2]: log p(targets) and entropy,
        of the sampling distribution ``policy`` describes (None: the raw logits').

        ``targets``: [B, K] token ids, one per position the head sees (the model's
        ``logits_to_keep`` positions).
        """
        if self._targets is not None:
            raise RuntimeError("ChunkedLMHead.scoring is already active (not re-entrant)")
        self._targets, self._chunk_tokens, self._policy = targets, chunk_tokens, policy
        try:
            yield
        finally:
            self._targets, self._chunk_tokens, self._policy = None, 0, None

    def forward(self, hidden: Tensor) -> Tensor:
        if self._targets is None:
            return super().forward(hidden)
        logp, entropy = chunked_logprobs_entropy(
            hidden,
            self.weight,
            self._targets,
            chunk_tokens=self._chunk_tokens,
            bias=self.bias,
            policy=self._policy,
        )
        return torch.stack([logp, entropy], dim=-1)


def install_chunked_head(model: torch.nn.Module) -> ChunkedLMHead:
    """Swap the model's output projection for a `ChunkedLMHead` sharing its weights (idempotent).

    Raises:
        ConfigError: the model's output embedding is not an ``nn.Linear`` (nothing to swap); the
            message names the setting that avoids the swap.
    """
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if isinstance(head, ChunkedLMHead):
        return head
    if not isinstance(head, torch.nn.Linear):
        raise ConfigError(
            f"{type(model).__name__}'s output embedding is {type(head).__name__}, not nn.Linear; set "
            "learner.logprob_chunk_tokens = 0 to compute log-probs from the full logits"
        )
    chunked = ChunkedLMHead.sharing(head)
    model.set_output_embeddings(chunked)  # type: ignore[operator]  # transformers types it as a Tensor
    return chunked
