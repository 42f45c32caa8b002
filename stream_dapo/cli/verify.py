"""``stream-dapo verify``: score one response with any reward and print the verdict as JSON.

Examples::

    stream-dapo verify --gold 42 --text 'so the total is 42.\nAnswer: 42'
    stream-dapo verify --gold 42 --text 'The answer is #### 42'          # GSM8K's answer line
    echo '... \\boxed{\\frac{1}{2}}' | stream-dapo verify --gold 0.5
    stream-dapo verify --reward examples/rewards/length_budget.py:compute_score --row row.json < answer.txt
    stream-dapo verify --reward code --row humaneval_row.json < solution.md
    stream-dapo verify --config configs/mix.toml --source words --gold 7 --text 'Answer: 7'

The response is ``--text`` or stdin. ``--row FILE`` holds one row of the data schema (JSON, or the
first line of a .jsonl file): its ``reward_model.ground_truth``, ``data_source`` and ``extra_info``
are the reward's arguments, and ``--gold`` / ``--data-source`` override them. The reward runs as in
training, in a verifier worker with its timeout. Prints one line::

    {"score": 1.0, "reason": "exact", "seconds": 0.41, "correct": true, "extracted": "42",
     "extras": {}, "reward": 1.0}

(``reward`` is ``score``, kept for scripts written before ``score`` existed.) Exit 2, with a message,
for an unusable reward, row or option.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from stream_dapo.errors import ConfigError
from stream_dapo.rewards.spec import RewardSpec, parse_reward
from stream_dapo.verifier.backends import BACKENDS

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` options to ``parser``."""
    parser.add_argument("--gold", default=None, help="the reference answer, e.g. 42 or '\\frac{1}{2}'")
    parser.add_argument("--text", default=None, help="the model response (default: read it from stdin)")
    parser.add_argument(
        "--reward",
        default=None,
        help="math (default), math-verify, code, python:FILE.py:NAME, FILE.py:NAME or module:NAME",
    )
    parser.add_argument(
        "--config", action="append", default=[], metavar="FILE", help="score with a source of this config"
    )
    parser.add_argument("--source", default=None, help="with --config: the [[data.sources]] name")
    parser.add_argument("--row", default=None, help="a file holding one data row (JSON or .jsonl)")
    parser.add_argument("--data-source", default=None, help="the data_source argument (default: the row's)")
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
        help="math's equivalence checker (default builtin; math-verify needs `pip install -e '.[math-verify]'`)",
    )
    parser.add_argument(
        "--timeout-s", type=float, default=None, help="limit of the call (default: the reward's)"
    )


def _read_row(path: str) -> dict[str, Any]:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"--row {path}: no such file; give a file holding one data row as JSON")
    text = file.read_text(encoding="utf-8").strip()
    first = text.splitlines()[0] if file.suffix.lower() in (".jsonl", ".ndjson") and text else text
    try:
        row = json.loads(first)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--row {path}: not valid JSON ({exc}); one row of the data schema") from None
    if not isinstance(row, dict):
        raise ConfigError(f"--row {path}: expected a JSON object (one data row), got {type(row).__name__}")
    return row


def _spec_from_config(args: argparse.Namespace) -> RewardSpec:
    from stream_dapo.config import load_config
    from stream_dapo.config.sources import data_sources

    sources = {s.name: s for s in data_sources(load_config(args.config, []))}
    if args.source is None:
        if len(sources) != 1:
            raise ConfigError(f"--config has sources {', '.join(sources)}; pick one with --source NAME")
        return next(iter(sources.values())).reward
    if args.source not in sources:
        raise ConfigError(f"--source {args.source!r} is not in the config; its sources: {', '.join(sources)}")
    return sources[args.source].reward


def _spec(args: argparse.Namespace) -> RewardSpec:
    if args.config:
        if args.reward is not None:
            raise ConfigError("give --reward or --config/--source, not both")
        return _spec_from_config(args)
    if args.source is not None:
        raise ConfigError("--source needs --config FILE (the config that defines the source)")
    name = args.reward or ("math" if args.backend == "builtin" else "math-verify")
    math_options = {
        "pattern": args.pattern,
        "tail_chars": args.tail_chars,
        "max_input_chars": args.max_input_chars,
    }
    spec = parse_reward(name, setting="--reward")
    if spec.kind == "code":
        from stream_dapo.config.schema import VerifierConfig
        from stream_dapo.config.sources import code_options

        verifier = VerifierConfig()
        timeout = verifier.code.wall_s * verifier.code.max_cases + 5.0
        return parse_reward(name, setting="--reward", code=code_options(verifier), timeout_s=timeout)
    if spec.kind == "python":
        return spec
    return parse_reward(name, setting="--reward", math=math_options)


def run(args: argparse.Namespace) -> int:
    """Score one response; print the JSON verdict. Returns 0, or 2 for an unusable reward or option."""
    import dataclasses

    from stream_dapo.verifier.pool import ScoreItem, VerifierPool

    try:
        spec = _spec(args)
        if args.timeout_s is not None:
            spec = dataclasses.replace(spec, timeout_s=args.timeout_s)
        row = _read_row(args.row) if args.row else {}
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, dict):
            reward_model = {}
        gold = args.gold if args.gold is not None else reward_model.get("ground_truth")
        if gold is None:
            raise ConfigError("no gold answer: give --gold, or --row with reward_model.ground_truth")
        extra = row.get("extra_info")
        item = ScoreItem(
            "verify",
            args.text if args.text is not None else sys.stdin.read(),
            str(gold),
            str(args.data_source if args.data_source is not None else row.get("data_source") or ""),
            dict(extra) if isinstance(extra, dict) else {},
        )
        with VerifierPool(num_workers=1, rewards={"verify": spec}) as pool:
            scored = time.perf_counter()
            result = pool.score_batch([item])[0]
        seconds = time.perf_counter() - scored
    except (ConfigError, ValueError) as exc:
        print(f"stream-dapo verify: {exc}", file=sys.stderr)
        return 2
    verdict = {
        "score": result.reward,
        "reason": result.reason,
        "seconds": round(seconds, 4),
        "correct": result.correct,
        "extracted": result.extracted,
        "extras": result.extras,
        "reward": result.reward,
    }
    print(json.dumps(verdict))
    return 0
