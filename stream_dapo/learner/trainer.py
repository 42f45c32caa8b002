"""The learner: a DeepSpeed engine that takes one DAPO optimizer step per mini-batch.

One step (``train_step``), for a mini-batch of groups:

1. ``prepare``: every data-parallel rank gets the whole mini-batch, takes a token-balanced share of
   its sequences, packs the share into micro-batches and pads the micro-batch count to the largest
   on any rank (ZeRO-2/3 communicate inside forward/backward, so all ranks must run the same number).
   The valid-token count T (and the sequence count) is all-reduced over ranks. With
   learner.share_prompt a group's samples share forward rows (the prompt once; the log-probs are
   gathered back to one row per sample right after the forward, so the loss sees the same layout
   either way: `stream_dapo.learner.packing`).
2. ``accumulate_gradients``: forward/backward of every micro-batch with ``policy_loss(...,
   global_tokens=T)``. DeepSpeed's own scaling is undone exactly: ``backward(scale_wrt_gas=False)``
   skips its division by the accumulation steps, and the loss is multiplied by the data-parallel
   world size because DeepSpeed averages gradients over ranks. The accumulated gradient is then the
   gradient of the one-big-batch token-mean loss, however the batch is split.
3. ``apply_update``: ``engine.step()`` (gradient clipping, AdamW, LR warm-up), version += 1.

Gradient accumulation is caller-owned (``managed_gradient_accumulation: false``): the number of
micro-batches changes every step, so the boundary is simply the ``step()`` call.

The proximal log-probs of the decoupled loss come from ``compute_logprobs`` on the same packed
micro-batches before any step of the rollout batch (the service does that once per rollout batch).

Every log-prob and entropy here is of the generators' sampling distribution (``generator.temperature``,
``top_p``, ``top_k``, ``min_p``; ``stream_dapo.core.sampling``), the one vLLM returns mu for, so
pi_prox / mu is 1 at staleness 0 whatever the settings. Each step also reports how far mu is from
pi_prox (``StepMetrics.behaviour_gap``).

Memory at long context: log-probs and entropies come from the model's `ChunkedLMHead`
(learner.logprob_chunk_tokens tokens at a time, recomputed in backward, the sampling transform
applied per chunk), so no [B, W, V] logits tensor exists; learner.gradient_checkpointing and the
DeepSpeed offload switches are set up here too. ``stream-dapo plan --memory`` estimates what a
recipe needs per GPU.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import shutil
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from torch import Tensor

from stream_dapo.config import Config
from stream_dapo.core.loss import policy_loss, token_entropy, token_logprobs
from stream_dapo.core.sampling import BehaviourGap, behaviour_gap, sampling_logits
from stream_dapo.errors import ConfigError
from stream_dapo.learner import distributed
from stream_dapo.learner.checkpoints import DS_TAG, LEARNER_STATE_FILE
from stream_dapo.learner.lm_head import ChunkedLMHead, install_chunked_head
from stream_dapo.learner.packing import (
    MicroBatch,
    TrainSequence,
    pack_micro_batches,
    packing_efficiency,
    placeholder_micro_batch,
    plan_rows,
    row_tokens,
    sequences_from_groups,
    shared_prompt_attention,
    unpack_to_samples,
)
from stream_dapo.transport.messages import Group
from stream_dapo.weights.base import gather_full_state_dict

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine
    from transformers import PreTrainedModel

__all__ = [
    "AccumulatedStep",
    "Learner",
    "MiniBatch",
    "SHARE_PROMPT_ATTENTION",
    "StepMetrics",
    "check_share_prompt",
    "deepspeed_config",
    "enable_gradient_checkpointing",
    "init_distributed",
]

log = logging.getLogger(__name__)

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
"""Files copied from the source model directory into every HF export (the tokenizer and friends)."""


# --------------------------------------------------------------------------------------------------
# Configuration and distributed start-up
# --------------------------------------------------------------------------------------------------


def deepspeed_config(cfg: Config, world_size: int, *, on_gpu: bool | None = None) -> dict[str, Any]:
    """The DeepSpeed config dict for this learner.

    Batch sizes are nominal (one "sample" per micro-batch): the learner owns accumulation
    (``managed_gradient_accumulation: false``) and its own loss normalisation. No DeepSpeed LR
    scheduler: warm-up is a torch ``LambdaLR`` handed to ``deepspeed.initialize``.

    Raises:
        ConfigError: float16 (needs loss scaling, not supported), or bfloat16 at ZeRO stage 0 (which
            would accumulate gradients in bf16).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    lc = cfg.learner
    on_gpu = torch.cuda.is_available() if on_gpu is None else on_gpu
    dtype = cfg.model.dtype
    problem = cfg.learner_precision_problem()
    if problem is not None:
        raise ConfigError(problem)
    config: dict[str, Any] = {
        "train_batch_size": world_size,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": lc.grad_clip,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": lc.lr,
                "betas": list(lc.betas),
                "eps": 1e-8,
                "weight_decay": lc.weight_decay,
                # torch's AdamW: no compiled op (DeepSpeed's fused/CPU Adam build for a minute on first use).
                "torch_adam": True,
            },
        },
        "zero_optimization": {
            "stage": lc.zero_stage,
            # Overlapped reduction needs streams; with caller-owned accumulation DeepSpeed allows it
            # only where gradients are partitioned (stage >= 2).
            "overlap_comm": bool(on_gpu and lc.zero_stage >= 2),
        },
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": dtype == "bfloat16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if dtype == "bfloat16":
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    for key, device in (("offload_optimizer", lc.offload_optimizer), ("offload_param", lc.offload_param)):
        if device != "none":
            offload: dict[str, Any] = {"device": device, "pin_memory": on_gpu}
            if device == "nvme":
                offload["nvme_path"] = lc.offload_nvme_path
            config["zero_optimization"][key] = offload
    if lc.offload_optimizer != "none" and on_gpu:
        # The optimizer step runs on the CPU: DeepSpeed's vectorised CPU Adam, not torch's.
        config["optimizer"]["params"]["torch_adam"] = False
    return config


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Hugging Face activation checkpointing of every decoder layer, non-reentrant (works with
    ZeRO-3's hooks and with inputs that need no gradient).

    Raises:
        ConfigError: the model class does not support it.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"learner.gradient_checkpointing = true, but {type(model).__name__} does not support activation "
            "checkpointing; set learner.gradient_checkpointing = false"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[operator]


SHARE_PROMPT_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take the custom 4D mask of shared-prompt rows."""


def check_share_prompt(model: torch.nn.Module) -> None:
    """Refuse learner.share_prompt where the model would not honour its mask.

    Raises:
        ConfigError: the attention implementation ignores a custom 4D mask (flash-attention kernels
            take none), or some layers attend through another mask (sliding windows, chunks), which
            the shared-prompt mask would silently replace.
    """
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if impl not in SHARE_PROMPT_ATTENTION:
        raise ConfigError(
            f"learner.share_prompt = true needs attention that takes a 4D mask ({' or '.join(SHARE_PROMPT_ATTENTION)}); "
            f"{type(model).__name__} uses {impl!r}: set learner.share_prompt = false"
        )
    other = sorted({t for t in getattr(config, "layer_types", None) or () if t != "full_attention"})
    if other:
        raise ConfigError(
            f"learner.share_prompt = true replaces the attention mask of every layer, but "
            f"{type(model).__name__} has {', '.join(other)} layers: set learner.share_prompt = false"
        )


def _import_deepspeed() -> Any:
    """Import DeepSpeed with the CPU accelerator where there is no GPU, and without its shm op.

    DeepSpeed picks its accelerator once, at first import; ``DS_ACCELERATOR`` must be set before.
    Its shared-memory all-reduce op only serves inference all-reduce, compiles for ~40 s on first use
    and made one rank of a two-process run abort at exit: mark it incompatible so ``TorchBackend``
    skips building it (``build_shm_op`` consults ``deepspeed.ops.__compatible_ops__``).
    """
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # DeepSpeed's import decorates with torch.jit.script_method, which torch now deprecates.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )
    import deepspeed
    import deepspeed.ops

    ops = vars(deepspeed.ops)
    if "__compatible_ops__" in ops:  # already probed in this process: edit the cached result
        ops["__compatible_ops__"]["deepspeed_shm_comm"] = False
    else:
        # Probing compiles test programs for every op (noisy `ld` errors, ~0.1 s); the only reader of
        # this table on the training path is `build_shm_op`, and torch's AdamW needs no built op.
        ops["__compatible_ops__"] = {"deepspeed_shm_comm": False}
    # ZeRO-2/3 call torch.distributed.reduce_scatter_tensor, which torch deprecates with a warning on
    # every step; it is DeepSpeed's business, not the operator's.
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
    )
    return deepspeed


def init_distributed(timeout_s: float = 600.0) -> tuple[int, int, int]:
    """Join (or create) the default process group; returns (rank, world_size, local_rank).

    Under torchrun or the deepspeed launcher the environment already says who we are. A plain
    process (a test, ``stream-dapo learner`` without a launcher) becomes rank 0 of 1, its rendezvous
    store on port 0 (the kernel's choice at bind: no other rank needs to find it, and no port is picked
    and released first); without these variables DeepSpeed would try MPI discovery and fail. Backend: NCCL on GPUs,
    gloo on the CPU. Idempotent.
    """
    if "WORLD_SIZE" in os.environ and "RANK" not in os.environ:
        raise RuntimeError(
            "WORLD_SIZE is set but RANK is not: start multi-process learners with torchrun or the deepspeed "
            "launcher, which set RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT"
        )
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    deepspeed = _import_deepspeed()
    on_gpu = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if on_gpu:
        torch.cuda.set_device(local_rank)
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(
            dist_backend="nccl" if on_gpu else "gloo",
            auto_mpi_discovery=False,
            timeout=timedelta(seconds=timeout_s),
        )
    return torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank


# --------------------------------------------------------------------------------------------------
# Batches and metrics
# --------------------------------------------------------------------------------------------------


@dataclass
class MiniBatch:
    """One optimizer step's data, as this rank sees it.

    Attributes:
        micro_batches: this rank's share, packed, padded with placeholders to the same count on
            every rank.
        global_tokens: loss tokens (mask sum) over the whole mini-batch and all ranks: the T of the
            token-mean loss.
        global_seqs: samples with at least one loss token, over the mini-batch (seq-mean modes).
        global_real_tokens: tokens the forward passes process (real, unpadded), over all ranks: prompt
            + response per sample, or with learner.share_prompt a group's prompt once and one copy
            of its last token per response (for tokens/s).
        group_ids: ids of the groups, in order.
        reward_mean / accuracy / response_len_mean / truncation_rate: over all samples of the
            mini-batch (response length in tokens; truncated: stopped at algo.max_response_len).
        truncated_in_loss_share: of the mini-batch's truncated samples, the share that enters the
            loss with a nonzero advantage (loss_weight > 0, A != 0); None without truncated samples.
    """

    micro_batches: list[MicroBatch]
    global_tokens: int
    global_seqs: int
    global_real_tokens: int
    group_ids: list[str]
    reward_mean: float
    accuracy: float
    num_samples: int
    response_len_mean: float
    truncation_rate: float
    truncated_in_loss_share: float | None = None

    @property
    def packing_efficiency(self) -> float:
        return packing_efficiency(self.micro_batches)


@dataclass
class StepMetrics:
    """What one optimizer step reports (the same numbers on every rank)."""

    version: int
    """Learner version after the step."""
    loss: float
    pg_loss: float
    entropy: float
    clip_frac_low: float
    clip_frac_high: float
    clip_frac_dual: float
    is_weight_mean: float
    is_weight_max: float
    masked_frac: float
    approx_kl_behaviour: float
    ratio_mean: float
    kl_ref: float | None
    grad_norm: float
    lr: float
    reward_mean: float
    accuracy: float
    response_len_mean: float
    """Mean response length (tokens) of the mini-batch's samples."""
    truncation_rate: float
    """Fraction of the mini-batch's samples that hit algo.max_response_len unfinished."""
    groups: int
    samples: int
    loss_tokens: int
    """Tokens the loss averaged over (T)."""
    tokens: int
    """Tokens the forward passes processed (real, unpadded): prompt + response per sample; with
    learner.share_prompt a group's prompt counts once (plus one copy of its last token per response),
    so tokens/s then measures work done, not samples trained: compare step_seconds across the two."""
    tokens_per_second: float
    step_seconds: float
    packing_efficiency: float
    micro_batches: int
    max_staleness: int
    """Largest (version at this step - behaviour version) over trained tokens; -1 if none."""
    clip_high_prob_mean: float | None = None
    """Mean probability, under the ratio's denominator policy, of the tokens the upper clip bound
    stopped (A > 0, r > 1 + eps_high); None when there were none. DAPO's Fig. 3a finds them below
    0.2: the bound binds on unlikely tokens, which is what Clip-Higher frees."""
    seq_ratio_min: float | None = None
    """Smallest, over the step's samples with a trained token, length-normalised sequence ratio
    exp(mean_t log(pi_theta/pi_old)) (GSPO's s_i; algo.ratio_level = "sequence" clips it); None when
    no token was trained."""
    seq_ratio_max: float | None = None
    """Largest such sequence ratio; with seq_ratio_min, the spread of whole samples off-policy."""
    truncated_in_loss_share: float | None = None
    """Of the mini-batch's truncated samples, the share trained with a nonzero advantage: the
    reward noise DAPO's overlong filtering removes (a sample cut at the cap is scored wrong whatever
    its reasoning was). 0 with algo.overlong_filter on; None when no sample was truncated."""
    staleness_counts: dict[int, int] = field(default_factory=dict)
    """Trained tokens per staleness value."""
    behaviour_gap: dict[str, dict[str, float]] = field(default_factory=dict)
    """log pi_prox - log mu over the step's trained tokens (decoupled mode): ``"all"`` of them and
    the ``"fresh"`` ones, sampled by the weights the proximal pass ran with (staleness 0 there, so
    any gap is numerics or a sampling mismatch); each ``BehaviourGap.summary()``, absent if empty."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["staleness_counts"] = {str(k): v for k, v in sorted(self.staleness_counts.items())}
        return out


# Staleness values above this are pooled in the last slot of the all-reduced histogram.
_MAX_TRACKED_STALENESS = 255
# Loss metrics averaged over contributing tokens (weighted by num_tokens across micro-batches/ranks).
_MEAN_METRICS = (
    "clip_frac_low",
    "clip_frac_high",
    "clip_frac_dual",
    "clip_high_prob_density",
    "is_weight_mean",
    "approx_kl_behaviour",
    "ratio_mean",
    "entropy",
)
# Loss terms already normalised by the global counts: they add up over micro-batches and ranks.
_SUM_METRICS = ("loss", "pg_loss", "kl_ref")


@dataclass
class AccumulatedStep:
    """What `accumulate_gradients` hands to `apply_update`: this rank's sums over its micro-batches
    (loss terms, token-weighted loss metrics, staleness counts), before the cross-rank reduction."""

    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUM_METRICS, 0.0))
    weighted: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_MEAN_METRICS, 0.0))
    contributing: float = 0.0
    given: float = 0.0
    is_weight_max: float = 0.0
    seq_ratio_min: float = math.inf
    seq_ratio_max: float = 0.0
    staleness: Counter[int] = field(default_factory=Counter)
    gap: dict[str, BehaviourGap] = field(
        default_factory=lambda: {"all": BehaviourGap(), "fresh": BehaviourGap()}
    )
    has_kl: bool = False
    started: float = field(default_factory=time.perf_counter)


# --------------------------------------------------------------------------------------------------
# The learner
# --------------------------------------------------------------------------------------------------


EngineFactory = Callable[[torch.nn.Module, Config], Any]
"""(model, cfg) -> a training engine: ``module``, ``device``, ``backward``, ``step``, ``get_lr``,
``get_global_grad_norm``, ``dp_world_size``, called like the model (see `Learner`)."""


class Learner:
    """A DeepSpeed-wrapped causal LM that trains on packed groups with the DAPO loss.

    Construct it on every rank (collective). ``model`` overrides loading ``cfg.model.path`` (tests
    pass a freshly built model); ``source_dir`` is where ``export_hf`` copies tokenizer files from
    (default ``cfg.model.path``). ``make_engine(model, cfg)`` replaces DeepSpeed with another engine
    offering the slice of ``DeepSpeedEngine`` the step uses (``bench/perf/learner.py``'s plain torch one):
    it then runs in this one process, without a process group, at ``zero_stage`` -1.
    """

    def __init__(
        self,
        cfg: Config,
        model: PreTrainedModel | None = None,
        *,
        source_dir: str | os.PathLike[str] | None = None,
        make_engine: EngineFactory | None = None,
    ) -> None:
        self.cfg = cfg
        # An injected engine runs in this one process: no process group, no DeepSpeed.
        self.rank, self.world_size, self.local_rank = init_distributed() if make_engine is None else (0, 1, 0)
        # DeepSpeed's config errors come before the model loads, and it is imported before torch work.
        self._ds_config = deepspeed_config(cfg, self.world_size) if make_engine is None else None
        self._ds = _import_deepspeed() if make_engine is None else None
        self.loss_params = cfg.algo.loss_params
        self.sampling = cfg.generator.sampling_policy()
        """The distribution the generators sample; every log-prob here is of it."""
        if not self.sampling.is_identity:
            log.info("log-probs are of the generators' sampling distribution: %s", self.sampling.describe())
        self.source_dir = Path(source_dir if source_dir is not None else cfg.model.path)
        torch.manual_seed(cfg.learner.seed)
        dtype = getattr(torch, cfg.model.dtype)
        if model is None:
            model = self._load_model(dtype)
        model = model.to(dtype)
        model.config.use_cache = False
        model.train()
        if cfg.learner.share_prompt:
            check_share_prompt(model)
        self._dtype = dtype
        self._attn_implementation = getattr(model.config, "_attn_implementation", None)
        self.logprob_chunk_tokens = cfg.learner.logprob_chunk_tokens
        if self.logprob_chunk_tokens > 0:
            install_chunked_head(model)  # before DeepSpeed wraps the model (ZeRO-3 hooks every module)
        if cfg.learner.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        # The frozen reference exists only for the KL ablation: a full copy of the weights.
        self.ref_model: torch.nn.Module | None = None
        if cfg.algo.kl_coef > 0:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.pad_id = int(model.config.pad_token_id if model.config.pad_token_id is not None else 0)
        self.tie_word_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
        self._stage0_grad_norm: float | None = None
        self.engine: DeepSpeedEngine = (make_engine or self._deepspeed_engine)(model, cfg)
        self.device = torch.device(self.engine.device)
        if self.ref_model is not None:
            self.ref_model.to(self.device)
        self.zero_stage = cfg.learner.zero_stage if make_engine is None else -1
        self.version = 0

    def _deepspeed_engine(self, model: torch.nn.Module, cfg: Config) -> DeepSpeedEngine:
        """The default engine: DeepSpeed ZeRO at learner.zero_stage, with the warm-up LR schedule."""
        warmup = cfg.learner.warmup_steps

        def schedule(optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
            # Factor for the step about to be taken: 1/w, 2/w, ..., 1, then constant.
            return torch.optim.lr_scheduler.LambdaLR(
                optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
            )

        assert self._ds is not None, "DeepSpeed is imported when no engine is injected"
        engine, _, _, _ = self._ds.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=self._ds_config,
            lr_scheduler=schedule,
            dist_init_required=False,
        )
        self._capture_stage0_grad_norm(engine)
        return engine

    # ------------------------------------------------------------------ set-up helpers

    def _load_model(self, dtype: torch.dtype) -> PreTrainedModel:
        from transformers import AutoModelForCausalLM

        path = Path(self.cfg.model.path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path {str(path)!r} has no config.json; build the tiny model with `stream-dapo "
                "init-model` / `stream-dapo warmup`, or point model.path at a Hugging Face model directory"
            )
        return AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)

    def _capture_stage0_grad_norm(self, engine: DeepSpeedEngine) -> None:
        """Record the pre-clip gradient norm where DeepSpeed does not keep it.

        Without ZeRO (fp32, stage 0) the engine clips with ``clip_grad_norm_`` and drops the norm it
        returns; ZeRO optimizers store it as ``_global_grad_norm``. Wrap the engine's clip call on
        this instance to keep the value (the gradients are already all-reduced at that point).
        """
        from deepspeed.runtime.utils import clip_grad_norm_

        def clip_and_record() -> None:
            norm = clip_grad_norm_(
                parameters=engine.module.parameters(), max_norm=engine.gradient_clipping(), mpu=engine.mpu
            )
            self._stage0_grad_norm = float(norm)

        engine.clip_fp32_gradients = clip_and_record

    # ------------------------------------------------------------------ collectives

    def _all_reduce(self, values: Sequence[float], op: Literal["sum", "max"]) -> list[float]:
        return distributed.all_reduce(values, op, device=self.device, world_size=self.world_size)

    def barrier(self) -> None:
        distributed.barrier(self.world_size)

    # ------------------------------------------------------------------ data

    def shard(self, sequences: Sequence[TrainSequence]) -> list[int]:
        """Indices of the sequences this rank trains on: forward rows (`plan_rows`: one per sample,
        or a group's shared-prompt rows) longest first, each to the rank with the fewest tokens so
        far (deterministic, so every rank computes the same split)."""
        if self.world_size == 1:
            return list(range(len(sequences)))
        lc = self.cfg.learner
        rows = plan_rows(sequences, lc.micro_batch_tokens, lc.share_prompt)
        lengths = [row_tokens([sequences[i] for i in row]) for row in rows]
        loads = [0] * self.world_size
        mine: list[int] = []
        for k in sorted(range(len(rows)), key=lambda k: (-lengths[k], rows[k][0])):
            r = min(range(self.world_size), key=lambda r: (loads[r], r))
            loads[r] += lengths[k]
            if r == self.rank:
                mine.extend(rows[k])
        return sorted(mine)

    def prepare(self, groups: Sequence[Group]) -> MiniBatch:
        """Pack this rank's share of a mini-batch and count its tokens over all ranks (collective)."""
        if not groups:
            raise ValueError("a mini-batch needs at least one group")
        seqs = sequences_from_groups(groups)
        local = [seqs[i] for i in self.shard(seqs)]
        lc = self.cfg.learner
        micro = (
            pack_micro_batches(local, lc.micro_batch_tokens, self.pad_id, share_prompt=lc.share_prompt)
            if local
            else []
        )
        local_tokens = sum(float(mb.mask.sum()) for mb in micro)
        local_seqs = sum(float((mb.mask.sum(dim=-1) > 0).sum()) for mb in micro)
        local_real = sum(mb.real_tokens for mb in micro)
        tokens, nseqs, real = self._all_reduce([local_tokens, local_seqs, local_real], "sum")
        (count,) = self._all_reduce([len(micro)], "max")
        micro.extend(placeholder_micro_batch(self.pad_id) for _ in range(int(count) - len(micro)))
        samples = [s for g in groups for s in g.samples]
        truncated = [s for s in samples if s.truncated]
        return MiniBatch(
            micro_batches=micro,
            global_tokens=int(round(tokens)),
            global_seqs=int(round(nseqs)),
            global_real_tokens=int(round(real)),
            group_ids=[g.group_id for g in groups],
            reward_mean=float(np.mean([s.reward for s in samples])),
            accuracy=float(np.mean([s.correct for s in samples])),
            num_samples=len(samples),
            response_len_mean=float(np.mean([len(s.tokens) for s in samples])),
            truncation_rate=float(np.mean([s.truncated for s in samples])),
            truncated_in_loss_share=(
                float(np.mean([s.loss_weight > 0 and s.advantage != 0 for s in truncated]))
                if truncated
                else None
            ),
        )

    # ------------------------------------------------------------------ forward passes

    def _forward(self, model: Any, mb: MicroBatch) -> Any:
        """The model's forward over the micro-batch's rows (its ``logits_to_keep`` positions).

        Per-sample rows get no attention mask: rows are right-padded and attention is causal, so
        real tokens never see padding, and padding rows stay finite (a fully masked query row would
        not). Shared-prompt rows get their 4D mask (`shared_prompt_attention`: boolean for sdpa,
        additive for eager) and their position ids.
        """
        kwargs: dict[str, Any] = {}
        if mb.segments is not None:
            allowed = shared_prompt_attention(mb.segments)
            if self._attn_implementation == "eager":  # eager adds the mask to the scores
                additive = torch.zeros(allowed.shape, dtype=self._dtype, device=allowed.device)
                allowed = additive.masked_fill_(~allowed, torch.finfo(self._dtype).min)
            kwargs = {"attention_mask": allowed, "position_ids": mb.position_ids}
        return model(input_ids=mb.input_ids, logits_to_keep=mb.logits_to_keep, use_cache=False, **kwargs)

    def _logits(self, model: Any, mb: MicroBatch) -> Tensor:
        """[R, W', V] logits of the micro-batch's forward window (the full-logits path), of the
        sampling distribution: divided by the generators' temperature, truncated tokens at -inf
        (``sampling_logits``; the raw logits themselves at temperature 1 without truncation)."""
        out = self._forward(model, mb)
        return sampling_logits(out.logits[:, :-1], self.sampling)

    def _token_stats(self, model: Any, mb: MicroBatch, *, entropy_grad: bool) -> tuple[Tensor, Tensor]:
        """[B, W] log-probs of the targets and [B, W] entropies, in the micro-batch's per-sample view.

        Chunked path (learner.logprob_chunk_tokens > 0): the model's `ChunkedLMHead` scores the
        targets chunk by chunk inside the forward, so no [R, W', V] tensor exists. Full path: logits,
        then `token_logprobs` / `token_entropy`. The entropy carries a gradient only if
        ``entropy_grad`` (the entropy bonus); otherwise it is a metric. Shared-prompt rows are
        gathered into the per-sample view (`unpack_to_samples`; 0 off the response tokens).
        """
        logp, ent = self._window_stats(model, mb, entropy_grad=entropy_grad)
        if mb.unpack is not None:
            logp, ent = unpack_to_samples(logp, mb.unpack), unpack_to_samples(ent, mb.unpack)
        return logp, ent

    def _window_stats(self, model: Any, mb: MicroBatch, *, entropy_grad: bool) -> tuple[Tensor, Tensor]:
        """`_token_stats` over the forward window [R, W'], before any unpacking."""
        chunk = self.logprob_chunk_tokens
        if chunk == 0:
            logits = self._logits(model, mb)
            logp = token_logprobs(logits, mb.targets)
            if entropy_grad:
                return logp, token_entropy(logits)
            with torch.no_grad():
                return logp, token_entropy(logits.detach())
        head = getattr(model, "module", model).get_output_embeddings()
        assert isinstance(head, ChunkedLMHead), "the chunked head is installed at construction"
        # The head sees logits_to_keep = W' + 1 positions; the last one predicts nothing (target 0).
        targets = torch.nn.functional.pad(mb.targets.long(), (0, 1))
        with head.scoring(targets, chunk, self.sampling):
            out = self._forward(model, mb)
        stats = out.logits[:, :-1]
        logp, ent = stats[..., 0], stats[..., 1]
        return logp, ent if entropy_grad else ent.detach()

    @torch.no_grad()
    def compute_logprobs(self, micro_batches: Sequence[MicroBatch]) -> list[Tensor]:
        """Per-token log-probs [B, W] of each micro-batch under the current weights, no gradient.

        Collective under ZeRO-3 (every rank must pass the same number of micro-batches, which
        `prepare` guarantees). Used for the proximal log-probs of the decoupled loss.
        """
        return [logp for logp, _ in self.compute_token_stats(micro_batches)]

    @torch.no_grad()
    def compute_token_stats(self, micro_batches: Sequence[MicroBatch]) -> list[tuple[Tensor, Tensor]]:
        """(log-probs, entropies), each [B, W] in the per-sample view, of each micro-batch under the
        current weights, no gradient (collective under ZeRO-3, as `compute_logprobs`)."""
        out = []
        for mb in micro_batches:
            mb = mb.to(self.device)
            out.append(self._token_stats(self.engine, mb, entropy_grad=False))
        return out

    @torch.no_grad()
    def _ref_logprobs(self, mb: MicroBatch) -> Tensor:
        assert self.ref_model is not None
        return self._token_stats(self.ref_model, mb, entropy_grad=False)[0]

    # ------------------------------------------------------------------ the step

    def train_step(
        self,
        batch: MiniBatch | Sequence[Group],
        prox: Sequence[Tensor] | None = None,
        prox_version: int | None = None,
    ) -> StepMetrics:
        """One optimizer step on a mini-batch (collective): accumulate gradients, then update.

        ``prox``: proximal log-probs aligned with ``batch.micro_batches`` (from `compute_logprobs`
        before the first step of the rollout batch). In decoupled mode ``None`` means "the current
        weights", which is right only for the first mini-batch of a rollout batch: they are then
        the training forward's own log-probs, detached, so that mini-batch costs no extra pass.
        ``prox_version``: the version the proximal log-probs are of (default: the current one), for
        the fresh-token gap.
        """
        if not isinstance(batch, MiniBatch):
            batch = self.prepare(batch)
        acc = self.accumulate_gradients(batch, prox, prox_version)
        return self.apply_update(batch, acc)

    def accumulate_gradients(
        self, batch: MiniBatch, prox: Sequence[Tensor] | None = None, prox_version: int | None = None
    ) -> AccumulatedStep:
        """Forward/backward of every micro-batch; gradients add up in the engine (collective)."""
        acc = AccumulatedStep()
        prox_version = self.version if prox_version is None else prox_version
        if prox is not None and len(prox) != len(batch.micro_batches):
            raise ValueError(
                f"prox has {len(prox)} entries for {len(batch.micro_batches)} micro-batches; compute it with "
                "compute_logprobs(batch.micro_batches) on the same MiniBatch"
            )
        if batch.global_tokens == 0:
            log.warning(
                "mini-batch of %d groups has no loss tokens (every sample masked); the step applies a zero "
                "gradient",
                len(batch.group_ids),
            )
        # DeepSpeed averages gradients over data-parallel ranks; the loss is already divided by the
        # global token count, so scale by the world size to turn the average back into the sum.
        dp_scale = float(self.engine.dp_world_size)
        for k, mb in enumerate(batch.micro_batches):
            mb = mb.to(self.device)
            p = None if prox is None else prox[k].to(self.device)
            if p is not None and p.shape != mb.mask.shape:
                raise ValueError(
                    f"prox[{k}] has shape {tuple(p.shape)}, micro-batch {k} needs {tuple(mb.mask.shape)}"
                )
            loss, metrics, p = self._micro_batch_loss(mb, p, batch)
            self.engine.backward(loss * dp_scale, scale_wrt_gas=False)
            self._record(acc, loss, metrics, mb)
            if p is not None:
                trained = mb.mask > 0
                acc.gap["all"].add(behaviour_gap(p, mb.behaviour_logprobs, trained))
                acc.gap["fresh"].add(
                    behaviour_gap(p, mb.behaviour_logprobs, trained & (mb.versions == prox_version))
                )
        return acc

    def _micro_batch_loss(
        self, mb: MicroBatch, prox: Tensor | None, batch: MiniBatch
    ) -> tuple[Tensor, dict, Tensor | None]:
        """The micro-batch's loss and metrics, and the proximal log-probs it used."""
        logp, entropy = self._token_stats(self.engine, mb, entropy_grad=self.loss_params.entropy_coef > 0)
        if prox is None and self.loss_params.ratio_mode == "decoupled":
            # The weights have not moved since this rollout batch began: the proximal policy is the
            # current one, whose log-probs this forward just computed (the same values a separate
            # no-grad pass would give, at no extra cost).
            prox = logp.detach()
        ref = self._ref_logprobs(mb) if self.ref_model is not None else None
        loss, metrics = policy_loss(
            logp,
            mb.behaviour_logprobs,
            mb.advantages,
            mb.mask,
            self.loss_params,
            prox_logprobs=prox,
            ref_logprobs=ref,
            entropy=entropy,
            global_tokens=max(batch.global_tokens, 1),
            global_seqs=max(batch.global_seqs, 1),
        )
        return loss, metrics, prox

    def _record(
        self, acc: AccumulatedStep, loss: Tensor, metrics: Mapping[str, float], mb: MicroBatch
    ) -> None:
        acc.sums["loss"] += float(loss.detach())
        acc.sums["pg_loss"] += metrics["pg_loss"]
        if "kl_ref" in metrics:
            acc.sums["kl_ref"] += metrics["kl_ref"]
            acc.has_kl = True
        n = metrics["num_tokens"]
        acc.contributing += n
        for name in _MEAN_METRICS:
            acc.weighted[name] += metrics.get(name, 0.0) * n
        acc.given += float(mb.mask.sum())
        if n > 0:
            acc.is_weight_max = max(acc.is_weight_max, metrics["is_weight_max"])
            acc.seq_ratio_min = min(acc.seq_ratio_min, metrics["seq_ratio_min"])
            acc.seq_ratio_max = max(acc.seq_ratio_max, metrics["seq_ratio_max"])
        trained = mb.mask > 0
        if bool(trained.any()):
            stale = (self.version - mb.versions[trained]).cpu().numpy()
            values, counts = np.unique(stale, return_counts=True)
            acc.staleness.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))

    def apply_update(self, batch: MiniBatch, acc: AccumulatedStep) -> StepMetrics:
        """Clip, step the optimizer and the LR schedule, version += 1; reduce metrics (collective)."""
        lr = float(self.engine.get_lr()[0])
        self._stage0_grad_norm = None
        self.engine.step()
        self.version += 1
        grad_norm = self.engine.get_global_grad_norm()
        if grad_norm is None:
            grad_norm = self._stage0_grad_norm
        return self._reduce_metrics(batch, acc, lr, float("nan") if grad_norm is None else float(grad_norm))

    def _reduce_metrics(
        self, batch: MiniBatch, acc: AccumulatedStep, lr: float, grad_norm: float
    ) -> StepMetrics:
        hist = np.zeros(_MAX_TRACKED_STALENESS + 2)  # slot 0: negative (generator ahead after a rollback)
        for value, count in acc.staleness.items():
            hist[min(max(value, -1), _MAX_TRACKED_STALENESS) + 1] += count
        gap_sums = [x for gap in acc.gap.values() for x in gap.sums()]
        sums = self._all_reduce(
            [
                *acc.sums.values(),
                *acc.weighted.values(),
                acc.contributing,
                acc.given,
                float(acc.has_kl),
                *hist,
                *gap_sums,
            ],
            "sum",
        )
        maxes = self._all_reduce(
            [
                acc.is_weight_max,
                max(acc.staleness, default=-(2**31)),
                *(gap.max_abs for gap in acc.gap.values()),
                acc.seq_ratio_max,
                -acc.seq_ratio_min,  # the max of the negated values is the negated min
            ],
            "max",
        )
        width = len(gap_sums) // len(acc.gap)
        gap_reduced = sums[len(sums) - len(gap_sums) :]
        sums = sums[: len(sums) - len(gap_sums)]
        gaps = {
            name: BehaviourGap.from_reduced(gap_reduced[i * width : (i + 1) * width], maxes[2 + i])
            for i, name in enumerate(acc.gap)
        }
        n_sum = len(_SUM_METRICS)
        reduced = dict(zip(_SUM_METRICS, sums[:n_sum], strict=True))
        weighted = dict(zip(_MEAN_METRICS, sums[n_sum : n_sum + len(_MEAN_METRICS)], strict=True))
        contributing, given, has_kl = sums[n_sum + len(_MEAN_METRICS) : n_sum + len(_MEAN_METRICS) + 3]
        counts = sums[n_sum + len(_MEAN_METRICS) + 3 :]
        denom = max(contributing, 1.0)
        seq_ratio_max, neg_seq_ratio_min = maxes[2 + len(acc.gap) :]
        seconds = time.perf_counter() - acc.started
        max_stale = int(maxes[1])
        means = {name: weighted[name] / denom for name in _MEAN_METRICS}
        density = means.pop("clip_high_prob_density")
        return StepMetrics(
            version=self.version,
            loss=reduced["loss"],
            pg_loss=reduced["pg_loss"],
            kl_ref=reduced["kl_ref"] if has_kl else None,
            **means,
            clip_high_prob_mean=density / means["clip_frac_high"] if means["clip_frac_high"] > 0 else None,
            is_weight_max=maxes[0],
            seq_ratio_min=-neg_seq_ratio_min if contributing > 0 else None,
            seq_ratio_max=seq_ratio_max if contributing > 0 else None,
            masked_frac=(given - contributing) / given if given else 0.0,
            grad_norm=grad_norm,
            lr=lr,
            reward_mean=batch.reward_mean,
            accuracy=batch.accuracy,
            response_len_mean=batch.response_len_mean,
            truncation_rate=batch.truncation_rate,
            truncated_in_loss_share=batch.truncated_in_loss_share,
            groups=len(batch.group_ids),
            samples=batch.num_samples,
            loss_tokens=batch.global_tokens,
            tokens=batch.global_real_tokens,
            tokens_per_second=batch.global_real_tokens / seconds if seconds > 0 else 0.0,
            step_seconds=seconds,
            packing_efficiency=batch.packing_efficiency,
            micro_batches=len(batch.micro_batches),
            max_staleness=max_stale if max_stale > -(2**31) else -1,
            staleness_counts={i - 1: int(c) for i, c in enumerate(counts) if c},
            behaviour_gap={name: summary for name, gap in gaps.items() if (summary := gap.summary())},
        )

    # ------------------------------------------------------------------ weights

    def gather_state_dict(self) -> dict[str, Tensor] | None:
        """Full weights on rank 0 (CPU tensors in the model dtype, a tied output embedding once),
        None elsewhere. Collective under ZeRO-3."""
        return gather_full_state_dict(
            self.engine.module,
            rank=self.rank,
            zero_stage=self.zero_stage,
            tie_word_embeddings=self.tie_word_embeddings,
        )

    def export_hf(self, directory: str | os.PathLike[str]) -> None:
        """save_pretrained (safetensors) + tokenizer files into ``directory``, loadable by transformers
        and vLLM. Collective: gathers the weights, rank 0 writes."""
        self.write_hf(directory, self.gather_state_dict())

    def write_hf(self, directory: str | os.PathLike[str], state_dict: Mapping[str, Tensor] | None) -> None:
        """`export_hf` with weights already gathered: every rank calls it with what its
        `gather_state_dict` returned (None except on rank 0); ends with a barrier."""
        if self.rank == 0:
            if state_dict is None:
                raise ValueError("rank 0 needs the gathered state dict; pass gather_state_dict()'s result")
            out = Path(directory)
            out.mkdir(parents=True, exist_ok=True)
            self.engine.module.save_pretrained(str(out), state_dict=dict(state_dict), safe_serialization=True)
            for name in TOKENIZER_FILES:
                src = self.source_dir / name
                if src.is_file() and not (out / name).exists():
                    shutil.copy2(src, out / name)
        self.barrier()

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(
        self, directory: str | os.PathLike[str], extra_state: Mapping[str, Any] | None = None
    ) -> None:
        """DeepSpeed state (weights, optimizer, LR schedule) + the learner's state (collective).

        ``extra_state`` (JSON-serialisable) is stored next to the version, e.g. the position of the
        trained-group log; `load_checkpoint` returns it.
        """
        state = {"version": self.version, **(extra_state or {})}
        self.engine.save_checkpoint(str(directory), tag=DS_TAG, client_state={"learner": state})
        if self.rank == 0:
            (Path(directory) / LEARNER_STATE_FILE).write_text(json.dumps(state, indent=1) + "\n")
        self.barrier()

    def apply_optimizer_settings(self, lr: float, betas: tuple[float, float], weight_decay: float) -> None:
        """Make the configured lr, betas and weight decay those of the restored optimizer: a checkpoint
        restores its own, which would otherwise silently win over the config. The warm-up schedule
        continues where it was, from the new base lr."""
        sched = getattr(self.engine, "lr_scheduler", None)
        factor = 1.0
        if sched is not None and hasattr(sched, "base_lrs"):
            sched.base_lrs = [lr for _ in sched.base_lrs]
            factor = sched.lr_lambdas[0](sched.last_epoch)
        groups = list(self.engine.optimizer.param_groups)
        if sched is not None and getattr(sched, "optimizer", None) is not None:
            groups += [g for g in sched.optimizer.param_groups if all(g is not h for h in groups)]
        for group in groups:
            group["initial_lr"] = lr
            group["lr"] = lr * factor
            group["betas"] = tuple(betas)
            group["weight_decay"] = weight_decay

    def load_checkpoint(self, directory: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore what `save_checkpoint` wrote; returns the learner state (collective)."""
        path = Path(directory)
        if not (path / DS_TAG).is_dir():
            raise FileNotFoundError(
                f"{path} is not a learner checkpoint (no {DS_TAG}/ inside); point at a "
                "checkpoints/step_XXXXXX directory, or delete a broken 'latest' file to start fresh"
            )
        load_path, client_state = self.engine.load_checkpoint(str(path), tag=DS_TAG)
        if load_path is None or client_state is None or "learner" not in client_state:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {path}")
        state = dict(client_state["learner"])
        self.version = int(state["version"])
        return state
