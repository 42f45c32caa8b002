"""`stream-dapo run` stops its services in drain order, each with its own bound: the learner gets time
for its step, final checkpoint and commit while the buffer it commits to is still up.

Regression: every service had the same 30 s; a learner of a real model (a step takes minutes on CPU)
was killed mid-drain, its last step lost and its commit never sent, and only then the buffer stopped.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.config import load_config
from stream_dapo.tools import launch
from stream_dapo.tools.launch import StopRequested, Supervisor, stop_timeouts

pytestmark = pytest.mark.process

# A stand-in service: on SIGTERM it records the signal in the shared log, then drains until the
# test lets it go (the file `go-<name>` appears) and exits 0.
CHILD = r"""
import os, signal, sys, time
name, folder = sys.argv[1], sys.argv[2]
def on_term(*_):
    with open(os.path.join(folder, "order.log"), "a") as f:
        f.write(name + "\n")
    while not os.path.exists(os.path.join(folder, "go-" + name)):
        time.sleep(0.01)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(folder, "ready-" + name), "w").close()
while True:
    signal.pause()
"""


def test_the_bounds_follow_the_config() -> None:
    cfg = load_config(
        overrides=[
            "transport.timeout_s=20",
            "run.learner_stop_timeout_s=1200",
            "metrics.final_scrape_wait_s=30",
        ],
        environ={},
    )
    assert stop_timeouts(cfg) == {"generator": 2 * 20 + 30 + 30, "learner": 1200 + 30, "buffer": 60 + 30}


def test_services_stop_one_after_the_other_generators_learner_buffer(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    names = ["buffer", "learner", "generator-0", "generator-1"]  # started in the launcher's order
    for name in names:
        sup.start(name, [sys.executable, "-c", CHILD, name, str(tmp_path)], env={"PATH": ""})
    for name in names:  # every handler installed before the stop begins
        while not (tmp_path / f"ready-{name}").exists():
            assert all(c.popen.poll() is None for c in sup.children), "a stand-in died at start-up"
            threading.Event().wait(0.01)
    order = tmp_path / "order.log"

    def signalled() -> list[str]:
        return order.read_text().split() if order.exists() else []

    stopper = threading.Thread(target=sup.stop_all, args=({"generator": 600, "learner": 600, "buffer": 600},))
    stopper.start()
    expected = ["generator-0", "generator-1", "learner", "buffer"]
    for i, name in enumerate(expected):
        while len(signalled()) <= i:  # the next SIGTERM comes only once the previous child exited
            threading.Event().wait(0.01)
        assert signalled() == expected[: i + 1], "a service was signalled before the one draining exited"
        (tmp_path / f"go-{name}").touch()
    stopper.join()
    assert [c.popen.returncode for c in sup.children] == [0, 0, 0, 0], "each drained, none was killed"
    assert signalled() == expected


# A stand-in `stream-dapo eval`: it starts a grandchild (vLLM's engine-core process in the real
# one), and once its SIGTERM handler is in place asks the launcher (its parent) to stop, with
# SIGUSR1. On SIGTERM it records it and exits without stopping the grandchild.
FAKE_EVAL = r"""
import os, signal, subprocess, sys
folder = sys.argv[1]
engine = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
with open(os.path.join(folder, "engine.pid"), "w") as f:
    f.write(str(engine.pid))
def on_term(*_):
    open(os.path.join(folder, "eval-got-sigterm"), "w").close()
    os._exit(143)
signal.signal(signal.SIGTERM, on_term)
os.kill(os.getppid(), signal.SIGUSR1)
while True:
    signal.pause()
"""


def test_a_stop_during_the_launchers_eval_sigterms_it_and_kills_its_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: `stream-dapo run` ran its before/after eval with `subprocess.run`, which answers
    the launcher's stop with SIGKILL to the eval process alone: its vLLM engine-core and worker
    processes ran on with ppid 1. Now the eval gets SIGTERM (its engine shuts down) and then its
    whole process group SIGKILL, like a service."""
    monkeypatch.setattr(launch, "service_argv", lambda *_a: [sys.executable, "-c", FAKE_EVAL, str(tmp_path)])

    def stop(signum: int, _frame: Any) -> None:
        raise StopRequested(signal.SIGTERM)  # what the launcher's handler raises on SIGTERM

    before = signal.signal(signal.SIGUSR1, stop)
    try:
        with pytest.raises(StopRequested):
            launch.evaluate_subprocess(
                load_config(environ={}), tmp_path / "config.toml", tmp_path, "before", tmp_path
            )
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert (tmp_path / "eval-got-sigterm").exists(), "the eval was not asked to stop its engine"
    engine = int((tmp_path / "engine.pid").read_text())
    deadline = time.monotonic() + 60  # the group's SIGKILL is sent; only its reaping by init is awaited
    while _alive(engine):
        assert time.monotonic() < deadline, f"the eval's engine process {engine} outlived the stop"
        threading.Event().wait(0.01)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# A stand-in service that, on SIGTERM, does what argv[3] says: "ignore" (keeps running until killed),
