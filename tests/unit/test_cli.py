"""The command line: instant help (no heavy imports), config show, clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dapo.cli import COMMANDS, main

HEAVY = ("torch", "vllm", "deepspeed", "transformers", "zmq")


@pytest.mark.process
def test_help_imports_no_heavy_library() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from stream_dapo.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: main(['--help'])\n"
        "    except SystemExit: pass\n"
        "    main(['config', 'show'])\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_command_has_help() -> None:
    for name in COMMANDS:
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"])
        assert exc.value.code == 0


def test_config_show_paper_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "config",
                "show",
                "--config",
                str(Path(__file__).resolve().parents[2] / "configs" / "dapo-qwen2.5-32b.toml"),
                "--format",
                "json",
            ]
        )
        == 0
    )
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["algo"]["eps_high"] == 0.28 and cfg["algo"]["max_response_len"] == 20480


def test_config_error_exits_2_and_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "algo.eps_hihg=0.3"]) == 2
    assert "did you mean 'algo.eps_high'" in capsys.readouterr().err


def test_config_show_refuses_what_the_buffer_would_refuse(capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: `--set learner.checkpoint_every=50` passed `config show` and `run`'s check, then the
    buffer exited 2 and the learner and the generator 69 after 30 s."""
    assert main(["config", "show", "--set", "learner.checkpoint_every=50"]) == 2
    err = capsys.readouterr().err
    assert (
        "Set buffer.capacity_groups >= 400, or lower learner.checkpoint_every" in err
        and "Traceback" not in err
    )


def test_run_refuses_a_precision_the_learner_cannot_train_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: bf16 at ZeRO stage 0 was refused only by the learner, after the buffer and the
    generators had started (and loaded the model)."""
    out = tmp_path / "run"
    argv = ["run", "--quiet", "--set", "model.dtype=bfloat16", "--set", f'run.out_dir="{out}"']
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "set learner.zero_stage=1" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["config", "show", "--set", "model.dtype=bfloat16"]) == 0  # evaluate may serve bf16


def test_no_command_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


@pytest.mark.process
def test_vllm_logs_go_to_stderr_and_an_operators_stream_wins() -> None:
    """`stream-dapo eval > out.json` must leave only the JSON on stdout: vLLM logs to stdout by
    default, so every command points it at stderr first, unless VLLM_LOGGING_STREAM is set."""
    code = (
        "from stream_dapo.cli import library_logs_to_stderr\n"
        "library_logs_to_stderr()\n"
        "from vllm.config.logging import LoggingConfig\n"
        "from vllm.logger import configure_logging, init_logger\n"
        "configure_logging(LoggingConfig())\n"  # what building an engine does
        "init_logger('vllm.stream_dapo_test').warning('engine line')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_STREAM"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert "engine line" not in out.stdout and "engine line" in out.stderr
    env["VLLM_LOGGING_STREAM"] = "ext://sys.stdout"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert "engine line" in out.stdout and "engine line" not in out.stderr
