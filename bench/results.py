"""Run the benchmarks and write docs/RESULTS.md, docs/results/results.json and docs/results/*.png.

    python -m bench.results [--quick] [--only NAME,...] [--out DIR] [--render-only]

Sections (each a function in bench/ that returns a dict; this script only sequences and renders):

    generation     bench/perf/generation.py   vLLM (the project's RolloutEngine) vs transformers generate
    learner        bench/perf/learner.py      DeepSpeed ZeRO 0/2/3 vs plain torch, trained tokens/s
    packing        bench/perf/learner.py      the packer's efficiency vs naive padding
    transport      bench/perf/transport.py    codec, loopback TCP, raw ZeroMQ, memcpy
    weight_sync    bench/perf/weight_sync.py  file vs stream vs delta vs raw frames; into vLLM; changed bytes
    async_vs_sync  bench/perf/async_vs_sync.py  end-to-end samples/s of both modes

Each section runs in its own Python process (vLLM, DeepSpeed's process group and torch's thread
settings do not leak between sections), and its result is merged into OUT/results/results.json as
soon as it finishes; the page is then rendered from everything saved there, together with what
other tools left in OUT/results/ (ablation/ablation.md, peer_trl.json, drill.json, fuzz.json).
So `--only transport` reruns one section and keeps the others' numbers, and `--render-only`
re-renders the page from saved numbers. `--quick` runs every section at smoke-test sizes; its
numbers are marked as such on the page.

Hold the machine while measuring: `flock /tmp/stream-dapo-cpu.lock python -m bench.results`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

from bench.report import fmt, fmt_ratio, machine_info, markdown_table  # noqa: E402

RESULTS_JSON = "results.json"


@dataclass(frozen=True)
class Section:
    title: str
    module: str
    function: str
    script: str
    """The standalone command of the same measurement (`python -m <script>`)."""


SECTIONS: dict[str, Section] = {
    "generation": Section(
        "Generator: vLLM vs transformers",
        "bench.perf.generation",
        "measure_generation",
        "bench.perf.generation",
    ),
    "learner": Section(
        "Learner: DeepSpeed ZeRO vs plain torch",
        "bench.perf.learner",
        "measure_learner",
        "bench.perf.learner --only learner",
    ),
    "packing": Section(
        "Packing efficiency", "bench.perf.learner", "measure_packing", "bench.perf.learner --only packing"
    ),
    "transport": Section(
        "Transport", "bench.perf.transport", "measure_transport", "bench.perf.transport --json"
    ),
    "weight_sync": Section(
        "Weight sync", "bench.perf.weight_sync", "measure_weight_sync", "bench.perf.weight_sync"
    ),
    "async_vs_sync": Section(
        "Async vs sync, end to end",
        "bench.perf.async_vs_sync",
        "measure_async_vs_sync",
        "bench.perf.async_vs_sync",
    ),
}


# --------------------------------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------------------------------


def section_command(name: str, quick: bool) -> str:
    return f"python -m bench.results --only {name}" + (" --quick" if quick else "")


def standalone_command(name: str, quick: bool) -> str:
    """The section's own script with the sizes `run_child` uses."""
    if name == "async_vs_sync":
        return f"python -m {SECTIONS[name].script} " + (
            "--steps 2 --repeats 1" if quick else "--steps 40 --repeats 2"
        )
    return f"python -m {SECTIONS[name].script}" + (" --quick" if quick else "")


def run_child(name: str, quick: bool) -> dict[str, Any]:
    """`name`'s measure function in the current process (the --child side)."""
    import importlib

    section = SECTIONS[name]
    fn: Callable[..., dict[str, Any]] = getattr(importlib.import_module(section.module), section.function)
    if name == "async_vs_sync":
        return fn(steps=2, repeats=1) if quick else fn(steps=40, repeats=2)
    return fn(quick=quick)


