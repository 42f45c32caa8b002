"""μ against π_prox with the same weights: float32 vs bfloat16, sampling settings, and what the
importance-weight correction keeps.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.perf.logprob_precision [--prompts 32]
        [--seeds 0 1] [--json docs/results/logprob_precision.json]

The warm tiny model (configs/tiny-cpu.toml's) samples ``--prompts`` eval prompts x group_size with
the project's `RolloutEngine` (vLLM's CPU build, ``logprobs_mode="processed_logprobs"``), once with
the weights in float32 and once in bfloat16, at two sampling settings: the recipe's (temperature 1,
top-p 1) and a truncated one (temperature 0.7, top-p 0.9, top-k 20). The project's `Learner`
(plain torch engine, the same weights in float32 or bfloat16, its sampling policy set to the
generator's) recomputes every sampled token's proximal log-prob with `compute_logprobs`. For each
(generator dtype, learner dtype, setting): with d = log π_prox − log μ over the response tokens,

- mean and max |d|, the share of tokens whose ratio π_prox/μ leaves [0.9, 1.1] and [0.5, 2], the
  largest and smallest ratio;
- the same with the learner at temperature 1 without truncation on the truncated setting's samples
  (what the learner computed before μ and π were defined alike; what a learner whose generator.*
  settings differ from the generators' computes);
- what the loss's behaviour weight does with these ratios (``stream_dapo.core.loss.IS_MODES``):
  ``is_mode = "mask"`` keeps the tokens inside [1/C, C], ``"truncate"`` keeps every token and
  caps the weight at C; for C in 1.2, 1.5, 2 (the default) and 5, the share kept / capped and the
  mean weight.

Seeds: ``generator.seed`` = each of ``--seeds``; the engines of a seed start float32 then bfloat16,
the next seed in the other order. Figures are per seed (their spread is the sampling noise: other
responses, other tokens).

What it does not show: a GPU (its bf16 kernels, e.g. FlashAttention, differ from the CPU's; this
CPU has AVX512-BF16), a large vocabulary or long responses (the tiny model: 327 tokens, ~20-60
token answers), or the effect on training (no run here compares the correction modes' accuracy).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from bench.workload import task_prompts, tiny_config, warm_model_dir  # noqa: E402
from stream_dapo.core.sampling import BAND_TIGHT, BAND_WIDE, SamplingPolicy  # noqa: E402
from stream_dapo.transport.messages import Group, Sample  # noqa: E402

if TYPE_CHECKING:
    from stream_dapo.data.dataset import PromptItem
    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.generator.rollout import FinishedGroup
    from stream_dapo.learner.trainer import Learner

__all__ = ["SETTINGS", "gap_figures", "prox_minus_mu", "sample_groups"]

SETTINGS = {
    "T1.0 top-p 1.0": SamplingPolicy(),
    "T0.7 top-p 0.9 top-k 20": SamplingPolicy(temperature=0.7, top_p=0.9, top_k=20),
}
DTYPES = ("float32", "bfloat16")
MISMATCH = "T1.0 untruncated (mismatch)"
"""The learner's policy before this bench's fix: what a learner whose generator.* settings differ
from the generators' computes (the case StreamDapoBehaviourLogprobMismatch is for)."""
CAPS = (1.2, 1.5, 2.0, 5.0)


def sample_groups(engine: RolloutEngine, items: list[PromptItem], policy: SamplingPolicy) -> list[Group]:
    """One group per item, sampled at ``policy``, as the wire groups the learner trains on (rewards
    and advantages are placeholders: only tokens, μ and versions matter here)."""
    engine.temperature, engine.top_p = policy.temperature, policy.top_p
    engine.top_k, engine.min_p = policy.top_k, policy.min_p
    by_id = {engine.add_group(item): item for item in items}
    done: list[FinishedGroup] = []
    while len(done) < len(by_id):
        done.extend(engine.step())
    groups = []
    for finished in done:
        samples = [
            Sample(
                tokens=s.token_ids,
                logprobs=s.logprobs,
                versions=s.versions,
                reward=0.0,
                correct=False,
                truncated=s.truncated,
                advantage=0.0,
            )
            for s in finished.samples
        ]
        groups.append(
            Group(
                group_id=finished.group_id,
                prompt_id=finished.prompt_id,
                generator_id="bench",
                gold=finished.gold,
                prompt_tokens=finished.prompt_token_ids,
                created_at=finished.created_at,
                samples=samples,
            )
        )
    return groups


