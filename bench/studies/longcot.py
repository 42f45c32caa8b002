"""The long chain-of-thought task as the warm model samples it, and μ against π at these lengths.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.longcot [--config configs/tiny-longcot-cpu.toml]
        [--model DIR] [--prompts 64] [--seed 0] [--json docs/results/longcot_task.json]

One vLLM engine (the project's `RolloutEngine`, what a generator runs) samples `--prompts` eval
prompts x group_size at the recipe's settings (temperature, top-p, algo.max_response_len). The
verifier scores every response. Printed and written:

- response length: median, p90, p99, max, the share truncated at the cap, and of the truncated ones
  the share that never wrote an ``Answer:`` line and the share that repeat a line (a loop);
- accuracy and mean length by chain length (``extra_info["num_ops"]``, in buckets): harder (longer)
  problems should be less often right;
- behaviour vs learner log-probs with the same weights: transformers recomputes every sampled
  token's log-prob in float32 (the learner's forward); mean and max |log μ − log π|, and the share of
  tokens whose ratio π/μ leaves [0.9, 1.1], by position bucket (long sequences are where kernels
  and accumulation orders drift apart).

What it does not show: a trained policy (this is the start model), or the same at bfloat16.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from bench.workload import task_prompts, tiny_config  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "tiny-longcot-cpu.toml"
OPS_BUCKETS = ((5, 8), (9, 13), (14, 20), (21, 26))
POSITION_BUCKETS = ((0, 128), (128, 256), (256, 512), (512, 1_000_000))


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _has_loop(text: str) -> bool:
    lines = [line for line in text.splitlines() if line.strip()]
    return len(set(lines)) < len(lines)


def sample(cfg: Any, items: list[Any]) -> list[dict[str, Any]]:
    """Every response of every prompt: tokens, μ, text verdict and the problem's chain length."""
    from transformers import AutoTokenizer

    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.verifier import verify

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    engine = RolloutEngine.start(cfg)
    try:
        by_id = {engine.add_group(item): item for item in items}
        t0, tokens0 = time.perf_counter(), engine.tokens_generated
        done: list[Any] = []
        while len(done) < len(by_id):
            done.extend(engine.step())
        seconds, tokens = time.perf_counter() - t0, engine.tokens_generated - tokens0
    finally:
        engine.close()
    rows = []
    for group in done:
        item = by_id[group.group_id]
        for s in group.samples:
            text = tokenizer.decode(s.token_ids.tolist(), skip_special_tokens=True)
            assert isinstance(text, str)  # one sequence in, one string out
            rows.append(
                {
                    "num_ops": int(item.extra_info["num_ops"]),
                    "prompt": item.prompt_token_ids,
                    "tokens": s.token_ids.tolist(),
                    "mu": s.logprobs.tolist(),
                    "truncated": bool(s.truncated),
                    "correct": verify(text, item.gold).correct,
                    "has_answer": "Answer:" in text,
                    "loop": _has_loop(text),
                }
            )
    print(
        f"sampled {len(rows)} responses, {tokens} tokens in {seconds:.1f} s ({tokens / seconds:,.0f} tokens/s)"
    )
    return rows


