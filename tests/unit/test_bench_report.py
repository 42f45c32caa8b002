"""The benchmark helpers (bench/report.py) and the results page's pure renderers, on hand-computed
numbers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.report import (
    REPO,
    fmt,
    fmt_ratio,
    interleave,
    markdown_table,
    median,
    paired_ratio,
    repo_relative,
    save_json,
    summary,
)
from bench.results import json_tables, parse_only


def test_saved_results_name_paths_inside_the_checkout_relative_to_it(tmp_path: Path) -> None:
    data = {
        "model_dir": f"{REPO}/runs/m/warm",
        "command": f"python bench/x.py {REPO}/runs/a runs/b",
        "runs": [{"dir": f"{REPO}/runs/c"}, 3, None],
        "elsewhere": "/opt/models/m",
    }
    want = {
        "model_dir": "runs/m/warm",
        "command": "python bench/x.py runs/a runs/b",
        "runs": [{"dir": "runs/c"}, 3, None],
        "elsewhere": "/opt/models/m",
    }
    assert repo_relative(data) == want
    save_json(tmp_path / "deep" / "r.json", data, indent=1)
    assert json.loads((tmp_path / "deep" / "r.json").read_text()) == want


def test_median_of_odd_and_even_counts() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert median([4.0, 1.0, 3.0, 2.0]) == 2.5


def test_median_refuses_empty_and_non_finite_values() -> None:
    with pytest.raises(ValueError, match="no values"):
        median([])
    with pytest.raises(ValueError, match="non-finite"):
        median([1.0, math.nan])


def test_paired_ratio_is_the_median_of_per_repeat_ratios() -> None:
    # Per repeat: 10/5 = 2, 30/10 = 3, 8/8 = 1 -> median 2. (The ratio of medians would be 10/8.)
    assert paired_ratio([10.0, 30.0, 8.0], [5.0, 10.0, 8.0]) == 2.0


def test_paired_ratio_needs_equal_lengths_and_positive_denominators() -> None:
    with pytest.raises(ValueError, match="one b per a"):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([1.0], [0.0])


def test_summary_keeps_every_repeat() -> None:
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "values": [3.0, 1.0, 2.0]}


def test_interleave_rotates_the_order_and_drops_warmup_rounds() -> None:
    calls: list[str] = []
    counter = {"a": 0, "b": 0, "c": 0}

    def variant(name: str):
        def run() -> float:
            calls.append(name)
            counter[name] += 1
            return float(counter[name])

        return run

    out = interleave({k: variant(k) for k in "abc"}, repeats=3, warmup=1)
    # Round 0 (warm-up) a b c; round 1 b c a; round 2 c a b; round 3 a b c.
    assert "".join(calls) == "abc" + "bca" + "cab" + "abc"
    assert out == {"a": [2.0, 3.0, 4.0], "b": [2.0, 3.0, 4.0], "c": [2.0, 3.0, 4.0]}


def test_interleave_needs_a_repeat() -> None:
    with pytest.raises(ValueError, match="repeats"):
        interleave({"a": lambda: 1.0}, repeats=0)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1234.7, "1,235"),
        (123456.0, "123,456"),
        (12.345, "12.3"),
        (1.5, "1.50"),
        (0.012345, "0.0123"),
        (9.996, "10.0"),
        (99.96, "100"),
        (0.0, "0"),
        (-2.5, "-2.50"),
        (42, "42"),
        (12345, "12,345"),
        (None, "–"),
        (True, "yes"),
    ],
)
def test_fmt_keeps_three_significant_digits(value: float | int | None, text: str) -> None:
    assert fmt(value) == text


def test_fmt_ratio() -> None:
    assert fmt_ratio(2.4137) == "2.41×"
    assert fmt_ratio(None) == "–"


def test_markdown_table_aligns_and_escapes() -> None:
    table = markdown_table(["name", "rate"], [["a|b", "1.00"], ["c", "20"]])
    assert table == "| name | rate |\n| :-- | --: |\n| a\\|b | 1.00 |\n| c | 20 |\n"


def test_markdown_table_refuses_ragged_rows() -> None:
    with pytest.raises(ValueError, match="2 columns"):
        markdown_table(["a", "b"], [["only one"]])
    with pytest.raises(ValueError, match="align"):
        markdown_table(["a", "b"], [], align="l")


def test_json_tables_flattens_scalars_and_tabulates_lists_of_objects() -> None:
    report = {
        "ok": True,
        "seed": 0,
        "sides": {"trl": {"seconds": 12.5}, "note": "x"},
        "sockets": [{"socket": "samples", "crashes": 0, "mutations": {"flip": 3}}],
    }
    text = json_tables(report)
    assert "| ok | yes |" in text
    assert "| seed | 0 |" in text
    assert "| sides.trl | seconds: 12.5 |" in text
    assert "| sides.note | x |" in text
    # Nested objects inside list items are left out of the table.
    assert "| socket | crashes |\n| :-- | :-- |\n| samples | 0 |" in text


def test_parse_only_keeps_the_page_order_and_rejects_unknown_names() -> None:
    assert parse_only("transport,learner") == ["learner", "transport"]
    assert parse_only(None)[0] == "generation"
    with pytest.raises(SystemExit, match="unknown section"):
        parse_only("transport,nope")
