"""`stream-dapo plan --memory`: per-GPU memory of the learner, and what makes a recipe fit.

    stream-dapo plan --memory --config configs/dapo-qwen2.5-32b.toml --gpus 16 --gpu-gib 80

An estimate from the model's shape and the learner's settings, in bytes per GPU (P parameters, N
data-parallel GPUs, b bytes per value of model.dtype, T = learner.micro_batch_tokens, L layers, H
hidden, I intermediate, K = key/value width, V vocabulary, c = learner.logprob_chunk_tokens):

1. Weights: b P; under ZeRO-3 b P / N plus the gathered working set, b (max(V H, P_layer) +
   P_layer) (the module being computed and one prefetched). offload_param moves the shard off the
   GPU; the working set stays.
2. Gradients: accumulated in float32 (bfloat16 models accumulate in fp32, see `deepspeed_config`):
   4 P, / N from ZeRO-2 on; plus DeepSpeed's reduce bucket (5e8 values of b bytes, at most b P)
   under ZeRO >= 1. offload_optimizer keeps the fp32 gradient partition on the CPU (ZeRO >= 2).
3. Optimizer state: Adam's two moments, 8 P, plus fp32 master weights, 4 P, when b < 4; / N from
   ZeRO-1 on; 0 on the GPU with offload_optimizer (it is then in CPU memory or on NVMe).
4. Activations, per token of T: a decoder layer saves for backward its two norms' float32 inputs
   (2 x 4 H) and, in the model dtype, the norms' outputs, q/k/v after rotary embedding, the
   attention output and its reshaped copy, and four MLP tensors of width I: b (4 I + 5 H + 2 K)
   bytes. Without checkpointing, L of them. With learner.gradient_checkpointing, each layer keeps
   its input (b H) and one layer at a time is recomputed in full: L b H + one layer. Attention is
   assumed flash/memory-efficient (SDPA): no T^2 term.
5. Loss path: full logits hold about b + 12 bytes per (token, vocabulary entry) at their peak
   (the logits, a float32 copy or its gradient, the entropy's probabilities, one temporary);
   in float32 models the copy is the logits themselves: 12. Chunked: two float32 tensors of c
   tokens (log-probs and probabilities, then the bracket and the gradient, built in place) plus,
   below float32, the matmul's output in the model dtype: 8 (+ b) per entry; plus the float32
   lm_head gradient buffer it accumulates, 4 V H.
6. Overhead: a fixed allowance for the CUDA context, NCCL buffers and allocator fragmentation
   (``--reserve-gib``).

The estimate is of peaks that do not all happen at once (the loss path peaks after the
activations are built), so it errs high; docs/RESULTS.md compares it with measured peaks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stream_dapo.config import Config, from_section

__all__ = [
    "KNOWN_SHAPES",
    "MemoryEstimate",
    "MemoryPlanError",
    "ModelShape",
    "Settings",
    "estimate",
    "largest_micro_batch_tokens",
    "shape_for",
]

GIB = 1024**3
REDUCE_BUCKET_VALUES = 500_000_000
"""DeepSpeed's default reduce_bucket_size (values), which the learner does not change."""
DEFAULT_RESERVE_GIB = 3.0


