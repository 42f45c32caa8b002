"""bench/results.py's pages: one page per result, an index that links them, and --render-only
reproducing the committed pages bit for bit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import bench.results as results

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.process  # the index's machine table asks git for the commit when nothing was measured
def test_a_json_result_with_a_page_of_its_name_links_that_page_and_one_without_gets_a_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    (results_dir / "a.json").write_text(json.dumps({"pairs": 681}))
    (results_dir / "a.md").write_text("The corpus has 681 pairs (`a.json`).\n")
    (results_dir / "b.json").write_text(json.dumps({"pairs": 12}))
    (results_dir / "d").mkdir()
    (results_dir / "d" / "ablation.md").write_text("# D\n")
    monkeypatch.setattr(
        results,
        "EXTERNAL",
        (
            ("A", "a.json", "python a.py"),
            ("B", "b.json", "python b.py"),
            ("C", "c.json", "c"),
            ("D", "d/ablation.md", "d"),
        ),
    )
    pages = results.render_pages({}, results_dir, {})
    # a's own page is linked and not rewritten; b gets a page of its tables; c is not run yet
    assert "results/a.md" not in pages
    assert pages["results/b.md"].startswith(
        results.GENERATED + "# B\n\n[All results](../RESULTS.md)\n\nFrom `b.json`"
    )
    assert "| pairs | 12 |" in pages["results/b.md"]
    # a page this script wrote is written again, never mistaken for a page of its own
    (results_dir / "b.md").write_text(pages["results/b.md"])
    assert results.render_pages({}, results_dir, {})["results/b.md"] == pages["results/b.md"]
    index = pages["RESULTS.md"]
    assert "| A | [results/a.md](results/a.md) |" in index
    assert "| B | [results/b.md](results/b.md) |" in index
    assert "| C | not yet run: `c` |" in index
    assert "| D | [results/d/ablation.md](results/d/ablation.md) |" in index
    # every throughput section has a page, measured or not, and the index links each once
    for name in results.SECTIONS:
        assert pages[f"results/{name}.md"].startswith(
            f"{results.GENERATED}# {results.SECTIONS[name].title}\n"
        )
        assert index.count(f"(results/{name}.md)") == 1
    assert "Not yet run: `python -m bench.results --only transport`" in pages["results/transport.md"]


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
    assert "`async_sync_ttt_longcot.json`" in row and row.endswith(". |\n")
    (results_dir / "async_sync_ttt_longcot.json").write_text("{not json")
    assert results.time_to_target_row(results_dir) == alone  # a broken file: the figure left out


def test_render_only_reproduces_every_committed_page_bit_for_bit(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs)
    committed = {
        rel: (REPO / "docs" / rel).read_text()
        for rel in results.render_pages(
            results.load_results(docs / "results" / results.RESULTS_JSON), docs / "results", {}
        )
    }
    sections = results.load_results(docs / "results" / results.RESULTS_JSON)
    results.render(docs, sections, plots=False)
    for rel, text in committed.items():
        assert (docs / rel).read_text() == text, f"{rel} differs from what --render-only writes"
    assert len(committed) >= len(results.SECTIONS) + 5
