"""Prompts in the DAPO-Math-17k schema, and the endless sharded stream generators draw them from.

One row (parquet or JSON lines)::

    {"data_source": "math_dapo",
     "prompt": [{"role": "user", "content": "Solve the following math problem ..."}],
     "ability": "MATH",
     "reward_model": {"ground_truth": "34", "style": "rule"},
     "extra_info": {"index": "9a9b6eb4-..."}}

``prompt`` and ``reward_model.ground_truth`` are required; ``data_source``, ``ability`` and
``extra_info`` are optional. A file that breaks the schema raises `SchemaError`, a `ConfigError`
naming the file, the line or row, and the fix: services exit 2 on it (restarting cannot help), and
`stream-dapo run` checks its files with `check_data_file` before it starts any service. The public parquet file repeats each of its ~17k prompts about 100 times,
so ``load_prompts`` keeps the first row of each distinct prompt and counts the rest; prompts longer
than ``max_prompt_len`` tokens after the chat template are skipped and counted too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from stream_dapo.errors import ConfigError

__all__ = [
    "LazyPrompts",
    "LoadStats",
    "PromptItem",
    "PromptStream",
    "SchemaError",
    "StreamState",
    "check_data_file",
    "load_prompts",
    "prompt_id_of",
    "read_rows",
]

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("prompt", "reward_model")
SCHEMA_HELP = (
    "expected the DAPO-Math-17k schema: prompt (list of {role, content} messages), "
    "reward_model ({ground_truth: str, style: str}), and optionally data_source (str), ability (str), "
    "extra_info (dict)"
)
_PARQUET_BATCH_ROWS = 8192


class SchemaError(ConfigError):
    """A data file that does not follow the DAPO-Math-17k schema (or is missing): a configuration
    error, so every service and the CLI exit 2 with the message alone."""


class ChatTokenizer(Protocol):
    """What the loader needs from a Hugging Face tokenizer."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def __call__(self, text: str, **kwargs: Any) -> Any: ...


@dataclass
class PromptItem:
    """One distinct prompt, tokenized with the model's chat template."""

    prompt_id: str
    """Stable id: a hash of the prompt messages (the same text always gets the same id)."""
    messages: list[dict[str, str]]
    prompt_token_ids: list[int]
    gold: str
    """The ground-truth answer the verifier compares against."""
    data_source: str
    extra_info: dict[str, Any] = field(default_factory=dict)
    """The row's ``extra_info`` (the synthetic task keeps its worked solution here)."""
    source: str = "default"
    """The run's data source this prompt belongs to (``[[data.sources]]`` name): it picks the reward."""
    max_response_len: int | None = None
    """The source's response budget; None: the run's ``algo.max_response_len``."""


@dataclass
class LoadStats:
    """What ``load_prompts`` did with the rows of a file."""

    rows: int = 0
    duplicates: int = 0
    """Rows whose prompt text was already seen (the first occurrence is kept)."""
    gold_conflicts: int = 0
    """Duplicates whose ground truth differs from the kept row's (a data problem worth knowing)."""
    too_long: int = 0
    """Distinct prompts longer than max_prompt_len tokens after the chat template."""
    kept: int = 0


