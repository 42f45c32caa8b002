"""Learner throughput (DeepSpeed ZeRO 0/2/3 vs plain torch) and packing efficiency.

    .venv/bin/python -m bench.perf.learner [--quick]

Throughput. Four learners train the tiny Qwen2 model side by side in one process (DeepSpeed's CPU
accelerator, gloo, world size 1): plain torch, and DeepSpeed at ZeRO stages 0, 2 and 3. All run
the project's `Learner.train_step` on the same mini-batch (tiny-cpu's shape: 8 groups x G=8,
packed under the same token budget, decoupled DAPO loss with its no-grad proximal forward), from
the same initial weights, with the same optimizer (torch AdamW, the config's lr/betas/weight decay,
gradient clipping). "Plain torch" swaps only the engine: `loss.backward()`, `clip_grad_norm_`,
`AdamW.step()` instead of DeepSpeed's `backward`/`step`, so the ratio is what DeepSpeed costs or
saves on this machine. Steps interleave (one step of each learner per repeat, order rotated);
the figure is trained (real, unpadded) tokens per second of step time.

Packing. The project's packer (length-sorted greedy, rows x longest row <= micro_batch_tokens)
against naive padding, as real tokens / processed tokens, on two length distributions:
the tiny task's (prompts under the chat template, responses drawn from the worked solutions) and
a long chain-of-thought one modelled for the paper's Qwen2.5-32B recipe (log-normal prompt and
response lengths, responses truncated at L_max; parameters in `LONG_COT`).
"""

from __future__ import annotations

import json
import math
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]

import torch  # noqa: E402

from bench.report import bench_parser, interleave, paired_ratio, summary  # noqa: E402
from bench.workload import (  # noqa: E402
    init_model_dir,
    rollout_groups,
    task_prompts,
    task_responses,
    tiny_config,
)
from stream_dapo.config import Config, load_config  # noqa: E402
from stream_dapo.learner.packing import (  # noqa: E402
    TrainSequence,
    pack_micro_batches,
    packing_efficiency,
    sequences_from_groups,
)
from stream_dapo.learner.trainer import Learner  # noqa: E402

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["LONG_COT", "PlainTorchEngine", "torch_learner", "measure_learner", "measure_packing"]

PAPER_CONFIG = REPO / "configs" / "dapo-qwen2.5-32b.toml"
LONG_COT = {
    "prompt_median": 180,
    "prompt_sigma": 0.5,
    "response_median": 3500,
    "response_sigma": 0.9,
}
"""Modelled long-CoT lengths (log-normal medians and sigmas, in tokens); responses are cut at the
recipe's max_response_len, prompts at its max_prompt_len. A model, not a measurement."""


# --------------------------------------------------------------------------------------------------
# Plain torch behind the Learner's step
# --------------------------------------------------------------------------------------------------


