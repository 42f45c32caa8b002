"""The learner's checkpoints: pruning to learner.keep_checkpoints, and a full disk at a checkpoint.

A full disk is simulated by making the checkpoint's writer fail as it does on one (torch's zip
writer with its errno-less RuntimeError, or an OSError with ENOSPC), with the free space reported
as nearly none; everything else is the real learner service against a stand-in buffer.
"""

from __future__ import annotations

import argparse
import errno
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from stream_dapo.cli import learner as learner_cli
from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.learner.checkpoints import LATEST, discard_unfinished, prune_checkpoints, read_latest
from stream_dapo.runtime import service_runner
from stream_dapo.runtime.disk import is_disk_full
from stream_dapo.runtime.exit_codes import ExitCode
from tests.integration.test_learner import FakeBuffer, make_cfg, tiny_model

TORCH_FULL_DISK = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def make_checkpoints(root: Path, steps: list[int], latest: int | None) -> None:
    for step in steps:
        (root / f"step_{step:06d}" / "hf").mkdir(parents=True)
        (root / f"step_{step:06d}" / "learner_state.json").write_text(f'{{"version": {step}}}')
    if latest is not None:
        (root / LATEST).write_text(f"step_{latest:06d}\n")


def names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir())


# --------------------------------------------------------------------------------------------------
# Pruning
# --------------------------------------------------------------------------------------------------


def test_pruning_keeps_the_newest_checkpoints_and_nothing_else_of_ours(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, [2, 4, 6, 8, 10], latest=10)
    (tmp_path / ".step_000012.tmp").mkdir()  # being written: not a checkpoint yet
    (tmp_path / "notes.txt").write_text("mine")
    assert prune_checkpoints(tmp_path, keep=3) == ["step_000002", "step_000004"]
    assert names(tmp_path) == [
        ".step_000012.tmp",
        LATEST,
        "notes.txt",
        "step_000006",
        "step_000008",
        "step_000010",
    ]
    assert prune_checkpoints(tmp_path, keep=3) == []


def test_pruning_never_deletes_the_checkpoint_latest_names(tmp_path: Path) -> None:
    # latest behind the newest directories (a resume from an older checkpoint): it stays, with the newest.
    make_checkpoints(tmp_path, [1, 2, 3, 4], latest=1)
    assert prune_checkpoints(tmp_path, keep=1) == ["step_000002", "step_000003"]
    assert names(tmp_path) == [LATEST, "step_000001", "step_000004"]
    assert read_latest(tmp_path) == "step_000001"


def test_pruning_orders_by_step_number_not_by_name(tmp_path: Path) -> None:
    (tmp_path / "step_999999").mkdir()
    (tmp_path / "step_1000000").mkdir()
    assert prune_checkpoints(tmp_path, keep=1) == ["step_999999"]
    assert names(tmp_path) == ["step_1000000"]


def test_keep_checkpoints_is_at_least_one() -> None:
    assert load_config(environ={}).learner.keep_checkpoints == 3
    with pytest.raises(ConfigError, match="learner.keep_checkpoints"):
        load_config(overrides=["learner.keep_checkpoints=0"], environ={})


def test_a_failed_write_leaves_only_the_checkpoint_latest_names(tmp_path: Path) -> None:
    make_checkpoints(tmp_path, [1, 2], latest=1)  # step 2 renamed, but `latest` was never updated
    (tmp_path / ".step_000003.tmp" / "deepspeed").mkdir(parents=True)
    discard_unfinished(tmp_path, tmp_path / ".step_000003.tmp", tmp_path / "step_000002")
    assert names(tmp_path) == [LATEST, "step_000001"]
    discard_unfinished(tmp_path, tmp_path / ".step_000001.tmp", tmp_path / "step_000001")
    assert names(tmp_path) == [LATEST, "step_000001"]


def run_learner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: dict[str, Any] | None = None, **learner: float
) -> tuple[int, FakeBuffer]:
    """`stream-dapo learner` in-process against a stand-in buffer; returns its exit code."""
    tiny_model(0).save_pretrained(tmp_path / "model")
    cfg = make_cfg(
        tmp_path,
        algo=algo or {},
        learner={"sync_every": 1, "checkpoint_every": 1, "mini_batch_samples": 2, **learner},
        transport={"timeout_s": 10.0},
        metrics={"learner_port": 0},
        weights={"chunk_bytes": 4096},
    )
    monkeypatch.setattr(service_runner, "on_stop_signal", lambda *args: None)  # no handlers in pytest
    buffer = FakeBuffer(cfg)
    try:
        return learner_cli.run(argparse.Namespace(cfg=buffer.cfg, max_steps=None)), buffer
    finally:
        buffer.close()


