"""Turn groups of samples into padded micro-batches under a token budget.

Each sample becomes one sequence, prompt + response. Sequences are sorted by length (longest first)
and cut greedily into micro-batches whose *padded* size, rows x longest row, stays within the token
budget: padding is what the forward pass pays for, so that is what the budget bounds. Sorting keeps
rows of one micro-batch close in length, which keeps padding small.

Alignment: a causal LM's logit at position t predicts token t + 1. A micro-batch therefore carries
per-token tensors over a window of logit positions ``[start, T - 1)``, where ``start`` is the last
prompt position of the shortest prompt in the micro-batch (no response token is predicted earlier).
Column ``c`` of every per-token tensor belongs to logit position ``start + c`` and to the token at
position ``start + c + 1``; so for a sequence with prompt length P, response token j sits in column
``P + j - 1 - start``. The forward pass computes only ``T - start`` logit positions
(``logits_to_keep``), which for long prompts and large vocabularies is most of the logits memory.

Everything here is plain torch/numpy on the CPU; the learner moves micro-batches to its device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from stream_dapo.transport.messages import Group

__all__ = [
    "MicroBatch",
    "TrainSequence",
    "packing_efficiency",
    "pack_micro_batches",
    "placeholder_micro_batch",
    "scatter_to_sequences",
    "sequences_from_groups",
]


@dataclass(frozen=True)
class TrainSequence:
    """One sample as the learner sees it.

    Attributes:
        prompt: int32 [P] prompt token ids (P >= 1).
        response: int32 [L] response token ids (L >= 1).
        behaviour_logprobs: float32 [L] log-probs the generator sampled ``response`` with.
        versions: int32 [L] policy version that produced each response token.
        advantage: the sample's advantage (broadcast over its tokens by the loss).
        loss_weight: 0 drops the sample from the loss and from the token count (overlong filter);
            any value > 0 counts it fully (the token-mean loss has no per-sample weights).
        group_id / sample_index: where it came from, for logs and tests.
    """

    prompt: np.ndarray
    response: np.ndarray
    behaviour_logprobs: np.ndarray
    versions: np.ndarray
    advantage: float
    loss_weight: float = 1.0
    group_id: str = ""
    sample_index: int = 0

    def __post_init__(self) -> None:
        if self.prompt.ndim != 1 or self.prompt.shape[0] < 1:
            raise ValueError(f"prompt must be a non-empty 1-d array, got shape {self.prompt.shape}")
        n = self.response.shape[0]
        if self.response.ndim != 1 or n < 1:
            raise ValueError(f"response must be a non-empty 1-d array, got shape {self.response.shape}")
        for name in ("behaviour_logprobs", "versions"):
            if getattr(self, name).shape != (n,):
                raise ValueError(
                    f"{name} must have one entry per response token ({n}), got shape "
                    f"{getattr(self, name).shape}"
                )

    def __len__(self) -> int:
        """Tokens the forward pass sees: P + L."""
        return int(self.prompt.shape[0] + self.response.shape[0])

    @property
    def trained(self) -> bool:
        return self.loss_weight > 0


def sequences_from_groups(groups: Iterable[Group]) -> list[TrainSequence]:
    """One `TrainSequence` per sample, in group order then sample order."""
    out: list[TrainSequence] = []
    for group in groups:
        for i, s in enumerate(group.samples):
            out.append(
                TrainSequence(
                    prompt=np.asarray(group.prompt_tokens, dtype=np.int32),
                    response=np.asarray(s.tokens, dtype=np.int32),
                    behaviour_logprobs=np.asarray(s.logprobs, dtype=np.float32),
                    versions=np.asarray(s.versions, dtype=np.int32),
                    advantage=float(s.advantage),
                    loss_weight=float(s.loss_weight),
                    group_id=group.group_id,
                    sample_index=i,
                )
            )
    return out


@dataclass
class MicroBatch:
    """B right-padded sequences of length T, and per-token tensors over W = T - 1 - start columns.

    Attributes:
        input_ids: int64 [B, T]; padding is ``pad_id``.
        attention_mask: int64 [B, T]; 1 on real tokens.
        start: first logit position used (see the module docstring).
        targets: int64 [B, W], ``input_ids[:, start + 1:]``: the token each logit column predicts.
        mask: float32 [B, W], 1 where the target is a response token of a sample with loss_weight > 0:
            exactly the tokens the loss averages over.
        response_mask: bool [B, W], 1 on every response token (loss_weight ignored).
        behaviour_logprobs: float32 [B, W], generator log-probs on response tokens, 0 elsewhere.
        versions: int64 [B, W], behaviour version on response tokens, -1 elsewhere.
        advantages: float32 [B].
        loss_weight: float32 [B].
        seq_index: int64 [B], index of each row in the list given to `pack_micro_batches`
            (-1 for a placeholder row).
        real_tokens: sum of the rows' unpadded lengths.
    """

    input_ids: Tensor
    attention_mask: Tensor
    start: int
    targets: Tensor
    mask: Tensor
    response_mask: Tensor
    behaviour_logprobs: Tensor
    versions: Tensor
    advantages: Tensor
    loss_weight: Tensor
    seq_index: Tensor
    real_tokens: int
    placeholder: bool = field(default=False)

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass processes, B * T."""
        return int(self.input_ids.numel())

    @property
    def logits_to_keep(self) -> int:
        """How many trailing positions' logits the model must return: T - start (the last is unused)."""
        return int(self.input_ids.shape[1] - self.start)

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy with every tensor on ``device``."""
        moved: dict[str, Any] = {
            name: (value.to(device, non_blocking=True) if isinstance(value, Tensor) else value)
            for name, value in vars(self).items()
        }
        return MicroBatch(**moved)


def pack_micro_batches(
    sequences: Sequence[TrainSequence], token_budget: int, pad_id: int = 0
) -> list[MicroBatch]:
    """Length-sorted greedy packing: rows x longest row <= ``token_budget`` in every micro-batch.

    Every sequence lands in exactly one micro-batch. The order is deterministic (length descending,
    ties by input index), so every data-parallel rank packs the same input the same way.

    Raises:
        ValueError: a sequence is longer than the budget (raise ``learner.micro_batch_tokens``).
    """
    if token_budget < 2:
        raise ValueError(f"token_budget must be >= 2, got {token_budget}")
    order = sorted(range(len(sequences)), key=lambda i: (-len(sequences[i]), i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        n = len(sequences[i])
        if n > token_budget:
            raise ValueError(
                f"sequence {i} has {n} tokens (prompt {sequences[i].prompt.shape[0]} + response "
                f"{sequences[i].response.shape[0]}), more than the micro-batch budget of {token_budget}; "
                "raise learner.micro_batch_tokens to at least model.max_prompt_len + algo.max_response_len"
            )
        # Longest first: the first row of a micro-batch sets its padded length.
        if current and (len(current) + 1) * len(sequences[current[0]]) > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return [_collate([sequences[i] for i in rows], rows, pad_id) for rows in batches]


def _collate(rows: Sequence[TrainSequence], indices: Sequence[int], pad_id: int) -> MicroBatch:
    lengths = [len(s) for s in rows]
    width_total = max(lengths)
    start = min(int(s.prompt.shape[0]) for s in rows) - 1
    width = width_total - 1 - start
    b = len(rows)
    input_ids = np.full((b, width_total), pad_id, dtype=np.int64)
    attention = np.zeros((b, width_total), dtype=np.int64)
    response_mask = np.zeros((b, width), dtype=bool)
    behaviour = np.zeros((b, width), dtype=np.float32)
    versions = np.full((b, width), -1, dtype=np.int64)
    for r, s in enumerate(rows):
        p, n = int(s.prompt.shape[0]), len(s)
        input_ids[r, :p] = s.prompt
        input_ids[r, p:n] = s.response
        attention[r, :n] = 1
        # Response token j sits at position p + j and is predicted by the logit at p + j - 1.
        cols = slice(p - 1 - start, n - 1 - start)
        response_mask[r, cols] = True
        behaviour[r, cols] = s.behaviour_logprobs
        versions[r, cols] = s.versions
    loss_weight = np.array([s.loss_weight for s in rows], dtype=np.float32)
    mask = response_mask & (loss_weight[:, None] > 0)
    ids = torch.from_numpy(input_ids)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.from_numpy(attention),
        start=start,
        targets=ids[:, start + 1 :].clone(),
        mask=torch.from_numpy(mask.astype(np.float32)),
        response_mask=torch.from_numpy(response_mask),
        behaviour_logprobs=torch.from_numpy(behaviour),
        versions=torch.from_numpy(versions),
        advantages=torch.tensor([s.advantage for s in rows], dtype=torch.float32),
        loss_weight=torch.from_numpy(loss_weight),
        seq_index=torch.tensor(list(indices), dtype=torch.int64),
        real_tokens=int(sum(lengths)),
    )


def placeholder_micro_batch(pad_id: int = 0) -> MicroBatch:
    """A one-row, two-token micro-batch with an all-zero mask: it contributes nothing to the loss.

    ZeRO-2/3 communicate inside every forward/backward, so all data-parallel ranks must run the
    same number of micro-batches; a rank with less data runs these to keep in step.
    """
    ids = torch.full((1, 2), pad_id, dtype=torch.int64)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.ones((1, 2), dtype=torch.int64),
        start=0,
        targets=ids[:, 1:].clone(),
        mask=torch.zeros((1, 1), dtype=torch.float32),
        response_mask=torch.zeros((1, 1), dtype=torch.bool),
        behaviour_logprobs=torch.zeros((1, 1), dtype=torch.float32),
        versions=torch.full((1, 1), -1, dtype=torch.int64),
        advantages=torch.zeros(1, dtype=torch.float32),
        loss_weight=torch.zeros(1, dtype=torch.float32),
        seq_index=torch.full((1,), -1, dtype=torch.int64),
        real_tokens=0,
        placeholder=True,
    )


def packing_efficiency(micro_batches: Iterable[MicroBatch]) -> float:
    """Real tokens / processed (padded) tokens over real micro-batches; 1.0 when there are none."""
    real = processed = 0
    for mb in micro_batches:
        if not mb.placeholder:
            real += mb.real_tokens
            processed += mb.padded_tokens
    return real / processed if processed else 1.0


def scatter_to_sequences(
    micro_batches: Sequence[MicroBatch], values: Sequence[Tensor], num_sequences: int
) -> list[np.ndarray]:
    """Per-token values [B, W] of each micro-batch back to one float array [L_i] per sequence.

    The inverse of packing for response-aligned quantities (log-probs, entropies): entry j of
    sequence i is the value at the column that predicts response token j.
    """
    out: list[np.ndarray | None] = [None] * num_sequences
    for mb, vals in zip(micro_batches, values, strict=True):
        if vals.shape != mb.response_mask.shape:
            raise ValueError(
                f"values shape {tuple(vals.shape)} != micro-batch {tuple(mb.response_mask.shape)}"
            )
        host = vals.detach().float().cpu().numpy()
        rmask = mb.response_mask.cpu().numpy()
        for r, idx in enumerate(mb.seq_index.tolist()):
            if idx >= 0:
                out[idx] = host[r][rmask[r]]
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise ValueError(
            f"sequences {missing[:5]} are in no micro-batch; pass every micro-batch of the packing"
        )
    return [v for v in out if v is not None]
