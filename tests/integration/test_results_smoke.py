"""bench/results.py end to end at --quick sizes on its cheap sections (transport, weight sync,
packing, and the learner with 2 steps): it writes the page and results.json with finite positive
figures, and --render-only rebuilds the page from the saved numbers."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ["learner", "packing", "transport", "weight_sync"]


def figures(tree: Any, path: str = "") -> list[tuple[str, float]]:
    """Every number under a "median" key or named like a rate or ratio, with its path."""
    out: list[tuple[str, float]] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            where = f"{path}.{key}"
            if isinstance(value, int | float) and not isinstance(value, bool):
                if key == "median" or "ratio" in where or "_vs_" in where:
                    out.append((where, float(value)))
            else:
                out.extend(figures(value, where))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            out.extend(figures(value, f"{path}[{i}]"))
    return out


@pytest.mark.timeout(300)
def test_quick_results_page_has_finite_positive_figures(tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "bench.results",
        "--quick",
        "--out",
        str(tmp_path),
        "--only",
        ",".join(SECTIONS),
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    page = tmp_path / "RESULTS.md"
    saved = json.loads((tmp_path / "results" / "results.json").read_text())["sections"]
    assert sorted(saved) == sorted(SECTIONS)
    for name in SECTIONS:
        entry = saved[name]
        assert entry["quick"] is True
        assert entry["command"] == f"python -m bench.results --only {name} --quick"
        found = figures(entry["data"])
        assert found, f"{name}: no figures in {entry['data']}"
        bad = [(where, v) for where, v in found if not (math.isfinite(v) and v > 0)]
        assert bad == [], f"{name}: figures not finite and positive: {bad}"
    assert saved["learner"]["data"]["steps"] == 2
    assert len(set(saved["learner"]["data"]["first_loss"].values())) == 1  # same data, same init

    index = page.read_text()
    pages = {name: (tmp_path / "results" / f"{name}.md").read_text() for name in [*SECTIONS, "generation"]}
    for name in SECTIONS:
        assert f"`python -m bench.results --only {name} --quick`" in pages[name]
        assert f"(results/{name}.md)" in index
    assert "Not yet run: `python -m bench.results --only generation`" in pages["generation"]
    assert "## Machine" in index and "DeepSpeed" in index
    assert "Smoke-test sizes" in pages["transport"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        pass
    else:
        for name in SECTIONS:
            assert (tmp_path / "results" / f"{name}.png").stat().st_size > 1000
            assert f"({name}.png)" in pages[name]

    # Re-render from the saved numbers alone: same sections, no benchmark runs.
    page.unlink()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.results", "--render-only", "--out", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "`python -m bench.results --only transport --quick`"
        in (tmp_path / "results" / "transport.md").read_text()
    )
    assert page.read_text() == index
