"""The machine record of a wall-clock figure, from /proc/cpuinfo text given by hand, and the code
version a run records, from a git repository made here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stream_dapo import __version__
from stream_dapo.runtime.host import code_version, cpu_isa, cpu_model, describe_machine

ZEN3 = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
    "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
    "processor\t: 1\nmodel name\t: Other\nflags\t: avx512f\n"
)
ZEN4 = "cpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9B14\nflags\t\t: avx2 avx512f avx512_vnni avx512_bf16 fma\n"


def test_the_vector_isa_of_the_first_processor_only() -> None:
    assert cpu_isa(ZEN3) == "family 25 model 1: avx2"  # the second processor's avx512f is not read
    assert cpu_isa(ZEN4) == "family 25 model 17: avx2 avx512f avx512_bf16 avx512_vnni"
    assert (
        cpu_isa("flags\t: sse2\n")
        == "family ? model ?: none of avx2 avx512f avx512_bf16 avx512_vnni amx_bf16"
    )


def test_one_line_tells_apart_two_machines_of_one_model_name() -> None:
    assert cpu_model(ZEN3) == "AMD EPYC 7B13"
    assert describe_machine(ZEN3, cores=2) == "AMD EPYC 7B13 (family 25 model 1: avx2), 2 usable cores"
    same_name = ZEN4.replace("9B14", "7B13")
    assert describe_machine(same_name, cores=2) != describe_machine(ZEN3, cores=2)


def _git(repo: Path, *args: str) -> str:
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *ident, *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.process
def test_code_version_names_the_commit_and_says_when_tracked_files_differ(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    _git(tmp_path, "add", "a.py")
    _git(tmp_path, "commit", "-q", "-m", "one")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert code_version(tmp_path) == head
    (tmp_path / "notes.txt").write_text("untracked\n")  # untracked files are not the code
    assert code_version(tmp_path) == head
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == f"{head} (with uncommitted changes)"


@pytest.mark.process
def test_code_version_outside_a_checkout_root_is_the_package_version(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    inside = tmp_path / ".venv" / "lib"  # an installed package under some other repository
    inside.mkdir(parents=True)
    assert code_version(inside) == f"stream-dapo {__version__}"
    assert code_version(tmp_path / "missing") == f"stream-dapo {__version__}"
