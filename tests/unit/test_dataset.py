"""The DAPO-Math-17k loader and the sharded prompt stream, on a 20-row sample of the real schema.

The sample (tests/data/dapo_math_sample.jsonl) holds 15 distinct prompts, 5 repeated rows (the public
file repeats every prompt) and one prompt of ~1300 tokens; the others are at most 247 tokens under
the tiny model's tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_dapo.data.dataset import (
    LazyPrompts,
    PromptStream,
    SchemaError,
    StreamState,
    check_data_file,
    load_prompts,
    prompt_id_of,
)
from stream_dapo.errors import ConfigError
from stream_dapo.model.tiny import build_tokenizer

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "dapo_math_sample.jsonl"
MAX_PROMPT_LEN = 256  # the config default


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def sample_rows() -> list[dict]:
    return [json.loads(line) for line in SAMPLE.read_text().splitlines()]


@pytest.fixture(scope="module")
def parquet_sample(tmp_path_factory, sample_rows) -> Path:
    path = tmp_path_factory.mktemp("parquet") / "dapo_math_sample.parquet"
    pq.write_table(pa.Table.from_pylist(sample_rows), path)
    return path


@pytest.fixture(scope="module")
def prompts(tokenizer):
    items, _ = load_prompts(SAMPLE, tokenizer, MAX_PROMPT_LEN)
    return items


def test_jsonl_counts_duplicates_and_too_long(tokenizer):
    items, stats = load_prompts(SAMPLE, tokenizer, MAX_PROMPT_LEN)
    assert (stats.rows, stats.duplicates, stats.too_long, stats.kept) == (20, 5, 1, 14)
    assert stats.gold_conflicts == 0
    assert len(items) == 14
    assert len({item.prompt_id for item in items}) == 14
    assert max(len(item.prompt_token_ids) for item in items) <= MAX_PROMPT_LEN
    # First occurrence kept, file order preserved.
    assert items[0].gold == "4" and items[0].extra_info == {"index": "9b1f3c2e-0d4a-4c55-8f3e-1a2b3c4d5e01"}
    assert [item.gold for item in items[:3]] == ["4", "24", "117"]
    assert {item.data_source for item in items} == {"math_dapo"}


def test_raising_the_length_limit_keeps_the_long_prompt(tokenizer):
    _, stats = load_prompts(SAMPLE, tokenizer, 4096)
    assert (stats.too_long, stats.kept) == (0, 15)


def test_parquet_gives_the_same_prompts_as_jsonl(tokenizer, parquet_sample, prompts):
    items, stats = load_prompts(parquet_sample, tokenizer, MAX_PROMPT_LEN)
    assert (stats.rows, stats.duplicates, stats.too_long, stats.kept) == (20, 5, 1, 14)
    assert [i.prompt_id for i in items] == [p.prompt_id for p in prompts]
    assert [i.prompt_token_ids for i in items] == [p.prompt_token_ids for p in prompts]
    assert [i.gold for i in items] == [p.gold for p in prompts]


def test_prompt_id_is_a_stable_hash_of_the_messages(prompts, sample_rows):
    assert prompts[0].prompt_id == prompt_id_of(sample_rows[0]["prompt"])
    # Key order inside a message does not matter, the text does.
    reordered = [{"content": m["content"], "role": m["role"]} for m in sample_rows[0]["prompt"]]
    assert prompt_id_of(reordered) == prompts[0].prompt_id
    changed = [{"role": "user", "content": sample_rows[0]["prompt"][0]["content"] + " "}]
    assert prompt_id_of(changed) != prompts[0].prompt_id


def test_chat_template_is_applied(tokenizer, prompts):
    item = prompts[0]
    head = tokenizer("<|im_start|>user\n", add_special_tokens=False)["input_ids"]
    tail = tokenizer("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    ids = item.prompt_token_ids
    assert ids[: len(head)] == head
    assert ids[-len(tail) :] == tail
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert (
        tokenizer.decode(ids)
        == f"<|im_start|>user\n{item.messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_missing_column_is_named(tmp_path, tokenizer, sample_rows, fmt):
    rows = [{k: v for k, v in row.items() if k != "reward_model"} for row in sample_rows]
    path = tmp_path / f"bad.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(SchemaError, match=r"missing column 'reward_model'.*DAPO-Math-17k schema"):
        load_prompts(path, tokenizer, MAX_PROMPT_LEN)


def test_malformed_messages_are_refused(tmp_path, tokenizer, sample_rows):
    row = dict(sample_rows[0], prompt=[{"role": "user"}])
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(SchemaError, match="row 1.*'role' and 'content'"):
        load_prompts(path, tokenizer, MAX_PROMPT_LEN)


def test_missing_file_and_unknown_format_name_the_fix(tmp_path, tokenizer):
    with pytest.raises(FileNotFoundError, match="data.train_path"):
        load_prompts(tmp_path / "nope.parquet", tokenizer, MAX_PROMPT_LEN)
    csv = tmp_path / "data.csv"
    csv.write_text("prompt,reward_model\n")
    with pytest.raises(SchemaError, match=r"\.parquet or \.jsonl"):
        load_prompts(csv, tokenizer, MAX_PROMPT_LEN)


def test_check_data_file_counts_the_rows_of_a_good_file() -> None:
    assert check_data_file(SAMPLE) == 20


def test_check_data_file_names_the_line_of_a_malformed_row(tmp_path, sample_rows):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(sample_rows[0]) + "\n" + '{"prompt": [\n' + json.dumps(sample_rows[1]) + "\n")
    with pytest.raises(
        SchemaError, match=r"train\.jsonl:2: not valid JSON .*one JSON object per line"
    ) as info:
        check_data_file(path)
    # A configuration error: services and the CLI exit 2 on it, with the message alone.
    assert isinstance(info.value, ConfigError)


def test_check_data_file_names_a_missing_prompt_column_and_a_missing_file(tmp_path, sample_rows):
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "prompt"}) + "\n" for r in sample_rows)
    )
    with pytest.raises(SchemaError, match=r"train\.jsonl:1: missing column 'prompt'"):
        check_data_file(path)
    with pytest.raises(SchemaError, match=r"data\.eval_path = .*nope\.jsonl does not exist"):
        check_data_file(tmp_path / "nope.jsonl", "data.eval_path")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SchemaError, match="no rows"):
        check_data_file(tmp_path / "empty.jsonl")


# --------------------------------------------------------------------------------------------------
# PromptStream
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_each_prompt_goes_to_exactly_one_shard_per_epoch(prompts, num_shards):
    streams = [PromptStream(prompts, seed=7, num_shards=num_shards, shard_index=i) for i in range(num_shards)]
    for epoch in range(3):
        shards = [s.shard_indices(epoch) for s in streams]
        flat = [i for shard in shards for i in shard]
        assert sorted(flat) == list(range(len(prompts)))  # union = all, no prompt twice
        sizes = [len(shard) for shard in shards]
        assert max(sizes) - min(sizes) <= 1


def test_order_is_deterministic_for_a_seed_and_changes_across_epochs(prompts):
    a = PromptStream(prompts, seed=3)
    b = PromptStream(prompts, seed=3)
    other_seed = PromptStream(prompts, seed=4)
    assert a.shard_indices(0) == b.shard_indices(0)
    assert a.shard_indices(0) != a.shard_indices(1)
    assert a.shard_indices(0) != other_seed.shard_indices(0)
    first = [next(a).prompt_id for _ in range(30)]
    second = [next(b).prompt_id for _ in range(30)]
    assert first == second


def test_stream_is_endless_and_reports_the_epoch(prompts):
    stream = PromptStream(prompts, seed=0, num_shards=3, shard_index=1)
    size = stream.shard_size
    assert size == 5  # 14 prompts over 3 shards: 5, 5, 4
    seen = []
    for _ in range(2 * size + 1):
        item = next(stream)
        seen.append((stream.epoch, item.prompt_id))
    assert [e for e, _ in seen] == [0] * size + [1] * size + [2]
    expected_epoch0 = [prompts[i].prompt_id for i in stream.shard_indices(0)]
    assert [pid for e, pid in seen if e == 0] == expected_epoch0
    assert stream.state == StreamState(epoch=2, position=1)


def test_resume_from_state_continues_where_it_stopped(prompts):
    original = PromptStream(prompts, seed=11, num_shards=2, shard_index=0)
    for _ in range(9):  # past the end of epoch 0 (7 prompts)
        next(original)
    state = original.state
    assert state == StreamState(epoch=1, position=2)
    resumed = PromptStream(prompts, seed=11, num_shards=2, shard_index=0, state=state)
    assert [next(resumed).prompt_id for _ in range(12)] == [next(original).prompt_id for _ in range(12)]


def test_bad_shard_layouts_are_refused(prompts):
    with pytest.raises(ValueError, match="shard_index 2 is outside"):
        PromptStream(prompts, num_shards=2, shard_index=2)
    with pytest.raises(ValueError, match="num_generators"):
        PromptStream(prompts[:2], num_shards=3, shard_index=0)
    with pytest.raises(ValueError, match="different data set or shard layout"):
        PromptStream(prompts, num_shards=2, shard_index=0, state=StreamState(epoch=0, position=99))


# --------------------------------------------------------------------------------------------------
# Lazily: a generator tokenizes only what its shard serves (issue 41 item 4)
# --------------------------------------------------------------------------------------------------


class CountingTokenizer:
    """The tiny model's tokenizer, counting how many prompts it encodes."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoded = 0

    def apply_chat_template(self, conversation, **kwargs):
        return self.inner.apply_chat_template(conversation, **kwargs)

    def __call__(self, text, **kwargs):
        self.encoded += 1
        return self.inner(text, **kwargs)


