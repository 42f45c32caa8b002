"""services/<name>.py is `stream-dapo <name>`: the same parser, the same help, the same exit code for
a bad setting (the DESIGN's one entry point per long-running service)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("service", ["generator", "buffer", "learner"])
def test_the_entry_point_is_the_command(service: str) -> None:
    script = _run([sys.executable, f"services/{service}.py", "--help"])
    command = _run([sys.executable, "-m", "stream_dapo.cli", service, "--help"])
    assert script.returncode == command.returncode == 0, script.stderr + command.stderr
    # argparse names the program after argv[0]; everything after the usage line is the same
    assert script.stdout.split("\n", 1)[1] == command.stdout.split("\n", 1)[1]
    assert "--config" in script.stdout and "--set" in script.stdout

    typo = _run([sys.executable, f"services/{service}.py", "--set", "algo.eps_hihg=0.3"])
    assert typo.returncode == 2
    assert "unknown key 'algo.eps_hihg'; did you mean 'algo.eps_high'?" in typo.stderr
