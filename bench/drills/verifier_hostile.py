"""The verifier's hostile-input corpus under the worker pool: worst-case latency, and that nothing runs.

    python -m bench.drills.verifier_hostile [--repeats 3] [--timeout-s 5] [--json docs/results/verifier_hostile.json]

Every response of the corpus in tests/unit/test_verifier_hostile.py (power towers, `__import__` and
LaTeX-wrapped variants, a million digits, ten thousand nested braces, ...) is checked alone against
the gold "1" through `VerifierPool` (2 workers, the default per-check timeout of 5 s), from an empty
working directory. Reported: the latency of each check (median over repeats), the worst one, the
reasons, how many hit the timeout, whether every hostile response scored -1, and whether the
marker file the injection attempts would create ever appeared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from stream_dapo.testing.hostile import HOSTILE_RESPONSES  # noqa: E402
from stream_dapo.verifier import VerifierPool  # noqa: E402


def _label(response: str) -> str:
    return response if len(response) <= 48 else f"{response[:40]}… ({len(response):,} chars)"


def measure(repeats: int = 3, timeout_s: float = 5.0) -> dict:
    latencies: list[list[float]] = [[] for _ in HOSTILE_RESPONSES]
    reasons: list[str] = []
    rewards: list[float] = []
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            with VerifierPool(num_workers=2, timeout_s=timeout_s) as pool:
                pool.verify_batch([("Answer: 1", "1")])  # workers up before timing
                for r in range(repeats):
                    for i, response in enumerate(HOSTILE_RESPONSES):
                        t0 = time.perf_counter()
                        (result,) = pool.verify_batch([(response, "1")])
                        latencies[i].append(time.perf_counter() - t0)
                        if r == 0:
                            reasons.append(result.reason)
                            rewards.append(result.reward)
                (sane,) = pool.verify_batch([("Answer: 1", "1")])
            marker = any(Path(tmp).rglob("PWNED")) or (cwd / "PWNED").exists()
        finally:
            os.chdir(cwd)
    medians = [statistics.median(x) for x in latencies]
    worst = max(range(len(medians)), key=medians.__getitem__)
    return {
        "inputs": len(HOSTILE_RESPONSES),
        "repeats": repeats,
        "timeout_s": timeout_s,
        "workers": 2,
        "worst_latency_s": medians[worst],
        "worst_input": _label(HOSTILE_RESPONSES[worst]),
        "median_latency_s": statistics.median(medians),
        "timeouts": reasons.count("timeout"),
        "reasons": {r: reasons.count(r) for r in sorted(set(reasons))},
        "all_scored_minus_1": all(x == -1.0 for x in rewards),
        "pool_still_verifies": sane.reward == 1.0,
        "marker_file_created": marker,
        "per_input": [
            {"input": _label(resp), "latency_s": m, "reason": reason}
            for resp, m, reason in zip(HOSTILE_RESPONSES, medians, reasons, strict=True)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    d = measure(args.repeats, args.timeout_s)
    for row in d["per_input"]:
        print(f"{row['latency_s'] * 1000:9.1f} ms  {row['reason']:16s} {row['input']}")
    print(
        f"{d['inputs']} hostile inputs x {d['repeats']}: worst {d['worst_latency_s']:.3f} s "
        f"({d['worst_input']}), median {d['median_latency_s'] * 1000:.1f} ms, timeouts {d['timeouts']}, "
        f"all -1: {d['all_scored_minus_1']}, marker file: {d['marker_file_created']}, "
        f"pool still verifies: {d['pool_still_verifies']}"
    )
    if args.json:
        save_json(args.json, d)


if __name__ == "__main__":
    main()
