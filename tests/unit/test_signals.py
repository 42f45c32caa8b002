"""`exit_on_sigterm`: while a tool holds processes it must stop (a vLLM engine's), SIGTERM unwinds it
like Ctrl-C, so its ``finally`` runs; the handler before it comes back afterwards.

Regression: tools that started ``vllm.LLM`` without such a handler (the real-model study's eval, the
TRL comparison's eval) ended at once on SIGTERM and left vLLM's engine-core and worker processes
running with ppid 1, busy on every core they were bound to.
"""

from __future__ import annotations

import selectors
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from stream_dapo.generator import vllm_utils
from stream_dapo.runtime.signals import exit_on_sigterm

# Enters the block, says so, blocks; its finally sends itself a second SIGTERM (which must not cut
# the clean-up short) and then writes the file the test reads.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from stream_dapo.runtime.signals import exit_on_sigterm

    done = sys.argv[1]
    with exit_on_sigterm("the test's stand-in engine"):
        try:
            print("ready", flush=True)
            time.sleep(600)  # ended by the SIGTERM, never by the clock
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while unwinding: ignored
            with open(done, "w") as f:
                f.write("finally ran")
    """
)


def _own_handler(signum: int, _frame: Any) -> None:
    raise AssertionError("the handler installed before the block was called")


@pytest.fixture
def own_sigterm_handler() -> Any:
    """A handler of the test's own in place of pytest's, put back afterwards."""
    before = signal.signal(signal.SIGTERM, _own_handler)
    yield _own_handler
    signal.signal(signal.SIGTERM, before)


@pytest.mark.process
def test_sigterm_runs_the_finally_block_of_a_real_process_and_exits_143(tmp_path: Path) -> None:
    done = tmp_path / "finally.txt"
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(done)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None  # both are pipes
        with selectors.DefaultSelector() as sel:  # the handler is installed once "ready" is printed
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=120), "the child never entered the block"
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=120)  # a bound on failure only: it exits as soon as it unwinds
        stderr = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert returncode == 128 + signal.SIGTERM, stderr
    assert done.read_text() == "finally ran", stderr
    assert "received SIGTERM: stopping the test's stand-in engine" in stderr


def test_sigterm_inside_the_block_raises_system_exit_and_the_old_handler_comes_back(
    own_sigterm_handler: Any,
) -> None:
    with pytest.raises(SystemExit) as exited, exit_on_sigterm("nothing"):
        assert signal.getsignal(signal.SIGTERM) not in (own_sigterm_handler, signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
    assert exited.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler


def test_a_block_that_ends_normally_or_raises_restores_the_old_handler(own_sigterm_handler: Any) -> None:
    with exit_on_sigterm("nothing"):
        pass
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler
    with pytest.raises(ValueError), exit_on_sigterm("nothing"):
        raise ValueError("boom")
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler


def test_off_the_main_thread_nothing_changes(own_sigterm_handler: Any) -> None:
    seen: list[Any] = []

    def body() -> None:
        with exit_on_sigterm("nothing"):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [own_sigterm_handler]


def test_running_llm_shuts_the_engine_down_when_sigterm_arrives(
    own_sigterm_handler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tools' engine (`stream-dapo eval`, the studies' evals): SIGTERM while it is up stops its
    processes (`shutdown_llm`) before the tool exits."""
    engine = object()
    stopped: list[object] = []
    monkeypatch.setattr(vllm_utils, "make_llm", lambda *a, **kw: engine)
    monkeypatch.setattr(vllm_utils, "shutdown_llm", stopped.append)
    gen = vllm_utils.GeneratorConfig()
    with (
        pytest.raises(SystemExit),
        vllm_utils.running_llm("model", gen, dtype="float32", max_model_len=8, seed=0),
    ):
        signal.raise_signal(signal.SIGTERM)
    assert stopped == [engine]
    assert signal.getsignal(signal.SIGTERM) is own_sigterm_handler
