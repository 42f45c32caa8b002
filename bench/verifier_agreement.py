"""Verifier agreement: each backend's verdicts against a graded corpus, and its verifications/s.

The corpus (``bench/verifier_corpus.py``) holds a few hundred (gold, response) pairs across answer
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

Run: ``python bench/verifier_agreement.py [--json docs/results/verifier_agreement.json]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_corpus import CLASSES, Pair, build_corpus  # noqa: E402

from stream_dapo.verifier import VerifierPool  # noqa: E402

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


def _answer_of(response: str) -> str:
    return response.rsplit("Answer: ", 1)[-1] if "Answer: " in response else response.split("answer is ")[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="pool workers (default 1: the per-core rate)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh pools whose rates give the median")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the pool's per-check timeout")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()

    corpus = build_corpus()
    backends = ["builtin"]
    if importlib.util.find_spec("math_verify") is not None:
        backends.append("math-verify")
    else:
        print("Math-Verify is not installed (pip install -e '.[math-verify]'): builtin only")
    print(
        f"corpus: {len(corpus)} pairs ({sum(p.correct for p in corpus)} graded correct), "
        f"{len(CLASSES)} classes; pool workers: {args.workers}; repeats: {args.repeats} (median)"
    )

    report: dict[str, dict[str, object]] = {}
    verdicts: dict[str, list[bool]] = {}
    for backend in backends:
        first, rate, counters = pooled_run(corpus, backend, args.workers, args.timeout_s)
        rates = [rate] + [
            pooled_run(corpus, backend, args.workers, args.timeout_s)[1] for _ in range(args.repeats - 1)
        ]
        verdicts[backend] = first
        report[backend] = {
            **agreement(corpus, first),
            "verifications_per_s": statistics.median(rates),
            "rates": rates,
            "counters": counters,
        }
    if "math-verify" in backends:
        e2e, e2e_rate = math_verify_end_to_end(corpus)
        verdicts["math-verify-e2e"] = e2e
        report["math-verify-e2e"] = {**agreement(corpus, e2e), "verifications_per_s": e2e_rate}

    names = list(report)
    print(f"\n{'':22}" + "".join(f"{n:>17}" for n in names))
    for key, label in (
        ("agreement", "agreement"),
        ("false_positives", "false positives"),
        ("false_negatives", "false negatives"),
        ("verifications_per_s", "verifications/s"),
    ):
        cells = []
        for n in names:
            value = report[n][key]
            cells.append(f"{value:>17.1%}" if key == "agreement" else f"{value:>17.0f}")
        print(f"{label:22}" + "".join(cells))
    print("per class (agreement):")
    for cls in CLASSES:
        count = sum(p.cls == cls for p in corpus)
        print(f"  {cls + f' ({count})':20}" + "".join(f"{report[n]['per_class'][cls]:>17.1%}" for n in names))  # type: ignore[index]

    if "math-verify" in verdicts:
        print("\npairs where builtin and math-verify disagree (graded verdict, then each backend's):")
        disagreements = []
        for p, b, m in zip(corpus, verdicts["builtin"], verdicts["math-verify"], strict=True):
            if b != m:
                disagreements.append(
                    {
                        "class": p.cls,
                        "gold": p.gold,
                        "answer": _answer_of(p.response),
                        "graded": p.correct,
                        "builtin": b,
                        "math_verify": m,
                    }
                )
                print(
                    f"  [{p.cls}] gold {p.gold!r} answer {_answer_of(p.response)!r}: graded {p.correct}, "
                    f"builtin {b}, math-verify {m}"
                )
        report["disagreements"] = {"pairs": disagreements}  # type: ignore[dict-item]
    print("\npairs where builtin disagrees with the graded verdict:")
    for p, b in zip(corpus, verdicts["builtin"], strict=True):
        if b != p.correct:
            print(
                f"  [{p.cls}] gold {p.gold!r} answer {_answer_of(p.response)!r}: graded {p.correct}, builtin {b}"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
