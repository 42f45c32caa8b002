"""Where vLLM's engine core runs (`generator.engine_process`): tokens/s and the cores it takes.

    python -m bench.perf.engine_process [--config configs/tiny-longcot-cpu.toml] [--groups 16]
        [--finish 48] [--repeats 2] [--json FILE]

Each (mode, repeat) is a fresh process running the project's `RolloutEngine` on the config's
model and settings, train prompts, G = group_size: a warm-up of 4 groups, then `--groups` groups
kept in flight (each finished group replaced at once) until `--finish` groups finished. It
reports generated tokens per second and the CPU seconds all its processes used (its own and
vLLM's children, from /proc via psutil) per second of that window, i.e. how many cores
generation took. Modes interleave, order rotated every repeat; OMP_NUM_THREADS=1 as
`stream-dapo run` gives generators. "separate" is vLLM's default (engine core in its own
process), "inline" runs it in the generator's process. What matters on a machine where the
learner shares the cores is the cores column: what generation leaves to the learner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from bench.report import bench_parser, markdown_table, median, save_json  # noqa: E402

MODES = ("separate", "inline")


def measure_one(config: Path, mode: str, groups: int, finish: int) -> dict:
    """In this process: start the engine for ``mode`` and measure one window."""
    import psutil

    from bench.workload import task_prompts, tiny_config, warm_model_dir
    from stream_dapo.generator.engine import RolloutEngine

    cfg = tiny_config([f'generator.engine_process="{mode}"'], config=config)
    model = warm_model_dir(cfg)
    cfg = tiny_config([f"model.path={model}", f'generator.engine_process="{mode}"'], config=config)
    prompts = iter(task_prompts(cfg, model, split="train"))
    engine = RolloutEngine.start(cfg)
    me = psutil.Process()

    def cpu_seconds() -> float:
        total = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system
        return total

    try:
        for _ in range(4):
            engine.add_group(next(prompts))
        while engine.num_in_flight:
            engine.step()
        t0, c0, k0 = time.perf_counter(), cpu_seconds(), engine.tokens_generated
        for _ in range(groups):
            engine.add_group(next(prompts))
        done = 0
        while done < finish:
            finished = engine.step()
            done += len(finished)
            for _ in finished:
                engine.add_group(next(prompts))
        seconds, cpu, tokens = time.perf_counter() - t0, cpu_seconds() - c0, engine.tokens_generated - k0
    finally:
        engine.close()
    return {
        "mode": mode,
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds, 1),
        "cores_used": round(cpu / seconds, 3),
        "cpu_ms_per_1k_tokens": round(1e6 * cpu / tokens, 1),
    }


def measure(config: Path, groups: int, finish: int, repeats: int) -> dict:
    runs = []
    for r in range(repeats):
        order = MODES[r % 2 :] + MODES[: r % 2]
        for mode in order:
            argv = [sys.executable, "-m", __spec__.name, "--one", mode, "--config", str(config)]
            argv += ["--groups", str(groups), "--finish", str(finish)]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
            out = subprocess.run(argv, check=True, cwd=REPO, capture_output=True, text=True, env=env).stdout
            row = {"repeat": r, **json.loads(out.strip().splitlines()[-1])}
            runs.append(row)
            print(json.dumps(row), flush=True)
    return {
        "config": str(config),
        "groups_in_flight": groups,
        "groups_finished": finish,
        "repeats": repeats,
        "runs": runs,
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "tiny-longcot-cpu.toml")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--finish", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--one", choices=MODES, default=None, help=argparse_hidden())
    args = parser.parse_args()
    if args.quick:
        args.groups, args.finish, args.repeats = 2, 2, 1
    if args.one:
        print(json.dumps(measure_one(args.config, args.one, args.groups, args.finish)))
        return
    result = measure(args.config, args.groups, args.finish, args.repeats)
    rows = []
    for mode in MODES:
        mine = [r for r in result["runs"] if r["mode"] == mode]
        cells = [mode, len(mine)]
        for key in ("tokens_per_second", "cores_used", "cpu_ms_per_1k_tokens"):
            values = [r[key] for r in mine]
            cells.append(f"{median(values):g} [{min(values):g}, {max(values):g}]")
        rows.append(cells)
    print(markdown_table(["mode", "runs", "tokens/s", "cores used", "CPU ms per 1k tokens"], rows, "lrrrr"))
    save_json(args.json, result)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
