"""What a wall-clock figure depends on: the CPU model, its vector ISA and the usable cores.

Two machines sold under one model name ("AMD EPYC") ran the same recipe 2.5x apart (vLLM tokens/s)
with and without AVX-512, so a record of where a figure was measured names the ISA flags too. Used by
`stream-dapo ablate` (each cell records its machine, and a report whose cells ran on several says
that their seconds do not compare) and by the bench scripts' machine record.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["ISA_FLAGS", "cpu_isa", "cpu_model", "describe_machine"]

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
