"""Learner memory at long context: full logits vs chunked log-probs, checkpointing off vs on.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.perf.learner_memory [--quick]

A model of Qwen2.5-0.5B's shapes where they matter for memory (vocabulary 151,936, hidden 896,
intermediate 4864, 14 heads / 2 key-value heads, tied embeddings) but with `LAYERS` decoder
layer(s), so that two cores finish; float32, random weights (seed 0). One training step of the
project's `Learner.train_step` (plain torch engine: AdamW, clipping; `bench/perf/learner.py`) on one
micro-batch of T tokens: a group of two sequences of T/2 tokens (64 prompt tokens each),
ratio_mode = behaviour (no proximal forward; the decoupled mode adds one no-grad forward per
rollout batch, not per step), entropy as a metric (entropy_coef 0, the recipe's).

Each point runs in its own subprocess so its peak resident memory (ru_maxrss) is its own. Reported:
peak RSS, peak RSS above the process's footprint after imports (what the learner itself adds), the
step's wall time, and `stream-dapo plan --memory`'s estimate of the same step (float32, ZeRO-0,
no reserve) beside it. Points whose estimate exceeds `MAX_ESTIMATE_GIB` are skipped, not run (the
machine is shared; a process stays under ~10 GiB), and say so. One step per point: the first step
of a fresh process (AdamW state allocated in it), so step time includes that; no repeats (the 8k
chunked step alone takes minutes on two cores), so the times carry no spread.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from stream_dapo.runtime.host import code_version  # noqa: E402
from stream_dapo.tools.memory_plan import GIB, ModelShape, Settings, estimate  # noqa: E402

LAYERS = 1
SHAPE = ModelShape(
    layers=LAYERS, hidden=896, intermediate=4864, heads=14, kv_heads=2, vocab=151936, tied=True
)
LENGTHS = (1024, 2048, 4096, 8192)
CHUNK = 1024
MAX_ESTIMATE_GIB = 10.0
PROMPT = 64
OUT = REPO / "docs" / "results" / "learner_memory.json"


def points(lengths: tuple[int, ...]) -> list[dict[str, Any]]:
    """Full and chunked at every length; checkpointing on at the second-smallest length, both paths
    (with one layer its effect is small next to the loss path's, and each 8k step takes minutes)."""
    out = [{"tokens": t, "chunk": c, "checkpointing": False} for t in lengths for c in (0, CHUNK)]
    t = lengths[min(1, len(lengths) - 1)]
    out += [{"tokens": t, "chunk": c, "checkpointing": True} for c in (0, CHUNK)]
    return out


def settings(point: dict[str, Any]) -> Settings:
    return Settings(
        dtype_bytes=4,
        zero_stage=0,
        micro_batch_tokens=point["tokens"],
        logprob_chunk_tokens=point["chunk"],
        gradient_checkpointing=point["checkpointing"],
        offload_optimizer="none",
        offload_param="none",
    )


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(point: dict[str, Any], threads: int) -> dict[str, Any]:
    """One training step at ``point``, in this process; returns its figures."""
    import numpy as np
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.perf.learner import torch_learner
    from stream_dapo.config import Config
    from stream_dapo.transport.messages import Group, Sample

    torch.set_num_threads(threads)
    rss_imports = _rss_bytes()
    t = point["tokens"]
    half = t // 2
    cfg = Config.model_validate(
        {
            "model": {"max_prompt_len": PROMPT, "path": "unused"},
            "algo": {"group_size": 2, "max_response_len": half - PROMPT, "ratio_mode": "behaviour"},
            "learner": {
                "mini_batch_samples": 2,
                "rollout_batch_prompts": 1,
                "micro_batch_tokens": t,
                "logprob_chunk_tokens": point["chunk"],
                "gradient_checkpointing": point["checkpointing"],
            },
        }
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(**SHAPE.to_hf_config(), max_position_embeddings=max(t, 2048))
    ).float()
    learner = torch_learner(cfg, model)
    rng = np.random.default_rng(0)
    n = half - PROMPT
    samples = [
        Sample(
            tokens=rng.integers(0, SHAPE.vocab, n).astype(np.int32),
            logprobs=np.full(n, -11.9, np.float32),
            versions=np.zeros(n, np.int32),
            reward=r,
            correct=r > 0,
            truncated=False,
            advantage=r,
        )
        for r in (1.0, -1.0)
    ]
    group = Group(
        group_id="g",
        prompt_id="p",
        generator_id="bench",
        gold="1",
        prompt_tokens=rng.integers(0, SHAPE.vocab, PROMPT).astype(np.int32),
        created_at=0.0,
        samples=samples,
    )
    batch = learner.prepare([group])
    assert len(batch.micro_batches) == 1 and batch.micro_batches[0].input_ids.numel() == t
    rss_before = _rss_bytes()
    start = time.perf_counter()
    metrics = learner.train_step(batch)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "peak_rss_gib": peak / GIB,
        "rss_after_imports_gib": rss_imports / GIB,
        "rss_before_step_gib": rss_before / GIB,
        "learner_peak_gib": (peak - rss_imports) / GIB,
        "step_seconds": seconds,
        "loss": metrics.loss,
        "entropy": metrics.entropy,
        "grad_norm": metrics.grad_norm,
    }