def prox_minus_mu(learner: Learner, groups: list[Group]) -> np.ndarray:
    """d = log π_prox − log μ of every response token (float64 [tokens]), π_prox from the learner's
    `compute_logprobs` under its current sampling policy."""
    batch = learner.prepare(groups)
    prox = learner.compute_logprobs(batch.micro_batches)
    parts = []
    for mb, p in zip(batch.micro_batches, prox, strict=True):
        trained = mb.mask > 0
        parts.append((p.double() - mb.behaviour_logprobs.double())[trained].numpy())
    return np.concatenate(parts)


def gap_figures(d: np.ndarray) -> dict[str, Any]:
    ratio = np.exp(d)

    def outside(band: tuple[float, float]) -> float:
        return float(((ratio < band[0]) | (ratio > band[1])).mean())

    finite = np.isfinite(d)
    return {
        "tokens": int(d.size),
        "mean_abs": float(np.abs(d[finite]).mean()),
        "max_abs": float(np.abs(d).max()),
        "outside_0.9_1.1": outside(BAND_TIGHT),
        "outside_0.5_2": outside(BAND_WIDE),
        "max_ratio": float(ratio.max()),
        "min_ratio": float(ratio.min()),
        "zero_ratio": float((ratio == 0).mean()),
    }


def correction_figures(d: np.ndarray) -> list[dict[str, Any]]:
    """The loss's behaviour weight on these log-ratios, per mode and cap."""
    import torch

    from stream_dapo.core.loss import IS_MODES, PolicyLossParams

    log_w = torch.from_numpy(np.where(np.isfinite(d), d, -np.inf))
    rows = []
    for mode in ("truncate", "mask"):  # the modes with a cap C (icepop has its own band)
        weight_fn = IS_MODES[mode]
        for cap in CAPS:
            w = weight_fn(log_w, PolicyLossParams(is_cap=cap))
            rows.append(
                {
                    "is_mode": mode,
                    "cap": cap,
                    "kept": float((w > 0).double().mean()),
                    "capped": float((log_w > math.log(cap)).double().mean()) if mode == "truncate" else 0.0,
                    "mean_weight": float(w.double().mean()),
                }
            )
    return rows


def _learners(model_dir: Path) -> dict[str, Learner]:
    from bench.perf.learner import PlainTorchEngine
    from stream_dapo.learner.trainer import Learner

    out = {}
    for dtype in DTYPES:
        cfg = tiny_config([f"model.path={model_dir}", f"model.dtype={dtype}"])
        out[dtype] = Learner(cfg, make_engine=PlainTorchEngine)
    return out


