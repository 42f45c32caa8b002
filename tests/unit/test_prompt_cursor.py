"""A generator's place in its prompt shard survives a restart (stream_dapo/generator/prompts.py)."""

from __future__ import annotations

import json
from pathlib import Path

from stream_dapo.data.dataset import PromptItem, PromptStream, StreamState
from stream_dapo.generator.prompts import SEED_STRIDE, PromptCursor, ShardLayout


def items(n: int) -> list[PromptItem]:
    return [PromptItem(f"p{i}", [{"role": "user", "content": str(i)}], [i], str(i), "test") for i in range(n)]


def ids(stream: PromptStream, n: int) -> list[str]:
    return [next(stream).prompt_id for _ in range(n)]


def test_a_restarted_generator_continues_its_shard_where_it_stopped(tmp_path: Path) -> None:
    """Regression: a restarted generator served its shard again from epoch 0, position 0."""
    layout = ShardLayout.of("train.jsonl", 10, data_seed=3, num_shards=2, index=1)
    path = tmp_path / "generator-1.prompts.json"
    first = PromptCursor(path, layout).stream(items(10))
    served = ids(first, 7)  # the shard has 5 prompts: into epoch 1
    PromptCursor(path, layout).save(first.state, force=True)
    again = PromptCursor(path, layout).stream(items(10))
    assert again.state == StreamState(epoch=1, position=2)
    uninterrupted = PromptCursor(tmp_path / "other.json", layout).stream(items(10))
    assert ids(again, 6) == ids(uninterrupted, 13)[7:]
    assert served == ids(PromptCursor(tmp_path / "fresh.json", layout).stream(items(10)), 7)


def test_a_position_saved_for_another_layout_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "generator-0.prompts.json"
    old = ShardLayout.of("train.jsonl", 10, data_seed=0, num_shards=1, index=0)
    stream = PromptCursor(path, old).stream(items(10))
    ids(stream, 4)
    PromptCursor(path, old).save(stream.state, force=True)
    for other in (
        ShardLayout.of("train.jsonl", 12, data_seed=0, num_shards=1, index=0),  # the data changed
        ShardLayout.of("train.jsonl", 10, data_seed=0, num_shards=2, index=0),  # more shards
    ):
        assert PromptCursor(path, other).load() is None
    path.write_text("{not json")
    assert PromptCursor(path, old).load() is None


def test_a_second_generator_on_one_shard_shuffles_it_differently() -> None:
    a = ShardLayout.of("d", 10, data_seed=5, num_shards=2, index=1)
    b = ShardLayout.of("d", 10, data_seed=5, num_shards=2, index=3)  # joined beyond num_generators
    assert (a.shard_index, b.shard_index) == (1, 1) and (a.seed, b.seed) == (5, 5 + SEED_STRIDE)


def test_saves_are_rate_limited_but_a_forced_save_always_writes(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    cursor = PromptCursor(path, ShardLayout.of("d", 4, 0, 1, 0))
    cursor.save(StreamState(0, 1))
    cursor.save(StreamState(0, 2))  # within SAVE_EVERY_S of the last write: skipped
    assert json.loads(path.read_text())["position"] == 1
    cursor.save(StreamState(0, 3), force=True)
    assert json.loads(path.read_text())["position"] == 3
    assert not list(tmp_path.glob(".*.tmp"))