def test_lazy_prompts_index_without_tokenizing_and_tokenize_only_what_a_shard_serves(tokenizer):
    counting = CountingTokenizer(tokenizer)
    lazy = LazyPrompts(SAMPLE, counting, 4096)
    assert (len(lazy), lazy.stats.rows, lazy.stats.duplicates, counting.encoded) == (15, 20, 5, 0)
    stream = PromptStream(lazy, seed=3, num_shards=4, shard_index=1)
    served = [next(stream) for _ in range(3)]
    assert counting.encoded == 3  # of 15 distinct prompts: the three it served
    assert [p.prompt_id for p in served] == [lazy[i].prompt_id for i in stream.shard_indices(0)[:3]]


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_a_lazy_stream_serves_what_the_eager_stream_serves(tokenizer, num_shards):
    """With no over-long prompt, the indices are `load_prompts`'s: saved positions stay valid."""
    eager, _ = load_prompts(SAMPLE, tokenizer, 4096)
    lazy = LazyPrompts(SAMPLE, tokenizer, 4096)
    for shard in range(num_shards):
        a = PromptStream(eager, seed=7, num_shards=num_shards, shard_index=shard)
        b = PromptStream(lazy, seed=7, num_shards=num_shards, shard_index=shard)
        for _ in range(2 * a.shard_size + 1):  # across an epoch boundary
            x, y = next(a), next(b)
            assert (x.prompt_id, x.prompt_token_ids, x.gold, x.extra_info) == (
                y.prompt_id,
                y.prompt_token_ids,
                y.gold,
                y.extra_info,
            )
        assert a.state == b.state