def run(prompts: int, seeds: list[int]) -> dict[str, Any]:
    import torch

    from stream_dapo.generator.engine import RolloutEngine

    torch.set_num_threads(1)
    base = tiny_config()
    model_dir = warm_model_dir(base)
    cfg0 = tiny_config([f"model.path={model_dir}"])
    items = task_prompts(cfg0, model_dir, split="eval")[:prompts]
    learners = _learners(model_dir)
    rows: list[dict[str, Any]] = []
    for i, seed in enumerate(seeds):
        order = DTYPES if i % 2 == 0 else DTYPES[::-1]
        for gen_dtype in order:
            cfg = tiny_config(
                [f"model.path={model_dir}", f"model.dtype={gen_dtype}", f"generator.seed={seed}"]
            )
            engine = RolloutEngine.start(cfg)
            try:
                sampled = {}
                for name, policy in SETTINGS.items():
                    t0 = time.perf_counter()
                    sampled[name] = sample_groups(engine, items, policy)
                    print(
                        f"seed {seed} generator {gen_dtype} {name}: sampled in {time.perf_counter() - t0:.1f} s"
                    )
            finally:
                engine.close()
            for name, groups in sampled.items():
                policies = {"generator's": SETTINGS[name]}
                if not SETTINGS[name].is_identity:
                    policies[MISMATCH] = SamplingPolicy()
                for (learner_dtype, learner), (policy_name, policy) in itertools.product(
                    learners.items(), policies.items()
                ):
                    if policy_name == MISMATCH and learner_dtype != gen_dtype:
                        continue
                    learner.sampling = policy
                    d = prox_minus_mu(learner, groups)
                    rows.append(
                        {
                            "seed": seed,
                            "generator": gen_dtype,
                            "learner": learner_dtype,
                            "setting": name,
                            "learner_policy": policy_name,
                            **gap_figures(d),
                            "correction": correction_figures(d),
                        }
                    )
    return {
        "model": str(model_dir),
        "prompts": len(items),
        "group_size": cfg0.algo.group_size,
        "seeds": seeds,
        "rows": rows,
    }


def _spread(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    return format(lo, fmt) if lo == hi else f"{format(lo, fmt)}–{format(hi, fmt)}"


def print_report(out: dict[str, Any]) -> None:
    rows = out["rows"]
    keys = sorted({(r["setting"], r["generator"], r["learner"], r["learner_policy"]) for r in rows})
    print(
        f"\n{out['prompts']} prompts x {out['group_size']} samples, seeds {out['seeds']} (ranges over seeds)"
    )
    print(
        "| setting | generator | learner | learner policy | tokens | mean abs(d) | max abs(d) | "
        "outside [0.9, 1.1] | outside [0.5, 2] | ratio 0 | max ratio |"
    )
    print("| :-- | :-- | :-- | :-- | --: | --: | --: | --: | --: | --: | --: |")
    for key in keys:
        sel = [r for r in rows if (r["setting"], r["generator"], r["learner"], r["learner_policy"]) == key]
        print(
            f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {_spread([r['tokens'] for r in sel], ',')} | "
            f"{_spread([r['mean_abs'] for r in sel], '.1e')} | {_spread([r['max_abs'] for r in sel], '.1e')} | "
            f"{_spread([r['outside_0.9_1.1'] for r in sel], '.2%')} | {_spread([r['outside_0.5_2'] for r in sel], '.2%')} | "
            f"{_spread([r['zero_ratio'] for r in sel], '.2%')} | "
            f"{_spread([r['max_ratio'] for r in sel], '.3f')} |"
        )
    print(
        "\nbehaviour weight (mask: share kept; truncate: share capped), generator and learner in the same dtype"
    )
    print("| setting | dtype | mask C=1.2 | mask C=1.5 | mask C=2 | mask C=5 | truncate capped C=1.2 | C=2 |")
    print("| :-- | :-- | --: | --: | --: | --: | --: | --: |")
    for setting in SETTINGS:
        for dtype in DTYPES:
            sel = [
                r
                for r in rows
                if (r["setting"], r["generator"], r["learner"], r["learner_policy"])
                == (setting, dtype, dtype, "generator's")
            ]
            if not sel:
                continue

            def cell(mode: str, cap: float, field: str, sel: list[dict[str, Any]] = sel) -> str:
                vals = [
                    c[field] for r in sel for c in r["correction"] if (c["is_mode"], c["cap"]) == (mode, cap)
                ]
                return _spread(vals, ".2%")

            print(
                f"| {setting} | {dtype} | {cell('mask', 1.2, 'kept')} | {cell('mask', 1.5, 'kept')} | "
                f"{cell('mask', 2.0, 'kept')} | {cell('mask', 5.0, 'kept')} | {cell('truncate', 1.2, 'capped')} | "
                f"{cell('truncate', 2.0, 'capped')} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    out = run(args.prompts, args.seeds)
    out["command"] = "python -m bench.perf.logprob_precision " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print_report(out)
    save_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
