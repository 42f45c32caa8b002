"""`stream-dapo run` with every tracking backend on, offline: W&B and TensorBoard hold what
metrics.jsonl holds, read back with the libraries' own readers, and the run writes its report.

The session's short async run (real vLLM, ZeroMQ, DeepSpeed on the tiny model; the `async_run` of
tests/integration/conftest.py, which the end-to-end tests share) with
``tracking.backends = ["jsonl", "wandb", "tensorboard"]`` and ``WANDB_MODE=offline`` (no network,
no account). TensorBoard's event files are read with tensorboard's `EventAccumulator`, W&B's
offline run file with W&B's own protobuf schema (`tests/integration/wandb_files.py`). The step
axis of both must be the learner versions of `learner/metrics.jsonl`, and their values its values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dapo.runtime.tracking import staleness_quantiles
from tests.integration.conftest import TRACKING_PROJECT, TRACKING_TAGS
from tests.integration.pipeline_runs import ASYNC_STEPS
from tests.integration.wandb_files import read_offline_run

pytestmark = pytest.mark.timeout(900)

STEPS = ASYNC_STEPS


@pytest.fixture(scope="module")
def tracked_run(async_run) -> Path:
    """The session's async run (tests/integration/conftest.py), which tracks to every backend."""
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    rc, _summary, _seen, out, _prom = async_run
    assert rc == 0
    return out


def jsonl_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "learner" / "metrics.jsonl").read_text().splitlines()]


def test_tensorboard_event_files_hold_the_jsonl_steps_and_values(tracked_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rows = jsonl_rows(tracked_run)
    assert [r["version"] for r in rows] == list(range(1, STEPS + 1))
    logdir = tracked_run / "tracking" / "tensorboard" / TRACKING_PROJECT / tracked_run.name
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
    assert run["name"] == tracked_run.name and run["project"] == TRACKING_PROJECT
    assert run["tags"] == TRACKING_TAGS
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
    assert (
        json.loads((tracked_run / "learner" / "config.json").read_text())["tracking"]["tags"] == TRACKING_TAGS
    )