class MemoryPlanError(ValueError):
    """Inputs the memory plan cannot work with; the message names the fix."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Qwen2-style decoder that memory depends on."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    @property
    def kv_width(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        """q, k, v with biases, o without, gate/up/down, two norms."""
        h, k = self.hidden, self.kv_width
        return h * h + h + 2 * (h * k + k) + h * h + 3 * h * self.intermediate + 2 * h

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return embeddings + self.layers * self.layer_params + self.hidden

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        optional = {  # Hugging Face's defaults where a config.json omits the key
            "num_key_value_heads": lambda: config["num_attention_heads"],
            "tie_word_embeddings": lambda: False,
        }
        try:
            values = {
                name: config.get(key) or optional[key]() if key in optional else config[key]
                for name, key in _HF_KEYS.items()
            }
            typed: dict[str, Any] = {
                name: bool(v) if name == "tied" else int(v) for name, v in values.items()
            }
            return cls(**typed)
        except KeyError as exc:
            raise MemoryPlanError(
                f"model config.json lacks {exc.args[0]!r}; pass --model-shape with one of "
                f"{', '.join(KNOWN_SHAPES)}"
            ) from None

    def to_hf_config(self) -> dict[str, Any]:
        """The Hugging Face config keys of this shape (the inverse of `from_hf_config`)."""
        return {key: getattr(self, name) for name, key in _HF_KEYS.items()}


_HF_KEYS = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "intermediate": "intermediate_size",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "vocab": "vocab_size",
    "tied": "tie_word_embeddings",
}
"""`ModelShape` field -> Hugging Face config.json key."""


KNOWN_SHAPES: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape(24, 896, 4864, 14, 2, 151936, True),
    "qwen2.5-1.5b": ModelShape(28, 1536, 8960, 12, 2, 151936, True),
    "qwen2.5-7b": ModelShape(28, 3584, 18944, 28, 4, 152064, False),
    "qwen2.5-14b": ModelShape(48, 5120, 13824, 40, 8, 152064, False),
    "qwen2.5-32b": ModelShape(64, 5120, 27648, 40, 8, 152064, False),
    "qwen2.5-72b": ModelShape(80, 8192, 29568, 64, 8, 152064, False),
}
"""Published shapes of the Qwen2.5 base models (their config.json), for recipes whose model.path
is not on this machine."""


def shape_for(model_path: str, name: str | None = None) -> tuple[ModelShape, str]:
    """The model's shape and where it came from: ``name`` (a `KNOWN_SHAPES` key), else
    model.path/config.json, else a known name inside model.path (``/models/Qwen2.5-32B``)."""
    if name is not None:
        key = name.lower()
        if key not in KNOWN_SHAPES:
            raise MemoryPlanError(f"--model-shape {name!r} is not one of {', '.join(KNOWN_SHAPES)}")
        return KNOWN_SHAPES[key], f"--model-shape {key}"
    config = Path(model_path) / "config.json"
    if config.is_file():
        return ModelShape.from_hf_config(json.loads(config.read_text())), str(config)
    base = Path(model_path).name.lower()
    for key in sorted(KNOWN_SHAPES, key=len, reverse=True):
        if key in base:
            return KNOWN_SHAPES[key], f"known shape {key} (from model.path {model_path!r})"
    raise MemoryPlanError(
        f"model.path {model_path!r} has no config.json here and names no known model; pass --model-shape "
        f"with one of {', '.join(KNOWN_SHAPES)}"
    )


@dataclass(frozen=True)
class Settings:
    """The learner settings memory depends on (a `LearnerConfig` slice, plus the dtype)."""

    dtype_bytes: int
    zero_stage: int
    micro_batch_tokens: int
    logprob_chunk_tokens: int
    gradient_checkpointing: bool
    offload_optimizer: str
    offload_param: str

    @classmethod
    def from_config(cls, cfg: Config) -> Settings:
        """The `learner` keys of the same names, and the bytes of model.dtype."""
        return from_section(cls, cfg.learner, dtype_bytes=4 if cfg.model.dtype == "float32" else 2)

    def describe(self) -> str:
        parts = [
            f"zero_stage={self.zero_stage}",
            f"logprob_chunk_tokens={self.logprob_chunk_tokens}",
            f"gradient_checkpointing={str(self.gradient_checkpointing).lower()}",
        ]
        if self.offload_optimizer != "none":
            parts.append(f'offload_optimizer="{self.offload_optimizer}"')
        if self.offload_param != "none":
            parts.append(f'offload_param="{self.offload_param}"')
        return ", ".join(parts)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU, by item (`estimate`'s docstring gives each formula), and per-GPU CPU memory
    for what is offloaded."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    loss_path: float
    overhead: float
    cpu_offloaded: float

    @property
    def total(self) -> float:
        return (
            self.weights + self.gradients + self.optimizer + self.activations + self.loss_path + self.overhead
        )


def _per_token_bytes(shape: ModelShape, s: Settings) -> tuple[float, float]:
    """(activation bytes per token, loss-path bytes per token of the full-logits path)."""
    b, h = s.dtype_bytes, shape.hidden
    layer = b * (4 * shape.intermediate + 5 * h + 2 * shape.kv_width) + 8 * h
    model_level = b * 2 * h + 4 * h  # embedding output, final norm (float32 input, output)
    if s.gradient_checkpointing:
        act = shape.layers * b * h + layer + model_level
    else:
        act = shape.layers * layer + model_level
    full_loss = shape.vocab * ((b + 12) if b < 4 else 12)
    return act, full_loss


def _static(shape: ModelShape, s: Settings, gpus: int) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, cpu_offloaded) bytes per GPU."""
    p, b = shape.params, s.dtype_bytes
    stage = s.zero_stage
    cpu = 0.0
    if stage == 3:
        working = b * (max(shape.vocab * shape.hidden, shape.layer_params) + shape.layer_params)
        shard = b * p / gpus
        if s.offload_param != "none":
            cpu += shard
            shard = 0.0
        weights = shard + working
    else:
        weights = float(b * p)
    grads = 4.0 * p / (gpus if stage >= 2 else 1)
    if stage >= 2 and s.offload_optimizer != "none":
        cpu += grads
        grads = 0.0
    if stage >= 1:
        grads += b * min(REDUCE_BUCKET_VALUES, p)
    opt = (8.0 + (4.0 if b < 4 else 0.0)) * p / (gpus if stage >= 1 else 1)
    if s.offload_optimizer != "none":
        cpu += opt
        opt = 0.0
    return weights, grads, opt, cpu


