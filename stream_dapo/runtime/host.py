"""What a figure depends on: the CPU model, its vector ISA and the usable cores, and the code's version.

Two machines sold under one model name ("AMD EPYC") ran the same recipe 2.5x apart (vLLM tokens/s)
with and without AVX-512, so a record of where a figure was measured names the ISA flags too. Used by
`stream-dapo ablate` (each cell records its machine, and a report whose cells ran on several says
that their seconds do not compare) and by the bench scripts' machine record. `code_version` names
the code a run imported: a long measurement outlives commits (an ablation resumed over sessions), so
each of its cells records the version its run started with.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

__all__ = ["ISA_FLAGS", "code_version", "cpu_isa", "cpu_model", "describe_machine"]

ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")
"""The /proc/cpuinfo flags that decide the CPU kernels torch and vLLM pick."""


def _first_processor(cpuinfo: str | None) -> dict[str, str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor is enough
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model(cpuinfo: str | None = None) -> str:
    """/proc/cpuinfo's ``model name`` (``cpuinfo``: its text, for tests), else the platform's name."""
    fields = _first_processor(cpuinfo) or {}
    return fields.get("model name") or platform.processor() or "unknown"


def cpu_isa(cpuinfo: str | None = None) -> str:
    """``family F model M: <the ISA_FLAGS present>`` from /proc/cpuinfo's first processor."""
    fields = _first_processor(cpuinfo)
    if fields is None:
        return "unknown"
    flags = set(fields.get("flags", "").split())
    present = [f for f in ISA_FLAGS if f in flags]
    head = f"family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    return f"{head}: {' '.join(present) if present else 'none of ' + ' '.join(ISA_FLAGS)}"


def describe_machine(cpuinfo: str | None = None, cores: int | None = None) -> str:
    """One line: ``<model> (<isa>), <N> usable cores``; ``cores`` defaults to this process's affinity."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return f"{cpu_model(cpuinfo)} ({cpu_isa(cpuinfo)}), {cores} usable cores"


def _git(tree: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=tree, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def code_version(tree: Path | None = None) -> str:
    """The code at ``tree`` (default: this package's checkout): ``<short commit>``, plus `` (with
    uncommitted changes)`` when tracked files differ from it; ``stream-dapo <version>`` where ``tree``
    is no git checkout (an installed wheel) or git is missing.

    Read it when the code is imported (a process keeps what it imported; the commit may move on while
    it runs)."""
    from stream_dapo import __version__

    tree = Path(__file__).resolve().parents[2] if tree is None else tree
    # Only the checkout's own root: an installed package inside some other repository (a venv in a
    # project folder) must not take that repository's commit.
    head = _git(tree, "rev-parse", "--short", "HEAD") if (tree / ".git").exists() else None
    if not head:
        return f"stream-dapo {__version__}"
    dirty = _git(tree, "status", "--porcelain", "--untracked-files=no")
    return f"{head} (with uncommitted changes)" if dirty else head
