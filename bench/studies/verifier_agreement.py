"""Verifier agreement: each backend's verdicts against a graded corpus, and its verifications/s.

The corpus (``bench/studies/verifier_corpus.py``) holds a few hundred (gold, response) pairs across answer
classes (sets, tuples and intervals, several answers, ``x = 5``, factorials and binomials,
approximations of irrational golds, ratios, text wrappers, units and degrees, percentages,
scientific notation, ``\\dfrac``/``\\tfrac``, mixed numbers, expressions) plus DAPO-Math-17k-style
integer answers, each with the verdict a careful grader gives.

For each backend (``builtin``, ``math-verify``) the corpus goes through a fresh ``VerifierPool``
(the path generators use: same extraction, timeout and counters); the verdicts of the first pass
are scored, and the rate is the median over ``--repeats`` fresh pools of one pass each (imports
warmed on other items first, the corpus itself never seen before by that pool). For reference, the
report also scores Math-Verify end to end as TRL calls it (``math_verify.parse`` of the whole
response, in process, with its own extraction and timeouts), which is not a backend here.

Run: ``python -m bench.studies.verifier_agreement [--json docs/results/verifier_agreement.json]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.report import save_json  # noqa: E402
from bench.studies.verifier_corpus import CLASSES, Pair, build_corpus  # noqa: E402
from stream_dapo.verifier import VerifierPool  # noqa: E402
from stream_dapo.verifier.extract import extract_answer  # noqa: E402

E2E = "math-verify-e2e"  # Math-Verify as TRL calls it, with its own extraction: a reference, not a backend

_WARM_UP = [
    ("Answer: 2\\sqrt{2}", "\\sqrt{8}"),
    ("Answer: (x+1)^2", "x^2+2x+1"),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}"),
    ("Answer: 1.4142136", "\\sqrt{2}"),
]


def pooled_run(
    corpus: list[Pair], backend: str, workers: int, timeout_s: float
) -> tuple[list[bool], float, dict[str, int]]:
    """One pass of the corpus through a fresh pool: (verdicts, verifications/s, counters)."""
    items = [(p.response, p.gold) for p in corpus]
    with VerifierPool(num_workers=workers, timeout_s=timeout_s, backend=backend) as pool:
        pool.verify_batch(_WARM_UP * workers)  # each worker imports sympy (and Math-Verify) here
        start = time.perf_counter()
        results = pool.verify_batch(items)
        rate = len(items) / (time.perf_counter() - start)
        counters = pool.counters
    return [r.correct for r in results], rate, counters


def math_verify_end_to_end(corpus: list[Pair]) -> tuple[list[bool], float]:
    """Math-Verify as TRL calls it: its own extraction from the whole response (in process)."""
    from math_verify import parse, verify

    verdicts = []
    start = time.perf_counter()
    for p in corpus:
        gold = parse(f"${p.gold}$")
        answer = parse(p.response)
        verdicts.append(bool(gold) and bool(answer) and verify(gold, answer))
    return verdicts, len(corpus) / (time.perf_counter() - start)


def agreement(corpus: list[Pair], verdicts: list[bool]) -> dict[str, object]:
    """Share of pairs where ``verdicts`` equal the graded verdicts, overall and per class, and the
    false positives (wrong answers rewarded) and false negatives (right answers refused)."""
    per_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    false_pos = false_neg = 0
    for p, v in zip(corpus, verdicts, strict=True):
        per_class[p.cls][0] += v == p.correct
        per_class[p.cls][1] += 1
        false_pos += v and not p.correct
        false_neg += p.correct and not v
    agreed = sum(a for a, _ in per_class.values())
    return {
        "agreement": agreed / len(corpus),
        "agreed": agreed,
        "pairs": len(corpus),
        "false_positives": false_pos,
        "false_negatives": false_neg,
        "per_class": {cls: per_class[cls][0] / per_class[cls][1] for cls in CLASSES if cls in per_class},
    }


def _pair_row(p: Pair, **verdicts: bool) -> dict[str, object]:
    return {
        "class": p.cls,
        "gold": p.gold,
        "answer": extract_answer(p.response),
        "graded": p.correct,
        **verdicts,
    }


def score(corpus: list[Pair], args: argparse.Namespace) -> dict[str, object]:
    """Every backend's verdicts and rates on ``corpus``, as the JSON report."""
    backends = ["builtin"]
    if importlib.util.find_spec("math_verify") is not None:
        backends.append("math-verify")
    else:
        print("Math-Verify is not installed (pip install -e '.[math-verify]'): builtin only")
    rows: list[dict[str, object]] = []
    verdicts: dict[str, list[bool]] = {}
    per_class: dict[str, dict[str, float]] = {}
    for backend in backends:
        first, rate, counters = pooled_run(corpus, backend, args.workers, args.timeout_s)
        rates = [rate] + [
            pooled_run(corpus, backend, args.workers, args.timeout_s)[1] for _ in range(args.repeats - 1)
        ]
        verdicts[backend] = first
        scored = agreement(corpus, first)
        per_class[backend] = scored.pop("per_class")  # type: ignore[assignment]
        rows.append(
            {
                "backend": backend,
                **scored,
                "verifications_per_s": statistics.median(rates),
                "timeouts": counters["timeout"],
            }
        )
    if "math-verify" in backends:
        e2e, e2e_rate = math_verify_end_to_end(corpus)
        verdicts[E2E] = e2e
        scored = agreement(corpus, e2e)
        per_class[E2E] = scored.pop("per_class")  # type: ignore[assignment]
        rows.append({"backend": E2E, **scored, "verifications_per_s": e2e_rate, "timeouts": None})
    names = list(verdicts)
    return {
        "pairs": len(corpus),
        "graded_correct": sum(p.correct for p in corpus),
        "classes": len(CLASSES),
        "workers": args.workers,
        "repeats": args.repeats,
        "timeout_s": args.timeout_s,
        "backends": rows,
        "per_class": [
            {
                "class": cls,
                "pairs": sum(p.cls == cls for p in corpus),
                **{n: per_class[n][cls] for n in names},
            }
            for cls in CLASSES
        ],
        "disagreements": [
            _pair_row(p, builtin=b, math_verify=m)
            for p, b, m in zip(
                corpus, verdicts["builtin"], verdicts.get("math-verify", verdicts["builtin"]), strict=True
            )
            if b != m
        ],
        "builtin_misses": [
            _pair_row(p, builtin=b)
            for p, b in zip(corpus, verdicts["builtin"], strict=True)
            if b != p.correct
        ],
    }