def estimate(
    shape: ModelShape, s: Settings, gpus: int, reserve_gib: float = DEFAULT_RESERVE_GIB
) -> MemoryEstimate:
    """Per-GPU memory of the learner at ``s.micro_batch_tokens`` tokens per micro-batch."""
    if gpus < 1:
        raise MemoryPlanError(f"--gpus must be >= 1, got {gpus}")
    weights, grads, opt, cpu = _static(shape, s, gpus)
    act, full_loss = _per_token_bytes(shape, s)
    t = s.micro_batch_tokens
    c = s.logprob_chunk_tokens
    if c > 0:
        per_entry = 8 + (s.dtype_bytes if s.dtype_bytes < 4 else 0)
        loss = min(c, t) * shape.vocab * per_entry + 4.0 * shape.vocab * shape.hidden
    else:
        loss = t * full_loss
    return MemoryEstimate(
        weights=weights,
        gradients=grads,
        optimizer=opt,
        activations=t * act,
        loss_path=float(loss),
        overhead=reserve_gib * GIB,
        cpu_offloaded=cpu,
    )


def largest_micro_batch_tokens(
    shape: ModelShape, s: Settings, gpus: int, gpu_gib: float, reserve_gib: float = DEFAULT_RESERVE_GIB
) -> int:
    """The largest micro_batch_tokens (a multiple of 64) whose estimate fits in ``gpu_gib``; 0 if
    even 64 tokens do not fit. The estimate grows linearly in T (the chunked loss path is flat once
    T >= c), so one division finds it, checked against the estimate itself."""
    budget = gpu_gib * GIB

    def fits(t: int) -> bool:
        return estimate(shape, replace(s, micro_batch_tokens=t), gpus, reserve_gib).total <= budget

    if not fits(64):
        return 0
    lo, hi = 64, 64
    while fits(hi * 2) and hi < 2**26:
        hi *= 2
    hi *= 2
    while hi - lo > 64:  # bisection on multiples of 64
        mid = (lo + hi) // 2 // 64 * 64
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


CANDIDATES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("chunked log-probs", {"logprob_chunk_tokens": 1024}),
    ("+ activation checkpointing", {"logprob_chunk_tokens": 1024, "gradient_checkpointing": True}),
    (
        "+ optimizer offload to CPU",
        {"logprob_chunk_tokens": 1024, "gradient_checkpointing": True, "offload_optimizer": "cpu"},
    ),
    (
        "+ parameter offload to CPU",
        {
            "logprob_chunk_tokens": 1024,
            "gradient_checkpointing": True,
            "offload_optimizer": "cpu",
            "offload_param": "cpu",
        },
    ),
)
"""Settings tried, in order of cost, when the configured ones do not fit (ZeRO-3 assumed for the
offload rows, as DeepSpeed needs for parameter offload)."""


def _candidates(s: Settings) -> Iterable[tuple[str, Settings]]:
    yield "as configured", s
    for name, changes in CANDIDATES:
        stage = (
            3 if "offload_param" in changes else max(s.zero_stage, 1 if "offload_optimizer" in changes else 0)
        )
        yield name, replace(s, zero_stage=stage, **changes)


