"""bench/results.py's included sections: a JSON section shows its own page when it has one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import bench.results as results


def test_a_json_section_with_a_page_of_its_name_shows_the_page_and_one_without_shows_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.json").write_text(json.dumps({"pairs": 681}))
    (tmp_path / "a.md").write_text("The corpus has 681 pairs (`results/a.json`).\n")
    (tmp_path / "b.json").write_text(json.dumps({"pairs": 12}))
    monkeypatch.setattr(
        results,
        "EXTERNAL",
        (("A", "a.json", "python a.py"), ("B", "b.json", "python b.py"), ("C", "c.json", "c")),
    )
    page = results.render_external(tmp_path)
    a, b, c = page.split("### ")[1:]
    assert a == "A\n\nThe corpus has 681 pairs (`results/a.json`).\n\n"
    assert (
        b.startswith(f"B\n\nFrom `{tmp_path.name}/b.json`, written by `python b.py`.")
        and "| pairs | 12 |" in b
    )
    assert c == "C\n\nNot yet run: `c`\n\n"


def test_the_time_to_target_row_names_the_long_cot_seeds_when_their_file_is_there(tmp_path: Path) -> None:
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    alone = results.time_to_target_row(results_dir)
    assert "tiny-cpu: one seed" in alone and "long-CoT" not in alone
    over = {"ratio_sync_over_async": {"mean": 1.3891, "std": 0.0594, "n": 3, "missing": 0}}
    (results_dir / "async_sync_ttt_longcot.json").write_text(
        json.dumps({"target_delta": 0.1, "over_seeds": over})
    )
    row = results.time_to_target_row(results_dir)
    assert "long-CoT recipe: 3 seeds, sync/async 1.39 ± 0.06 to +10 points" in row
    assert "`results/async_sync_ttt_longcot.json`" in row and row.endswith(". |\n")
    (results_dir / "async_sync_ttt_longcot.json").write_text("{not json")
    assert (
        results.time_to_target_row(results_dir) == alone
    )  # a broken file: the figure left out, no traceback
