"""Code-sandbox throughput: HumanEval's canonical solutions scored per second, sandboxed and bare.

    .venv/bin/python -m bench.code_sandbox [--rows 64] [--repeats 3] [--quick]

Workload: the first ``--rows`` HumanEval problems, each a response whose fenced block is the
problem's prompt followed by its canonical solution, scored by ``score_code`` (one sandboxed run per
problem: bubblewrap, the trusted launcher, the nonce harness). Variants, each with 1 and 2 worker
threads: ``namespaces`` and ``rlimits`` (the two isolations) and ``bare``, a plain
``subprocess.run([python, "-I", "-c", program])`` of the same program (the solution, the test,
``check(entry_point)``) with no sandbox, no limits and no harness: the floor a sandbox adds to.
Every variant runs once per repeat, in rotating order (``bench.report.interleave``), so a slow moment
of the shared machine lands on all of them alike; each figure is min / median / max over repeats.
Overhead is per test: 1/rate(sandboxed) - 1/rate(bare) at the same worker count, paired by repeat.
Run under the CPU lock on a shared machine:
``flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.code_sandbox``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.report import bench_parser, interleave, median
from stream_dapo.data.humaneval import load_problems
from stream_dapo.runtime.host import cpu_model
from stream_dapo.verifier.code import CodeSettings, score_code
from stream_dapo.verifier.sandbox import sandbox_problem

WORKERS = (1, 2)


def _response(problem: dict[str, Any]) -> str:
    return f"```python\n{problem['prompt']}{problem['canonical_solution']}```\n"


def _truth(problem: dict[str, Any]) -> str:
    import json

    return json.dumps({"entry_point": problem["entry_point"], "test": problem["test"]})


def _bare(problem: dict[str, Any]) -> bool:
    program = f"{problem['prompt']}{problem['canonical_solution']}\n{problem['test']}\ncheck({problem['entry_point']})\n"
    done = subprocess.run([sys.executable, "-I", "-c", program], capture_output=True, timeout=60, check=False)
    return done.returncode == 0


def _rate(run_one: Callable[[dict[str, Any]], bool], problems: list[dict[str, Any]], workers: int) -> float:
    """Tests per second over ``problems`` with ``workers`` threads; every test must pass."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        ok = list(pool.map(run_one, problems))
    seconds = time.perf_counter() - start
    if not all(ok):
        raise SystemExit(f"{ok.count(False)} canonical solutions did not pass: the figure would be wrong")
    return len(problems) / seconds


def _sandboxed(isolation: str) -> Callable[[dict[str, Any]], bool]:
    settings = CodeSettings(isolation=isolation)

    def run_one(problem: dict[str, Any]) -> bool:
        return score_code(_response(problem), _truth(problem), settings).reason == "passed"

    return run_one


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rows", type=int, default=64, help="HumanEval problems per variant and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows, repeats = (8, 1) if args.quick else (args.rows, args.repeats)
    problems = load_problems()[:rows]
    kinds: dict[str, Callable[[dict[str, Any]], bool]] = {"bare": _bare}
    for isolation in ("namespaces", "rlimits"):
        problem = sandbox_problem(isolation)
        if problem is None:
            kinds[isolation] = _sandboxed(isolation)
        else:
            print(f"{isolation}: skipped ({problem})")
    variants = {
        f"{kind} x{workers}": (lambda run=run, w=workers: _rate(run, problems, w))
        for kind, run in kinds.items()
        for workers in WORKERS
    }
    print(f"host: {cpu_model()}, {os.cpu_count()} cores; python {sys.version.split()[0]}")
    print(f"workload: {rows} HumanEval canonical solutions per variant; {repeats} interleaved repeats")
    rates = interleave(variants, repeats, warmup=1 if not args.quick else 0)
    print(f"{'variant':<16}{'tests/s min':>12}{'median':>10}{'max':>10}")
    for name, values in rates.items():
        print(f"{name:<16}{min(values):>12.1f}{median(values):>10.1f}{max(values):>10.1f}")
    print("overhead per test against bare, same workers (ms, min / median / max over repeats):")
    for kind in kinds:
        if kind == "bare":
            continue
        for workers in WORKERS:
            sandboxed, bare = rates[f"{kind} x{workers}"], rates[f"bare x{workers}"]
            extra = [1000 * (1 / s - 1 / b) for s, b in zip(sandboxed, bare, strict=True)]
            ratio = median([b / s for s, b in zip(sandboxed, bare, strict=True)])
            print(
                f"  {kind} x{workers}: {min(extra):.1f} / {median(extra):.1f} / {max(extra):.1f} ms "
                f"({ratio:.2f}x the bare time per test)"
            )


if __name__ == "__main__":
    main()
