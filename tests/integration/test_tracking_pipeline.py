"""`stream-dapo run` with every tracking backend on, offline: W&B and TensorBoard hold what
metrics.jsonl holds, read back with the libraries' own readers, and the run writes its report.

One short async run (real vLLM, ZeroMQ, DeepSpeed on the tiny model) with
``tracking.backends = ["jsonl", "wandb", "tensorboard"]`` and ``WANDB_MODE=offline`` (no network,
no account). TensorBoard's event files are read with tensorboard's `EventAccumulator`, W&B's
offline run file with W&B's own protobuf schema (`tests/integration/wandb_files.py`). The step
axis of both must be the learner versions of `learner/metrics.jsonl`, and their values its values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dapo.tracking import staleness_quantiles
from tests.helpers import free_ports, tiny_overrides
from tests.integration.wandb_files import read_offline_run

pytestmark = pytest.mark.timeout(900)

STEPS = 4


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory: pytest.TempPathFactory, warm_model: Path) -> Path:
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    out = tmp_path_factory.mktemp("tracking") / "tracked-run"
    overrides = tiny_overrides(warm_model, out, free_ports(8)) + [
        f"learner.total_steps={STEPS}",
        'tracking.backends=["jsonl", "wandb", "tensorboard"]',
        'tracking.tags=["test", "tiny"]',
        'tracking.project="stream-dapo-test"',
    ]
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--mode", "async"]
    for item in overrides:
        argv += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=840)
    if proc.returncode != 0 or not (out / "summary.json").exists():
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((out / "logs").glob("*.log"))
        )
        pytest.fail(
            f"run failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}\n{logs}"
        )
    return out


def jsonl_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "learner" / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_event_files_hold_the_jsonl_steps_and_values(tracked_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = jsonl_rows(tracked_run)
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    logdir = tracked_run / "tracking" / "tensorboard" / "stream-dapo-test" / "tracked-run"
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    for tag, key in (
        ("train/loss", "loss"),
        ("train/entropy", "entropy"),
        ("rollout/reward_mean", "reward_mean"),
        ("rollout/accuracy", "accuracy"),
        ("perf/tokens_per_second", "tokens_per_second"),
    ):
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [r["version"] for r in rows], tag
        # TensorBoard stores float32.
        assert [e.value for e in events] == pytest.approx([r[key] for r in rows], rel=1e-6, abs=1e-7), tag
    # The generators' rollout window (every group finished, the filtered ones included).
    tracked = [r for r in rows if "gen_groups" in r]
    assert tracked, "no step carried the generators' rollout window"
    assert all(
        0 <= r["gen_filtered_share_all_wrong"] + r["gen_filtered_share_all_correct"] <= 1 for r in tracked
    )
    share = acc.Scalars("generators/filtered_share_all_wrong")
    assert [e.step for e in share] == [r["version"] for r in tracked]
    assert [e.value for e in share] == pytest.approx(
        [r["gen_filtered_share_all_wrong"] for r in tracked], abs=1e-6
    )
    stale = acc.Scalars("rollout/staleness_max")
    assert [e.value for e in stale] == [
        staleness_quantiles(r["staleness_counts"])["staleness_max"] for r in rows
    ]
    assert "config/text_summary" in acc.Tags()["tensors"]
    config_text = acc.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "[tracking]" in config_text and '"wandb"' in config_text


def test_wandb_offline_run_holds_the_config_once_and_the_jsonl_steps(tracked_run: Path) -> None:
    rows = jsonl_rows(tracked_run)
    (run_dir,) = sorted((tracked_run / "tracking" / "wandb").glob("offline-run-*"))
    run = read_offline_run(run_dir)
    assert run["name"] == "tracked-run" and run["project"] == "stream-dapo-test"
    assert run["tags"] == ["test", "tiny"]
    assert run["config"]["algo"]["group_size"] == 4
    assert run["config"]["learner"]["total_steps"] == STEPS
    history = [h for h in run["history"] if "train/loss" in h]
    assert [h["_step"] for h in history] == [r["version"] for r in rows]
    for key, section in (("loss", "train"), ("reward_mean", "rollout"), ("clip_frac_high", "train")):
        assert [h[f"{section}/{key}"] for h in history] == [r[key] for r in rows], key  # JSON doubles: exact


def test_the_run_writes_its_report_with_the_generator_side_plots(tracked_run: Path) -> None:
    report = (tracked_run / "report.md").read_text()
    for name in ("reward_accuracy", "staleness", "throughput", "weight_sync", "filtered_groups"):
        assert f"(report/{name}.png)" in report, name
        assert (tracked_run / "report" / f"{name}.png").stat().st_size > 10_000, name
    assert "Not recorded in these runs" not in report.split("## Weight synchronisation")[1]
    live = [json.loads(line) for line in (tracked_run / "metrics.jsonl").read_text().splitlines()]
    assert any(row["generator_tokens_per_s"] > 0 for row in live)
    assert live[-1]["step"] == STEPS  # the final metrics give the last steps a row
    assert json.loads((tracked_run / "learner" / "config.json").read_text())["tracking"]["tags"] == [
        "test",
        "tiny",
    ]
