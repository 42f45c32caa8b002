"""Tracking: the scalars backends get, and a failing backend is reported once and dropped."""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.runtime.tracking import JsonlBackend, Tracker, staleness_quantiles, tracked_scalars


@pytest.fixture
def fresh_wandb(monkeypatch: pytest.MonkeyPatch):
    """Real W&B with none of this machine's WANDB_ variables, torn down afterwards (wandb keeps its
    settings in a process-wide singleton)."""
    wandb = pytest.importorskip("wandb")
    for name in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    yield wandb
    wandb.teardown()


def make_cfg(tmp_path: Path, *extra: str):
    return load_config(overrides=[f"run.out_dir={json.dumps(str(tmp_path / 'run'))}", *extra], environ={})


def row(version: int, **values: Any) -> dict[str, Any]:
    return {"version": version, "loss": 0.1 * version, "reward_mean": -0.5, **values}


def test_staleness_quantiles_are_token_weighted_and_take_the_bucket_that_reaches_q() -> None:
    # 100 tokens: 50 at 0, 45 at 1, 5 at 3 -> half at <= 0, 95% at <= 1, worst 3.
    assert staleness_quantiles({"0": 50, "1": 45, "3": 5}) == {
        "staleness_p50": 0.0,
        "staleness_p95": 1.0,
        "staleness_max": 3.0,
    }
    # 49 of 100 at 0 is not half: the median is the next value.
    assert staleness_quantiles({0: 49, 2: 51})["staleness_p50"] == 2.0
    assert staleness_quantiles({}) == {}
    assert staleness_quantiles({"4": 0}) == {}


def test_tracked_scalars_name_sections_and_leave_out_what_is_not_a_finite_number() -> None:
    scalars = tracked_scalars(
        {
            "version": 7,
            "loss": 0.25,
            "kl_ref": None,
            "accuracy": 0.5,
            "tokens_per_second": 1200,
            "grad_norm": float("nan"),
            "wall_time": 1e9,
            "staleness_counts": {"0": 3, "2": 1},
        }
    )
    assert scalars == {
        "train/loss": 0.25,
        "rollout/accuracy": 0.5,
        "rollout/staleness_p50": 0.0,
        "rollout/staleness_p95": 2.0,
        "rollout/staleness_max": 2.0,
        "perf/tokens_per_second": 1200.0,
    }


class Recorder:
    name = "recorder"

    def __init__(self, fail_at_step: int | None = None) -> None:
        self.steps: list[int] = []
        self.configs = 0
        self.closed = False
        self.fail_at_step = fail_at_step

    def log_config(self, cfg) -> None:
        self.configs += 1

    def log(self, step: int, row: Mapping[str, Any]) -> None:
        if step == self.fail_at_step:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.steps.append(step)

    def close(self) -> None:
        self.closed = True


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_backend_that_cannot_be_imported_is_reported_once_with_the_install_command(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path, 'tracking.backends=["jsonl", "wandb"]')

    def no_wandb(cfg, resumed_at=None):
        raise ModuleNotFoundError("No module named 'wandb'")

    tracker = Tracker.start(cfg, {"jsonl": JsonlBackend, "wandb": no_wandb})
    for v in (1, 2, 3):
        tracker.log(v, row(v))
    tracker.close()
    (message,) = errors(caplog)
    assert "tracking backend wandb failed while starting" in message
    assert "pip install -e '.[wandb]'" in message and "tracking.backends" in message
    assert tracker.failed == {"wandb": "ModuleNotFoundError: No module named 'wandb'"}
    lines = (tmp_path / "run" / "learner" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["version"] for line in lines] == [1, 2, 3]
    assert json.loads((tmp_path / "run" / "learner" / "config.json").read_text())["tracking"]["backends"] == [
        "jsonl",
        "wandb",
    ]


def test_a_backend_that_fails_mid_run_is_dropped_and_the_others_get_every_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_cfg(tmp_path, 'tracking.backends=["jsonl", "tensorboard"]')
    full_disk, healthy = Recorder(fail_at_step=2), Recorder()
    tracker = Tracker.start(cfg, {"jsonl": lambda c, r: healthy, "tensorboard": lambda c, r: full_disk})
    for v in (1, 2, 3, 4):
        tracker.log(v, row(v))  # never raises
    tracker.close()
    assert healthy.steps == [1, 2, 3, 4] and healthy.configs == 1 and healthy.closed
    assert full_disk.steps == [1] and not full_disk.closed  # dropped at step 2: not called again
    (message,) = errors(caplog)
    assert "while logging step 2" in message and "No space left on device" in message
    assert "fix the cause above" in message