def run_section(name: str, quick: bool, log_dir: Path) -> dict[str, Any]:
    """Run one section in a child process; return its results.json entry."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        out = Path(tmp) / "result.json"
        argv = [sys.executable, "-m", "bench.results", "--child", name, "--child-out", str(out)]
        if quick:
            argv.append("--quick")
        # A section is a world of its own: never inherit a parent's torch.distributed variables
        # (a parent that ran an in-process learner may still hold its MASTER_PORT).
        from stream_dapo.tools.launch import LAUNCHER_VARS

        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        with log.open("w") as f:
            proc = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
            raise RuntimeError(
                f"section {name} failed (exit {proc.returncode}); last lines of {log}:\n{tail}"
            )
        data = json.loads(out.read_text())
    return {
        "section": name,
        "command": section_command(name, quick),
        "standalone": standalone_command(name, quick),
        "quick": quick,
        "finished_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "machine": machine_info(),
        "data": data,
    }


def load_results(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get("sections", {}))


def save_results(path: Path, sections: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = {name: sections[name] for name in SECTIONS if name in sections}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"sections": ordered}, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)


# --------------------------------------------------------------------------------------------------
# Rendering: one function per section, entry -> Markdown
# --------------------------------------------------------------------------------------------------


def _med(summary: dict[str, Any]) -> float:
    return float(summary["median"])


def _range(summary: dict[str, Any], scale: float = 1.0) -> str:
    return f"{fmt(summary['min'] * scale)}–{fmt(summary['max'] * scale)}"


def _header(name: str, entry: dict[str, Any]) -> str:
    lines = [f"Command: `{entry['command']}` (standalone: `{entry['standalone']}`)."]
    lines.append(f"Measured {entry['finished_at']} in {fmt(entry['wall_seconds'])} s.")
    if entry.get("quick"):
        lines.append("")
        lines.append(
            "> **Smoke-test sizes (`--quick`)**: these numbers check that the benchmark runs; do not quote them."
        )
    return "\n".join(lines) + "\n\n"


def render_generation(d: dict[str, Any]) -> str:
    tps, start, lengths = d["tokens_per_second"], d["startup_seconds"], d["response_length"]
    variants = (
        ("vllm", f"vLLM (RolloutEngine), worker on {d['threads']} core(s)"),
        ("transformers", f"transformers generate, {d['threads']} thread(s)"),
        ("transformers_all_cores", f"transformers generate, {d['all_cores']} threads"),
    )
    rows = [
        [
            label,
            fmt(_med(tps[k])),
            _range(tps[k]),
            fmt(start[k.removesuffix("_all_cores")]),
            fmt(lengths[k]["mean"]),
            f"{fmt(100 * lengths[k]['truncated_fraction'])}%",
        ]
        for k, label in variants
    ]
    return (
        f"Warm tiny model, {d['prompts_per_repeat']} synthetic-task prompts per repeat (chat template) x "
        f"G = {d['group_size']} samples = {d['samples_per_repeat']} responses, at most {d['max_tokens']} "
        f"tokens, temperature {d['temperature']}, top-p {d['top_p']}, "
        f"{d['repeats']} interleaved repeats after one warm-up round.\n\n"
        + markdown_table(
            ["engine", "response tokens/s", "min–max", "start-up s (excluded)", "mean tokens", "truncated"],
            rows,
        )
        + f"\n**vLLM / transformers (same threads): {fmt_ratio(d['ratio_vllm_vs_transformers'])}**; "
        f"vLLM / transformers with {d['all_cores']} threads: "
        f"{fmt_ratio(d['ratio_vllm_vs_transformers_all_cores'])} (medians of the per-repeat ratios).\n\n"
        "vLLM runs the model in a worker bound to generator.threads cores, but its scheduler and the "
        "output handling run in processes of their own, so it can use more than that: hence the "
        "second transformers line, with a thread per core. vLLM also returns the sampled token's "
        "log-prob at every position (the generator needs it); transformers samples all responses as "
        "one left-padded batch and keeps stepping until the longest one ends. Start-up: vLLM's engine "
        "processes and KV cache vs loading the model (once, for both transformers lines).\n"
    )


def render_learner(d: dict[str, Any]) -> str:
    mb = d["mini_batch"]
    labels = {
        "torch": "plain torch",
        "zero0": "DeepSpeed ZeRO-0",
        "zero2": "DeepSpeed ZeRO-2",
        "zero3": "DeepSpeed ZeRO-3",
    }
    rows = []
    for k, label in labels.items():
        s = d["tokens_per_second"][k]
        rows.append(
            [label, fmt(_med(s)), _range(s), "1×" if k == "torch" else fmt_ratio(d["ratio_vs_torch"][k])]
        )
    losses = set(d["first_loss"].values())
    same = (
        "identical"
        if len(losses) == 1
        else "NOT identical: " + ", ".join(f"{k} {v:.6g}" for k, v in d["first_loss"].items())
    )
    return (
        f"Tiny Qwen2 ({fmt(d['params'])} parameters, fp32), one process, torch {d['torch_threads']} threads; "
        f"mini-batch of {mb['groups']} groups x {mb['samples'] // mb['groups']} = {mb['samples']} samples, "
        f"{fmt(mb['real_tokens'])} real tokens ({fmt(mb['loss_tokens'])} in the loss) in {mb['micro_batches']} "
        f"micro-batch(es) of <= {fmt(mb['micro_batch_tokens'])} tokens (packing efficiency "
        f"{fmt(mb['packing_efficiency'])}); {d['steps']} interleaved steps per learner after "
        f"{d['warmup_steps']} warm-up steps.\n\n"
        + markdown_table(["learner", "trained tokens/s", "min–max", "vs plain torch"], rows)
        + f"\nFirst-step losses {same} across the four learners (same data, same initial weights). "
        "Every learner runs the project's `Learner.train_step` (packing, decoupled DAPO loss with its "
        "proximal forward, clipping, AdamW); plain torch swaps only DeepSpeed's engine for "
        "`backward()` + `clip_grad_norm_` + `AdamW.step()`. World size 1: ZeRO-2/3 have nothing to "
        "partition across, so this is their bookkeeping cost, not their memory benefit.\n"
    )


def render_packing(d: dict[str, Any]) -> str:
    rows = []
    for key, label in (
        ("tiny", "tiny task (tiny-cpu)"),
        ("long_cot", "long CoT, modelled (32B recipe limits)"),
    ):
        c = d[key]
        e = c["efficiency"]
        rows.append(
            [
                label,
                c["mini_batch_samples"],
                fmt(c["micro_batch_tokens"]),
                fmt(c["max_len"]),
                fmt(_med(c["mean_sequence_tokens"])),
                fmt(_med(e["packer"])),
                fmt(_med(e["pad_to_longest"])),
                fmt(_med(e["pad_to_max_length"])),
                fmt_ratio(c["packer_vs_pad_to_max_length"]),
                fmt(round(_med(c["micro_batches"]))),
            ]
        )
    draws = d["tiny"]["draws"]
    return (
        "Real tokens / processed tokens (higher is better), median over "
        f"{draws} random mini-batches per distribution.\n\n"
        + markdown_table(
            [
                "length distribution",
                "samples",
                "token budget",
                "max length",
                "mean tokens/seq",
                "packer",
                "pad to longest",
                "pad to max length",
                "packer / pad to max",
                "micro-batches",
            ],
            rows,
        )
        + "\n- packer: `pack_micro_batches` (sort by length, cut greedily so rows x longest row stays "
        "within `learner.micro_batch_tokens`);\n"
        "- pad to longest: every row of the mini-batch padded to its longest sequence;\n"
        "- pad to max length: every row padded to `max_prompt_len + max_response_len`.\n\n"
        f"Tiny task: {d['tiny']['source']}. Long CoT: {d['long_cot']['source']} — a model of long "
        "chain-of-thought rollouts, not a measurement.\n"
    )


def render_transport(d: dict[str, Any]) -> str:
    rows = []
    for g in d["groups"]:
        payload = f"{fmt(g['response_tokens'])} tok x {g['samples']} ({fmt(g['message_bytes'] / 1e6)} MB)"
        lb = g["loopback"]
        for key, label in (
            ("encode", "encode"),
            ("decode", "decode"),
            ("encode+decode", "encode + decode"),
            ("from_wire", "typed from maps (from_map)"),
        ):
            r = g["codec"][key]
            rows.append([payload, label, fmt(_med(r["gb_per_s"])), fmt(_med(r["msgs_per_s"])), ""])
        rows.append(
            [
                payload,
                "TCP loopback, codec",
                fmt(_med(lb["codec"]["gb_per_s"])),
                fmt(_med(lb["codec"]["msgs_per_s"])),
                fmt_ratio(lb["codec_vs_memcpy"]),
            ]
        )
        rows.append(
            [
                payload,
                "TCP loopback, raw frames",
                fmt(_med(lb["raw"]["gb_per_s"])),
                fmt(_med(lb["raw"]["msgs_per_s"])),
                fmt_ratio(lb["raw_vs_memcpy"]),
            ]
        )
        rows.append([payload, "numpy copy, same bytes", fmt(_med(lb["memcpy"]["gb_per_s"])), "", "1×"])
    push = [
        [
            f"{p['frame_bytes'] >> 20} MiB",
            p["frames_per_round"],
            fmt(_med(p["zmq"]["gb_per_s"])),
            fmt(_med(p["zmq"]["msgs_per_s"])),
            fmt(_med(p["memcpy"]["gb_per_s"])),
            fmt_ratio(p["zmq_vs_memcpy"]),
        ]
        for p in d["push_pull"]
    ]
    ratios = "; ".join(
        f"{fmt(g['response_tokens'])}-token groups {fmt_ratio(g['loopback']['codec_vs_raw'])}"
        for g in d["groups"]
    )
    mc = d["memcpy"]
    return (
        f"`groups` messages of one group of 16 samples (12 bytes per response token), {d['repeats']} "
        "repeats. Loopback: the sender is its own process (one encodes every message, one resends a "
        "pre-encoded frame); the receiver validates and decodes. The loopback rounds interleave with a "
        "numpy copy of the same bytes, and the ratios are paired per repeat.\n\n"
        + markdown_table(["payload", "path", "GB/s", "messages/s", "vs memcpy"], rows, "llrrr")
        + f"\nOver loopback, the codec path moves this fraction of the raw frames' bytes/s: {ratios}.\n\n"
        "Raw ZeroMQ PUSH/PULL of large bytes frames over TCP loopback (sender in its own process), "
        "interleaved with a numpy copy of the same bytes:\n\n"
        + markdown_table(["frame", "frames/round", "GB/s", "frames/s", "memcpy GB/s", "vs memcpy"], push)
        + f"\nReference: numpy copy of {mc['bytes'] >> 20} MB: **{fmt(_med(mc['gb_per_s']))} GB/s** "
        "(the machine's memory-bandwidth ceiling for any transport).\n"
    )


_WS_PATHS = (
    ("raw", "raw ZeroMQ frames (ceiling)"),
    ("file", "file: one chunk at a time, temp file, read back"),
    ("stream", "stream: window of 4, into shared memory"),
    ("delta", "delta: stream against the held version"),
)


def _ws_cases(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    cases = [
        (f"synthetic fp32, {fmt(c['payload_bytes'] / 1e6)} MB", c) for c in d.get("transfer", {}).values()
    ]
    if "vllm" in d:
        v = d["vllm"]
        cases.append(
            (f"into vLLM, Qwen2 {fmt(v['parameters'] / 1e6)}M fp32, {fmt(v['payload_bytes'] / 1e6)} MB", v)
        )
    return cases


def render_weight_sync(d: dict[str, Any]) -> str:
    if "transfer" not in d and "vllm" not in d:
        return "Measured before issue 38's rewrite; rerun `python -m bench.results --only weight_sync`.\n"
    rows = []
    for label, c in _ws_cases(d):
        for path, plabel in _WS_PATHS:
            sent = c["wire_bytes"].get(path)
            rows.append(
                [
                    label,
                    plabel,
                    fmt(_med(c["gb_per_s"][path])),
                    _range(c["gb_per_s"][path]),
                    fmt(_med(c["seconds"][path])),
                    fmt(_med(sent) / 1e6) if sent else "",
                    fmt_ratio(c["vs_raw"][path]) if path != "raw" else "1×",
                ]
            )
    ratios = "; ".join(
        f"{label}: stream / file {fmt_ratio(c['stream_vs_file'])}, delta / stream {fmt_ratio(c['delta_vs_stream'])}"
        for label, c in _ws_cases(d)
    )
    out = (
        f"One version published per repeat and taken by each path; repeats interleaved (order rotated), "
        f"the learner's `WeightServer` in its own process, chunks of {fmt(d['chunk_bytes'] >> 20)} MiB over "
        f"loopback TCP, window {d['window']}. Seconds run from the publish call (the server hashes every chunk) "
        "to the version checked in the receiver's memory, or, into vLLM, to the engine sampling from it. Each "
        "version moves 1% of the elements of a fixed fp32 state by ~1e-3 relative (two versions differ in ~2% "
        "of the elements). The raw line moves the same number of chunk-sized frames by PUSH/PULL from another "
        "process, no protocol: the wire's ceiling in the same run.\n\n"
        + markdown_table(
            ["state", "path", "GB/s", "min–max", "seconds", "MB sent", "vs raw (paired)"],
            rows,
            "llrrrrr",
        )
        + f"\nRatios of GB/s, paired per repeat: {ratios}.\n"
    )
    if "vllm" in d:
        loads = d["vllm"]["engine_load_seconds"]
        out += (
            f"\nThe engine's share (pause, reload, spot check, resume): from the file {fmt(_med(loads['file']))} s, "
            f"from shared memory {fmt(_med(loads['image']))} s (medians).\n"
        )
    changed = d.get("changed", {})
    crow = []
    for key, label in (
        ("smollm2_135m_gsm", "SmolLM2-135M, GSM-Symbolic run"),
        ("tiny_cpu", "tiny recipe run"),
        ("synthetic", "synthetic state (--quick)"),
    ):
        if key not in changed:
            continue
        for dtype in ("fp32", "bf16"):
            for r in changed[key][dtype]:
                crow.append(
                    [
                        label,
                        dtype,
                        f"{r['from']} → {r['to']}",
                        fmt(r["bytes"] / 1e6),
                        f"{100 * r['changed_byte_fraction']:.1f}%",
                        f"{100 * r['sent_fraction']:.1f}%",
                        f"{r['chunks']['reused']} / {r['chunks']['delta']} / {r['chunks']['raw']}",
                    ]
                )
    if crow:
        out += (
            "\nChanged bytes between consecutive versions of real runs (as published, fp32, and cast to bf16 "
            "as a bf16 learner would publish them), and what a delta transfer sent (the real server and "
            "receiver, the previous version held as the base):\n\n"
            + markdown_table(
                [
                    "run",
                    "dtype",
                    "versions",
                    "MB",
                    "bytes changed",
                    "bytes sent",
                    "chunks reused / delta / raw",
                ],
                crow,
                "lllrrrr",
            )
        )
    return out + (
        "\nNot shown: more than one receiver (relays and the learner's egress with 1-8 receivers: "
        "[weight fan-out](weight_fanout.md)), a real network (loopback has no bandwidth limit, where deltas pay "
        "most), GPU engines (NCCL is unchanged), a first transfer into fresh shared memory (the rounds reuse "
        "the spare image, as a generator does), and the long-CoT recipe's model.\n"
    )


def render_async_vs_sync(d: dict[str, Any]) -> str:
    from bench.report import median

    gen, trained = d["generated_samples_per_second"], d["trained_samples_per_second"]
    rows = [[mode, fmt(median(gen[mode])), fmt(median(trained[mode]))] for mode in ("async", "sync")]
    rows.append(["async / sync", fmt_ratio(d["ratio_generated"]), fmt_ratio(d["ratio_trained"])])
    return (
        f"`stream-dapo run` ({d['config']}, no evaluation) for {d['steps']} optimizer steps per run, "
        f"{d['repeats']} interleaved repeats of each mode, {d['cores']} cores.\n\n"
        + markdown_table(["mode", "generated samples/s", "trained samples/s"], rows)
        + "\n"
    )


def time_to_target_row(results_dir: Path) -> str:
    """The status row under the async-vs-sync section: where its time-to-target figures are."""
    row = (
        "| time to a target eval accuracy, async vs sync | tiny-cpu: one seed (`python -m bench.studies.async_sync_ttt`, "
        "[its page](async_sync_ttt.md))"
    )
    path = results_dir / "async_sync_ttt_longcot.json"
    try:
        d = json.loads(path.read_text())
        ratio = d["over_seeds"]["ratio_sync_over_async"]
        row += (
            f"; long-CoT recipe: {ratio['n']} seeds, sync/async {ratio['mean']:.2f} ± {ratio['std']:.2f} to "
            f"+{round(100 * d['target_delta'])} points (`{path.name}`, [the long chain-of-thought page](longcot.md))"
        )
    except (OSError, ValueError, KeyError, TypeError):
        pass  # not measured yet, or an older file: the tiny-cpu figure alone
    return row + ". |\n"


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "generation": render_generation,
    "learner": render_learner,
    "packing": render_packing,
    "transport": render_transport,
    "weight_sync": render_weight_sync,
    "async_vs_sync": render_async_vs_sync,
}


# --------------------------------------------------------------------------------------------------
# Other tools' outputs
# --------------------------------------------------------------------------------------------------


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return fmt(v)
    if isinstance(v, dict):
        return ", ".join(f"{k}: {_cell(x)}" for k, x in v.items() if _scalar(x))
    return fmt(v) if isinstance(v, bool | int) or v is None else str(v)


def json_tables(obj: dict[str, Any]) -> str:
    """A JSON report as Markdown: its scalars (one level of nested objects flattened) in one table,
    each list of objects as its own table of their scalar fields."""
    scalars: list[list[str]] = []
    lists: list[tuple[str, list[dict[str, Any]]]] = []
    for key, value in obj.items():
        if _scalar(value):
            scalars.append([key, _cell(value)])
        elif isinstance(value, dict):
            for sub, v in value.items():
                if _scalar(v):
                    scalars.append([f"{key}.{sub}", _cell(v)])
                elif isinstance(v, dict) and all(_scalar(x) for x in v.values()):
                    scalars.append([f"{key}.{sub}", _cell(v)])
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lists.append((key, value))
    out = markdown_table(["field", "value"], scalars, "ll") if scalars else ""
    for key, items in lists:
        columns = [c for c in items[0] if _scalar(items[0][c])]
        out += f"\n`{key}`:\n\n" + markdown_table(
            columns, [[_cell(item.get(c)) for c in columns] for item in items], "l" * len(columns)
        )
    return out


EXTERNAL = (
    (
        "Two sources in one run, one scored by a user's reward function (SmolLM2-135M word problems)",
        "sources-mix-smollm2.md",
        "python -m bench.studies.real_model --config configs/smollm2-words-mix-cpu.toml --seed 0 "
        "--budget-s 3600 --sets words,concise (its JSON: real_model_smollm2-words-mix-cpu_seed0.json)",
    ),
    (
        "Ablation (the paper's Table 1 ladder)",
        "ablation/ablation.md",
        "stream-dapo ablate --out docs/results/ablation",
    ),
    (
        "Ablation on the long-CoT recipe (naive GRPO vs DAPO, the paper's curves)",
        "ablation-longcot/ablation.md",
        "stream-dapo ablate --config configs/tiny-longcot-cpu.toml --presets naive-grpo,dapo --seeds 3 "
        "--budget 120 --out runs/ablation-longcot, then its ablation.md, ablation.json and plots/ copied "
        "to docs/results/ablation-longcot/ (the cells' runs stay in runs/)",
    ),
    (
        "Dynamic sampling on the long-CoT recipe (+token-loss vs dapo, the current warm build)",
        "ablation-longcot-ds/ablation.md",
        "stream-dapo ablate --config configs/tiny-longcot-cpu.toml --presets +token-loss,dapo --seeds 3 "
        "--budget 32 --target-delta 0.10 --out runs/ablation-longcot-ds, then its ablation.md, "
        "ablation.json and plots/ copied to docs/results/ablation-longcot-ds/",
    ),
    (
        "The DAPO ladder on the long-CoT recipe (six presets, 3 seeds x 32 steps, the paper's curves)",
        "ablation-longcot-ladder/ablation.md",
        "stream-dapo ablate --config configs/tiny-longcot-cpu.toml --seeds 3 --budget 32 --target-delta 0.10 "
        "--out runs/ablation-longcot-ladder, then its ablation.md, ablation.json and plots/ copied to "
        "docs/results/ablation-longcot-ladder/",
    ),
    (
        "Clip-Higher with the clip made to bind on the long-CoT recipe (8 optimizer steps per rollout batch)",
        "ablation-longcot-cliphigher/ablation.md",
        "stream-dapo ablate --config configs/tiny-longcot-cpu.toml --set learner.mini_batch_samples=8 "
        "--set algo.max_staleness=32 --set learner.sync_every=4 --set learner.checkpoint_every=64 "
        "--presets +overlong-filter,+clip-higher --seeds 3 --budget 256 --target-delta 0.10 "
        "--out runs/ablation-longcot-cliphigher, then its ablation.md, ablation.json and plots/ copied to "
        "docs/results/ablation-longcot-cliphigher/",
    ),
    (
        "The paper's findings on the real model (SmolLM2-135M, warm word-problem recipe): dynamic sampling "
        "over 3 seeds, Clip-Higher 3 seeds, overlong filtering and soft punishment at a 48-token cap 3 seeds",
        "ablation-smollm2-warm/findings.md",
        "stream-dapo ablate --config configs/smollm2-words-warm-cpu.toml --presets dapo-all,no-dynamic-sampling "
        "--seeds 3 --budget 40 --out runs/findings-warm, then python -m bench.keep_ablation runs/findings-warm "
        "docs/results/ablation-smollm2-warm",
    ),
    (
        "Off-policy corrections where staleness binds: token TIS, geometric sequence mask, IcePop, GSPO "
        "(long-CoT recipe, float32 and bfloat16)",
        "offpolicy.md",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.studies.offpolicy --bf16 --bf16-seeds 1",
    ),
    (
        "The staleness bound's length bias, and holding the learner for groups in flight",
        "length_bias.json",
        "python -m bench.studies.length_bias RUN_DIR ... --json docs/results/length_bias.json (its page, "
        "length_bias.md, names the runs)",
    ),
    (
        "Async vs sync: time to a target eval accuracy",
        "async_sync_ttt.json",
        "python -m bench.studies.async_sync_ttt --out docs/results/async_sync_ttt.json",
    ),
    (
        "TRL peer comparison",
        "peer_trl.json",
        "python -m bench.studies.peer_trl --out docs/results/peer_trl.json",
    ),
    (
        "TRL peer comparison on the long-CoT recipe, seed 0",
        "peer_trl_longcot.json",
        "python -m bench.studies.peer_trl --config configs/tiny-longcot-cpu.toml --steps 120 --eval-every 20 "
        "--target-delta 0.05 --seed 0 --out docs/results/peer_trl_longcot.json",
    ),
    (
        "TRL peer comparison on the long-CoT recipe, seed 1",
        "peer_trl_longcot_seed1.json",
        "python -m bench.studies.peer_trl --config configs/tiny-longcot-cpu.toml --steps 120 --eval-every 20 "
        "--target-delta 0.05 --seed 1 --out docs/results/peer_trl_longcot_seed1.json",
    ),
    (
        "TRL peer comparison on the long-CoT recipe, seed 2",
        "peer_trl_longcot_seed2.json",
        "python -m bench.studies.peer_trl --config configs/tiny-longcot-cpu.toml --steps 120 --eval-every 20 "
        "--target-delta 0.05 --seed 2 --out docs/results/peer_trl_longcot_seed2.json",
    ),
    (
        "TRL peer comparison on the real model (SmolLM2-135M, word problems), seed 0",
        "peer_trl_smollm2_seed0.json",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.studies.peer_trl --config configs/smollm2-words-wide-cpu.toml "
        "--set learner.share_prompt=true --steps 400 --budget-s 3600 --eval-every 10 --grad-accum 4 --seed 0 "
        "--order trl,stream-dapo --work runs/peer-trl-smollm2/seed-0 --out docs/results/peer_trl_smollm2_seed0.json",
    ),
    (
        "TRL peer comparison on the real model (SmolLM2-135M, word problems), seed 1",
        "peer_trl_smollm2_seed1.json",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.studies.peer_trl --config configs/smollm2-words-wide-cpu.toml "
        "--set learner.share_prompt=true --steps 400 --budget-s 3600 --eval-every 10 --grad-accum 4 --seed 1 "
        "--order trl,stream-dapo --work runs/peer-trl-smollm2/seed-1 --out docs/results/peer_trl_smollm2_seed1.json",
    ),
    (
        "Weight deltas on or off in a real run on one machine (SmolLM2-135M fp32, loopback)",
        "weight_delta_run.json",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.studies.weight_delta_run --set learner.share_prompt=true "
        "--set learner.total_steps=400 --budget-s 720",
    ),
    ("Fault drill", "drill.json", "python -m bench.drills.drill --json docs/results/drill.json"),
    (
        "Elastic generator fleet drill",
        "drill_elastic.json",
        "python -m bench.drills.drill --elastic --json docs/results/drill_elastic.json",
    ),
    ("Protocol fuzzer", "fuzz.json", "python -m bench.drills.fuzz --json docs/results/fuzz.json"),
    (
        "Message codec choice: the hand-rolled validator (289e6bd) vs msgspec Structs vs pydantic models",
        "codec_choice.json",
        "python -m bench.perf.codec_choice --json docs/results/codec_choice.json, in each tree measured "
        "(its docstring says how the 289e6bd rows were made)",
    ),
    (
        "Verifier hostile inputs under the pool",
        "verifier_hostile.json",
        "python -m bench.drills.verifier_hostile --json docs/results/verifier_hostile.json",
    ),
    (
        "Verifier agreement with graded verdicts",
        "verifier_agreement.json",
        "python -m bench.studies.verifier_agreement --json docs/results/verifier_agreement.json",
    ),
    (
        "Behaviour log-probs: μ vs π_prox at identical weights (float32 vs bfloat16, sampling settings)",
        "logprob_precision.json",
        "python -m bench.perf.logprob_precision --json docs/results/logprob_precision.json",
    ),
    (
        "Learner memory at long context (bench/perf/learner_memory.py)",
        "learner_memory.json",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.perf.learner_memory",
    ),
    (
        "Weight fan-out through generator relays: learner egress and time to all loaded with 1-8 receivers "
        "(idle cores; 8 receivers share 2 cores, so the seconds are CPU-bound)",
        "weight_fanout.json",
        "python -m bench.perf.weight_fanout --receivers 1,2,4,8 --mb 128 --versions 3 --fanout 2",
    ),
    (
        "A real pretrained model (SmolLM2-135M-Instruct) through the whole pipeline, before and after RL",
        "real-model.md",
        "flock /tmp/stream-dapo-cpu.lock python -m bench.studies.real_model --config C --seed N "
        "(then --render)",
    ),
    (
        "Long chain-of-thought (configs/tiny-longcot-cpu.toml)",
        "longcot.md",
        "python -m bench.studies.longcot, bench/perf/async_vs_sync.py --config configs/tiny-longcot-cpu.toml, "
        "bench/studies/gradient_snr.py and bench/studies/plan_vs_run.py (each figure names its command and JSON)",
    ),
)


GENERATED = "<!-- written by `python -m bench.results`: edit bench/results.py or the result's JSON, not this page -->\n"
"""The first line of every page this script writes; a Markdown file without it is a page of its own."""


def external_page(title: str, rel: str, command: str, results_dir: Path) -> tuple[str | None, str | None]:
    """(the page of one external result, relative to results_dir; the text to write there, or None when
    the result keeps a page of its own). A result written as Markdown, or as JSON beside a Markdown
    page of the same name, is its own page; a JSON-only result gets one rendered here from its tables.
    (None, None) when it has not been run."""
    path = results_dir / rel
    if not path.is_file():
        return None, None
    if rel.endswith(".md"):
        return rel, None
    prose = path.with_suffix(".md")
    if prose.is_file() and not prose.read_text().startswith(GENERATED):
        return prose.relative_to(results_dir).as_posix(), None
    try:
        tables = json_tables(json.loads(path.read_text()))
    except (json.JSONDecodeError, AttributeError) as exc:
        tables = f"Could not read {rel}: {exc}\n"
    text = GENERATED + (
        f"# {title}\n\n[All results](../RESULTS.md)\n\nFrom `{rel}`, written by `{command}`; this page is "
        "rendered from it by `python -m bench.results --render-only`.\n\n" + tables
    )
    return Path(rel).with_suffix(".md").as_posix(), text.rstrip() + "\n"


# --------------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------------

MACHINE_ROWS = (
    ("CPU", "cpu_model"),
    ("CPU family, model and vector ISA", "cpu_isa"),
    ("cores (usable)", "usable_cores"),
    ("memory GiB", "memory_gib"),
    ("OS", "os"),
    ("Python", "python"),
    ("torch", "torch"),
    ("vLLM", "vllm"),
    ("DeepSpeed", "deepspeed"),
    ("transformers", "transformers"),
    ("pyzmq", "pyzmq"),
    ("numpy", "numpy"),
    ("git commit", "git_commit"),
)


def render_machine(sections: dict[str, Any]) -> str:
    machines = [e["machine"] for e in sections.values()] or [machine_info()]
    keys = [k for _, k in MACHINE_ROWS]
    distinct = {
        json.dumps({k: m.get(k) for k in keys if k != "git_commit"}, sort_keys=True) for m in machines
    }
    m = machines[-1]
    rows = [[label, _cell(m.get(key))] for label, key in MACHINE_ROWS]
    commits = sorted({str(e["machine"].get("git_commit")) for e in sections.values()})
    text = markdown_table(["", "value"], rows, "ll")
    if len(distinct) > 1:
        text += "\n**Warning**: the sections below were measured on different machines or stacks; see results.json.\n"
    if len(commits) > 1:
        text += f"\nSections were measured at different commits: {', '.join(commits)}.\n"
    return text


def headline_rows(sections: dict[str, Any]) -> list[list[str]]:
    """One line per comparison, for the summary at the top."""
    rows: list[list[str]] = []

    def add(name: str, figure: str, value: str) -> None:
        quick = " (quick)" if sections[name].get("quick") else ""
        rows.append([figure, value + quick, f"[{SECTIONS[name].title}](results/{name}.md)"])

    if "generation" in sections:
        d = sections["generation"]["data"]
        add(
            "generation",
            f"vLLM / transformers generate, response tokens/s ({d['threads']} thread(s) / {d['all_cores']} threads)",
            f"{fmt_ratio(d['ratio_vllm_vs_transformers'])} / {fmt_ratio(d['ratio_vllm_vs_transformers_all_cores'])}",
        )
    if "learner" in sections:
        d = sections["learner"]["data"]["ratio_vs_torch"]
        add(
            "learner",
            "DeepSpeed ZeRO-0 / 2 / 3 vs plain torch, trained tokens/s",
            " / ".join(fmt_ratio(d[k]) for k in ("zero0", "zero2", "zero3")),
        )
    if "packing" in sections:
        d = sections["packing"]["data"]
        add(
            "packing",
            "packing efficiency, packer vs pad to max length (tiny / long CoT)",
            f"{fmt(_med(d['tiny']['efficiency']['packer']))} vs {fmt(_med(d['tiny']['efficiency']['pad_to_max_length']))}"
            f" / {fmt(_med(d['long_cot']['efficiency']['packer']))} vs {fmt(_med(d['long_cot']['efficiency']['pad_to_max_length']))}",
        )
    if "transport" in sections:
        d = sections["transport"]["data"]
        big = d["groups"][-1]
        add(
            "transport",
            f"{fmt(big['response_tokens'])}-token groups over loopback, codec (vs memcpy)",
            f"{fmt(_med(big['loopback']['codec']['gb_per_s']))} GB/s ({fmt_ratio(big['loopback']['codec_vs_memcpy'])})",
        )
    if "weight_sync" in sections and "vllm" in sections["weight_sync"]["data"]:
        v = sections["weight_sync"]["data"]["vllm"]
        add(
            "weight_sync",
            f"weight sync of {fmt(v['payload_bytes'] / 1e6)} MB into vLLM, streamed vs file (vs raw frames)",
            f"{fmt(_med(v['gb_per_s']['stream']))} vs {fmt(_med(v['gb_per_s']['file']))} GB/s "
            f"({fmt_ratio(v['stream_vs_file'])}; {fmt_ratio(v['vs_raw']['stream'])} of raw)",
        )
    if "async_vs_sync" in sections:
        d = sections["async_vs_sync"]["data"]
        add("async_vs_sync", "async / sync, trained samples/s", fmt_ratio(d["ratio_trained"]))
    return rows


def measured_span(sections: dict[str, Any]) -> str:
    """When the saved sections were measured (from the data, so a re-render writes the same page)."""
    dates = sorted(str(e["finished_at"])[:10] for e in sections.values() if e.get("finished_at"))
    if not dates:
        return "nothing measured yet"
    return f"measured {dates[0]}" if dates[0] == dates[-1] else f"measured {dates[0]} to {dates[-1]}"


def render_section_page(name: str, entry: dict[str, Any] | None, results_dir: Path, plot: str | None) -> str:
    title = SECTIONS[name].title
    parts = [GENERATED, f"# {title}\n\n[All results](../RESULTS.md)\n\n"]
    if entry is None:
        parts.append(f"Not yet run: `{section_command(name, False)}`\n")
    else:
        parts.append(_header(name, entry))
        parts.append(RENDERERS[name](entry["data"]))
        if plot is not None:
            parts.append(f"\n![{title}]({plot})\n")
    if name == "async_vs_sync":
        parts.append("\n| figure | status |\n| :-- | :-- |\n" + time_to_target_row(results_dir))
    return "".join(parts).rstrip() + "\n"


def render_pages(sections: dict[str, Any], results_dir: Path, plots: dict[str, str]) -> dict[str, str]:
    """Every page bench/results.py writes: results/<section>.md per measured section, results/<name>.md
    per external JSON result without a page of its own, and RESULTS.md (path relative to the docs
    folder -> text). Each figure is stated on one page; RESULTS.md holds the headlines and links."""
    rel = results_dir.name
    pages: dict[str, str] = {}
    for name in SECTIONS:
        pages[f"{rel}/{name}.md"] = render_section_page(
            name, sections.get(name), results_dir, plots.get(name)
        )
    index_rows: list[list[str]] = []
    for title, source, command in EXTERNAL:
        page, text = external_page(title, source, command, results_dir)
        if page is None:
            index_rows.append([title, f"not yet run: `{command}`"])
            continue
        if text is not None:
            pages[f"{rel}/{page}"] = text
        index_rows.append([title, f"[{rel}/{page}]({rel}/{page})"])
    header = [
        GENERATED,
        "# Results\n\n",
        f"An index: each result has its own page under `{rel}/`, written by the command it names; each figure "
        f"is stated on its page. The throughput sections below were written by `python -m bench.results` "
        f"({measured_span(sections)}) from `{rel}/{RESULTS_JSON}`, which keeps every repeat. Rerun one with "
        "`--only NAME` (the others keep their saved numbers); `--render-only` rewrites every page from the "
        "saved numbers, and a test checks that it reproduces the committed pages.\n\n",
        "How to read the figures: each is the **median over repeats**; each comparison is a **ratio "
        "measured side by side in one run**: the repeats of A and B interleave (order rotated every "
        "repeat) and the ratio is the median of the per-repeat ratios. Min–max columns show the "
        "spread. Benchmarks ran one at a time, each section in its own process, holding the "
        "project's CPU lock (`flock /tmp/stream-dapo-cpu.lock`) so that no other measurement "
        "shared the cores.\n\n",
        "## Machine\n\n",
        render_machine(sections),
        "\n## Headlines\n\n",
    ]
    rows = headline_rows(sections)
    header.append(
        markdown_table(["figure", "value", "page"], rows, "lll") if rows else "Nothing measured yet.\n"
    )
    header.append("\n## Throughput, one page per part\n\n")
    header.append(
        markdown_table(
            ["part", "page"],
            [[SECTIONS[n].title, f"[{rel}/{n}.md]({rel}/{n}.md)"] for n in SECTIONS],
            "ll",
        )
    )
    header.append("\n## Studies, drills and tools\n\n")
    header.append(markdown_table(["result", "page"], index_rows, "ll"))
    pages["RESULTS.md"] = "".join(header).rstrip() + "\n"
    return pages


# --------------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------------


def _bars(ax: Any, labels: list[str], values: list[float], lows: list[float], highs: list[float]) -> None:
    errors = [
        [v - lo for v, lo in zip(values, lows, strict=True)],
        [hi - v for v, hi in zip(values, highs, strict=True)],
    ]
    ax.bar(labels, values, yerr=errors, capsize=4, color="#4c72b0")
    ax.set_ylim(0, max(highs) * 1.15)  # room for the labels above the error bars
    for i, (v, hi) in enumerate(zip(values, highs, strict=True)):
        ax.annotate(
            fmt(v), (i, hi), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points"
        )


def _plot_rates(ax: Any, series: dict[str, dict[str, Any]], labels: dict[str, str], ylabel: str) -> None:
    keys = list(labels)
    _bars(
        ax,
        [labels[k] for k in keys],
        [_med(series[k]) for k in keys],
        [series[k]["min"] for k in keys],
        [series[k]["max"] for k in keys],
    )
    ax.set_ylabel(ylabel)


def plot_generation(d: dict[str, Any], ax: Any) -> None:
    labels = {
        "vllm": "vLLM",
        "transformers": f"transformers\n{d['threads']} thread(s)",
        "transformers_all_cores": f"transformers\n{d['all_cores']} threads",
    }
    _plot_rates(ax, d["tokens_per_second"], labels, "response tokens/s")
    ax.set_title(f"vLLM / transformers (same threads) = {fmt_ratio(d['ratio_vllm_vs_transformers'])}")


def plot_learner(d: dict[str, Any], ax: Any) -> None:
    labels = {"torch": "torch", "zero0": "ZeRO-0", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    _plot_rates(ax, d["tokens_per_second"], labels, "trained tokens/s")
    ax.set_title("Learner throughput (median, min–max)")


def plot_packing(d: dict[str, Any], ax: Any) -> None:
    methods = {"packer": "packer", "pad_to_longest": "pad to longest", "pad_to_max_length": "pad to max"}
    width = 0.25
    for i, (key, label) in enumerate(methods.items()):
        values = [_med(d[c]["efficiency"][key]) for c in ("tiny", "long_cot")]
        ax.bar([x + (i - 1) * width for x in range(2)], values, width, label=label)
    ax.set_xticks(range(2), ["tiny task", "long CoT (modelled)"])
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("real / processed tokens")
    ax.legend(fontsize=8)
    ax.set_title("Packing efficiency")


def plot_transport(d: dict[str, Any], ax: Any) -> None:
    labels, values = [], []
    for g in d["groups"]:
        tag = f"{g['response_tokens'] // 1024}k"
        for key, name in (("codec", "codec"), ("raw", "raw"), ("memcpy", "memcpy")):
            labels.append(f"{tag} {name}")
            values.append(_med(g["loopback"][key]["gb_per_s"]))
    for p in d["push_pull"]:
        labels.append(f"PUSH {p['frame_bytes'] >> 20}MiB")
        values.append(_med(p["zmq"]["gb_per_s"]))
    ax.bar(labels, values, color="#55a868")
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (log)")
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    ax.set_title("Loopback transport vs memcpy")


def plot_weight_sync(d: dict[str, Any], ax: Any) -> None:
    cases = _ws_cases(d)
    width = 0.8 / len(_WS_PATHS)
    for i, (path, _label) in enumerate(_WS_PATHS):
        values = [_med(c["gb_per_s"][path]) for _, c in cases]
        ax.bar([x + (i - 1.5) * width for x in range(len(cases))], values, width, label=path)
    ax.set_xticks(
        range(len(cases)),
        [label.split(",")[0] + f" ({fmt(c['payload_bytes'] / 1e6)} MB)" for label, c in cases],
    )
    ax.tick_params(axis="x", labelsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("GB/s (publish to checked / loaded)")
    ax.legend(fontsize=7)
    ax.set_title("Weight sync by path")


def plot_async_vs_sync(d: dict[str, Any], ax: Any) -> None:
    from bench.report import summary

    series = {m: summary(d["trained_samples_per_second"][m]) for m in ("async", "sync")}
    _plot_rates(ax, series, {"async": "async", "sync": "sync"}, "trained samples/s")
    ax.set_title(f"async / sync = {fmt_ratio(d['ratio_trained'])}")


PLOTS: dict[str, Callable[[dict[str, Any], Any], None]] = {
    "generation": plot_generation,
    "learner": plot_learner,
    "packing": plot_packing,
    "transport": plot_transport,
    "weight_sync": plot_weight_sync,
    "async_vs_sync": plot_async_vs_sync,
}


def write_plots(sections: dict[str, Any], results_dir: Path) -> dict[str, str]:
    """One PNG per measured section; returns section -> path relative to its page. Needs the bench
    extra's matplotlib; without it the page has no plots (and says so on stderr)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is missing: no plots (pip install -e '.[bench]')", file=sys.stderr)
        return {}
    out: dict[str, str] = {}
    for name, entry in sections.items():
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        PLOTS[name](entry["data"], ax)
        if entry.get("quick"):
            fig.text(0.99, 0.01, "--quick sizes", ha="right", fontsize=7, color="red")
        fig.tight_layout()
        fig.savefig(results_dir / f"{name}.png", dpi=110)
        plt.close(fig)
        out[name] = f"{name}.png"
    return out


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def render(out: Path, sections: dict[str, Any], plots: bool = True) -> Path:
    """Write every page (and, with `plots`, the sections' PNGs) under `out`; returns RESULTS.md."""
    results_dir = out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    if plots:
        drawn = write_plots(sections, results_dir)
    else:  # the pages link the PNGs that are there
        drawn = {name: f"{name}.png" for name in sections if (results_dir / f"{name}.png").is_file()}
    for rel, text in render_pages(sections, results_dir, drawn).items():
        (out / rel).write_text(text)
    return out / "RESULTS.md"


