"""The fast tier's promise, enforced: a unit test that starts a process (a subprocess, a
multiprocessing pool) or a DeepSpeed engine must say so with ``@pytest.mark.process``;
``make test-fast`` deselects those. An unmarked test that tries fails with that fix."""

from __future__ import annotations

import multiprocessing.process
import subprocess
import sys

import matplotlib.font_manager  # noqa: F401  (see below)
import pytest

# matplotlib builds its font cache at its first import by running fc-list, a subprocess: imported
# here, before any guard, or on a machine without that cache (a fresh one) the guard below fails
# whichever unit test draws first.

FIX = "this unit test starts {what}: mark it @pytest.mark.process (make test-fast leaves those out)"


@pytest.fixture(autouse=True)
def _no_process_unless_marked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if request.node.get_closest_marker("process") is not None:
        return

    def refuse(what: str):
        def start(*args: object, **kwargs: object) -> None:
            raise AssertionError(FIX.format(what=what))

        return start

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("a subprocess"))
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse("a process"))
    deepspeed = sys.modules.get("deepspeed")
    if deepspeed is not None:
        monkeypatch.setattr(deepspeed, "initialize", refuse("a DeepSpeed engine"))