def test_real_tensorboard_that_cannot_create_its_directory_does_not_stop_the_jsonl_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("tensorboard")
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the tracking directory should be")
    cfg = make_cfg(
        tmp_path, 'tracking.backends=["jsonl", "tensorboard"]', f"tracking.dir={json.dumps(str(blocker))}"
    )
    tracker = Tracker.start(cfg)
    tracker.log(1, row(1))
    tracker.close()
    (message,) = errors(caplog)
    assert "tracking backend tensorboard failed while starting" in message
    assert [b for b in tracker.failed] == ["tensorboard"]
    assert len((tmp_path / "run" / "learner" / "metrics.jsonl").read_text().splitlines()) == 1


def test_tracking_config_refuses_a_backend_listed_twice_and_an_unknown_one() -> None:
    with pytest.raises(ConfigError, match="lists a backend twice"):
        load_config(overrides=['tracking.backends=["jsonl", "jsonl"]'], environ={})
    with pytest.raises(ConfigError, match="tracking.backends.0"):
        load_config(overrides=['tracking.backends=["mlflow"]'], environ={})


@pytest.mark.process
def test_real_wandb_with_a_bad_api_key_is_reported_once_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, fresh_wandb
) -> None:
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "bad")  # W&B refuses it before any network call
    cfg = make_cfg(tmp_path, 'tracking.backends=["wandb", "jsonl"]')
    tracker = Tracker.start(cfg)
    for v in (1, 2):
        tracker.log(v, row(v))
    tracker.close()
    (message,) = errors(caplog)
    assert "tracking backend wandb failed while starting (AuthenticationError" in message
    assert "WANDB_API_KEY" in message
    assert len((tmp_path / "run" / "learner" / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.process
def test_real_wandb_offline_takes_the_config_and_lets_its_own_variables_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_wandb
) -> None:
    from tests.integration.wandb_files import read_offline_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-the-environment")
    cfg = make_cfg(tmp_path, 'tracking.backends=["wandb"]', 'tracking.tags=["x"]', 'tracking.run_name="r1"')
    tracker = Tracker.start(cfg)
    for v in (1, 2):
        tracker.log(v, row(v, staleness_counts={"0": 3, "1": 1}))
    tracker.close()
    assert tracker.failed == {}
    (run_dir,) = (tmp_path / "run" / "tracking" / "wandb").glob("offline-run-*")
    run = read_offline_run(run_dir)
    assert (run["project"], run["name"], run["tags"]) == ("from-the-environment", "r1", ["x"])
    assert run["config"]["tracking"]["run_name"] == "r1"
    history = [h for h in run["history"] if "train/loss" in h]
    assert [(h["_step"], h["train/loss"], h["rollout/staleness_p95"]) for h in history] == [
        (1, 0.1, 1.0),
        (2, 0.2, 1.0),
    ]


@pytest.mark.process
def test_real_wandb_offline_continues_its_run_when_the_learner_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_wandb
) -> None:
    """Issue 41 (still open): the run id is stored with the learner's state and a resumed learner
    continues that W&B run instead of starting another."""
    from tests.integration.wandb_files import read_offline_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = make_cfg(tmp_path, 'tracking.backends=["wandb"]', 'tracking.run_name="r1"')
    first = Tracker.start(cfg)
    first.log(1, row(1))
    first.close()
    stored = json.loads((tmp_path / "run" / "learner" / "wandb-run.json").read_text())["id"]
    second = Tracker.start(cfg, resumed_at=1)
    second.log(2, row(2))
    second.close()
    assert first.failed == second.failed == {}
    runs = sorted((tmp_path / "run" / "tracking" / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(f"-{stored}" in r.name for r in runs)  # "...-<id>", "...-<id>-1"
    assert [read_offline_run(r)["id"] for r in runs] == [stored, stored]
    assert [h["_step"] for h in read_offline_run(runs[1])["history"] if "train/loss" in h] == [2]
    third = Tracker.start(
        make_cfg(tmp_path / "fresh", 'tracking.backends=["wandb"]')
    )  # a fresh run: a new id
    third.close()
    assert json.loads((tmp_path / "fresh" / "run" / "learner" / "wandb-run.json").read_text())["id"] != stored


def test_real_tensorboard_purges_the_steps_after_the_checkpoint_a_learner_resumes_from(
    tmp_path: Path,
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from stream_dapo.runtime.tracking import tensorboard_logdir

    cfg = make_cfg(tmp_path, 'tracking.backends=["tensorboard"]')
    crashed = Tracker.start(cfg)
    for v in (1, 2, 3, 4):  # logged steps 3 and 4, then died; its last checkpoint was at version 2
        crashed.log(v, row(v))
    crashed.close()
    resumed = Tracker.start(cfg, resumed_at=2)
    for v in (3, 4):
        resumed.log(v, {**row(v), "loss": 10.0 * v})
    resumed.close()
    events = EventAccumulator(str(tensorboard_logdir(cfg)))
    events.Reload()
    losses = [(e.step, round(e.value, 3)) for e in events.Scalars("train/loss")]
    assert losses == [(1, 0.1), (2, 0.2), (3, 30.0), (4, 40.0)]
