"""`stream-dapo run` stops its services in drain order, each with its own bound: the learner gets time
for its step, final checkpoint and commit while the buffer it commits to is still up.

Regression: every service had the same 30 s; a learner of a real model (a step takes minutes on CPU)
was killed mid-drain, its last step lost and its commit never sent, and only then the buffer stopped.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from stream_dapo.config import load_config
from stream_dapo.tools.launch import Supervisor, stop_timeouts

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
        overrides=["transport.timeout_s=20", "run.learner_stop_timeout_s=1200", "metrics.final_scrape_wait_s=30"],
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