def memory_plan(
    shape: ModelShape,
    s: Settings,
    gpus: int,
    gpu_gib: float,
    reserve_gib: float = DEFAULT_RESERVE_GIB,
    min_tokens: int = 64,
) -> dict[str, Any]:
    """The estimate as configured, the largest micro_batch_tokens, and each candidate setting.

    ``min_tokens``: the smallest micro_batch_tokens the recipe allows (one whole sequence,
    model.max_prompt_len + algo.max_response_len); where nothing fits at the configured size, the
    first setting whose largest size reaches it is the suggestion (``fits_smaller``)."""
    rows: list[dict[str, Any]] = []
    candidates = list(_candidates(s))
    if s.logprob_chunk_tokens > 0:  # what the chunked loss path saves, for comparison only
        candidates.insert(1, ("(full logits instead)", replace(s, logprob_chunk_tokens=0)))
    for name, cand in candidates:
        est = estimate(shape, cand, gpus, reserve_gib)
        rows.append(
            {
                "name": name,
                "settings": cand.describe(),
                "estimate_gib": {k: v / GIB for k, v in asdict(est).items()} | {"total": est.total / GIB},
                "fits": est.total <= gpu_gib * GIB,
                "largest_micro_batch_tokens": largest_micro_batch_tokens(
                    shape, cand, gpus, gpu_gib, reserve_gib
                ),
            }
        )
    eligible = [r for r in rows if not r["name"].startswith("(")]
    first_fit = next((r["name"] for r in eligible if r["fits"]), None)
    smaller = next((r["name"] for r in eligible if r["largest_micro_batch_tokens"] >= min_tokens), None)
    return {
        "min_tokens": min_tokens,
        "fits_smaller": None if first_fit is not None else smaller,
        "gpus": gpus,
        "gpu_gib": gpu_gib,
        "reserve_gib": reserve_gib,
        "micro_batch_tokens": s.micro_batch_tokens,
        "params": shape.params,
        "shape": asdict(shape),
        "rows": rows,
        "first_fit": first_fit,
    }


def format_memory_plan(result: dict[str, Any], source: str) -> str:
    shape = result["shape"]
    lines = [
        f"model: {result['params'] / 1e9:.2f}B parameters, {shape['layers']} layers, hidden {shape['hidden']}, "
        f"vocabulary {shape['vocab']} ({'tied' if shape['tied'] else 'untied'} embeddings) [{source}]",
        f"learner: {result['gpus']} GPU(s) of {result['gpu_gib']:g} GiB, micro_batch_tokens = "
        f"{result['micro_batch_tokens']}, reserve {result['reserve_gib']:g} GiB per GPU",
        "",
        f"{'GiB per GPU':28s} {'weights':>8s} {'grads':>8s} {'optim':>8s} {'activ':>8s} {'loss':>8s} "
        f"{'total':>8s} {'fits':>5s} {'max T':>8s} {'CPU':>8s}",
    ]
    for r in result["rows"]:
        e = r["estimate_gib"]
        lines.append(
            f"{r['name']:28s} {e['weights']:8.1f} {e['gradients']:8.1f} {e['optimizer']:8.1f} "
            f"{e['activations']:8.1f} {e['loss_path']:8.1f} {e['total']:8.1f} {'yes' if r['fits'] else 'no':>5s} "
            f"{r['largest_micro_batch_tokens']:8d} {e['cpu_offloaded']:8.1f}"
        )
    lines.append("")
    lines.append(
        "max T: the largest learner.micro_batch_tokens that fits; CPU: offloaded GiB per GPU (host RAM)."
    )
    first = result["first_fit"]
    smaller = result["fits_smaller"]
    if first is None and smaller is not None:
        row = next(r for r in result["rows"] if r["name"] == smaller)
        lines.append(
            f"nothing fits at micro_batch_tokens = {result['micro_batch_tokens']}; {smaller} ({row['settings']}) "
            f"fits with learner.micro_batch_tokens = {row['largest_micro_batch_tokens']} (one sequence needs "
            f"{result['min_tokens']})"
        )
    elif first is None:
        lines.append(
            f"nothing here fits one sequence ({result['min_tokens']} tokens): add GPUs (--gpus) or use "
            "larger ones (--gpu-gib)"
        )
    else:
        row = next(r for r in result["rows"] if r["name"] == first)
        lines.append(f"fits: {first} ({row['settings']})")
    return "\n".join(lines)
