"""A process pool that runs rewards (``verify`` and every other ``stream_dapo.rewards`` scorer) with
a wall-clock timeout per check.

What it runs: each pool holds named rewards (``RewardSpec``s; one per data source in a run) and
every item names its reward: ``score_batch([ScoreItem("words", response, gold, data_source,
extra_info), ...])``. ``verify_batch([(response, gold), ...])`` is the one-reward shorthand. Each
worker builds every scorer when it starts (a user's module is imported there, never in the parent):
one that cannot be built stops the pool's start with the scorer's ``ConfigError``, which names the
setting and the fix. A timeout or a crash scores the item's reward's ``failure_score``.

Why processes: a pathological answer can keep sympy busy for minutes, and Python cannot interrupt a
thread stuck in C code; a process can be killed. Why "spawn": the generator process holds torch and
vLLM threads, and forking a multi-threaded process can deadlock the child. Workers import only this
package (sympy is imported later, on the first answer that needs the symbolic path), so a pool starts
in well under a second. Note that "spawn" re-imports the parent's ``__main__`` module in each worker:
entry-point scripts must keep heavy imports inside functions (as ``stream_dapo.cli`` does).

How a batch runs: the items are cut into chunks (one message each way per chunk, so inter-process
overhead per item is small); idle workers take chunks. Each worker writes into a small shared array
which item it is on and when it started it, so the parent can tell, without any per-item message,
which item has run longer than ``timeout_s``. That item scores -1 ("timeout"), the worker is killed
and replaced, and the other items of its chunk go back to the queue (also the ones the worker had
already finished but not yet reported: verification is pure, so repeating them is harmless). A
worker that dies mid-chunk is handled the same way, with "worker_crashed". Every kill blames exactly
one item, so a batch always finishes. The clock of the first symbolic check in a worker stops while
the worker imports sympy: that half second is start-up, not checking.

Test hooks: when ``STREAM_DAPO_VERIFIER_TEST_HOOKS=1`` is set in a worker's environment (it inherits
the parent's at start), a gold answer equal to ``TEST_HANG_GOLD`` makes the worker sleep for an hour
and ``TEST_CRASH_GOLD`` makes it exit abruptly, and the worker's first sympy import takes
``TEST_IMPORT_DELAY_S`` longer (a slow machine, made certain). Without the variable those strings are
ordinary golds and imports take what they take.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from stream_dapo.errors import ConfigError
from stream_dapo.rewards.spec import RewardSpec
from stream_dapo.verifier.backends import check_backend
from stream_dapo.verifier.core import REASONS, VerifyResult, check_limits
from stream_dapo.verifier.equivalence import on_first_sympy_import
from stream_dapo.verifier.extract import compile_answer_pattern

if TYPE_CHECKING:
    from stream_dapo.config import VerifierConfig
    from stream_dapo.rewards.scorers import Scorer

__all__ = [
    "DEFAULT_REWARD",
    "TEST_CRASH_GOLD",
    "TEST_HANG_GOLD",
    "TEST_HOOKS_ENV",
    "TEST_IMPORT_DELAY_S",
    "ScoreItem",
    "VerifierPool",
]

DEFAULT_REWARD = "default"
"""The name of the reward ``verify_batch`` uses: the one built from the constructor's math arguments."""

TEST_HOOKS_ENV = "STREAM_DAPO_VERIFIER_TEST_HOOKS"
TEST_HANG_GOLD = "__stream_dapo_test_hang__"
TEST_CRASH_GOLD = "__stream_dapo_test_crash__"
TEST_IMPORT_DELAY_S = 5.0

_MAX_CHUNK = 256
_CHUNKS_PER_WORKER = 4  # enough chunks per worker to balance load, few enough to keep IPC negligible
_STARTUP_TIMEOUT_S = 60.0
_IMPORT_GRACE_S = 60.0  # how long a worker's one-time sympy import may take
_MAX_FAILED_STARTS = 3
# Layout of each worker's shared progress array.
_CHUNK_ID, _POSITION, _STARTED_AT = 0, 1, 2

# What goes over the pipe for one item's result: (correct, reward, extracted, reason, extras).
_ResultTuple = tuple[bool, float, "str | None", str, dict[str, float]]


