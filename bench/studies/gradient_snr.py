"""How much of a mini-batch's policy gradient is signal: the DAPO gradient's agreement between
independent mini-batches, on the embedded task and on the long chain-of-thought task.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.gradient_snr \
        [--config configs/tiny-longcot-cpu.toml --config configs/tiny-cpu.toml] [--prompts 64] \
        [--sizes 2 4 8 16] [--splits 200] [--seed 0] [--json docs/results/gradient_snr.json]

For each config: one vLLM engine (the project's `RolloutEngine`) samples `--prompts` train prompts x
group_size at the recipe's settings from the warm model; the verifier scores them, and the
generator's own `build_group` applies dynamic sampling, overlong shaping and group advantages. The
learner (the project's `Learner`, DeepSpeed, the recipe's loss) then computes the gradient of each
kept group's loss on the start weights, in the recipe's token-level units (the token-mean
gradient of a mini-batch is the token-weighted sum of its groups' gradients).

Printed: for mini-batches of K groups drawn at random as two disjoint halves of the kept pool, the
cosine between the two mini-batch gradients (median and 10-90% range over `--splits` draws). Two
estimates of the same expected gradient agree to cos = K s^2 / (1 + K s^2) with s^2 the per-group
signal-to-noise ratio, so s^2 is read off the cosines and the mini-batch size at which two
mini-batches would agree to 0.5 (half signal) is 1 / s^2 groups. Also the share of draws whose
mini-batch gradient would sharpen the policy (its descent direction raises the final norm's scale,
the direction that undoes the warm-up's folded temperature).

What it does not show: how the signal evolves while training (this is the start model), or the
optimizer (Adam normalises each parameter, so its step direction is noisier than this cosine says
where many parameters get pure-noise gradients).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]

from bench.workload import task_prompts, tiny_config  # noqa: E402

DEFAULT_CONFIGS = [REPO / "configs" / "tiny-longcot-cpu.toml", REPO / "configs" / "tiny-cpu.toml"]


def sample_groups(cfg: Any, items: list[Any]) -> tuple[list[Any], dict[str, Any]]:
    """Kept groups (wire `Group`s with shaped rewards and advantages) and the pool's statistics."""
    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.generator.rollout import RolloutSettings, build_group
    from stream_dapo.verifier import verify

    engine = RolloutEngine.start(cfg)
    try:
        ids = {engine.add_group(item): item for item in items}
        done: list[Any] = []
        while len(done) < len(ids):
            done.extend(engine.step())
    finally:
        engine.close()
    settings = RolloutSettings.from_config(cfg.algo)
    kept, outcomes, lengths, correct = [], {"kept": 0, "all_correct": 0, "all_wrong": 0}, [], []
    for finished in done:
        results = [verify(s.text, finished.gold) for s in finished.samples]
        lengths += [len(s) for s in finished.samples]
        correct += [r.correct for r in results]
        outcome = build_group(finished, results, settings, "bench")
        if outcome.group is None:
            outcomes["all_correct" if all(r.correct for r in results) else "all_wrong"] += 1
        else:
            outcomes["kept"] += 1
            kept.append(outcome.group)
    stats = {
        "groups": len(done),
        **outcomes,
        "accuracy": float(np.mean(correct)),
        "mean_response_len": float(np.mean(lengths)),
    }
    return kept, stats


