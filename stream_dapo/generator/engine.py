"""``RolloutEngine``: continuous group generation on a vLLM ``LLMEngine``, with in-place weight swaps.

One prompt becomes G vLLM requests with ``n = 1`` and ids ``{group_id}:{i}``, which share the prompt's
KV blocks through prefix caching. That is what vLLM does internally for ``n = G`` too, but ``n > 1``
is refused with greedy sampling (evaluation, tests), and separate requests keep the bookkeeping one
request = one sample. Outputs stream as DELTAs; a group is handed out as soon as its G samples
finished, while the engine keeps the other groups running.

Per-token behaviour versions. vLLM's engine core runs in its own process and keeps stepping while
this process does other work, so the number of tokens *this* process has seen when it swaps weights
is not the number the engine had generated. The engine core itself labels every batch of outputs
with its current weight version (``LLMEngine.set_weight_version``) and the finished
``CompletionOutput.weight_versions`` lists the spans ``[start, end)`` each version sampled; that is
exact, and ``versions_from_spans`` turns it into ``versions[t]``. Labels change only while the
scheduler is paused (below), so no step straddles a swap.

Weight update protocol (``update_weights``), each step a helper with a timeout:

1. pause: ``sleep(level=0, mode="keep")`` stops scheduling and waits for the running step to end;
   requests stay in the engine with their KV cache.
2. load: ``collective_rpc("update_weights_from_shm")`` (the checked image in shared memory, which the
   worker maps: no file, no copy through the RPC; ``stream_dapo.weights.image``) or
   ``"update_weights_from_file"`` reloads in place and spot-checks (``worker_ext``).
3. label: ``set_weight_version(str(version))``: later tokens carry the new version.
4. invalidate KV: ``kv_on_update="recompute"`` (default) calls ``reset_prefix_cache(
   reset_running_requests=True)``: running requests are preempted and recompute their KV with the new
   weights, so every token sampled after the swap has a behaviour log-prob that is exactly the new
   policy's, and no new prompt can hit a prefix block computed by old weights. ``"keep"`` keeps the
   in-flight KV (cheaper for very long rollouts; post-swap tokens then attend to old-weight KV); new
   requests get a per-version ``cache_salt`` so they never hit old blocks, and the plain
   ``reset_prefix_cache()`` (which refuses, returning False, while requests hold blocks) is retried
   at the engine's next idle step, to release the old hashes. Not while it is busy: every refusal
   logs a vLLM warning, once a second for the whole of a continuously fed run, and meanwhile the
   salted old blocks are unreachable and evicted like any free block. ``"between-groups"``: the
   generator service swaps only once no group is in flight (it starts none while an update waits),
   so the reset has nothing to preempt and every sample is sampled by one version.
   ``tokens_recomputed`` counts the context tokens each reset made the engine prefill again.
5. resume: ``wake_up(tags=["scheduling"])``.

A failure after the load started leaves half-loaded weights: the engine stays paused and
``WeightUpdateError`` tells the caller to restart the generator (a restarted generator fetches the
current weights before its first prompt).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import numpy as np

from stream_dapo.data.sources import DEFAULT_SOURCE
from stream_dapo.generator.rollout import FinishedGroup, FinishedSample
from stream_dapo.generator.worker_ext import WORKER_EXTENSION

if TYPE_CHECKING:
    from stream_dapo.config import Config
    from stream_dapo.weights.image import WeightImage

__all__ = [
    "KvOnUpdate",
    "PromptLike",
    "RolloutEngine",
    "WeightUpdateError",
    "check_weights_file",
    "versions_from_spans",
]

logger = logging.getLogger(__name__)

KvOnUpdate = Literal["recompute", "keep", "between-groups"]
KV_ON_UPDATE: tuple[KvOnUpdate, ...] = ("recompute", "keep", "between-groups")
T = TypeVar("T")

_KV_RESET_RETRY_S = 1.0
_MAX_DRAIN_STEPS = 256


class WeightUpdateError(RuntimeError):
    """A weight update failed; the message says whether the engine is still usable."""


class PromptLike(Protocol):
    """What a group needs of ``stream_dapo.data.dataset.PromptItem``."""

    prompt_id: str
    prompt_token_ids: list[int]
    gold: str


# --------------------------------------------------------------------------------------------------
# Pure bookkeeping
# --------------------------------------------------------------------------------------------------


def versions_from_spans(spans: Sequence[Any] | None, num_tokens: int, default: int) -> np.ndarray:
    """``versions[t]`` (int32 [num_tokens]) from vLLM's ``WeightVersionSpan`` list.

    Each span has ``version`` (our integer version as a string), ``start`` and ``end`` (token indices,
    end exclusive); together they must tile ``[0, num_tokens)``. ``None`` (vLLM had no label for these
    tokens) gives ``default`` everywhere.
    """
    out = np.full(num_tokens, default, dtype=np.int32)
    if spans is None:
        return out
    pos = 0
    for span in spans:
        start, end = int(span.start), int(span.end)
        if start != pos or end < start or end > num_tokens:
            raise ValueError(
                f"weight-version spans {[(s.version, s.start, s.end) for s in spans]} do not tile "
                f"[0, {num_tokens}); label versions with RolloutEngine only"
            )
        try:
            out[start:end] = int(span.version)
        except ValueError:
            raise ValueError(
                f"weight version label {span.version!r} is not an integer; label versions with RolloutEngine only"
            ) from None
        pos = end
    if pos != num_tokens:
        raise ValueError(f"weight-version spans cover {pos} of {num_tokens} tokens")
    return out


@dataclass
class _SampleState:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    cached_tokens: int = 0
    finished: FinishedSample | None = None


@dataclass
class _GroupState:
    group_id: str
    prompt: PromptLike
    created_at: float
    start_version: int
    samples: list[_SampleState]

    def done(self) -> bool:
        return all(s.finished is not None for s in self.samples)


class GroupAssembler:
    """In-flight groups and their samples, fed with DELTA ``RequestOutput``s.

    Engine-free on purpose: the unit tests drive it with hand-made outputs.
    """

    def __init__(self) -> None:
        self._groups: dict[str, _GroupState] = {}
        self._requests: dict[str, tuple[str, int]] = {}
        """vLLM request id -> (group id, sample index)."""
        self.tokens_generated = 0
        """Response tokens received so far (all groups, aborted ones included)."""
        self.unlabelled_samples = 0
        """Samples vLLM returned without weight-version spans (given their group's start version)."""

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    @property
    def group_ids(self) -> list[str]:
        return list(self._groups)

    def start_versions(self) -> list[int]:
        """The policy version each in-flight group was started at."""
        return [state.start_version for state in self._groups.values()]

    def add(self, group_id: str, prompt: PromptLike, group_size: int, version: int) -> list[str]:
        """Register a group; returns the request ids of its samples, in sample order."""
        if group_id in self._groups:
            raise ValueError(f"group id {group_id!r} is already in flight; ids must be unique")
        self._groups[group_id] = _GroupState(
            group_id, prompt, time.time(), version, [_SampleState() for _ in range(group_size)]
        )
        ids = self.request_ids(group_id)
        for i, rid in enumerate(ids):
            self._requests[rid] = (group_id, i)
        return ids

    def context_tokens(self) -> int:
        """Tokens a KV reset makes the engine prefill again: each unfinished sample's response so far,
        plus its group's prompt once (the group's samples share the prompt's blocks through prefix
        caching, so the first to be rescheduled recomputes it for all)."""
        total = 0
        for state in self._groups.values():
            running = [s for s in state.samples if s.finished is None]
            if running:
                total += len(state.prompt.prompt_token_ids) + sum(len(s.token_ids) for s in running)
        return total

    def request_ids(self, group_id: str) -> list[str]:
        state = self._groups[group_id]
        return [f"{group_id}:{i}" for i in range(len(state.samples))]

    def drop(self, group_id: str) -> list[str]:
        """Forget a group; returns its request ids (empty if it was not in flight)."""
        if group_id not in self._groups:
            return []
        ids = self.request_ids(group_id)
        del self._groups[group_id]
        for rid in ids:
            self._requests.pop(rid, None)
        return ids

    def consume(self, outputs: Iterable[Any]) -> list[FinishedGroup]:
        """Apply DELTA outputs; return the groups whose G samples have all finished (in finish order)."""
        done: list[FinishedGroup] = []
        for out in outputs:
            where = self._requests.get(out.request_id)
            if where is None:
                continue  # a late output of an aborted group
            state = self._groups[where[0]]
            sample = state.samples[where[1]]
            sample.cached_tokens = max(sample.cached_tokens, int(getattr(out, "num_cached_tokens", 0) or 0))
            for completion in out.outputs:
                self._apply(state, where[1], completion)
            if state.done():
                self.drop(state.group_id)
                done.append(self._finish(state))
        return done

    def _apply(self, state: _GroupState, index: int, completion: Any) -> None:
        sample = state.samples[index]
        if sample.finished is not None:
            return
        new_ids = list(completion.token_ids)
        sample.token_ids.extend(new_ids)
        sample.logprobs.extend(_sampled_logprobs(new_ids, completion.logprobs, state.group_id))
        sample.text.append(completion.text)
        self.tokens_generated += len(new_ids)
        if completion.finish_reason is None:
            return
        n = len(sample.token_ids)
        spans = getattr(completion, "weight_versions", None)
        if spans is None and n:
            self.unlabelled_samples += 1
        sample.finished = FinishedSample(
            token_ids=np.asarray(sample.token_ids, dtype=np.int32),
            logprobs=np.asarray(sample.logprobs, dtype=np.float32),
            versions=versions_from_spans(spans, n, state.start_version),
            text="".join(sample.text),
            finish_reason=str(completion.finish_reason),
            cached_prompt_tokens=sample.cached_tokens,
        )

    @staticmethod
    def _finish(state: _GroupState) -> FinishedGroup:
        prompt = state.prompt
        return FinishedGroup(
            group_id=state.group_id,
            prompt_id=prompt.prompt_id,
            gold=prompt.gold,
            prompt_token_ids=np.asarray(prompt.prompt_token_ids, dtype=np.int32),
            created_at=state.created_at,
            samples=[s.finished for s in state.samples if s.finished is not None],
            start_version=state.start_version,
            source=getattr(prompt, "source", DEFAULT_SOURCE),
            data_source=getattr(prompt, "data_source", ""),
            extra_info=getattr(prompt, "extra_info", None) or {},
        )


def _sampled_logprobs(token_ids: list[int], logprobs: Any, group_id: str) -> list[float]:
    """The sampled token's log-prob at each new position (``SamplingParams(logprobs=0)``): with the
    engine's ``logprobs_mode="processed_logprobs"`` (``vllm_utils``), under the tempered, truncated
    distribution it was sampled from."""
    if logprobs is None or len(logprobs) != len(token_ids):
        got = None if logprobs is None else len(logprobs)
        raise RuntimeError(
            f"group {group_id}: vLLM returned {got} log-prob entries for {len(token_ids)} tokens; "
            "requests must be made with SamplingParams(logprobs=0)"
        )
    return [float(position[token].logprob) for token, position in zip(token_ids, logprobs, strict=True)]


def check_weights_file(path: str | os.PathLike[str]) -> None:
    """Refuse a weights file before pausing the engine for it: it must exist and parse as safetensors."""
    from safetensors import safe_open

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"weights file {p} does not exist; the weights receiver must write it first")
    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            if not list(f.keys()):
                raise ValueError("no tensors")
    except Exception as exc:
        raise ValueError(f"{p} is not a usable safetensors state dict ({exc}); refusing to load it") from exc


