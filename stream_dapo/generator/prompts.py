"""Where a generator is in its prompt shard, kept across restarts.

A generator that restarts (a crash, a preempted node, `systemctl restart`) continues its shard where
it stopped instead of serving the shard's first prompts again from epoch 0, which would train the
same prompts twice as often as the rest. The cursor is a small JSON file per generator id, written
atomically every few seconds and at shutdown, holding the stream's ``StreamState`` and the layout it
belongs to; a file written for another layout (other data, seed or shard count) is ignored, with a
log line, and the shard starts at epoch 0.

The position counts prompts *started*: groups in flight when a generator dies are not generated again
(their credits come back to the buffer with the lease).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stream_dapo.data.dataset import PromptStream, StreamState
from stream_dapo.runtime.disk import write_text_atomic

log = logging.getLogger("stream_dapo.generator")

SAVE_EVERY_S = 5.0

SEED_STRIDE = 1_000_003
"""Seed offset per extra replica of a shard: generators I and I + num_generators share shard I mod
num_generators but shuffle it differently, so they do not start the same prompts at the same time."""


@dataclass(frozen=True)
class ShardLayout:
    """What a saved position is only valid for."""

    data: str
    num_prompts: int
    seed: int
    num_shards: int
    shard_index: int

    @classmethod
    def of(cls, data: str, num_prompts: int, data_seed: int, num_shards: int, index: int) -> ShardLayout:
        """Generator `index`'s layout: shard index mod num_shards, a seed per replica of that shard."""
        return cls(
            data, num_prompts, data_seed + SEED_STRIDE * (index // num_shards), num_shards, index % num_shards
        )


class _PositionFile:
    """A position file written atomically, at most every SAVE_EVERY_S unless forced, only when the
    position changed; a failure to write is logged, never fatal (the next save tries again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved_at = float("-inf")
        self._saved: Any = None

    def save(self, state: Any, doc: Callable[[], dict[str, Any]], force: bool) -> None:
        now = time.monotonic()
        if state == self._saved or (not force and now - self._saved_at < SAVE_EVERY_S):
            return
        self._saved_at = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(doc()))
            self._saved = state
        except OSError as exc:
            log.warning("cannot save the prompt position to %s: %s", self.path, exc)


class PromptCursor:
    """Loads and saves one generator's position in its shard."""

    def __init__(self, path: Path, layout: ShardLayout) -> None:
        self.path = path
        self.layout = layout
        self._file = _PositionFile(path)

    def load(self) -> StreamState | None:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning(
                "ignoring the prompt position in %s (%s): starting the shard at epoch 0", self.path, exc
            )
            return None
        if doc.get("layout") != asdict(self.layout):
            log.info(
                "the prompt position in %s is for another data set, seed or shard count: starting the shard at epoch 0",
                self.path,
            )
            return None
        state = StreamState(int(doc["epoch"]), int(doc["position"]))
        log.info(
            "continuing the prompt shard at epoch %d, position %d (%s)",
            state.epoch,
            state.position,
            self.path,
        )
        return state

    def stream(self, prompts: Any) -> PromptStream:
        """The shard's stream, resumed from the saved position when it fits this layout."""
        return self.stream_at(prompts, self.load())

    def stream_at(self, prompts: Any, state: StreamState | None) -> PromptStream:
        """The shard's stream from ``state`` (None: epoch 0); a state beyond the shard is ignored."""
        lay = self.layout
        try:
            return PromptStream(
                prompts, seed=lay.seed, num_shards=lay.num_shards, shard_index=lay.shard_index, state=state
            )
        except ValueError as exc:  # a position beyond this shard: the data changed under the same name
            log.warning(
                "ignoring the prompt position in %s (%s): starting the shard at epoch 0", self.path, exc
            )
            return PromptStream(
                prompts, seed=lay.seed, num_shards=lay.num_shards, shard_index=lay.shard_index
            )

    def save(self, state: StreamState, *, force: bool = False) -> None:
        """Write the position (at most every SAVE_EVERY_S unless `force`); a failure is logged, not fatal."""
        self._file.save(
            state,
            lambda: {"layout": asdict(self.layout), "epoch": state.epoch, "position": state.position},
            force,
        )


class MixCursor:
    """Loads and saves one generator's position in a mix of several sources (``MixedStream``).

    The file holds each source's layout and ``StreamState`` and the mix's counts per source. A
    source whose layout changed (other data, seed or shard count) starts its shard at epoch 0, with a
    log line, and the others continue; the counts are kept only when the sources are the same ones,
    else the mix starts over (its proportions hold from there).
    """

    def __init__(self, path: Path, layouts: dict[str, ShardLayout]) -> None:
        self.path = path
        self.layouts = layouts
        self._file = _PositionFile(path)

    def load(self) -> Any:
        """The saved ``MixState`` fitted to these layouts, or None."""
        from stream_dapo.data.mixing import MixState

        try:
            doc = json.loads(self.path.read_text())
            saved = doc["sources"]
            counts = {name: int(n) for name, n in doc["counts"].items()}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning(
                "ignoring the prompt positions in %s (%s): starting every source at epoch 0", self.path, exc
            )
            return None
        streams: dict[str, StreamState] = {}
        for name, layout in self.layouts.items():
            entry = saved.get(name) if isinstance(saved, dict) else None
            if not isinstance(entry, dict) or entry.get("layout") != asdict(layout):
                log.info("source %s: no saved position for this data, seed and shard count: epoch 0", name)
                continue
            streams[name] = StreamState(int(entry["epoch"]), int(entry["position"]))
            log.info("source %s: continuing at epoch %d, position %d", name, *asdict(streams[name]).values())
        if set(counts) != set(self.layouts):
            counts = {}
        return MixState(counts=counts, streams=streams)

    def stream(
        self, prompts: dict[str, Any], weights: dict[str, float], budgets: dict[str, int | None]
    ) -> Any:
        """The ``MixedStream`` over every source's shard, resumed where it fits."""
        from stream_dapo.data.mixing import MixedStream

        state = self.load()
        streams = {}
        for name, layout in self.layouts.items():
            one = PromptCursor(self.path, layout)
            resumed = None if state is None else state.streams.get(name)
            streams[name] = one.stream_at(prompts[name], resumed)
        return MixedStream(streams, weights, budgets=budgets, state=state)

    def save(self, state: Any, *, force: bool = False) -> None:
        """Write the positions (at most every SAVE_EVERY_S unless `force`); a failure is logged."""
        self._file.save(
            state,
            lambda: {
                "counts": state.counts,
                "sources": {
                    name: {"layout": asdict(self.layouts[name]), **asdict(stream)}
                    for name, stream in state.streams.items()
                },
            },
            force,
        )