def group_gradients(cfg: Any, groups: list[Any]) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """[n_groups, n_params] token-weighted gradients of each group's loss, and (the final norm's slice
    of the flattened parameters as a mask, that norm's weight)."""
    import torch
    from transformers import AutoModelForCausalLM

    from stream_dapo.learner.trainer import Learner

    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    learner = Learner(cfg, model, source_dir=Path(cfg.model.path))
    params = [p for p in learner.engine.module.parameters() if p.requires_grad]
    names = [n for n, p in learner.engine.module.named_parameters() if p.requires_grad]
    norm_mask = np.concatenate(
        [np.full(p.numel(), n == "model.norm.weight", dtype=bool) for n, p in zip(names, params, strict=True)]
    )
    norm_weight = learner.engine.module.model.norm.weight.detach().numpy().copy()
    rows = []
    for group in groups:
        for p in params:
            p.grad = None
        batch = learner.prepare([group])
        learner.accumulate_gradients(batch, None)
        flat = torch.cat([p.grad.reshape(-1) for p in params]).double().numpy()
        rows.append(flat * batch.global_tokens)  # back from the group's token mean to a token sum
    grads = np.stack(rows)
    return grads, (norm_mask, norm_weight)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30))


def agreement(
    grads: np.ndarray, norm: tuple[np.ndarray, np.ndarray], sizes: list[int], splits: int, seed: int
) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    mask, weight = norm
    out = []
    n = grads.shape[0]
    for k in sizes:
        if 2 * k > n:
            print(f"  K={k}: needs {2 * k} kept groups, the pool has {n}; skipped")
            continue
        cosines, norm_cosines, projections = [], [], []
        for _ in range(splits):
            pick = rng.permutation(n)[: 2 * k]
            a, b = grads[pick[:k]].sum(0), grads[pick[k:]].sum(0)
            cosines.append(_cos(a, b))
            norm_cosines.append(_cos(a[mask], b[mask]))
            # Descent direction -a: sharpening when it grows the norm weight along itself.
            projections.append(float(-a[mask] @ weight) / k)
        sharpen = sum(p > 0 for p in projections)
        cosines.sort()
        med = statistics.median(cosines)
        s2 = med / (k * (1 - med)) if 0 < med < 1 else float("nan")
        out.append(
            {
                "groups_per_batch": k,
                "cosine_median": med,
                "cosine_p10": cosines[int(0.1 * len(cosines))],
                "cosine_p90": cosines[int(0.9 * len(cosines))],
                "signal_to_noise_per_group": s2,
                "groups_for_half_signal": 1 / s2 if s2 == s2 and s2 > 0 else float("inf"),
                "share_sharpening": sharpen / splits,
                "norm_cosine_median": statistics.median(norm_cosines),
                "sharpening_mean_over_std": statistics.fmean(projections)
                / (statistics.pstdev(projections) + 1e-30),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, action="append", default=None)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: the config's warm model)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    from stream_dapo.model.warmup import ensure_warm_model

    results = []
    for config in args.config or DEFAULT_CONFIGS:
        cfg = tiny_config(config=config)
        model_dir = args.model.resolve() if args.model else ensure_warm_model(cfg).resolve()
        cfg = tiny_config([f"model.path={model_dir}", f"generator.seed={args.seed}"], config=config)
        items = task_prompts(cfg, model_dir, split="train")[: args.prompts]
        groups, stats = sample_groups(cfg, items)
        print(f"== {config.name}: {stats}")
        grads, norm = group_gradients(cfg, groups)
        rows = agreement(grads, norm, args.sizes, args.splits, args.seed)
        for r in rows:
            print(
                f"  K={r['groups_per_batch']:3d} groups ({r['groups_per_batch'] * cfg.algo.group_size} samples): "
                f"cos {r['cosine_median']:.3f} [{r['cosine_p10']:.3f}, {r['cosine_p90']:.3f}]  "
                f"s^2/group {r['signal_to_noise_per_group']:.4f} -> half signal at "
                f"{r['groups_for_half_signal']:.0f} groups; final norm: cos {r['norm_cosine_median']:.3f}, "
                f"sharpening in {r['share_sharpening']:.0%} of draws (mean/std {r['sharpening_mean_over_std']:.2f})"
            )
        results.append(
            {
                "config": str(config.resolve().relative_to(REPO)),
                "model": str(model_dir),
                "pool": stats,
                "agreement": rows,
            }
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"prompts": args.prompts, "seed": args.seed, "splits": args.splits, "results": results},
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