def test_a_lazy_stream_skips_and_counts_over_long_prompts(tokenizer, parquet_sample):
    for path in (SAMPLE, parquet_sample):
        lazy = LazyPrompts(path, tokenizer, MAX_PROMPT_LEN)
        stream = PromptStream(lazy, seed=0)
        served = [next(stream) for _ in range(2 * 15)]  # two epochs of 15 distinct prompts, one too long
        assert len({p.prompt_id for p in served}) == 14
        assert max(len(p.prompt_token_ids) for p in served) <= MAX_PROMPT_LEN
        assert lazy.stats.too_long == 1  # counted once, skipped every epoch
    eager, _ = load_prompts(SAMPLE, tokenizer, MAX_PROMPT_LEN)
    assert {p.prompt_id for p in served} == {p.prompt_id for p in eager}


def test_a_shard_of_only_over_long_prompts_names_the_setting(tokenizer):
    with pytest.raises(ConfigError, match=r"model\.max_prompt_len = 8 tokens; raise it"):
        next(PromptStream(LazyPrompts(SAMPLE, tokenizer, 8), seed=0))


def test_indexing_a_large_file_reports_progress_and_holds_a_few_bytes_per_row(tmp_path, monkeypatch):
    """50,000 rows (40,000 distinct): indexing tokenizes nothing, peaks under 128 bytes a row and keeps
    about 9 bytes per distinct prompt, where `load_prompts` keeps every row tokenized."""
    import tracemalloc

    from stream_dapo.data import dataset

    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        for i in range(50_000):
            k = i % 40_000
            row = {
                "prompt": [{"role": "user", "content": f"What is {k} + {k}? " * 8}],
                "reward_model": {"ground_truth": str(2 * k)},
            }
            f.write(json.dumps(row) + "\n")

    class NoTokenizer:
        def apply_chat_template(self, *a, **k):
            raise AssertionError("indexing must not tokenize")

        def __call__(self, *a, **k):
            raise AssertionError("indexing must not tokenize")

    seen = {"calls": 0, "rows": 0, "fraction": 0.0, "monotonic": True}

    def progress(rows: int, fraction: float) -> None:
        seen["monotonic"] = seen["monotonic"] and rows > seen["rows"] and fraction >= seen["fraction"]
        seen.update(calls=seen["calls"] + 1, rows=rows, fraction=fraction)

    monkeypatch.setattr(dataset, "INDEX_PROGRESS_EVERY_S", 0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        lazy = LazyPrompts(path, NoTokenizer(), 256, progress=progress)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (lazy.stats.rows, lazy.stats.duplicates, len(lazy)) == (50_000, 10_000, 40_000)
    print(f"peak {(peak - before) / 50_000:.1f} B/row, kept {(kept - before) / 40_000:.1f} B/prompt")
    assert peak - before < 128 * 50_000
    assert kept - before < 16 * 40_000
    assert (seen["calls"], seen["rows"], seen["monotonic"]) == (50_000, 50_000, True) and seen[
        "fraction"
    ] < 1.0
    lazy.close()
