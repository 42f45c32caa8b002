"""How a generator's tokens/s scales with the groups it holds: the planner's engine-scaling exponent.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.perf.engine_scaling \
        [--config configs/tiny-longcot-cpu.toml] [--groups 1 2 4 8 16] [--window 12] [--repeats 2]

`stream-dapo plan --gen-scaling` takes alpha in tokens/s(m) = tokens/s(M) x (m / M)^alpha, m the
groups in one replica's engine and M = generator.max_groups_in_flight (`stream_dapo.tools.plan`, step
4). This measures it: the project's `RolloutEngine` (what the generator service runs, with the
config's vLLM settings, threads and core binding) samples the config's train prompts, G samples
each, at most algo.max_response_len tokens, at a constant m. Every group that finishes is replaced
at once (the closed loop of a generator whose credits never run out), so m counts groups as the
generator does: a group stays in flight until its longest sample ends, and the sequences in the
engine are fewer than m x G while the shorter samples of its groups are done.

For each m: a ramp of m x G x 150 tokens (so the groups' starts spread out), then the response
tokens produced over --window seconds; repeats interleave the m values (rotated), the figure is
the median. alpha is the least-squares slope of log tokens/s against log m, and the slope between
the smallest and the largest m; both are printed.

What it does not show: the rate inside a run (the learner shares the cores there, and weight loads
pause the engine), or a GPU's curve (measure that on the GPU with the same script).
"""

from __future__ import annotations

import argparse
import itertools
import math
import time
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import interleave, machine_info, save_json, summary  # noqa: E402
from bench.workload import task_prompts, tiny_config  # noqa: E402

LONGCOT_CONFIG = REPO / "configs" / "tiny-longcot-cpu.toml"
RAMP_TOKENS_PER_SAMPLE = 150


def fit_exponent(groups: list[int], tps: list[float]) -> float:
    """Least-squares slope of log tps against log groups."""
    xs, ys = [math.log(g) for g in groups], [math.log(t) for t in tps]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def measure_scaling(
    config: Path, groups: list[int], window_s: float, repeats: int, out_dir: Path
) -> dict[str, Any]:
    from stream_dapo.generator.engine import RolloutEngine

    cfg = tiny_config([f'run.out_dir="{out_dir.resolve()}"'], config=config)
    model_dir = Path(cfg.model.path)
    prompts = itertools.cycle(task_prompts(cfg, model_dir, split="train"))
    g = cfg.algo.group_size
    engine = RolloutEngine.start(cfg)

    def at(m: int) -> float:
        for _ in range(m):
            engine.add_group(next(prompts))

        def run_until(stop: Any) -> None:
            while not stop():
                for _ in engine.step():
                    engine.add_group(next(prompts))

        start_tokens = engine.tokens_generated
        run_until(lambda: engine.tokens_generated - start_tokens >= m * g * RAMP_TOKENS_PER_SAMPLE)
        tokens0, t0 = engine.tokens_generated, time.perf_counter()
        run_until(lambda: time.perf_counter() - t0 >= window_s)
        rate = (engine.tokens_generated - tokens0) / (time.perf_counter() - t0)
        engine.abort_all()
        while engine.num_in_flight:
            engine.step()
        return rate

    try:
        rates = interleave({str(m): partial(at, m) for m in groups}, repeats, warmup=1)
    finally:
        engine.close()
    medians = [summary(rates[str(m)])["median"] for m in groups]
    return {
        "config": str(config.relative_to(REPO) if config.is_relative_to(REPO) else config),
        "model_dir": str(model_dir),
        "group_size": g,
        "max_response_len": cfg.algo.max_response_len,
        "max_groups_in_flight": cfg.generator.max_groups_in_flight,
        "threads": cfg.generator.threads,
        "window_s": window_s,
        "repeats": repeats,
        "seed": cfg.generator.seed,
        "tokens_per_second": {str(m): summary(rates[str(m)]) for m in groups},
        "exponent_fit": fit_exponent(groups, medians),
        "exponent_ends": math.log(medians[-1] / medians[0]) / math.log(groups[-1] / groups[0]),
        "machine": machine_info(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=LONGCOT_CONFIG)
    parser.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--window", type=float, default=12.0, help="seconds measured per point")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=REPO / "runs" / "engine-scaling")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    groups = sorted(set(args.groups))
    if len(groups) < 2 or groups[0] < 1:
        parser.error("--groups needs at least two counts >= 1")
    result = measure_scaling(args.config, groups, args.window, args.repeats, args.out_dir)
    for m in groups:
        s = result["tokens_per_second"][str(m)]
        print(
            f"  {m:3d} groups in flight: {s['median']:8.0f} tokens/s  (min {s['min']:.0f}, max {s['max']:.0f})"
        )
    print(f"  exponent: fit {result['exponent_fit']:.3f}, ends {result['exponent_ends']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        save_json(args.json, result, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
