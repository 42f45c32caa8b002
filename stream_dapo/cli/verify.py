"""``stream-dapo verify``: score one response against a gold answer and print the verdict as JSON.

Examples::

    stream-dapo verify --gold 42 --text 'so the total is 42.\nAnswer: 42'
    echo '... \\boxed{\\frac{1}{2}}' | stream-dapo verify --gold 0.5
    stream-dapo verify --gold '\\{1,2\\}' --text 'Answer: \\{2,1\\}' --backend math-verify

Prints ``{"correct": ..., "reward": ..., "extracted": ..., "reason": ...}`` on one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from stream_dapo.verifier.backends import BACKENDS
from stream_dapo.verifier.core import verify

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` options to ``parser``."""
    parser.add_argument("--gold", required=True, help="the reference answer, e.g. 42 or '\\frac{1}{2}'")
    parser.add_argument("--text", default=None, help="the model response (default: read it from stdin)")
    parser.add_argument(
        "--pattern",
        default=None,
        help="regex with one capture group around the answer, tried before 'Answer:' and \\boxed{}",
    )
    parser.add_argument(
        "--tail-chars",
        type=int,
        default=300,
        help="search the pattern and the 'Answer:' line in this many trailing characters (default 300)",
    )
    parser.add_argument(
        "--max-input-chars",
        type=int,
        default=10_000,
        help="responses longer than this score -1 as too_long (default 10000)",
    )
    parser.add_argument(
        "--backend",
        choices=BACKENDS,
        default="builtin",
        help="equivalence checker (default builtin; math-verify needs `pip install -e '.[math-verify]'`)",
    )


def run(args: argparse.Namespace) -> int:
    """Verify one response; print the JSON verdict. Returns 0, or 2 for bad options."""
    text = args.text if args.text is not None else sys.stdin.read()
    try:
        result = verify(
            text,
            args.gold,
            pattern=args.pattern,
            tail_chars=args.tail_chars,
            max_input_chars=args.max_input_chars,
            backend=args.backend,
        )
    except ValueError as exc:
        print(f"stream-dapo verify: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(result)))
    return 0
