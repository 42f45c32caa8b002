"""Exit codes tell a supervisor whether a restart can help (stream_dapo/exit_codes.py)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest

from stream_dapo.cli import main
from stream_dapo.config import load_config
from stream_dapo.exit_codes import ExitCode
from tests.helpers import free_ports


def test_codes_are_the_documented_numbers() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 69, 130]


def test_a_config_typo_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "algo.eps_hihg=0.3"]) == ExitCode.CONFIG
    assert "algo.eps_high" in capsys.readouterr().err


def test_a_generator_whose_buffer_never_answers_exits_69_and_names_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from stream_dapo.generator import service

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))  # checked before the engine
    samples, metrics = free_ports(2)
    cfg = load_config(
        overrides=[
            f"model.path={model}",
            f'run.out_dir="{tmp_path / "run"}"',
            f"transport.samples_port={samples}",
            f"metrics.generator_port={metrics}",
            "transport.timeout_s=0.5",
        ],
        environ={},
    )
    with caplog.at_level(logging.ERROR, logger="stream_dapo"):
        code = service.run(argparse.Namespace(cfg=cfg, index=0))
    assert code == ExitCode.PEER_UNAVAILABLE
    assert "start `stream-dapo buffer` first" in caplog.text