@pytest.mark.process
def test_the_learner_keeps_its_newest_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, buffer = run_learner(tmp_path, monkeypatch, total_steps=4, keep_checkpoints=2)
    assert code == ExitCode.OK
    ckpts = tmp_path / "run" / "checkpoints"
    assert names(ckpts) == [LATEST, "step_000003", "step_000004"]
    assert read_latest(ckpts) == "step_000004"
    assert [c.learner_version for c in buffer.commits] == [1, 2, 3, 4]


@pytest.mark.process
def test_a_resume_applies_a_new_lr_and_refuses_a_new_group_size_naming_both_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: after a restart with learner.lr 2e-4 -> 1e-4 every step still trained at 2e-4 (the
    restored optimizer's), unlogged; algo.group_size 8 -> 4 was accepted and trained mixed batches."""
    import json

    assert run_learner(tmp_path, monkeypatch, total_steps=2, warmup_steps=0, lr=2e-4)[0] == ExitCode.OK
    with caplog.at_level("INFO", logger="stream_dapo"):
        assert run_learner(tmp_path, monkeypatch, total_steps=4, warmup_steps=0, lr=1e-4)[0] == ExitCode.OK
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "learner" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["version"] for r in rows] == [1, 2, 3, 4]
    assert [r["lr"] for r in rows] == pytest.approx([2e-4, 2e-4, 1e-4, 1e-4])
    assert "resumed with changed settings, applied: learner.lr 0.0002 -> 0.0001" in caplog.text
    caplog.clear()
    with caplog.at_level("ERROR", logger="stream_dapo"):
        code, _ = run_learner(
            tmp_path,
            monkeypatch,
            algo={"group_size": 4},
            total_steps=6,
            warmup_steps=0,
            lr=1e-4,
            mini_batch_samples=4,
        )
    assert code == ExitCode.CONFIG
    assert "algo.group_size 2 -> 4" in caplog.text and "another run.out_dir" in caplog.text
    assert "Traceback" not in caplog.text


# --------------------------------------------------------------------------------------------------
# A full disk
# --------------------------------------------------------------------------------------------------


def nearly_full(monkeypatch: pytest.MonkeyPatch) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))


def test_torch_writer_errors_count_as_a_full_disk_only_when_the_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"), tmp_path)
    assert is_disk_full(
        RuntimeError("Error while serializing: IoError(No space left on device (os error 28))"), tmp_path
    )
    wrapped = RuntimeError("checkpoint failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert is_disk_full(wrapped, tmp_path)
    assert not is_disk_full(RuntimeError(TORCH_FULL_DISK), tmp_path)  # plenty of space: some other fault
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"), tmp_path)
    nearly_full(monkeypatch)
    assert is_disk_full(RuntimeError(TORCH_FULL_DISK), tmp_path)
    assert is_disk_full(RuntimeError("basic_ios::clear: iostream error"), tmp_path)
    assert not is_disk_full(RuntimeError("CUDA out of memory"), tmp_path)


@pytest.mark.parametrize(
    "failure",
    [RuntimeError(TORCH_FULL_DISK), OSError(errno.ENOSPC, "No space left on device")],
    ids=["torch-zip-writer", "ENOSPC"],
)
@pytest.mark.process
def test_a_full_disk_at_a_checkpoint_keeps_the_last_good_one_and_exits_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    failure: Exception,
) -> None:
    ckpts = tmp_path / "run" / "checkpoints"
    save = torch.save

    def save_until_the_disk_fills(obj, f, *args, **kwargs):
        if ".step_000002.tmp" not in str(f):
            return save(obj, f, *args, **kwargs)
        Path(f).write_bytes(b"PK\x03\x04 half a zip file")  # what the writer got out before the disk filled
        nearly_full(monkeypatch)
        raise failure

    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    with caplog.at_level(logging.ERROR, logger="stream_dapo"):
        code, buffer = run_learner(tmp_path, monkeypatch, total_steps=2)

    assert code == ExitCode.FAILURE  # the units restart on 1 (RestartPreventExitStatus=2 only)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith(f"learner stopped: no space left on {ckpts} ")
    assert "checkpoint step_000002" in errors[0] and "`latest` still names step_000001" in errors[0]
    assert "Traceback" not in capsys.readouterr().err
    # The last good state: step 1 complete and named by latest, nothing half-written anywhere.
    assert names(ckpts) == [LATEST, "step_000001"]
    assert read_latest(ckpts) == "step_000001"
    assert (ckpts / "step_000001" / "hf" / "model.safetensors").is_file()
    assert [p for p in (tmp_path / "run").rglob("*") if ".tmp" in p.name] == []
    # Only step 1's groups were committed: step 2's return to the queue at the next learner_hello.
    assert [c.learner_version for c in buffer.commits] == [1]