def print_report(report: dict[str, Any]) -> None:
    rows = report["backends"]
    print(
        f"corpus: {report['pairs']} pairs ({report['graded_correct']} graded correct), {report['classes']} "
        f"classes; pool workers: {report['workers']}; rate: median of {report['repeats']} fresh pools"
    )
    print(f"\n{'':24}" + "".join(f"{r['backend']:>17}" for r in rows))
    print(f"{'agreement':24}" + "".join(f"{r['agreement']:>17.1%}" for r in rows))
    for key in ("agreed", "false_positives", "false_negatives", "verifications_per_s"):
        print(f"{key.replace('_', ' '):24}" + "".join(f"{r[key]:>17.0f}" for r in rows))
    print("per class (agreement):")
    for c in report["per_class"]:
        label = f"{c['class']} ({c['pairs']})"
        print(f"  {label:22}" + "".join(f"{c[r['backend']]:>17.1%}" for r in rows))
    print("\npairs where builtin and math-verify disagree:")
    for d in report["disagreements"]:
        print(
            f"  [{d['class']}] gold {d['gold']!r}, answer {d['answer']!r}: graded {d['graded']}, "
            f"builtin {d['builtin']}, math-verify {d['math_verify']}"
        )
    print("\npairs where builtin disagrees with the graded verdict:")
    for d in report["builtin_misses"]:
        print(f"  [{d['class']}] gold {d['gold']!r}, answer {d['answer']!r}: graded {d['graded']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="pool workers (default 1: the per-core rate)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh pools whose rates give the median")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the pool's per-check timeout")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    report = score(build_corpus(), args)
    print_report(report)
    if args.json is not None:
        save_json(args.json, report, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