# "fail" (exits 3) or "drain" (writes its final metrics and exits 0).
ENDING = r"""
import json, os, signal, sys
name, folder, how = sys.argv[1], sys.argv[2], sys.argv[3]
def on_term(*_):
    if how == "ignore":
        return
    if how == "drain":
        os.makedirs(os.path.join(folder, "final-metrics"), exist_ok=True)
        with open(os.path.join(folder, "final-metrics", name + ".json"), "w") as f:
            json.dump({"x_total": 1.0}, f)
    sys.exit(3 if how == "fail" else 0)
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(folder, "ready-" + name), "w").close()
while True:
    signal.pause()
"""


def test_the_summary_names_each_service_killed_or_failed_at_stop_and_its_missing_final_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: a generator that died in its shutdown (exit 1, EBADF) or was killed at its bound
    left no final metrics, and nothing in the run said so: its figures in a benchmark came out null."""
    sup = Supervisor(tmp_path)
    ending = {"generator-0": "ignore", "learner": "fail", "buffer": "drain"}
    for name, how in ending.items():
        sup.start(name, [sys.executable, "-c", ENDING, name, str(tmp_path), how], env={"PATH": ""})
    for name in ending:
        while not (tmp_path / f"ready-{name}").exists():
            assert all(c.popen.poll() is None for c in sup.children), "a stand-in died at start-up"
            threading.Event().wait(0.01)
    # It ignores SIGTERM, so any bound expires: a short one only keeps the test short.
    sup.stop_all({"generator": 0.2, "learner": 600, "buffer": 600})
    assert launch.service_stops(sup.stops, tmp_path) == {
        "generator-0": {"exit_code": -signal.SIGKILL, "killed": True, "final_metrics": False},
        "learner": {"exit_code": 3, "killed": False, "final_metrics": False},
        "buffer": {"exit_code": 0, "killed": False, "final_metrics": True},
    }
    said = caplog.text
    assert "generator-0 did not stop within" in said and "killing it" in said
    assert "learner exited with code 3 while stopping" in said
    assert "generator-0 wrote no final metrics (it was killed)" in said
    assert "learner wrote no final metrics (it exited with code 3)" in said
    assert "buffer wrote no final metrics" not in said


class _View:
    """The live view's two members `supervise` uses; counts its updates, and on the first one lets
    the service `release` exit (so the exit comes after supervise's first look, whatever the speed)."""

    def __init__(self, release: Path | None = None) -> None:
        self.endpoints: Any = None
        self.updates = 0
        self.release = release

    def update(self) -> dict[str, Any]:
        self.updates += 1
        if self.release is not None:
            self.release.touch()
        return {}


# A stand-in service that exits with the code in argv[1] once the file argv[2] appears.
EXIT_WHEN = r"""
import os, sys, time
while not os.path.exists(sys.argv[2]):
    time.sleep(0.01)
sys.exit(int(sys.argv[1]))
"""


def _supervised(tmp_path: Path, names_codes: dict[str, int]) -> tuple[Supervisor, Any]:
    cfg = load_config(overrides=[f'run.out_dir="{tmp_path}"'], environ={})
    sup = Supervisor(tmp_path)
    for name, code in names_codes.items():
        argv = [sys.executable, "-c", EXIT_WHEN, str(code), str(tmp_path / f"go-{name}")]
        sup.start(name, argv, env={"PATH": ""})
    return sup, cfg


@pytest.mark.timeout(900)
def test_supervise_returns_when_the_learner_exits_not_at_the_next_period(tmp_path: Path) -> None:
    """Regression: supervise slept its whole period (5 s) between looks, so every run ended up to a
    period after its learner. With an hour's period it must still return on the learner's exit (a
    sleep would hit this test's timeout)."""
    sup, cfg = _supervised(tmp_path, {"buffer": 0, "learner": 0})
    view = _View(release=tmp_path / "go-learner")
    try:
        launch.supervise(sup, view, cfg, period_s=3600)  # type: ignore[arg-type]
        assert sup.children[1].popen.returncode == 0 and sup.children[0].popen.poll() is None
        assert view.updates == 2  # one look before the exit, one after: no period went by
    finally:
        (tmp_path / "go-buffer").touch()
        sup.stop_all(30)


@pytest.mark.timeout(900)
def test_supervise_fails_naming_a_service_that_died_first(tmp_path: Path) -> None:
    sup, cfg = _supervised(tmp_path, {"buffer": 3, "learner": 0})
    (tmp_path / "go-buffer").touch()
    try:
        with pytest.raises(launch.ServiceFailed, match=r"^buffer exited with code 3; last lines of"):
            launch.supervise(sup, _View(), cfg, period_s=3600)  # type: ignore[arg-type]
        assert sup.children[1].popen.poll() is None  # the learner is still at work
    finally:
        (tmp_path / "go-learner").touch()
        sup.stop_all(30)


def test_wait_for_an_exit_without_pidfds_sleeps_the_period(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.delattr(launch.os, "pidfd_open", raising=False)
    monkeypatch.setattr(launch.time, "sleep", slept.append)

    class Running:
        pid = 1

        def poll(self) -> None:
            return None

    launch.wait_for_an_exit([Running()], 2.5)  # type: ignore[list-item]
    assert slept == [2.5]