def with_estimate(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with the memory plan's current estimate of its point (float32, ZeRO-0, no reserve)."""
    est = estimate(SHAPE, settings(row), gpus=1, reserve_gib=0)
    row["estimate_gib"] = est.total / GIB
    row["estimate_items_gib"] = {
        "weights": est.weights / GIB,
        "gradients": est.gradients / GIB,
        "optimizer": est.optimizer / GIB,
        "activations": est.activations / GIB,
        "loss_path": est.loss_path / GIB,
    }
    return row


def run_point(point: dict[str, Any], threads: int, max_gib: float = MAX_ESTIMATE_GIB) -> dict[str, Any]:
    row = with_estimate(dict(point))
    row["commit"] = code_version(REPO)
    if row["estimate_gib"] > max_gib:
        row["skipped"] = f"estimate {row['estimate_gib']:.1f} GiB > {max_gib:g} GiB (--max-gib)"
        print(f"  {_label(point)}: skipped, {row['skipped']}", flush=True)
        return row
    cmd = [sys.executable, "-m", __spec__.name, "--child", json.dumps(point), "--threads", str(threads)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    if proc.returncode != 0:
        row["error"] = (
            proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        )
        print(f"  {_label(point)}: FAILED {row['error']}", flush=True)
        return row
    row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(
        f"  {_label(point)}: peak RSS {row['peak_rss_gib']:.2f} GiB (learner {row['learner_peak_gib']:.2f}, "
        f"estimate {row['estimate_gib']:.2f}), step {row['step_seconds']:.1f} s",
        flush=True,
    )
    return row


def _label(point: dict[str, Any]) -> str:
    path = "full" if point["chunk"] == 0 else f"chunk {point['chunk']}"
    return f"T={point['tokens']:5d} {path:10s} ckpt {'on ' if point['checkpointing'] else 'off'}"


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's goal at the longest length: chunked peak <= 1/4 of full, step time <= 1.3x.
    Where the full point was skipped, its estimate stands in (said so)."""

    def find(t: int, chunk: int, ckpt: bool = False) -> dict[str, Any] | None:
        return next(
            (r for r in rows if r["tokens"] == t and r["chunk"] == chunk and r["checkpointing"] == ckpt), None
        )

    out: dict[str, Any] = {}
    for t in sorted({r["tokens"] for r in rows}):
        full, chunked = find(t, 0), find(t, CHUNK)
        if full is None or chunked is None or "learner_peak_gib" not in chunked:
            continue
        entry: dict[str, Any] = {"chunked_learner_peak_gib": chunked["learner_peak_gib"]}
        if "learner_peak_gib" in full:
            entry["full_learner_peak_gib"] = full["learner_peak_gib"]
            entry["peak_ratio"] = chunked["learner_peak_gib"] / full["learner_peak_gib"]
            entry["time_ratio"] = chunked["step_seconds"] / full["step_seconds"]
        else:
            entry["full_estimate_gib"] = full["estimate_gib"]
            entry["peak_ratio_vs_full_estimate"] = chunked["learner_peak_gib"] / full["estimate_gib"]
        out[str(t)] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 2k tokens only")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (default 2)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--max-gib",
        type=float,
        default=MAX_ESTIMATE_GIB,
        help=f"skip points whose estimate exceeds this (default {MAX_ESTIMATE_GIB:g}: a shared machine)",
    )
    parser.add_argument(
        "--only",
        metavar="T/CHUNK/CKPT,...",
        help="run only these points (e.g. 1024/1024/off,2048/1024/on) and replace them in --out, keeping "
        "the other rows; every row's estimate is recomputed with the current plan",
    )
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child), args.threads)))
        return
    lengths = LENGTHS[:2] if args.quick else LENGTHS
    print(f"learner memory: {SHAPE} ({SHAPE.params / 1e6:.0f}M parameters), float32, {args.threads} threads")
    started = time.time()
    if args.only:
        todo = []
        for item in args.only.split(","):
            t, c, ckpt = item.split("/")
            todo.append({"tokens": int(t), "chunk": int(c), "checkpointing": ckpt == "on"})
        old = json.loads(args.out.read_text())
        fresh = [run_point(p, args.threads, args.max_gib) for p in todo]
        key = ("tokens", "chunk", "checkpointing")
        rows = [r for r in old["rows"] if not any(all(r[k] == f[k] for k in key) for f in fresh)] + fresh
        rows = [
            with_estimate(r)
            for r in sorted(rows, key=lambda r: (r["checkpointing"], r["tokens"], r["chunk"]))
        ]
        wall = old.get("wall_seconds", 0.0) + time.time() - started
        command = old["command"] + f" && ... --only {args.only}"
    else:
        rows = [run_point(p, args.threads, args.max_gib) for p in points(lengths)]
        wall = time.time() - started
        command = "flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.perf.learner_memory" + (
            " --quick" if args.quick else ""
        )
    result = {
        "shape": SHAPE.__dict__,
        "params": SHAPE.params,
        "chunk_tokens": CHUNK,
        "threads": args.threads,
        "torch_threads_note": "one step per point, first step of a fresh process; no repeats",
        "max_estimate_gib": MAX_ESTIMATE_GIB,
        "rows": rows,
        "summary": summarise(rows),
        "wall_seconds": wall,
        "command": command,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_json(args.out, result, indent=1)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.out} ({result['wall_seconds']:.0f} s)")


if __name__ == "__main__":
    main()