def parse_only(value: str | None) -> list[str]:
    if not value:
        return list(SECTIONS)
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}")
    return [n for n in SECTIONS if n in names]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes (marked on the page)")
    parser.add_argument("--only", default=None, help=f"comma-separated sections: {','.join(SECTIONS)}")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="page directory (default: docs)")
    parser.add_argument("--render-only", action="store_true", help="re-render from OUT/results/results.json")
    parser.add_argument("--no-plots", action="store_true", help="leave the PNGs as they are (pages only)")
    parser.add_argument("--child", choices=list(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        args.child_out.write_text(json.dumps(run_child(args.child, args.quick)))
        return 0

    out = args.out.resolve()
    json_path = out / "results" / RESULTS_JSON
    sections = load_results(json_path)
    failed = []
    if not args.render_only:
        for name in parse_only(args.only):
            print(f"[results] {name} ...", flush=True)
            try:
                sections[name] = run_section(name, args.quick, REPO / "runs" / "bench-logs")
            except RuntimeError as exc:
                print(exc, file=sys.stderr, flush=True)
                failed.append(name)
                continue
            save_results(json_path, sections)
            print(f"[results] {name} done in {sections[name]['wall_seconds']} s", flush=True)
    save_results(json_path, sections)
    page = render(out, sections, plots=not args.no_plots)
    print(f"[results] wrote {page} and {json_path}")
    if failed:
        print(
            f"[results] failed: {', '.join(failed)} (their previous numbers, if any, are kept)",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
