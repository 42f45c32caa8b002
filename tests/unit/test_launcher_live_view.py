"""The live view of `stream-dapo run`: one line rewritten in place on a terminal, plain lines otherwise."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from stream_dapo.config import load_config
from stream_dapo.tools.launch import (
    Endpoints,
    LiveView,
    exit_hint,
    format_duration,
    format_status,
    rewrites_in_place,
    starvation_warning,
    status_text,
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


ROW = {
    "t": 125.0,
    "step": 10,
    "version_generators": 9,
    "samples_per_s": 6.93,
    "generator_tokens_per_s": 1834.6,
    "reward": -0.3125,
    "accuracy": 0.34375,
    "staleness_p95": 4.0,
    "filtered_frac": 0.395,
    "buffer_waiting": 12,
    "eta_s": 375,
}


def test_durations_read_as_hours_minutes_seconds() -> None:
    assert format_duration(3725) == "1h02m05s"
    assert format_duration(125.4) == "2m05s"
    assert format_duration(7) == "7s"
    assert format_duration(None) == "?"


def test_the_status_line_shows_progress_throughput_and_eta() -> None:
    line = format_status(ROW, total_steps=40)
    assert line == (
        "step 10/40 (25%) gen-v 9 | 6.9 samples/s 1835 tok/s | reward -0.312 acc 0.344 | "
        "stale-p95 4 filtered 40% buffer 12 | 2m05s elapsed, ETA 6m15s"
    )
    early = format_status({**ROW, "step": 0, "staleness_p95": None, "eta_s": None}, total_steps=40)
    assert "stale-p95 -" in early and early.endswith("ETA ?")


def test_a_terminal_gets_the_line_rewritten_a_pipe_gets_a_line_each(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm-256color")
    assert rewrites_in_place(Terminal()) is True
    assert rewrites_in_place(io.StringIO()) is False
    monkeypatch.setenv("TERM", "dumb")
    assert rewrites_in_place(Terminal()) is False


def test_in_place_text_returns_clears_and_fits_the_terminal() -> None:
    assert status_text("abc", in_place=False, width=0) == "abc\n"
    assert status_text("abc", in_place=True, width=80) == "\r\x1b[2Kabc"
    cut = status_text("x" * 100, in_place=True, width=20)
    assert cut == "\r\x1b[2K" + "x" * 18 + "…"  # 19 columns: the cursor never wraps


class NoServices(Endpoints):
    def snapshot(self) -> dict[str, dict[str, float]]:
        return {}


@pytest.mark.parametrize("stream_cls, expect_newlines", [(Terminal, 1), (io.StringIO, 3)])
def test_the_view_writes_three_updates_as_one_line_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream_cls: type[io.StringIO], expect_newlines: int
) -> None:
    monkeypatch.setenv("TERM", "xterm")
    cfg = load_config(overrides=[f'run.out_dir="{tmp_path}"'], environ={})
    stream = stream_cls()
    view = LiveView(cfg, NoServices("", "", []), tmp_path, quiet=False, stream=stream)
    for _ in range(3):
        view.update()
    view.finish()
    text = stream.getvalue()
    assert text.count("\n") == expect_newlines
    assert text.count("step 0/40") == 3
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_rates_in_a_row_are_over_the_time_since_the_previous_row(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry

    from stream_dapo.runtime.metrics import GeneratorMetrics, registry_samples

    cfg = load_config(overrides=[f'run.out_dir="{tmp_path}"'], environ={})
    registry = CollectorRegistry()
    gm = GeneratorMetrics(registry)
    view = LiveView(cfg, NoServices("", "", []), tmp_path, quiet=True)

    gm.tokens.inc(1000)
    for seconds in (0.2, 0.3):
        gm.weight_sync_seconds.observe(seconds)
    gm.groups.labels(outcome="mixed").inc(6)
    gm.groups.labels(outcome="all_wrong").inc(3)
    gm.groups.labels(outcome="all_correct").inc(1)
    first = view.row({"generator-0": registry_samples(registry)}, elapsed=10.0)
    assert first["generator_tokens_per_s"] == 100.0  # 1000 tokens in the first 10 s
    assert first["generator_weight_sync_seconds"] == 0.25
    assert (first["groups_kept"], first["groups_all_wrong"], first["groups_all_correct"]) == (6, 3, 1)
    assert first["filtered_frac"] == 0.4

    gm.tokens.inc(3000)
    for seconds in (0.1, 0.2, 0.6):
        gm.weight_sync_seconds.observe(seconds)
    second = view.row({"generator-0": registry_samples(registry)}, elapsed=25.0)
    assert second["generator_tokens_per_s"] == 200.0  # 3000 more in 15 s
    assert second["generator_weight_sync_seconds"] == 0.3  # the three new loads: 0.9 s / 3
    third = view.row({"generator-0": registry_samples(registry)}, elapsed=30.0)
    assert third["generator_tokens_per_s"] == 0.0 and third["generator_weight_sync_seconds"] is None


def _groups(wrong: int, right: int, kept: int) -> dict:
    finished = wrong + right + kept
    return {
        "groups_all_wrong": wrong,
        "groups_all_correct": right,
        "groups_kept": kept,
        "filtered_frac": round(1 - kept / finished, 3),
    }


def test_starvation_is_named_with_its_cause_and_fixes_once_it_is_clear() -> None:
    cfg = load_config([], ["learner.rollout_batch_prompts=8"], environ={})
    # 97 of 100 groups all wrong (the SmolLM2 run): the learner waits ~267 groups per batch
    msg = starvation_warning(_groups(95, 2, 3), cfg)
    assert msg is not None and msg.startswith(
        "dynamic sampling drops 97% of groups (95 all wrong, 2 all correct"
    )
    assert "every ~267 groups" in msg and "[sft]" in msg and "generator.temperature" in msg
    msg = starvation_warning(_groups(2, 95, 3), cfg)
    assert msg is not None and "almost always right" in msg
    assert starvation_warning(_groups(20, 0, 10), cfg) is None  # 67% filtered: dynamic sampling at work
    assert starvation_warning(_groups(31, 0, 0), cfg) is None  # fewer than 4 rollout batches finished
    assert starvation_warning(_groups(32, 0, 0), cfg) is not None


def test_a_sigkilled_service_is_named_as_the_likely_oom_kill_with_the_knobs() -> None:
    hint = exit_hint(-9)
    assert "out-of-memory killer" in hint and "learner.micro_batch_tokens" in hint and "plan --memory" in hint
    assert exit_hint(1) == exit_hint(0) == exit_hint(None) == ""


def test_the_status_line_shows_each_sources_accuracy_and_mean_score() -> None:
    sources = {
        "words": {"samples": 40.0, "correct": 10.0, "score_sum": -20.0},
        "concise": {"samples": 8.0, "correct": 2.0, "score_sum": 2.0},
        "code": {"samples": 0.0, "correct": 0.0, "score_sum": 0.0},
    }
    line = format_status({**ROW, "sources": sources}, total_steps=40)
    assert line.endswith(" | words acc 0.25 score -0.50, concise acc 0.25 score +0.25, code -")
    assert "words" not in format_status(ROW, total_steps=40)
