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

Shared prompts (``share_prompt``, learner.share_prompt): the samples of a group have the same prompt,
so they can share one forward row instead of repeating it G times::

    [ prompt[:-1] | prompt[-1] r_1 | prompt[-1] r_2 | ... | prompt[-1] r_G ]

Each response *segment* starts with its own copy of the prompt's last token, so the segment's first
position predicts the response's first token exactly as in a per-sample row. A token attends to
``prompt[:-1]`` and, causally, to its own segment (`shared_prompt_attention`); position ids restart
at P - 1 in every segment. Every response token then sees the same context at the same positions as
in its own row, and its logit is the same (up to float rounding). A row costs
``P - 1 + sum_i (1 + L_i)`` tokens instead of ``sum_i (P + L_i)``. Consecutive sequences with the same
prompt (`sequences_from_groups` keeps a group's samples together) share a row; a group whose row
would exceed the budget is split, in order, into as few rows as fit (at worst one sample per row,
today's layout).

Such a micro-batch has two layouts. Its *forward* fields (``input_ids``, ``attention_mask``,
``position_ids``, ``segments``, ``targets``) describe the shared rows; its *per-sample view*
(``mask``, ``response_mask``, ``behaviour_logprobs``, ``versions``, ``advantages``, ``loss_weight``,
``seq_index``) is exactly the layout the same samples would have one per row, and ``unpack`` maps
the view's response columns to the forward window. The learner gathers its per-token log-probs and
entropies through ``unpack`` (`unpack_to_samples`) right after the forward, so the loss, the
proximal log-probs and everything downstream see per-sample rows either way.

Everything here is plain torch/numpy on the CPU; the learner moves micro-batches to its device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
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
    "plan_rows",
    "row_tokens",
    "scatter_to_sequences",
    "sequences_from_groups",
    "shared_prompt_attention",
    "unpack_to_samples",
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
    """R forward rows of length T, and per-token tensors of B samples over W columns.

    Without shared prompts (``unpack`` is None) each sample is one row: R = B, and the window of
    the forward is the view (W = T - 1 - start). With shared prompts the forward fields describe the
    shared rows and the rest is the per-sample view (module docstring).

    Forward fields:
        input_ids: int64 [R, T]; padding is ``pad_id``.
        attention_mask: int64 [R, T]; 1 on real tokens.
        start: first logit position used (see the module docstring); the same in the view.
        targets: int64 [R, T - 1 - start], ``input_ids[:, start + 1:]``: the token each logit column
            of the forward window predicts.
        position_ids: int64 [R, T] or None (None: 0 .. T - 1 in every row).
        segments: int64 [R, T] or None (None: plain causal rows): 0 on a row's shared prompt prefix,
            k >= 1 on its k-th response segment, -1 on padding (see `shared_prompt_attention`).

    Per-sample view, [B, W] with W = (longest sample) - 1 - start:
        mask: float32 [B, W], 1 where the target is a response token of a sample with loss_weight > 0:
            exactly the tokens the loss averages over.
        response_mask: bool [B, W], 1 on every response token (loss_weight ignored).
        behaviour_logprobs: float32 [B, W], generator log-probs on response tokens, 0 elsewhere.
        versions: int64 [B, W], behaviour version on response tokens, -1 elsewhere.
        advantages: float32 [B].
        loss_weight: float32 [B].
        seq_index: int64 [B], index of each sample in the list given to `pack_micro_batches`
            (-1 for a placeholder row).
        unpack: int64 [B, W] or None: on response columns, the index of the same token's logit
            column in the flattened forward window [R * (T - 1 - start)]; -1 elsewhere.

    real_tokens: real (unpadded) tokens of the forward rows: what the forward pass processes.
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
    position_ids: Tensor | None = None
    segments: Tensor | None = None
    unpack: Tensor | None = None

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass processes, R * T."""
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


def row_tokens(row: Sequence[TrainSequence]) -> int:
    """Tokens of one forward row holding ``row``'s samples (all with the same prompt):
    P - 1 + sum_i (1 + L_i); for one sample P + L."""
    return int(row[0].prompt.shape[0]) - 1 + sum(1 + int(s.response.shape[0]) for s in row)


def plan_rows(
    sequences: Sequence[TrainSequence], token_budget: int, share_prompt: bool = False
) -> list[list[int]]:
    """Which sequences share a forward row: lists of indices into ``sequences``, in input order.

    Without ``share_prompt`` every sequence is its own row. With it, consecutive sequences with the
    same prompt tokens share a row while its `row_tokens` stay within ``token_budget``; the next one
    starts a new row (so an oversized group splits, in order, into as few rows as fit). A sequence
    longer than the budget on its own is still one row; `pack_micro_batches` rejects it.
    """
    if not share_prompt:
        return [[i] for i in range(len(sequences))]
    rows: list[list[int]] = []
    tokens = 0
    for i, s in enumerate(sequences):
        if rows:
            head = sequences[rows[-1][0]]
            extra = 1 + int(s.response.shape[0])
            if np.array_equal(head.prompt, s.prompt) and tokens + extra <= token_budget:
                rows[-1].append(i)
                tokens += extra
                continue
        rows.append([i])
        tokens = len(s)
    return rows


def pack_micro_batches(
    sequences: Sequence[TrainSequence], token_budget: int, pad_id: int = 0, *, share_prompt: bool = False
) -> list[MicroBatch]:
    """Length-sorted greedy packing: rows x longest row <= ``token_budget`` in every micro-batch.

    Every sequence lands in exactly one micro-batch. The order is deterministic (row length
    descending, ties by input index), so every data-parallel rank packs the same input the same way.
    ``share_prompt``: a group's samples share forward rows (`plan_rows`, module docstring).

    Raises:
        ValueError: a sequence is longer than the budget (raise ``learner.micro_batch_tokens``).
    """
    if token_budget < 2:
        raise ValueError(f"token_budget must be >= 2, got {token_budget}")
    rows = plan_rows(sequences, token_budget, share_prompt)
    lengths = [row_tokens([sequences[i] for i in row]) for row in rows]
    order = sorted(range(len(rows)), key=lambda r: (-lengths[r], rows[r][0]))
    batches: list[list[int]] = []
    current: list[int] = []
    for r in order:
        n = lengths[r]
        if n > token_budget:
            i = rows[r][0]
            raise ValueError(
                f"sequence {i} has {n} tokens (prompt {sequences[i].prompt.shape[0]} + response "
                f"{sequences[i].response.shape[0]}), more than the micro-batch budget of {token_budget}; "
                "raise learner.micro_batch_tokens to at least model.max_prompt_len + algo.max_response_len"
            )
        # Longest first: the first row of a micro-batch sets its padded length.
        if current and (len(current) + 1) * lengths[current[0]] > token_budget:
            batches.append(current)
            current = []
        current.append(r)
    if current:
        batches.append(current)
    out = []
    for batch in batches:
        indices = [i for r in batch for i in rows[r]]
        mb = _collate([sequences[i] for i in indices], indices, pad_id)
        if any(len(rows[r]) > 1 for r in batch):
            mb = _share_rows(mb, [[sequences[i] for i in rows[r]] for r in batch], pad_id)
        out.append(mb)
    return out


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


def _share_rows(mb: MicroBatch, rows: Sequence[Sequence[TrainSequence]], pad_id: int) -> MicroBatch:
    """``mb`` (the per-sample layout of the rows' samples, in row order) with its forward fields
    replaced by one shared-prompt row per entry of ``rows`` (module docstring)."""
    start = mb.start  # min P - 1: a shared row's first segment copy of prompt[-1] sits at P - 1 too
    lengths = [row_tokens(row) for row in rows]
    width_total = max(lengths)
    width = width_total - 1 - start
    n_rows = len(rows)
    input_ids = np.full((n_rows, width_total), pad_id, dtype=np.int64)
    attention = np.zeros((n_rows, width_total), dtype=np.int64)
    positions = np.zeros((n_rows, width_total), dtype=np.int64)
    segments = np.full((n_rows, width_total), -1, dtype=np.int64)
    unpack = np.full(tuple(mb.response_mask.shape), -1, dtype=np.int64)
    b = 0
    for r, row in enumerate(rows):
        prompt = row[0].prompt
        p = int(prompt.shape[0])
        input_ids[r, : p - 1] = prompt[:-1]
        positions[r, : p - 1] = np.arange(p - 1)
        segments[r, : p - 1] = 0
        o = p - 1  # where the current segment's copy of prompt[-1] goes
        for k, s in enumerate(row, start=1):
            n = int(s.response.shape[0])
            input_ids[r, o] = prompt[-1]
            input_ids[r, o + 1 : o + 1 + n] = s.response
            positions[r, o : o + 1 + n] = np.arange(p - 1, p + n)
            segments[r, o : o + 1 + n] = k
            # Response token j: view column p - 1 + j - start; forward logit position o + j.
            unpack[b, p - 1 - start : p - 1 - start + n] = r * width + (o - start) + np.arange(n)
            o += 1 + n
            b += 1
        attention[r, :o] = 1
    ids = torch.from_numpy(input_ids)
    return replace(
        mb,
        input_ids=ids,
        attention_mask=torch.from_numpy(attention),
        targets=ids[:, start + 1 :].clone(),
        position_ids=torch.from_numpy(positions),
        segments=torch.from_numpy(segments),
        unpack=torch.from_numpy(unpack),
        real_tokens=int(sum(lengths)),
    )


def shared_prompt_attention(segments: Tensor) -> Tensor:
    """bool [R, 1, T, T] attention mask of shared-prompt rows from their ``segments`` [R, T]:
    query q may attend key k iff k <= q and k is on the shared prefix (segment 0) or in q's own
    segment. Padding (-1) attends to the prefix and to padding up to itself, so no query row is
    fully masked (scaled_dot_product_attention would return NaN for it)."""
    r, t = segments.shape
    causal = torch.ones((t, t), dtype=torch.bool, device=segments.device).tril()
    same = segments[:, :, None] == segments[:, None, :]
    prefix = (segments == 0)[:, None, :]
    return ((same | prefix) & causal)[:, None]


def unpack_to_samples(values: Tensor, index: Tensor) -> Tensor:
    """Per-token ``values`` [R, W'] of a forward window gathered into the per-sample view [B, W]
    (``MicroBatch.unpack`` is ``index``); 0 where ``index`` is -1. Differentiable (a gather)."""
    picked = values.reshape(-1)[index.clamp(min=0)]
    return torch.where(index >= 0, picked, torch.zeros((), dtype=values.dtype, device=values.device))


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