class PlainTorchEngine:
    """The slice of ``DeepSpeedEngine`` that ``Learner``'s step uses, on plain torch.

    AdamW with the config's settings (DeepSpeed's ``torch_adam`` builds the same optimizer), the same
    constant-after-warm-up LR schedule, and ``clip_grad_norm_`` before every step.
    """

    def __init__(self, model: torch.nn.Module, cfg: Config) -> None:
        lc = cfg.learner
        self.module = model
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=lc.lr,
            betas=(lc.betas[0], lc.betas[1]),
            eps=1e-8,
            weight_decay=lc.weight_decay,
        )
        warmup = lc.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
        )
        self.grad_clip = lc.grad_clip
        self.dp_world_size = 1
        self.device = "cpu"
        self._grad_norm: float | None = None

    def __call__(self, **kwargs: Any) -> Any:
        return self.module(**kwargs)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        loss.backward()

    def step(self) -> None:
        norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip or float("inf"))
        self._grad_norm = float(norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_global_grad_norm(self) -> float | None:
        return self._grad_norm


def torch_learner(cfg: Config, model: PreTrainedModel) -> Learner:
    """`Learner` with `PlainTorchEngine` in place of DeepSpeed (one process, no process group):
    packing, the loss, metrics and the step are the project's code."""
    return Learner(cfg, model, make_engine=PlainTorchEngine)


# --------------------------------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------------------------------

VARIANTS = ("torch", "zero0", "zero2", "zero3")


def _make_learner(name: str, cfg: Config, model_dir: Path) -> Learner:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if name == "torch":
        return torch_learner(cfg, model)
    stage_cfg = cfg.model_copy(deep=True)
    stage_cfg.learner.zero_stage = int(name.removeprefix("zero"))
    return Learner(stage_cfg, model, source_dir=model_dir)


def measure_learner(quick: bool = False) -> dict[str, Any]:
    """Trained tokens/s of plain torch and ZeRO 0/2/3 on one mini-batch, interleaved; ratios vs torch."""
    steps, warmup = (2, 1) if quick else (20, 3)
    cfg = tiny_config()
    model_dir = init_model_dir(cfg)
    cfg = tiny_config([f"model.path={model_dir}"])
    items = task_prompts(cfg, model_dir)  # the eval split: 200 prompts, same generator as train
    responses = task_responses(items, model_dir)
    groups_per_version = cfg.admission.groups_per_version
    groups = rollout_groups(
        items, responses, num_groups=groups_per_version, group_size=cfg.algo.group_size, seed=0
    )

    started = time.perf_counter()
    learners = {name: _make_learner(name, cfg, model_dir) for name in VARIANTS}
    setup_seconds = time.perf_counter() - started
    batch = learners["torch"].prepare(groups)
    tokens = batch.global_real_tokens
    losses: dict[str, list[float]] = {name: [] for name in VARIANTS}

    def one_step(name: str) -> float:
        learner = learners[name]
        start = time.perf_counter()
        metrics = learner.train_step(groups)
        seconds = time.perf_counter() - start
        if not math.isfinite(metrics.loss):
            raise RuntimeError(f"{name}: non-finite loss {metrics.loss}")
        losses[name].append(metrics.loss)
        return tokens / seconds

    rates = interleave({name: partial(one_step, name) for name in VARIANTS}, steps, warmup=warmup)
    # Same data, same init, same optimizer: the variants should follow the same trajectory.
    first_loss = {name: values[0] for name, values in losses.items()}
    return {
        "model_dir": str(model_dir),
        "params": sum(p.numel() for p in learners["torch"].engine.module.parameters()),
        "torch_threads": torch.get_num_threads(),
        "mini_batch": {
            "groups": len(groups),
            "samples": batch.num_samples,
            "real_tokens": tokens,
            "loss_tokens": batch.global_tokens,
            "micro_batches": len(batch.micro_batches),
            "micro_batch_tokens": cfg.learner.micro_batch_tokens,
            "packing_efficiency": batch.packing_efficiency,
        },
        "steps": steps,
        "warmup_steps": warmup,
        "setup_seconds": setup_seconds,
        "tokens_per_second": {name: summary(values) for name, values in rates.items()},
        "ratio_vs_torch": {
            name: paired_ratio(rates[name], rates["torch"]) for name in VARIANTS if name != "torch"
        },
        "first_loss": first_loss,
    }


# --------------------------------------------------------------------------------------------------
# Packing efficiency
# --------------------------------------------------------------------------------------------------


def padding_efficiencies(
    sequences: list[TrainSequence], token_budget: int, max_len: int
) -> dict[str, float | int]:
    """Real / processed tokens of one mini-batch under the packer and two naive paddings.

    - packer: `pack_micro_batches` (length-sorted, budget on rows x longest row);
    - pad to longest: every row padded to the longest sequence of the mini-batch;
    - pad to max length: every row padded to max_prompt_len + max_response_len.
    """
    real = sum(len(s) for s in sequences)
    micro = pack_micro_batches(sequences, token_budget)
    return {
        "packer": packing_efficiency(micro),
        "pad_to_longest": real / (len(sequences) * max(len(s) for s in sequences)),
        "pad_to_max_length": real / (len(sequences) * max_len),
        "micro_batches": len(micro),
        "real_tokens": real,
    }


def long_cot_sequences(cfg: Config, num: int, rng: np.random.Generator) -> list[TrainSequence]:
    """``num`` sequences with `LONG_COT` lengths under ``cfg``'s length limits (random token ids)."""
    p = LONG_COT
    prompt_len = np.clip(
        rng.lognormal(math.log(p["prompt_median"]), p["prompt_sigma"], num), 8, cfg.model.max_prompt_len
    ).astype(int)
    response_len = np.clip(
        rng.lognormal(math.log(p["response_median"]), p["response_sigma"], num), 1, cfg.algo.max_response_len
    ).astype(int)
    out = []
    for pl, rl in zip(prompt_len, response_len, strict=True):
        out.append(
            TrainSequence(
                prompt=np.ones(int(pl), dtype=np.int32),
                response=np.ones(int(rl), dtype=np.int32),
                behaviour_logprobs=np.zeros(int(rl), dtype=np.float32),
                versions=np.zeros(int(rl), dtype=np.int32),
                advantage=1.0,
            )
        )
    return out


def _packing_case(draws: list[dict[str, float | int]], cfg: Config, source: str) -> dict[str, Any]:
    keys = ("packer", "pad_to_longest", "pad_to_max_length")
    out: dict[str, Any] = {
        "source": source,
        "mini_batch_samples": cfg.learner.mini_batch_samples,
        "micro_batch_tokens": cfg.learner.micro_batch_tokens,
        "max_len": cfg.model.max_prompt_len + cfg.algo.max_response_len,
        "draws": len(draws),
        "efficiency": {k: summary([float(d[k]) for d in draws]) for k in keys},
        "micro_batches": summary([float(d["micro_batches"]) for d in draws]),
        "mean_sequence_tokens": summary(
            [float(d["real_tokens"]) / cfg.learner.mini_batch_samples for d in draws]
        ),
    }
    out["packer_vs_pad_to_max_length"] = paired_ratio(
        [float(d["packer"]) for d in draws], [float(d["pad_to_max_length"]) for d in draws]
    )
    out["packer_vs_pad_to_longest"] = paired_ratio(
        [float(d["packer"]) for d in draws], [float(d["pad_to_longest"]) for d in draws]
    )
    return out


def measure_packing(quick: bool = False) -> dict[str, Any]:
    """Packing efficiency over ``draws`` random mini-batches of each distribution (median)."""
    draws = 3 if quick else 50
    cfg = tiny_config()
    model_dir = init_model_dir(cfg)
    items = task_prompts(cfg, model_dir)  # the eval split: 200 prompts, same generator as train
    responses = task_responses(items, model_dir)
    group_size = cfg.algo.group_size
    tiny = []
    for d in range(draws):
        groups = rollout_groups(
            items,
            responses,
            num_groups=cfg.admission.groups_per_version,
            group_size=group_size,
            seed=d,
        )
        tiny.append(
            padding_efficiencies(
                sequences_from_groups(groups),
                cfg.learner.micro_batch_tokens,
                cfg.model.max_prompt_len + cfg.algo.max_response_len,
            )
        )
    paper = load_config([PAPER_CONFIG], environ={})
    rng = np.random.default_rng(0)
    long_cot = [
        padding_efficiencies(
            long_cot_sequences(paper, paper.learner.mini_batch_samples, rng),
            paper.learner.micro_batch_tokens,
            paper.model.max_prompt_len + paper.algo.max_response_len,
        )
        for _ in range(draws)
    ]
    return {
        "tiny": _packing_case(tiny, cfg, "tiny-cpu: task prompts + worked-solution lengths"),
        "long_cot": _packing_case(
            long_cot, paper, f"dapo-qwen2.5-32b limits, modelled log-normal lengths {LONG_COT}"
        ),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--only", choices=("learner", "packing"), default=None)
    args = parser.parse_args()
    out = {}
    if args.only in (None, "packing"):
        out["packing"] = measure_packing(args.quick)
    if args.only in (None, "learner"):
        out["learner"] = measure_learner(args.quick)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
