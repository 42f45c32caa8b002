"""Is the warm-up's training a function of its config, on this machine and across machines?

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.warmup_determinism
        [--config configs/tiny-longcot-cpu.toml] [--steps 60] [--repeats 2]
        [--json docs/results/warmup_determinism.json] [--compare docs/results/warmup_determinism.json]

The first ``--steps`` optimizer steps of the warm-up's first phase (the config's data, init seed,
batch size, lr and lr schedule, batch order), run from the same untrained model with exactly 1 and
exactly 2 torch threads, ``--repeats`` times each, interleaved (1, 2, 1, 2, ...). Printed and
written: every run's loss at every step (full precision) and a sha256 of its final weights; whether
the repeats agree bit for bit, whether the thread counts do, and the largest weight difference
between them.

``--compare`` reads a JSON this script wrote (on another machine, say) and reports the first step
whose loss differs and by how much: the warm-up's outcome is chaotic in its early steps (a tiny model
learns this task through an abrupt transition), so a difference in the last bit there can end in a
different model after 3,400 steps. The JSON records the CPU model, the ISA level torch dispatched to
and the library versions, which is what such a difference would come from.

What it does not show: where two trajectories that part end up (that takes the whole warm-up), or
anything about the RL runs that start from the warm model.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from bench.workload import tiny_config  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "tiny-longcot-cpu.toml"


def weights_digest(model: Any) -> str:
    """sha256 over every parameter's bytes, in the model's parameter order."""
    h = hashlib.sha256()
    for name, param in model.state_dict().items():
        h.update(name.encode())
        h.update(param.detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def first_difference(a: list[float], b: list[float]) -> dict[str, Any] | None:
    """The first step whose loss differs between two trajectories, and the largest gap after it."""
    for step, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            gaps = [abs(p - q) for p, q in zip(a[step:], b[step:], strict=False)]
            return {"step": step, "loss_a": x, "loss_b": y, "max_gap_after": max(gaps)}
    return None


def machine() -> dict[str, Any]:
    """What a difference in the numerics would come from."""
    import numpy
    import torch
    import transformers

    from stream_dapo.runtime.host import cpu_model

    return {
        "cpu": cpu_model(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
    }


def run_once(
    cfg: Any, init_dir: Path, examples: list[Any], pad_id: int, *, threads: int, steps: int
) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    from stream_dapo.model.warmup import train_supervised

    w = cfg.warmup
    model = AutoModelForCausalLM.from_pretrained(init_dir, dtype=torch.float32)
    losses: list[float] = []
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(w.seed)  # as warmup() does before its phases
        train_supervised(
            model,
            examples,
            steps=w.steps,
            stop_after=steps,
            batch_size=w.batch_size,
            lr=w.lr,
            seed=w.seed,
            pad_id=pad_id,
            threads=threads,
            log_every=0,
            by_length=w.batch_by_length,
            on_step=lambda _step, loss: losses.append(loss),
        )
    seconds = time.perf_counter() - t0
    return {
        "threads": threads,
        "seconds_per_step": seconds / steps,
        "weights_sha256": weights_digest(model),
        "losses": losses,
        "_state": {k: v.detach().clone() for k, v in model.state_dict().items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per thread count (default 2)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--compare", type=Path, default=None, help="a JSON of this script to compare with")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error("--steps and --repeats must be at least 1")
    reference = None
    if args.compare is not None:
        try:
            reference = json.loads(args.compare.read_text())
            reference_losses = reference["runs"][0]["losses"]
        except (OSError, ValueError, KeyError, IndexError) as exc:
            parser.error(f"--compare {args.compare}: not a JSON written by this script ({exc})")

    import torch
    from transformers import AutoTokenizer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.tiny import init_model
    from stream_dapo.model.warmup import build_examples, tiny_spec

    with tempfile.TemporaryDirectory(prefix="warmup-determinism-") as tmp:
        cfg = tiny_config([f'run.out_dir="{tmp}"'], config=args.config)
        spec = tiny_spec(cfg)
        torch.set_num_threads(1)
        train_path, _ = ensure_synthetic_data(cfg.data, Path(tmp) / "data")
        init_dir = init_model(Path(tmp) / "init", seed=cfg.warmup.seed, spec=spec)
        tokenizer = AutoTokenizer.from_pretrained(init_dir)
        items, _ = load_prompts(train_path, tokenizer, spec.max_position_embeddings)
        examples = build_examples(items, tokenizer)
        runs = []
        for repeat in range(args.repeats):
            for threads in (1, 2):
                result = run_once(
                    cfg, init_dir, examples, tokenizer.pad_token_id, threads=threads, steps=args.steps
                )
                result["repeat"] = repeat
                runs.append(result)
                print(
                    f"repeat {repeat} threads {threads}: loss {result['losses'][0]:.6f} -> "
                    f"{result['losses'][-1]:.6f}, {result['seconds_per_step']:.3f} s/step, "
                    f"weights {result['weights_sha256'][:16]}",
                    flush=True,
                )

    by_threads = {t: [r for r in runs if r["threads"] == t] for t in (1, 2)}
    repeats_agree = {t: len({r["weights_sha256"] for r in rs}) == 1 for t, rs in by_threads.items()}
    a, b = by_threads[1][0], by_threads[2][0]
    max_weight_diff = max(float((a["_state"][k] - b["_state"][k]).abs().max()) for k in a["_state"])
    summary: dict[str, Any] = {
        "config": str(args.config),
        "steps": args.steps,
        "repeats": args.repeats,
        "machine": machine(),
        "repeats_agree_bitwise": {str(t): v for t, v in repeats_agree.items()},
        "thread_counts_agree_bitwise": a["weights_sha256"] == b["weights_sha256"],
        "max_weight_diff_1_vs_2_threads": max_weight_diff,
        "first_loss_difference_1_vs_2_threads": first_difference(a["losses"], b["losses"]),
    }
    if reference is not None:
        summary["compared_with"] = {
            "file": str(args.compare),
            "machine": reference.get("machine"),
            "weights_agree_bitwise": reference["runs"][0]["weights_sha256"] == a["weights_sha256"]
            if reference.get("steps") == args.steps
            else None,
            "first_loss_difference": first_difference(reference_losses, a["losses"]),
        }
    print(json.dumps(summary, indent=2))
    for r in runs:
        del r["_state"]
    save_json(args.json, {**summary, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