def prompt_id_of(messages: Sequence[dict[str, str]]) -> str:
    """Stable id of a prompt: sha256 of its canonical JSON, 16 hex digits."""
    canonical = json.dumps([{"role": m["role"], "content": m["content"]} for m in messages], sort_keys=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


# --------------------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------------------


def _check_columns(columns: Iterable[str], path: Path) -> None:
    present = set(columns)
    for name in REQUIRED_COLUMNS:
        if name not in present:
            raise SchemaError(f"{path}: missing column '{name}' (columns: {sorted(present)}); {SCHEMA_HELP}")


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    # Batches, not the whole table: the public file has ~1.8M rows, mostly duplicates.
    parquet = pq.ParquetFile(path)
    _check_columns(parquet.schema_arrow.names, path)
    for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        yield from batch.to_pylist()


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SchemaError(
                    f"{path}:{line_no}: not valid JSON ({exc}); one JSON object per line"
                ) from None
            if not isinstance(row, dict):
                raise SchemaError(f"{path}:{line_no}: expected a JSON object, got {type(row).__name__}")
            _check_columns(row.keys(), Path(f"{path}:{line_no}"))
            yield row


def read_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """Rows of a .parquet or .jsonl/.json-lines file, with the required columns checked."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"data file {path} not found; set data.train_path / data.eval_path to an existing "
            ".parquet or .jsonl file, or leave them unset to use the synthetic task"
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path)
    raise SchemaError(
        f"{path}: unknown file type '{suffix}'; use .parquet or .jsonl (one JSON object per line)"
    )


def _parse_row(row: dict[str, Any], where: str) -> tuple[list[dict[str, str]], str]:
    """Validate one row; return its messages and gold answer."""
    prompt = row["prompt"]
    if isinstance(prompt, np.ndarray):  # some parquet writers hand lists back as arrays
        prompt = prompt.tolist()
    if not isinstance(prompt, list) or not prompt:
        raise SchemaError(f"{where}: 'prompt' must be a non-empty list of messages; {SCHEMA_HELP}")
    messages = []
    for msg in prompt:
        if (
            not isinstance(msg, dict)
            or not isinstance(msg.get("role"), str)
            or not isinstance(msg.get("content"), str)
        ):
            raise SchemaError(
                f"{where}: every 'prompt' message needs string 'role' and 'content', got {msg!r}; {SCHEMA_HELP}"
            )
        messages.append({"role": msg["role"], "content": msg["content"]})
    reward_model = row["reward_model"]
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        raise SchemaError(f"{where}: 'reward_model' must be a dict with 'ground_truth'; {SCHEMA_HELP}")
    return messages, str(reward_model["ground_truth"])


def parsed_rows(path: str | Path) -> Iterator[tuple[dict[str, Any], list[dict[str, str]], str]]:
    """(row, messages, gold answer) of every row of a DAPO-schema file, each one validated."""
    for n, row in enumerate(read_rows(path), 1):
        messages, gold = _parse_row(row, f"{path}: row {n}")
        yield row, messages, gold


def check_data_file(path: str | Path, setting: str = "data.train_path") -> int:
    """Validate every row of a DAPO-schema file without tokenizing it; returns the number of rows.

    Raises `SchemaError` naming the file, the line or row and the fix, also when the file is
    missing (``setting`` is the config key that points at it) or holds no rows.
    """
    if not Path(path).is_file():
        raise SchemaError(
            f"{setting} = {path} does not exist; point it at a .parquet or .jsonl file, or leave it "
            "unset to use the synthetic task"
        )
    rows = sum(1 for _ in parsed_rows(path))
    if rows == 0:
        raise SchemaError(f"{path}: no rows; {SCHEMA_HELP}")
    return rows


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def encode_prompt(tokenizer: ChatTokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` under the model's chat template, ending in the assistant header."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    # The template already spells every special token the model expects; adding BOS/EOS on top
    # would put tokens in the prompt that the model never sees in this position.
    # verbose=False: over-long prompts are expected here; the loader counts and skips them itself.
    return list(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])


def load_prompts(
    path: str | Path, tokenizer: ChatTokenizer, max_prompt_len: int
) -> tuple[list[PromptItem], LoadStats]:
    """Read, validate, de-duplicate and tokenize a DAPO-schema file.

    Returns the kept prompts in file order (first occurrence of each distinct prompt) and the counts.
    """
    if max_prompt_len < 1:
        raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
    stats = LoadStats()
    gold_of: dict[str, str] = {}
    items: list[PromptItem] = []
    for row, messages, gold in parsed_rows(path):
        stats.rows += 1
        pid = prompt_id_of(messages)
        if pid in gold_of:
            stats.duplicates += 1
            stats.gold_conflicts += gold_of[pid] != gold
            continue
        gold_of[pid] = gold
        ids = encode_prompt(tokenizer, messages)
        if len(ids) > max_prompt_len:
            stats.too_long += 1
            continue
        extra = row.get("extra_info")
        items.append(
            PromptItem(
                prompt_id=pid,
                messages=messages,
                prompt_token_ids=ids,
                gold=gold,
                data_source=str(row.get("data_source") or Path(path).stem),
                extra_info=dict(extra) if isinstance(extra, dict) else {},
            )
        )
    stats.kept = len(items)
    if stats.rows == 0:
        raise SchemaError(f"{path}: no rows; {SCHEMA_HELP}")
    log.info(
        "%s: %d rows, %d duplicates, %d too long (> %d tokens), %d prompts kept",
        path,
        stats.rows,
        stats.duplicates,
        stats.too_long,
        max_prompt_len,
        stats.kept,
    )
    if stats.gold_conflicts:
        log.warning(
            "%s: %d duplicate prompts disagree on ground_truth; the first is used", path, stats.gold_conflicts
        )
    if not items:
        raise ConfigError(
            f"{path}: every prompt is longer than model.max_prompt_len={max_prompt_len}; raise it"
        )
    return items, stats


# --------------------------------------------------------------------------------------------------
# Lazily: index once, tokenize what is served
# --------------------------------------------------------------------------------------------------

INDEX_PROGRESS_EVERY_S = 5.0


class LazyPrompts(Sequence[PromptItem | None]):
    """The distinct prompts of a DAPO-schema file, indexed in one pass and tokenized when served.

    What a generator needs of a huge file: ``load_prompts`` holds every row tokenized (about 2.3 KB a
    prompt, minutes of start-up at a million rows); this holds, per distinct prompt, where its row
    is (a byte offset into a JSON-lines file; for parquet, the row's compact JSON in one buffer) and
    reads, validates and tokenizes a prompt only when ``[i]`` asks for it, so a generator tokenizes
    the prompts of its shard as it serves them, never the others'. Indexing hashes every row (the
    prompt id, to keep the first row of each distinct prompt, as ``load_prompts`` does) with 24
    bytes a row of typed arrays (then about 9 bytes per distinct prompt are kept), and calls ``progress(rows, fraction)`` every
    ``INDEX_PROGRESS_EVERY_S`` (a service beats its liveness there and logs).

    ``[i]`` is None for a prompt longer than ``max_prompt_len`` tokens (counted in ``too_long`` the
    first time; ``PromptStream`` skips it). Indices are over distinct prompts in file order, so with
    no over-long prompt they are ``load_prompts``'s indices and a stream over either serves the same
    prompts in the same order.
    """

    def __init__(
        self,
        path: str | Path,
        tokenizer: ChatTokenizer,
        max_prompt_len: int,
        *,
        progress: Callable[[int, float], None] | None = None,
        data_sources: Iterable[str] | None = None,
    ) -> None:
        if max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {max_prompt_len}")
        self.path = Path(path)
        self.data_sources = None if data_sources is None else frozenset(data_sources)
        """Keep only rows whose ``data_source`` is one of these (None: every row)."""
        self._tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len
        self.stats = LoadStats()
        self._parquet = self.path.suffix.lower() == ".parquet"
        self._store = bytearray()
        """Parquet only: the distinct rows as compact JSON, back to back (`_locators` are offsets)."""
        t0 = time.monotonic()
        pids, golds, locators = self._index(progress)
        _, first, inverse = np.unique(pids, return_index=True, return_inverse=True)
        # A duplicate whose answer differs from its prompt's first row's: a data problem worth knowing.
        self.stats.gold_conflicts = int(np.count_nonzero(golds != golds[first][inverse]))
        first = np.sort(first)  # the first row of each distinct prompt, in file order
        self.stats.rows = len(pids)
        self.stats.duplicates = len(pids) - len(first)
        if self._parquet:
            locators = self._keep_rows(locators[first])
        else:
            locators = locators[first]
        self._locators: np.ndarray = locators
        self._too_long = np.zeros(len(first), dtype=bool)
        self._file: Any = None
        if self.stats.rows == 0:
            if self.data_sources is not None:
                raise SchemaError(
                    f"{self.path}: no row has data_source in {sorted(self.data_sources)}; fix the "
                    "source's data_source list (or the file)"
                )
            raise SchemaError(f"{self.path}: no rows; {SCHEMA_HELP}")
        log.info(
            "%s: %d rows indexed in %.1f s, %d duplicates, %d distinct prompts (tokenized as they are "
            "served; each generator only its shard's)",
            self.path,
            self.stats.rows,
            time.monotonic() - t0,
            self.stats.duplicates,
            len(first),
        )
        if self.stats.gold_conflicts:
            log.warning(
                "%s: %d duplicate prompts disagree on ground_truth; the first is used",
                self.path,
                self.stats.gold_conflicts,
            )

    # -------------------------------------------------------------------------------- index

    def _rows(self) -> Iterator[tuple[int, dict[str, Any], float]]:
        """(locator, row, fraction of the file read) of every row: a JSON-lines row's byte offset,
        a parquet row's index."""
        if self._parquet:
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(self.path)
            _check_columns(parquet.schema_arrow.names, self.path)
            total = max(1, parquet.metadata.num_rows)
            n = 0
            for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
                for row in batch.to_pylist():
                    yield n, row, n / total
                    n += 1
            return
        read_rows(self.path)  # the missing-file and file-type errors, named as everywhere else
        size = max(1, self.path.stat().st_size)
        with self.path.open("rb") as f:
            offset = 0
            for line_no, line in enumerate(f, 1):
                start, offset = offset, offset + len(line)
                if line.strip():
                    yield start, _parse_jsonl_line(line, self.path, line_no), start / size

    def _index(
        self, progress: Callable[[int, float], None] | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # Typed arrays, not lists of ints: 24 bytes a row while indexing, not ~130.
        pids, golds, locators = array("Q"), array("Q"), array("q")
        reported = time.monotonic()
        for n, (locator, row, fraction) in enumerate(self._rows(), 1):
            messages, gold = _parse_row(row, f"{self.path}: row {n}")
            if self.data_sources is not None and _data_source_of(row, self.path) not in self.data_sources:
                continue
            pids.append(int(prompt_id_of(messages), 16))
            golds.append(int(hashlib.sha256(gold.encode()).hexdigest()[:16], 16))
            locators.append(locator)
            if progress is not None and time.monotonic() - reported >= INDEX_PROGRESS_EVERY_S:
                reported = time.monotonic()
                progress(n, fraction)
        return (
            np.frombuffer(pids, dtype=np.uint64),
            np.frombuffer(golds, dtype=np.uint64),
            np.frombuffer(locators, dtype=np.int64),
        )

    def _keep_rows(self, first_rows: np.ndarray) -> np.ndarray:
        """Parquet: a second pass keeping the first row of each distinct prompt as compact JSON
        (``first_rows``: their row numbers in the file)."""
        keep = np.zeros(int(first_rows.max(initial=-1)) + 1, dtype=bool)
        keep[first_rows] = True
        offsets: list[int] = []
        for index, row, _ in self._rows():
            if index < len(keep) and keep[index]:
                offsets.append(len(self._store))
                self._store += _compact_row(row)
        offsets.append(len(self._store))
        return np.array(offsets, dtype=np.int64)

    # -------------------------------------------------------------------------------- access

    def __len__(self) -> int:
        return len(self._too_long)

    def __getitem__(self, i: int) -> PromptItem | None:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(f"prompt {i} of {len(self)}")
        i %= len(self)
        row = self._row(i)
        messages, gold = _parse_row(row, f"{self.path}: prompt {i}")
        ids = encode_prompt(self._tokenizer, messages)
        if len(ids) > self.max_prompt_len:
            if not self._too_long[i]:
                self._too_long[i] = True
                self.stats.too_long += 1
                log.info(
                    "%s: skipping a prompt of %d tokens (> model.max_prompt_len = %d); %d so far",
                    self.path,
                    len(ids),
                    self.max_prompt_len,
                    self.stats.too_long,
                )
            return None
        extra = row.get("extra_info")
        return PromptItem(
            prompt_id=prompt_id_of(messages),
            messages=messages,
            prompt_token_ids=ids,
            gold=gold,
            data_source=_data_source_of(row, self.path),
            extra_info=dict(extra) if isinstance(extra, dict) else {},
        )

    def _row(self, i: int) -> dict[str, Any]:
        if self._parquet:
            start, end = int(self._locators[i]), int(self._locators[i + 1])
            row: dict[str, Any] = json.loads(bytes(self._store[start:end]))
            return row
        if self._file is None:
            self._file = self.path.open("rb")  # noqa: SIM115 (kept open while prompts are served)
        self._file.seek(int(self._locators[i]))
        return _parse_jsonl_line(self._file.readline(), self.path, f"byte {int(self._locators[i])}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _data_source_of(row: dict[str, Any], path: Path) -> str:
    """A row's ``data_source``, or the file's name without its suffix when the row has none."""
    return str(row.get("data_source") or path.stem)


def _compact_row(row: dict[str, Any]) -> bytes:
    keep = {key: row.get(key) for key in ("prompt", "reward_model", "data_source", "extra_info")}
    return json.dumps(keep, separators=(",", ":"), default=_json_default).encode()


def _json_default(value: Any) -> Any:
    if isinstance(value, np.ndarray):  # some parquet writers hand lists back as arrays
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} of a data row")


def _parse_jsonl_line(line: bytes, path: Path, where: object) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SchemaError(f"{path}:{where}: not valid JSON ({exc}); one JSON object per line") from None
    if not isinstance(row, dict):
        raise SchemaError(f"{path}:{where}: expected a JSON object, got {type(row).__name__}")
    if not all(name in row for name in REQUIRED_COLUMNS):  # a Path only for the message: pathlib interns
        _check_columns(row.keys(), Path(f"{path}:{where}"))
    return row


# --------------------------------------------------------------------------------------------------
# The endless, sharded stream
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StreamState:
    """Where a ``PromptStream`` resumes: the next item is ``position`` in the shard's order of ``epoch``."""

    epoch: int = 0
    position: int = 0


class PromptStream:
    """An endless iterator over one shard of the prompts, epoch after epoch.

    Every epoch, all prompts are shuffled with a generator seeded by ``(seed, epoch)`` and generator
    ``shard_index`` of ``num_shards`` takes every ``num_shards``-th prompt of that order, starting at
    ``shard_index``. So within an epoch each prompt goes to exactly one generator, the shards differ
    in size by at most one, the order is the same on every run with the same seed, and it changes from
    epoch to epoch. All generators must be given the same prompts and seed.

    Example: 5 prompts and 2 shards; if epoch 0 shuffles to [3, 0, 4, 1, 2], shard 0 serves prompts
    3, 4, 2 and shard 1 serves 0, 1. After two ``next`` calls, shard 0's ``state`` is
    ``StreamState(epoch=0, position=2)``, and a stream built with that state serves prompt 2 next.
    """

    def __init__(
        self,
        prompts: Sequence[PromptItem | None],
        *,
        seed: int = 0,
        num_shards: int = 1,
        shard_index: int = 0,
        state: StreamState | None = None,
    ) -> None:
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        if not 0 <= shard_index < num_shards:
            raise ValueError(
                f"shard_index {shard_index} is outside [0, {num_shards}); use 0..{num_shards - 1}"
            )
        if len(prompts) < num_shards:
            raise ConfigError(
                f"{len(prompts)} prompts cannot feed {num_shards} generators (a shard would be empty); "
                "lower generator.num_generators or add prompts"
            )
        self._prompts = prompts if isinstance(prompts, LazyPrompts) else list(prompts)
        self._seed = seed
        self._num_shards = num_shards
        self._shard_index = shard_index
        state = state or StreamState()
        self._epoch = state.epoch
        self._order = self._shard_order(state.epoch)
        if not 0 <= state.position <= len(self._order):
            raise ValueError(
                f"resume position {state.position} is outside this shard's {len(self._order)} prompts; "
                "the saved state belongs to a different data set or shard layout"
            )
        self._position = state.position
        self._last_epoch = state.epoch

    def _shard_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self._seed, epoch])
        return rng.permutation(len(self._prompts))[self._shard_index :: self._num_shards]

    def shard_indices(self, epoch: int) -> list[int]:
        """Indices (into ``prompts``) this shard serves in ``epoch``, in order."""
        return [int(i) for i in self._shard_order(epoch)]

    @property
    def shard_size(self) -> int:
        return len(self._order)

    @property
    def epoch(self) -> int:
        """Epoch of the item ``next`` returned last."""
        return self._last_epoch

    @property
    def state(self) -> StreamState:
        """Resume point: a new stream built with this state continues with the next item."""
        return StreamState(self._epoch, self._position)

    def __iter__(self) -> PromptStream:
        return self

    def __next__(self) -> PromptItem:
        """The next prompt; one that is None in ``prompts`` (too long, see ``LazyPrompts``) is skipped."""
        for _ in range(2 * len(self._order) + 1):
            if self._position >= len(self._order):
                self._epoch += 1
                self._order = self._shard_order(self._epoch)
                self._position = 0
            item = self._prompts[int(self._order[self._position])]
            self._last_epoch = self._epoch
            self._position += 1
            if item is not None:
                return item
        max_len = getattr(self._prompts, "max_prompt_len", "?")
        raise ConfigError(
            f"every prompt of this generator's shard is longer than model.max_prompt_len = {max_len} tokens; "
            "raise it"
        )
