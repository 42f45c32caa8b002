"""`WeightIntake` on a stand-in engine and weight source: the late-joiner load, the swap between
steps (held back while groups run under kv_on_update = "between-groups"), a refused file, close."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from stream_dapo.config import load_config
from stream_dapo.generator.engine import RolloutEngine
from stream_dapo.generator.weight_intake import WeightIntake
from stream_dapo.runtime.metrics import GeneratorMetrics, Health
from stream_dapo.weights import WeightUpdate


class Engine:
    """What the intake asks of an engine: its version and how many groups run."""

    version = 0
    num_in_flight = 0


class Source:
    """A `WeightSource` (startup "look") that finds `published` when polled; `load` relabels the
    engine, or raises `refuse` (a file pruned before it was loaded)."""

    first_version = 0
    startup = "look"

    def __init__(self) -> None:
        self.published: WeightUpdate | None = None
        self.latest_seen = -1
        self.refuse: Exception | None = None
        self.loaded: list[tuple[int, int]] = []
        self.closed = False

    def __call__(self, have: int) -> WeightUpdate | None:
        if self.published is None:
            return None
        self.latest_seen = self.published.version
        return self.published if self.published.version != have else None

    def join(self, engine: Any) -> None:
        pass

    def load(self, engine: Any, update: WeightUpdate) -> float:
        if self.refuse is not None:
            raise self.refuse
        self.loaded.append((update.version, engine.num_in_flight))
        engine.version = update.version
        return 0.25

    def close(self) -> None:
        self.closed = True


def make_intake(
    source: Source, mode: str = "recompute"
) -> tuple[WeightIntake, Callable[[str], float | None], Health]:
    cfg = load_config(
        overrides=[f'generator.kv_on_update="{mode}"', "generator.weight_poll_s=60"], environ={}
    )
    registry = CollectorRegistry()
    metrics, health = GeneratorMetrics(registry), Health()

    def build(relay_metrics: Any) -> Any:
        raise AssertionError("the injected source is used")

    intake = WeightIntake(
        source,  # type: ignore[arg-type]
        build,
        generator=cfg.generator,
        timeout_s=5.0,
        weights_address="tcp://127.0.0.1:1",
        shared_dir=Path("/nowhere"),
        metrics=metrics,
        health=health,
        stop=threading.Event(),
    )
    return intake, registry.get_sample_value, health


def test_a_starting_generator_loads_the_published_version_before_the_first_prompt() -> None:
    source, engine = Source(), Engine()
    source.published = WeightUpdate(3, None, 100, fetch_seconds=0.5)
    intake, sample, health = make_intake(source)
    try:
        intake.load_initial(cast(RolloutEngine, engine))
        assert engine.version == 3 and source.loaded == [(3, 0)]
        assert sample("stream_dapo_generator_policy_version") == 3 and health.detail["policy_version"] == 3
        assert sample("stream_dapo_generator_weight_sync_bytes_total") == 100
        assert sample("stream_dapo_generator_weight_sync_seconds_sum") == 0.75  # fetch + load
        intake.update_gauges()
        assert sample("stream_dapo_generator_weights_behind_versions") == 0
    finally:
        intake.close()
    assert source.closed


def test_between_groups_holds_an_update_until_the_groups_in_flight_finished() -> None:
    source, engine = Source(), Engine()
    intake, sample, _ = make_intake(source, "between-groups")
    try:
        intake.load_initial(cast(RolloutEngine, engine))  # nothing published: the initial model
        assert engine.version == 0 and not intake.holding
        engine.num_in_flight = 1
        source.published = WeightUpdate(1, None, 10)
        assert intake.watcher is not None and intake.watcher.poll_once() is not None
        assert intake.holding, "no new group may start on weights already superseded"
        intake.apply_new()
        assert source.loaded == [] and intake.holding
        engine.num_in_flight = 0
        intake.apply_new()
        assert source.loaded == [(1, 0)] and not intake.holding
        assert sample("stream_dapo_generator_weight_hold_seconds_total") >= 0.0
    finally:
        intake.close()


def test_recompute_swaps_at_once_and_a_refused_file_is_polled_for_again() -> None:
    source, engine = Source(), Engine()
    intake, _, _ = make_intake(source)
    try:
        intake.load_initial(cast(RolloutEngine, engine))
        engine.num_in_flight = 2
        source.published = WeightUpdate(1, None, 10)
        assert intake.watcher is not None and intake.watcher.poll_once() is not None
        assert not intake.holding
        source.refuse = FileNotFoundError("v1 was pruned")
        intake.apply_new()  # refused before pausing: keep sampling from v0, poll relative to it
        assert engine.version == 0
        source.refuse, source.published = None, WeightUpdate(2, None, 10)
        assert intake.watcher.poll_once() is not None
        intake.apply_new()
        assert source.loaded == [(2, 2)], "swapped with the groups still running"
    finally:
        intake.close()