@dataclass(frozen=True)
class ScoreItem:
    """One response to score with the pool's reward named ``reward`` (verl's four arguments)."""

    reward: str
    response: str
    gold: str
    data_source: str = ""
    extra_info: dict[str, Any] | None = None


def _run_test_hook(gold: str) -> None:
    if gold == TEST_HANG_GOLD:
        time.sleep(3600)
    elif gold == TEST_CRASH_GOLD:
        os._exit(17)


def _check_one(scorer: Scorer, spec: RewardSpec, item: tuple[Any, ...]) -> _ResultTuple:
    _, response, gold, data_source, extra_info = item
    try:
        r = scorer(data_source, response, gold, extra_info or {})
    except Exception:  # a scorer bug on one item must not take the worker down
        reason = "parse_error" if spec.kind in ("math", "math-verify") else "reward_error"
        r = VerifyResult(correct=False, reward=spec.failure_score, extracted=None, reason=reason)
    return (r.correct, r.reward, r.extracted, r.reason, r.extras)


def _load_scorers(rewards: dict[str, RewardSpec]) -> dict[str, Scorer]:
    from stream_dapo.rewards.scorers import load_scorer

    return {name: load_scorer(spec) for name, spec in rewards.items()}


def _worker_main(conn: Connection, progress: Any, rewards: dict[str, RewardSpec]) -> None:
    """Worker loop: build the scorers, then receive ``(chunk_id, items)``, score each item, send
    ``("done", chunk_id, results)``."""
    # Ctrl-C and `kill -TERM -<pgid>` go to the whole process group; the parent decides when
    # workers stop (it drains first, and a parent that dies closes the pipe: EOF ends the loop).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hooks = os.environ.get(TEST_HOOKS_ENV) == "1"

    def pause_clock() -> None:
        # A start time in the future: the import gets _IMPORT_GRACE_S before the parent gives up on it.
        progress[_STARTED_AT] = time.monotonic() + _IMPORT_GRACE_S

    def restart_clock() -> None:
        progress[_STARTED_AT] = time.monotonic()

    on_first_sympy_import(pause_clock, restart_clock)
    if hooks:
        on_first_sympy_import(lambda: time.sleep(TEST_IMPORT_DELAY_S), lambda: None)
    try:
        scorers = _load_scorers(rewards)
    except ConfigError as exc:
        conn.send(("load_error", os.getpid(), str(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        chunk_id, items = message
        results: list[_ResultTuple] = []
        for position, item in enumerate(items):
            # Written in this order (time, position, chunk) and read in the reverse order by the
            # parent, so a position it reads is never paired with an older start time.
            progress[_STARTED_AT] = time.monotonic()
            progress[_POSITION] = position
            progress[_CHUNK_ID] = chunk_id
            if hooks:
                _run_test_hook(item[2])
            results.append(_check_one(scorers[item[0]], rewards[item[0]], item))
        conn.send(("done", chunk_id, results))


@dataclass
class _Chunk:
    chunk_id: int
    indices: list[int]
    items: list[tuple[Any, ...]]
    """(reward name, response, gold, data_source, extra_info) per item: what crosses the pipe."""


class _Worker:
    """One worker process, its pipe, its progress array, and the chunk it is working on."""

    def __init__(self, ctx: Any, args: tuple[Any, ...]) -> None:
        self.progress = ctx.RawArray("d", 3)
        self.progress[_CHUNK_ID] = -1.0
        self.progress[_POSITION] = -1.0
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        self.process: BaseProcess = ctx.Process(
            target=_worker_main,
            args=(child_conn, self.progress, *args),
            name="stream-dapo-verifier",
            daemon=True,
        )
        self.process.start()
        # Close our copy of the child's end so that the child's death shows up as EOF on ours.
        child_conn.close()
        self.conn: Connection = parent_conn
        self.ready = False
        self.started_at = time.monotonic()
        self.chunk: _Chunk | None = None
        self.sent_at = 0.0

    def current_position(self) -> tuple[int, float]:
        """The chunk position being verified and since when; before the worker picks the chunk up,
        position 0 since it was sent."""
        assert self.chunk is not None
        chunk_id = int(self.progress[_CHUNK_ID])
        position = int(self.progress[_POSITION])
        started_at = float(self.progress[_STARTED_AT])
        if chunk_id != self.chunk.chunk_id or position < 0:
            return 0, self.sent_at
        return position, started_at

    def deadline(self, timeout_of: dict[str, float]) -> float:
        if not self.ready:
            return self.started_at + _STARTUP_TIMEOUT_S
        if self.chunk is None:
            return math.inf
        position, started_at = self.current_position()
        return started_at + timeout_of[self.chunk.items[position][0]]

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5.0)
        self.conn.close()


def _scored(spec: RewardSpec, reason: str) -> VerifyResult:
    """The pool's own verdicts ("too_long", "timeout", "worker_crashed"): the reward's failure score."""
    return VerifyResult(correct=False, reward=spec.failure_score, extracted=None, reason=reason)


def _shutdown(workers: list[_Worker]) -> None:
    """Stop workers politely, then by force; used by ``close()`` and at garbage collection."""
    for worker in workers:
        try:
            worker.conn.send(None)
        except (OSError, ValueError):
            pass
    deadline = time.monotonic() + 2.0
    for worker in workers:
        worker.process.join(timeout=max(0.0, deadline - time.monotonic()))
        worker.kill()
    workers.clear()


class VerifierPool:
    """Score responses in worker processes, each check bounded by its reward's ``timeout_s``.

    Example::

        with VerifierPool(num_workers=2, timeout_s=5.0) as pool:
            results = pool.verify_batch([("...\\nAnswer: 42", "42"), ("\\boxed{7}", "8")])
            pool.counters  # {"exact": 1, "mismatch": 1, "timeout": 0, ...}

        rewards = {"words": parse_reward("math"), "mine": parse_reward("my_reward.py:compute_score")}
        with VerifierPool(num_workers=2, rewards=rewards) as pool:
            pool.score_batch([ScoreItem("mine", text, gold, "my_source", {"index": 3})])

    A timed-out or crashed check scores its reward's ``failure_score`` (-1 by default) with reason
    "timeout"/"worker_crashed"; the worker is replaced and the rest of the batch is still scored.
    ``verify_batch`` and ``score_batch`` may be called from several threads; calls run one at a time.
    """

    def __init__(
        self,
        num_workers: int = 1,
        timeout_s: float = 5.0,
        pattern: str | None = None,
        max_input_chars: int = 10_000,
        *,
        tail_chars: int = 300,
        chunk_size: int | None = None,
        backend: str = "builtin",
        rewards: dict[str, RewardSpec] | None = None,
    ) -> None:
        """Start ``num_workers`` workers and wait until each is ready.

        Args:
            num_workers: worker processes (one per core you can spare for verification).
            timeout_s: wall-clock limit for one check of the default reward.
            pattern, max_input_chars, tail_chars: passed to ``verify`` for every item of the default
                reward (``verify_batch``).
            chunk_size: items per message to a worker; None picks one from the batch size.
            backend: the default reward's equivalence checker, "builtin" or "math-verify" (see
                ``backends``); the timeout, counters and worker replacement are the same for both.
            rewards: more rewards by name, for ``score_batch`` (each with its own timeout).

        Raises:
            ValueError: for out-of-range parameters or an invalid pattern; ``ConfigError`` (a
                ValueError) for an unknown backend, "math-verify" when it is not installed, or a
                reward whose scorer cannot be built (a user's file that does not import).
            RuntimeError: when workers cannot start.
        """
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise ValueError(
                f"timeout_s must be a positive number of seconds (default 5.0), got {timeout_s!r}"
            )
        if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive integer or None (automatic), got {chunk_size!r}")
        check_limits(tail_chars, max_input_chars)
        compile_answer_pattern(pattern)  # fail here, in the caller, not in every worker
        check_backend(backend)
        default = RewardSpec(
            kind="math" if backend == "builtin" else "math-verify",
            timeout_s=float(timeout_s),
            math={"pattern": pattern, "tail_chars": tail_chars, "max_input_chars": max_input_chars},
        )
        self._rewards: dict[str, RewardSpec] = {DEFAULT_REWARD: default, **(rewards or {})}
        for spec in self._rewards.values():  # fail here, in the caller, not in every worker
            if spec.kind == "math-verify":
                check_backend("math-verify")
            if spec.kind in ("math", "math-verify"):
                compile_answer_pattern(spec.math.get("pattern"))
                check_limits(spec.math.get("tail_chars", 300), spec.math.get("max_input_chars", 10_000))
        self._timeout_of = {name: spec.timeout_s for name, spec in self._rewards.items()}
        self._num_workers = num_workers
        self._max_input_chars = max_input_chars
        self._chunk_size = chunk_size
        self._worker_args = (self._rewards,)
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()  # one batch at a time
        self._counters_lock = threading.Lock()  # so a metrics thread can read counters mid-batch
        self._counters: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._next_chunk_id = 0
        self._failed_starts = 0
        self._closed = False
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        try:
            for _ in range(num_workers):
                self._workers.append(_Worker(self._ctx, self._worker_args))
            while not all(w.ready for w in self._workers):
                self._service(results=[], pending=deque())
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_config(
        cls, config: VerifierConfig, rewards: dict[str, RewardSpec] | None = None
    ) -> VerifierPool:
        """The pool a ``[verifier]`` config section describes (workers, timeout, pattern, limits,
        backend), with ``rewards`` beside its default one."""
        return cls(
            num_workers=config.workers,
            timeout_s=config.timeout_s,
            pattern=config.pattern,
            max_input_chars=config.max_input_chars,
            backend=config.backend,
            rewards=rewards,
        )

    # -- public API ----------------------------------------------------------------------------------
    @property
    def counters(self) -> dict[str, int]:
        """Results so far by reason (every math reason is present, zero included)."""
        with self._counters_lock:
            return dict(self._counters)

    @property
    def rewards(self) -> dict[str, RewardSpec]:
        """The rewards this pool scores with, by name (``DEFAULT_REWARD`` included)."""
        return dict(self._rewards)

    def verify_batch(self, items: Sequence[tuple[str, str]]) -> list[VerifyResult]:
        """Verify ``(response, gold)`` pairs with the default reward; results in the same order."""
        checked: list[ScoreItem] = []
        for index, item in enumerate(items):
            if not (
                isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(x, str) for x in item)
            ):
                raise TypeError(f"item {index} must be a (response, gold) pair of two str, got {item!r:.80}")
            checked.append(ScoreItem(DEFAULT_REWARD, item[0], item[1]))
        return self.score_batch(checked)

    def score_batch(self, items: Sequence[ScoreItem]) -> list[VerifyResult]:
        """Score each item with the reward it names; results come back in the same order."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this VerifierPool is closed; create a new one")
            results: list[VerifyResult | None] = [None] * len(items)
            todo: list[int] = []
            wire: list[tuple[Any, ...]] = []
            for index, item in enumerate(items):
                spec = self._rewards.get(item.reward)
                if spec is None:
                    raise KeyError(
                        f"item {index} names reward {item.reward!r}, which this pool does not have "
                        f"(it has {', '.join(sorted(self._rewards))})"
                    )
                if not isinstance(item.response, str) or not isinstance(item.gold, str):
                    raise TypeError(
                        f"item {index}: response and gold must be str; decode token ids to text first"
                    )
                wire.append((item.reward, item.response, item.gold, item.data_source, item.extra_info))
                # Refuse over-long math inputs here: shipping a megabyte to a worker only to refuse it is waste.
                limit = spec.math.get("max_input_chars", self._max_input_chars)
                if spec.kind in ("math", "math-verify") and max(len(item.response), len(item.gold)) > limit:
                    results[index] = _scored(spec, "too_long")
                else:
                    todo.append(index)
            pending = self._make_chunks(todo, wire)
            while any(r is None for r in results):
                self._dispatch(pending)
                self._service(results, pending)
            done = [r for r in results if r is not None]
            with self._counters_lock:
                for r in done:
                    self._counters[r.reason] = self._counters.get(r.reason, 0) + 1
            return done

    def close(self) -> None:
        """Stop the workers; idempotent."""
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- scheduling ----------------------------------------------------------------------------------
    def _make_chunks(self, todo: list[int], items: Sequence[tuple[Any, ...]]) -> deque[_Chunk]:
        size = self._chunk_size or max(
            1, min(_MAX_CHUNK, math.ceil(len(todo) / (self._num_workers * _CHUNKS_PER_WORKER)))
        )
        chunks: deque[_Chunk] = deque()
        for start in range(0, len(todo), size):
            indices = todo[start : start + size]
            chunks.append(self._new_chunk(indices, [items[i] for i in indices]))
        return chunks

    def _new_chunk(self, indices: list[int], items: list[tuple[Any, ...]]) -> _Chunk:
        self._next_chunk_id += 1
        return _Chunk(self._next_chunk_id, indices, items)

    def _dispatch(self, pending: deque[_Chunk]) -> None:
        for worker in list(self._workers):
            if not pending:
                return
            if worker.ready and worker.chunk is None:
                chunk = pending.popleft()
                try:
                    worker.conn.send((chunk.chunk_id, chunk.items))
                except (OSError, ValueError):
                    # It died while idle: no item of this chunk was started, so none is to blame.
                    pending.appendleft(chunk)
                    self._replace(worker)
                    continue
                worker.chunk = chunk
                worker.sent_at = time.monotonic()

    def _service(self, results: list[VerifyResult | None], pending: deque[_Chunk]) -> None:
        """Wait for the next event (a message, a death, a deadline) and handle everything ready."""
        now = time.monotonic()
        earliest = min((w.deadline(self._timeout_of) for w in self._workers), default=math.inf)
        # At most one (shortest) timeout between looks at the clocks: a worker's sympy import moves
        # its clock's start into the future and back without waking us, and a deadline read during
        # the import would otherwise let its first check run _IMPORT_GRACE_S past the timeout.
        shortest = min(self._timeout_of.values())
        wait_s = None if earliest == math.inf else min(shortest, max(0.0, earliest - now))
        ready = set(wait([w.conn for w in self._workers], timeout=wait_s))
        for worker in list(self._workers):
            if worker in self._workers and worker.conn in ready:
                self._receive(worker, results, pending)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker in self._workers and worker.deadline(self._timeout_of) <= now:
                if not worker.ready:
                    self._replace(worker, failed_start=True)
                else:
                    self._blame_and_replace(worker, "timeout", results, pending)

    def _receive(self, worker: _Worker, results: list[VerifyResult | None], pending: deque[_Chunk]) -> None:
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            if not worker.ready:
                self._replace(worker, failed_start=True)
            elif worker.chunk is not None:
                self._blame_and_replace(worker, "worker_crashed", results, pending)
            else:
                self._replace(worker)
            return
        if message[0] == "ready":
            worker.ready = True
            self._failed_starts = 0
        elif message[0] == "load_error":
            raise ConfigError(message[2])
        elif message[0] == "done" and worker.chunk is not None and message[1] == worker.chunk.chunk_id:
            for index, (correct, reward, extracted, reason, extras) in zip(
                worker.chunk.indices, message[2], strict=True
            ):
                results[index] = VerifyResult(
                    correct=correct, reward=reward, extracted=extracted, reason=reason, extras=extras
                )
            worker.chunk = None

    def _blame_and_replace(
        self, worker: _Worker, reason: str, results: list[VerifyResult | None], pending: deque[_Chunk]
    ) -> None:
        """Score the item the worker was on as ``reason``, requeue the rest of its chunk, replace it."""
        chunk = worker.chunk
        assert chunk is not None
        position, _ = worker.current_position()
        results[chunk.indices[position]] = _scored(self._rewards[chunk.items[position][0]], reason)
        rest = [i for i in range(len(chunk.indices)) if i != position]
        if rest:
            pending.appendleft(
                self._new_chunk([chunk.indices[i] for i in rest], [chunk.items[i] for i in rest])
            )
        self._replace(worker)

    def _replace(self, worker: _Worker, *, failed_start: bool = False) -> None:
        worker.kill()
        self._workers.remove(worker)
        if failed_start:
            self._failed_starts += 1
            if self._failed_starts >= _MAX_FAILED_STARTS:
                raise RuntimeError(
                    f"verifier workers failed to start {self._failed_starts} times in a row (last exit code "
                    f"{worker.process.exitcode}); check that `python -c 'import stream_dapo.verifier'` works "
                    "in a fresh interpreter and that the entry script keeps heavy imports out of module level"
                )
        self._workers.append(_Worker(self._ctx, self._worker_args))