# --------------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------------


class RolloutEngine:
    """Groups in, finished groups out, weights swapped between engine steps.

    ``engine`` is a ``vllm.v1.engine.llm_engine.LLMEngine`` started with this package's worker
    extension (``RolloutEngine.start`` builds one from the config); tests of the bookkeeping may pass
    a stand-in with the same methods.
    """

    def __init__(
        self,
        engine: Any,
        *,
        group_size: int,
        max_response_len: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        version: int = 0,
        kv_on_update: KvOnUpdate = "recompute",
        rpc_timeout_s: float = 600.0,
        startup_seconds: float = 0.0,
    ) -> None:
        if group_size < 1 or max_response_len < 1:
            raise ValueError(
                f"need group_size >= 1 and max_response_len >= 1, got {group_size}, {max_response_len}"
            )
        if kv_on_update not in KV_ON_UPDATE:
            raise ValueError(f"kv_on_update must be one of {KV_ON_UPDATE}, got {kv_on_update!r}")
        self._engine = engine
        self.group_size = group_size
        self.max_response_len = max_response_len
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.kv_on_update: KvOnUpdate = kv_on_update
        self.rpc_timeout_s = rpc_timeout_s
        self.startup_seconds = startup_seconds
        self.version = version
        self.updates = 0
        self.tokens_recomputed = 0
        """Context tokens whose KV weight swaps dropped for recompute (``GroupAssembler.context_tokens``)."""
        self._groups = GroupAssembler()
        self._rpc = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-control")
        self._kv_reset_pending = False
        self._kv_reset_last_try = 0.0
        self._call("label", lambda: engine.set_weight_version(str(version)))

    # ---------------------------------------------------------------- construction

    @classmethod
    def start(
        cls,
        cfg: Config,
        *,
        index: int = 0,
        model_path: str | None = None,
        version: int = 0,
        temperature: float | None = None,
        kv_on_update: KvOnUpdate | None = None,
    ) -> RolloutEngine:
        """Start a vLLM engine for generator ``index`` from the resolved config (20-60 s on the CPU)."""
        from stream_dapo.generator.vllm_utils import (
            apply_cpu_env,
            apply_engine_process_env,
            engine_tempdir,
            is_cpu_platform,
            private_ipc_dir,
            vllm_engine_kwargs,
        )

        path = model_path or cfg.model.path
        if not Path(path, "config.json").is_file():
            raise FileNotFoundError(
                f"model directory {path} has no config.json; set model.path to a Hugging Face model "
                "directory or build the tiny default with `stream-dapo warmup`"
            )
        if is_cpu_platform():
            apply_cpu_env(cfg.generator, index=index)
        apply_engine_process_env(cfg.generator)
        private_ipc_dir()
        kwargs = vllm_engine_kwargs(
            path,
            cfg.generator,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_prompt_len + cfg.algo.max_response_len,
            seed=cfg.generator.seed + index,
        )
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        kwargs.setdefault("disable_log_stats", True)

        from vllm import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        t0 = time.perf_counter()
        with engine_tempdir():
            engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
        seconds = time.perf_counter() - t0
        logger.info("vLLM engine for %s started in %.1f s", path, seconds)
        return cls(
            engine,
            group_size=cfg.algo.group_size,
            max_response_len=cfg.algo.max_response_len,
            temperature=cfg.generator.temperature if temperature is None else temperature,
            top_p=cfg.generator.top_p,
            top_k=cfg.generator.top_k,
            min_p=cfg.generator.min_p,
            version=version,
            kv_on_update=cfg.generator.kv_on_update if kv_on_update is None else kv_on_update,
            startup_seconds=seconds,
        )

    # ---------------------------------------------------------------- generation

    @property
    def num_in_flight(self) -> int:
        """Groups started and not yet returned or aborted."""
        return len(self._groups)

    def start_versions(self) -> list[int]:
        """The policy version each in-flight group was started at (a lower bound on its tokens')."""
        return self._groups.start_versions()

    @property
    def tokens_generated(self) -> int:
        return self._groups.tokens_generated

    @property
    def unlabelled_samples(self) -> int:
        return self._groups.unlabelled_samples

    def add_group(self, prompt: PromptLike, group_id: str | None = None) -> str:
        """Start G samples of ``prompt``; returns the group id (a fresh uuid4 hex by default)."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        gid = group_id or uuid.uuid4().hex
        if not prompt.prompt_token_ids:
            raise ValueError(f"prompt {prompt.prompt_id} has no tokens")
        budget = getattr(prompt, "max_response_len", None) or self.max_response_len
        params = SamplingParams(
            n=1,
            max_tokens=min(budget, self.max_response_len),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
        )
        request: dict[str, Any] = {"prompt_token_ids": list(prompt.prompt_token_ids)}
        if self.kv_on_update == "keep":
            request["cache_salt"] = f"v{self.version}"
        request_ids = self._groups.add(gid, prompt, self.group_size, self.version)
        try:
            for rid in request_ids:
                self._engine.add_request(rid, dict(request), params)
        except BaseException:
            self.abort_group(gid)
            raise
        return gid

    def step(self) -> list[FinishedGroup]:
        """Collect what the engine produced since the last call; return the groups that finished.

        Blocks for at most one engine step, and not at all when nothing is in flight.
        """
        if not self._engine.has_unfinished_requests():
            self._retry_kv_reset()
            return []
        outputs = list(self._engine.step())
        outputs.extend(self._ready_outputs())
        # No retry of a pending KV reset here: vLLM refuses it (with a warning) while any request holds
        # blocks, which in a busy engine is always, so it waits for the next idle step above.
        return self._groups.consume(outputs)

    def _ready_outputs(self) -> list[Any]:
        """Outputs the engine process already queued: take them now rather than one per call, so a
        slow caller does not fall behind the engine. Relies on the multiprocess client's queue; other
        clients produce one step per call anyway."""
        queue = getattr(getattr(self._engine, "engine_core", None), "outputs_queue", None)
        outputs: list[Any] = []
        for _ in range(_MAX_DRAIN_STEPS):
            if queue is None or queue.empty() or not self._engine.has_unfinished_requests():
                break
            outputs.extend(self._engine.step())
        return outputs

    def abort_group(self, group_id: str) -> bool:
        request_ids = self._groups.drop(group_id)
        if request_ids:
            self._engine.abort_request(request_ids)
        return bool(request_ids)

    def abort_all(self, engine_alive: bool = True) -> int:
        """Abort every group in flight (drain); returns how many. ``engine_alive=False``: the
        engine's processes are gone (a stop signal reached them too), so the groups are only
        forgotten here, nothing is sent to vLLM."""
        group_ids = self._groups.group_ids
        request_ids = [rid for gid in group_ids for rid in self._groups.drop(gid)]
        if request_ids and engine_alive:
            self._engine.abort_request(request_ids)
        return len(group_ids)

    # ---------------------------------------------------------------- weights

    def update_weights(self, path: str | os.PathLike[str], version: int) -> float:
        """Swap to the weights in safetensors file ``path``, labelled ``version``; returns seconds.

        Call between ``step`` calls. A bad file is refused before the engine is paused (the engine
        keeps sampling from the old weights and the error is a ``ValueError``/``FileNotFoundError``).
        """
        check_weights_file(path)

        def load() -> int:
            self._load(str(path))
            return version

        return self._swap(load, f"{path} (version {version})")

    def update_weights_from_image(self, image: WeightImage, version: int) -> float:
        """Swap to the weights in the shared-memory safetensors image ``image``, labelled ``version``;
        returns seconds. The worker maps the same pages (no copy through the RPC, no file). An image
        that is not usable is refused before the engine is paused (``ValueError``; the engine keeps
        sampling from the old weights)."""
        from stream_dapo.weights.safetensors_view import SafetensorsError, check_header

        try:
            check_header(image.view)
        except SafetensorsError as exc:
            raise ValueError(
                f"weights version {version} is not a usable safetensors image ({exc}); refusing it"
            ) from exc
        what = f"shared memory (version {version}, {image.nbytes} bytes)"

        def load() -> int:
            results = self._call(
                "load",
                lambda: self._engine.collective_rpc(
                    "update_weights_from_shm", timeout=self.rpc_timeout_s, args=(image.name, image.nbytes)
                ),
            )
            if not results or not all(r is True for r in results):
                raise WeightUpdateError(f"workers did not confirm loading {what}: {results!r}")
            return version

        return self._swap(load, what)

    def join_nccl(self, host: str, port: int, world_size: int, rank_base: int) -> list[int]:
        """Join the learner's NCCL weight group (GPU only); returns the workers' ranks."""
        return self._call(
            "nccl join",
            lambda: self._engine.collective_rpc(
                "nccl_join", timeout=self.rpc_timeout_s, args=(host, port, world_size, rank_base)
            ),
        )

    def receive_weights_nccl(self, timeout_s: float) -> float:
        """Swap to the learner's next NCCL broadcast (GPU only); returns seconds (``version`` is updated)."""

        def load() -> int:
            versions = self._call(
                "nccl receive",
                lambda: self._engine.collective_rpc(
                    "nccl_receive_weights", timeout=timeout_s, args=(timeout_s,)
                ),
            )
            if not versions or len(set(versions)) != 1:
                raise WeightUpdateError(f"workers received different weight versions over NCCL: {versions}")
            return int(versions[0])

        return self._swap(load, "the NCCL broadcast")

    def _swap(self, load: Callable[[], int], what: str) -> float:
        """pause -> load (returns the version) -> label -> invalidate KV -> resume."""
        start = time.perf_counter()
        self._pause()
        try:
            version = load()
            self._label(version)
            self._invalidate_kv()
        except Exception as exc:
            raise WeightUpdateError(
                f"weight update from {what} failed after the engine was paused ({exc}); the weights may be "
                "half-loaded, so the engine stays paused: restart the generator"
            ) from exc
        self._resume()
        self.version = version
        self.updates += 1
        return time.perf_counter() - start

    def weights_checksum(self) -> str:
        """Fingerprint of the loaded weights (``WeightUpdateExtension.weights_checksum``)."""
        results = self._call("weights_checksum", lambda: self._engine.collective_rpc("weights_checksum"))
        return str(results[0])

    def _pause(self) -> None:
        self._call("pause", lambda: self._engine.sleep(level=0, mode="keep"))

    def _load(self, path: str) -> None:
        results = self._call(
            "load",
            lambda: self._engine.collective_rpc(
                "update_weights_from_file", timeout=self.rpc_timeout_s, args=(path,)
            ),
        )
        if not results or not all(r is True for r in results):
            raise WeightUpdateError(f"workers did not confirm loading {path}: {results!r}")

    def _label(self, version: int) -> None:
        self._call("label", lambda: self._engine.set_weight_version(str(version)))

    def _invalidate_kv(self) -> None:
        if self.kv_on_update != "keep":  # between-groups: nothing is running, so nothing to recompute
            self.tokens_recomputed += self._groups.context_tokens()
            ok = self._call(
                "reset_prefix_cache", lambda: self._engine.reset_prefix_cache(reset_running_requests=True)
            )
            if not ok:
                raise WeightUpdateError(
                    "vLLM could not reset its prefix cache even after preempting requests"
                )
            return
        # keep: new requests are salted with the new version, so the old blocks are unreachable; drop
        # their hashes as soon as no request holds them.
        self._kv_reset_pending = not self._call("reset_prefix_cache", self._engine.reset_prefix_cache)
        self._kv_reset_last_try = time.monotonic()

    def _resume(self) -> None:
        self._call("resume", lambda: self._engine.wake_up(tags=["scheduling"]))

    def _retry_kv_reset(self) -> None:
        if not self._kv_reset_pending or time.monotonic() - self._kv_reset_last_try < _KV_RESET_RETRY_S:
            return
        self._kv_reset_last_try = time.monotonic()
        self._kv_reset_pending = not self._call("reset_prefix_cache", self._engine.reset_prefix_cache)

    @property
    def kv_reset_pending(self) -> bool:
        return self._kv_reset_pending

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run one engine control call with a timeout (vLLM's sync utility calls have none)."""
        future = self._rpc.submit(fn)
        try:
            return future.result(timeout=self.rpc_timeout_s)
        except FutureTimeout:
            raise WeightUpdateError(
                f"vLLM did not answer {what!r} within {self.rpc_timeout_s:.0f} s; the engine process is stuck: "
                "restart the generator"
            ) from None

    # ---------------------------------------------------------------- shutdown

    def close(self) -> None:
        """Shut the engine processes down (idempotent)."""
        core = getattr(self._engine, "engine_core", None)
        shutdown = getattr(core, "shutdown", None)
        if callable(shutdown):
            shutdown()
        self._rpc.shutdown(wait=False, cancel_futures=True)
