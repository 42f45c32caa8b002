"""Two generators bound to one CPU core are told so (issue 41 item 4): each claims the cores its
vLLM threads are bound to with a lock file per core on its host, and a core another live engine
holds is a loud warning naming both, not a silent five-minute start."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stream_dapo.config import load_config
from stream_dapo.generator import vllm_utils
from stream_dapo.generator.root import build_generator
from stream_dapo.generator.vllm_utils import CoreClaims, bound_cores


def test_bind_strings_name_their_cores() -> None:
    assert bound_cores("0-3,6") == [0, 1, 2, 3, 6]
    assert bound_cores("0-1|2-3") == [0, 1, 2, 3]
    assert bound_cores("5") == [5]
    assert bound_cores("auto") == bound_cores("nobind") == bound_cores("") == []


def test_a_core_held_by_a_live_engine_is_a_conflict_naming_it_and_free_once_released(tmp_path: Path) -> None:
    first = CoreClaims([0, 1], "generator-0 (host pid 11 (ab))", tmp_path)
    assert first.conflicts == []
    second = CoreClaims([1, 2], "generator-1 (host pid 12 (cd))", tmp_path)
    assert second.conflicts == [(1, "generator-0 (host pid 11 (ab))")]
    message = second.describe("generator-1", "1-2")
    assert "core 1 by generator-0 (host pid 11 (ab))" in message
    assert "VLLM_CPU_OMP_THREADS_BIND" in message and "may take minutes to start" in message
    first.close()
    third = CoreClaims([0, 1], "generator-2 (host pid 13 (ef))", tmp_path)
    assert third.conflicts == []  # the first engine is gone: its locks went with it
    second.close()
    third.close()


def test_the_generator_warns_before_starting_its_engine_on_a_taken_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(vllm_utils, "is_cpu_platform", lambda: True)
    monkeypatch.setattr(vllm_utils.tempfile, "gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    other = CoreClaims([0], "generator-0 (host pid 11 (ab))", tmp_path / "stream-dapo-cores")
    cfg = load_config(overrides=[f'run.out_dir="{tmp_path}"'], environ={})
    generator = build_generator(cfg, 1)
    try:
        with caplog.at_level(logging.WARNING, logger="stream_dapo.generator"):
            generator.claim_cores()
        assert "generator-1 binds its vLLM threads to cores '0'" in caplog.text
        assert "core 0 by generator-0 (host pid 11 (ab))" in caplog.text
        assert generator.health.detail["core_conflicts"] == [0]
    finally:
        generator.close()
        other.close()


def test_a_lock_directory_that_cannot_be_written_checks_nothing_and_stops_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    claims = CoreClaims([0], "generator-0", blocker / "cores")  # not a directory: cannot be created
    assert claims.conflicts == []
    claims.close()