def learner_logprobs(model_dir: str, rows: list[dict[str, Any]]) -> None:
    """π: the sampled tokens' log-probs from transformers in float32 (the learner's forward)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for row in rows:
            prompt, response = row["prompt"], row["tokens"]
            logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
            lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
            row["pi"] = lp.tolist()


def report(rows: list[dict[str, Any]], cap: int) -> dict[str, Any]:
    lengths = [len(r["tokens"]) for r in rows]
    truncated = [r for r in rows if r["truncated"]]
    out: dict[str, Any] = {
        "responses": len(rows),
        "cap": cap,
        "length": {
            "median": statistics.median(lengths),
            "p90": _percentile(lengths, 0.9),
            "p99": _percentile(lengths, 0.99),
            "max": max(lengths),
            "mean": statistics.fmean(lengths),
        },
        "accuracy": statistics.fmean(r["correct"] for r in rows),
        "truncation_rate": len(truncated) / len(rows),
        "truncated_without_answer": (
            sum(not r["has_answer"] for r in truncated) / len(truncated) if truncated else 0.0
        ),
        "truncated_with_loop": sum(r["loop"] for r in truncated) / len(truncated) if truncated else 0.0,
        "by_num_ops": [],
        "logprob_mismatch": [],
    }
    for lo, hi in OPS_BUCKETS:
        bucket = [r for r in rows if lo <= r["num_ops"] <= hi]
        if bucket:
            out["by_num_ops"].append(
                {
                    "num_ops": f"{lo}-{hi}",
                    "responses": len(bucket),
                    "accuracy": statistics.fmean(r["correct"] for r in bucket),
                    "mean_length": statistics.fmean(len(r["tokens"]) for r in bucket),
                    "truncation_rate": statistics.fmean(r["truncated"] for r in bucket),
                }
            )
    if all("pi" in r for r in rows):
        import math

        for lo, hi in (*POSITION_BUCKETS, (0, 1_000_000)):
            diffs = [
                p - m
                for r in rows
                for i, (p, m) in enumerate(zip(r["pi"], r["mu"], strict=True))
                if lo <= i < hi
            ]
            if diffs:
                out["logprob_mismatch"].append(
                    {
                        "positions": "all" if (lo, hi) == (0, 1_000_000) else f"{lo}-{min(hi, cap)}",
                        "tokens": len(diffs),
                        "mean_abs": statistics.fmean(abs(d) for d in diffs),
                        "max_abs": max(abs(d) for d in diffs),
                        "ratio_outside_0.9_1.1": sum(not 0.9 <= math.exp(d) <= 1.1 for d in diffs)
                        / len(diffs),
                    }
                )
    return out


def print_report(out: dict[str, Any]) -> None:
    n = out["length"]
    print(
        f"{out['responses']} responses, cap {out['cap']}: length median {n['median']:.0f}, p90 {n['p90']}, "
        f"p99 {n['p99']}, max {n['max']}, mean {n['mean']:.0f}"
    )
    print(
        f"accuracy {out['accuracy']:.3f}; truncated {out['truncation_rate']:.1%}, of which "
        f"{out['truncated_without_answer']:.0%} never wrote Answer: and {out['truncated_with_loop']:.0%} repeat a line"
    )
    print("| num_ops | responses | accuracy | mean length | truncated |\n| :-- | --: | --: | --: | --: |")
    for b in out["by_num_ops"]:
        print(
            f"| {b['num_ops']} | {b['responses']} | {b['accuracy']:.3f} | {b['mean_length']:.0f} | "
            f"{b['truncation_rate']:.1%} |"
        )
    if out["logprob_mismatch"]:
        print("| positions | tokens | mean abs(log mu - log pi) | max | ratio outside [0.9, 1.1] |")
        print("| :-- | --: | --: | --: | --: |")
        for b in out["logprob_mismatch"]:
            print(
                f"| {b['positions']} | {b['tokens']:,} | {b['mean_abs']:.2e} | {b['max_abs']:.2e} | "
                f"{b['ratio_outside_0.9_1.1']:.4%} |"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument(
        "--model", type=Path, default=None, help="model directory (default: model.path, built)"
    )
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="vLLM sampling seed (generator.seed)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    cfg = tiny_config(config=args.config)
    if args.model is None:
        from stream_dapo.model.warmup import ensure_warm_model

        model_dir = ensure_warm_model(cfg).resolve()
    else:
        model_dir = args.model.resolve()
    cfg = tiny_config([f"model.path={model_dir}", f"generator.seed={args.seed}"], config=args.config)
    items = task_prompts(cfg, model_dir, split="eval")[: args.prompts]
    rows = sample(cfg, items)
    learner_logprobs(str(model_dir), rows)
    out = report(rows, cfg.algo.max_response_len)
    out.update(
        config=str(args.config.relative_to(REPO)), model=str(model_dir), prompts=len(items), seed=args.seed
    )
    print_report(out)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        save_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
