"""Run one untrusted Python program, with stdin, inside a sandbox with CPU, wall, memory, process and
output limits: ``run_program(source, stdin, limits=..., isolation=...) -> SandboxResult``.

Model text is never executed anywhere else (see DESIGN.md, "Rewards, sources and environments").

How a run is built, outside in:

1. ``bubblewrap`` (``isolation="namespaces"``): new mount, pid, network, IPC, UTS and cgroup
   namespaces. The program sees a read-only bind of only what the interpreter needs (its binary, its
   standard library, its shared library, ``/usr/lib`` and ``/usr/lib64``), a fresh ``/proc`` and a
   minimal ``/dev``, and a private, size-capped tmpfs as ``/tmp``, which is its cwd and ``$HOME``.
   Nothing else of the host exists in there: not ``/root``, ``/home``, ``/work``, ``/etc``, the run
   directories or any key. The network namespace has only its own loopback, so a connect to the
   host's loopback fails. ``--new-session`` keeps it away from the controlling terminal and
   ``--die-with-parent`` ends it when the scoring process dies. The process tree dies with the pid
   namespace: a child that calls ``setsid()`` and outlives its parent is killed with the rest.
2. A small trusted launcher (``_LAUNCHER``, run as root inside the sandbox when we are root) reads
   the run's spec from its stdin, forks the program with its rlimits set (CPU seconds, address
   space, file size, no core files) and waits for it. Its exit status and CPU time come back on a
   pipe the program never holds, so a program cannot forge them, and as root it cannot signal the
   launcher either.
3. The process limit. ``RLIMIT_NPROC`` does nothing for root (the kernel exempts uid 0), and with
   a user namespace bwrap would map the sandbox's user to root again. So when we are root the
   sandbox gets no user namespace (the other namespaces are as above) and the launcher drops the
   program to a fresh uid from ``UID_RANGE`` (random per run, so concurrent runs do not share a
   count), no groups, then sets ``RLIMIT_NPROC``: a fork bomb gets ``max_processes`` processes
   and ``EAGAIN`` after that. When we are not root, bwrap makes a user namespace and
   ``RLIMIT_NPROC`` counts the processes of that namespace's user, which is this run alone.
4. The scorer reads stdout and stderr (their sum capped at ``output_bytes``) and enforces the wall
   clock; when any limit trips it kills the whole process group (``os.killpg``), which takes the
   pid namespace with it.

``isolation="rlimits"`` is for machines where namespaces are unavailable (``sandbox_problem`` says
why): the same launcher and rlimits, its own session, a private temp directory (mode 0700) as cwd
and ``$HOME``, an environment of four variables, and as root the same fresh uid, whose processes
are all killed (``kill -KILL -1`` as that uid) when the run ends, so a ``setsid()`` escape does not
survive. It is weaker isolation: the program sees the host's file system and network as that user
would. When the interpreter lives where other users cannot read it (pyenv under a 0700 ``/root``),
the program keeps ``CAP_DAC_READ_SEARCH`` so that it can start at all, which lets it *read* every
file of the host. As a non-root user, the program runs as that user: ``RLIMIT_NPROC`` is set to the
user's current process count plus ``max_processes`` (so it shares that budget with whatever else
the user starts meanwhile), a ``setsid()`` escape is not killed, and ``kill(-1)`` from the program
reaches every process of that user, the trainer's included. The caller warns at every start
when this mode is chosen.

A program reads private input on fd ``PRIVATE_FD`` (3, a memory file, empty unless the caller gives
some) and may write up to ``REPORT_CAP`` bytes on fd ``REPORT_FD`` (4), which come back as
``SandboxResult.report``: the code reward's HumanEval harness uses them for a per-run nonce.

The sandbox runs the interpreter this process runs on (``sys.base_prefix``, not the virtual
environment), with ``-I``: only the standard library is importable.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass

__all__ = [
    "BWRAP_INSTALL",
    "ISOLATIONS",
    "PRIVATE_FD",
    "REPORT_CAP",
    "REPORT_FD",
    "SANDBOX_REASONS",
    "UID_RANGE",
    "SandboxLimits",
    "SandboxResult",
    "interpreter_paths",
    "run_program",
    "sandbox_problem",
]

ISOLATIONS: tuple[str, ...] = ("namespaces", "rlimits")
SANDBOX_REASONS: tuple[str, ...] = (
    "ok",  # exited 0
    "exit_nonzero",  # exited with another code (an uncaught exception is 1)
    "timeout",  # ran past wall_s
    "cpu_limit",  # used cpu_s of CPU (SIGXCPU, or SIGKILL at the hard limit)
    "memory",  # a MemoryError under the address-space limit
    "output_limit",  # wrote more than output_bytes to stdout/stderr/the report fd, or a too-big file
    "killed",  # ended by another signal (its own os.kill included)
    "sandbox_error",  # the sandbox itself did not start or run: never the program's fault
)
BWRAP_INSTALL = "apt-get install bubblewrap"
PRIVATE_FD = 3
REPORT_FD = 4
REPORT_CAP = 4096
# The uids the program runs as when we are root: high, so that no real account has them, and random
# per run so that two concurrent runs do not share an RLIMIT_NPROC count.
UID_RANGE = range(0x7000_0000, 0x7100_0000)
_STDERR_TAIL = 4000
_DRAIN_S = 2.0  # after a kill or the launcher's report: how long pipes may take to close
_PROBE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class SandboxLimits:
    """What one program run may use.

    Attributes:
        cpu_s: CPU seconds per process (``RLIMIT_CPU``: SIGXCPU at cpu_s, SIGKILL one second later).
        wall_s: wall-clock seconds for the whole run, sandbox start-up included.
        memory_mb: address space per process (``RLIMIT_AS``); Python itself needs about 30 MB.
        max_processes: processes (and threads) the program may have at once, itself included.
        output_bytes: stdout + stderr (+ the report fd) bytes before the run is killed.
        tmp_mb: the size of the private /tmp (namespaces), and the largest file it may write.
    """

    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    max_processes: int = 16
    output_bytes: int = 1_000_000
    tmp_mb: int = 64

    def __post_init__(self) -> None:
        def bad(name: str, need: str) -> ValueError:
            return ValueError(f"sandbox limit {name} = {getattr(self, name)!r}: {need}")

        for name in ("cpu_s", "memory_mb", "max_processes", "output_bytes", "tmp_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(name, "set a positive integer")
        if not isinstance(self.wall_s, int | float) or not math.isfinite(self.wall_s) or self.wall_s <= 0:
            raise bad("wall_s", "set a positive number of seconds")
        if self.memory_mb < 64:
            raise bad("memory_mb", "the interpreter alone needs about 30 MB of address space; set >= 64")


@dataclass(frozen=True)
class SandboxResult:
    """How one run ended.

    Attributes:
        reason: one of ``SANDBOX_REASONS``.
        exit_code: the program's exit code, None when it was ended by a signal or never started.
        signal: the signal that ended the program, None otherwise.
        stdout: what it wrote on stdout (decoded as UTF-8, bad bytes replaced), at most
            ``output_bytes``.
        stderr_tail: the last 4,000 bytes of what it wrote on stderr (the sandbox's own messages
            when reason is "sandbox_error").
        report: what it wrote on fd ``REPORT_FD``, at most ``REPORT_CAP`` bytes.
        cpu_s: the program's CPU time (its own, not its children's), None when unknown.
        wall_s: seconds from start to the end of the run.
    """

    reason: str
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr_tail: str
    report: bytes
    cpu_s: float | None
    wall_s: float

    def __post_init__(self) -> None:
        if self.reason not in SANDBOX_REASONS:
            raise ValueError(f"unknown sandbox reason {self.reason!r}; expected one of {SANDBOX_REASONS}")


# The trusted launcher. It runs with `python -I -S -c`, reads the spec (JSON) from stdin, writes
# "started" then the program's status (JSON) on the status fd, which the program never holds.
_LAUNCHER = r"""
import fcntl, json, os, resource, signal, sys

def memfd(name, data):
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd

def move(fd, target):
    if fd != target:
        os.dup2(fd, target)
        os.close(fd)
    else:
        os.set_inheritable(fd, True)

def cap(limit, value):
    soft, hard = resource.getrlimit(limit)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(limit, (value, value))

def keep_read_search():
    # CAP_DAC_READ_SEARCH through setuid and exec (an ambient capability): the interpreter is where
    # the new uid could not read it otherwise.
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    bit = 1 << 2
    data = (ctypes.c_uint32 * 6)(bit, bit, bit, 0, 0, 0)
    if libc.capset(header, data) != 0 or libc.prctl(47, 2, 2, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "capset/PR_CAP_AMBIENT_RAISE CAP_DAC_READ_SEARCH")

def child(spec, status_fd, report_fd):
    move(memfd("stdin", spec["stdin"].encode()), 0)
    move(report_fd, 4)
    move(memfd("private", spec["private"].encode()), 3)
    os.closerange(5, status_fd)
    os.closerange(status_fd + 1, 1 << 20)
    cpu, mem, fsize = spec["cpu_s"], spec["memory_bytes"], spec["fsize_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    cap(resource.RLIMIT_AS, mem)
    cap(resource.RLIMIT_FSIZE, fsize)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NOFILE, 256)
    cap(resource.RLIMIT_NPROC, spec["nproc"])
    import ctypes
    libc = ctypes.CDLL(None)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: no setuid binary gives root back
    uid = spec["uid"]
    if uid is not None:
        if spec["read_search"]:
            libc.prctl(8, 1, 0, 0, 0)  # PR_SET_KEEPCAPS
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if spec["read_search"]:
            keep_read_search()
    os.chdir(spec["cwd"])
    os.execve(spec["python"], [spec["python"], "-I", "-B", "main.py"], spec["env"])

def kill_uid(uid):
    pid = os.fork()
    if pid == 0:
        try:
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)

def main():
    status_fd = fcntl.fcntl(int(sys.argv[1]), fcntl.F_DUPFD_CLOEXEC, 100)
    report_fd = fcntl.fcntl(int(sys.argv[2]), fcntl.F_DUPFD_CLOEXEC, 100)
    os.close(int(sys.argv[1]))
    os.close(int(sys.argv[2]))
    spec = json.loads(sys.stdin.buffer.read())
    with open(os.path.join(spec["cwd"], "main.py"), "w", encoding="utf-8") as f:
        f.write(spec["source"])
    os.write(status_fd, b"started\n")
    pid = os.fork()
    if pid == 0:
        try:
            child(spec, status_fd, report_fd)
        except BaseException as exc:
            os.write(status_fd, ("setup_error %r\n" % (exc,)).encode())
        os._exit(126)
    os.close(report_fd)
    _, status, usage = os.wait4(pid, 0)
    if spec["uid"] is not None:
        kill_uid(spec["uid"])
    result = {
        "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": usage.ru_utime + usage.ru_stime,
    }
    os.write(status_fd, (json.dumps(result) + "\n").encode())

main()
"""


def _python() -> str:
    """The base interpreter (not the virtual environment's link to it)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.lru_cache(maxsize=1)
def interpreter_paths() -> tuple[str, ...]:
    """The host paths the interpreter needs: its binary, its standard library (``lib-dynload``
    included), its shared library when it has one, and the system library directories."""
    paths = [_python()]
    # The base installation's scheme: in a virtual environment, platstdlib would be the venv's.
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    stdlib = sysconfig.get_paths(vars={**base, "installed_base": sys.base_prefix})
    for key in ("stdlib", "platstdlib"):
        paths.append(os.path.realpath(stdlib[key]))
    soname = sysconfig.get_config_var("INSTSONAME")
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and soname and libdir:
        shared = os.path.join(libdir, soname)
        if os.path.exists(shared):
            paths.append(os.path.realpath(shared))
    for system in ("/usr/lib", "/usr/lib64"):
        if os.path.isdir(system):
            paths.append(system)
    unique: list[str] = []
    for path in paths:  # drop a path inside another one (Debian's stdlib is under /usr/lib)
        if not any(path == other or path.startswith(other.rstrip("/") + "/") for other in unique):
            unique = [u for u in unique if not u.startswith(path.rstrip("/") + "/")] + [path]
    return tuple(unique)


def _bwrap_argv(bwrap: str, limits: SandboxLimits, root: bool) -> list[str]:
    argv = [bwrap]
    if root:
        # No user namespace: there the sandbox's user would be root again, which RLIMIT_NPROC exempts.
        argv += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-all"]
    argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
    binds = interpreter_paths()
    # bwrap creates a bind's missing parents with mode 0700, which the program's uid could not cross.
    parents: set[str] = set()
    for path in binds:
        parent = os.path.dirname(path)
        while parent != "/":
            parents.add(parent)
            parent = os.path.dirname(parent)
    for parent in sorted(parents, key=lambda p: p.count("/")):
        if not any(parent == b or parent.startswith(b + "/") for b in binds):
            argv += ["--perms", "0755", "--dir", parent]
    for path in binds:
        argv += ["--ro-bind", path, path]
    for link in ("/lib", "/lib64"):  # Debian's merged /usr: links to usr/lib and usr/lib64
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(limits.tmp_mb << 20), "--perms", "1777", "--tmpfs", "/tmp", "--chdir", "/tmp"]
    argv += ["--clearenv"]
    return argv


def _world_readable(path: str) -> bool:
    """Whether a user with no relation to the owners can reach and read ``path`` (mode bits only)."""
    parts = os.path.realpath(path).split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _tasks_of(uid: int) -> int:
    """How many tasks (threads included, as RLIMIT_NPROC counts them) ``uid`` has now."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue  # it ended meanwhile
    return count


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of ``uid`` (as that uid, so nothing else can be hit)."""
    kill = shutil.which("kill") or "/bin/kill"
    try:
        subprocess.run(
            [kill, "-KILL", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        pass


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _error(message: str, started: float) -> SandboxResult:
    return SandboxResult("sandbox_error", None, None, "", message[-_STDERR_TAIL:], b"", None, _since(started))


def _since(started: float) -> float:
    return time.monotonic() - started


def run_program(
    source: str,
    stdin: str = "",
    *,
    limits: SandboxLimits | None = None,
    isolation: str = "namespaces",
    private: str = "",
) -> SandboxResult:
    """Run the Python program ``source`` with ``stdin`` in the sandbox (see the module docstring).

    Args:
        source: the program, run as ``main.py`` in its private cwd.
        stdin: its standard input.
        limits: ``SandboxLimits()`` when None.
        isolation: "namespaces" (bubblewrap) or "rlimits" (weaker; see the module docstring).
        private: text the program can read once on fd ``PRIVATE_FD``.

    Never raises for anything the program does; a sandbox that cannot start gives "sandbox_error"
    (``sandbox_problem`` says why in advance).
    """
    limits = limits or SandboxLimits()
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown sandbox isolation {isolation!r}; set one of {', '.join(ISOLATIONS)}")
    started = time.monotonic()
    root = os.geteuid() == 0
    uid = UID_RANGE[secrets.randbelow(len(UID_RANGE))] if root else None
    spec: dict[str, object] = {
        "source": source,
        "stdin": stdin,
        "private": private,
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_mb << 20,
        "fsize_bytes": limits.tmp_mb << 20,
        "nproc": limits.max_processes,
        "uid": uid,
        "read_search": False,
        "python": _python(),
    }
    launcher = [_python(), "-I", "-S", "-c", _LAUNCHER]
    tmpdir: str | None = None
    try:
        if isolation == "namespaces":
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                return _error(_missing_bwrap(), started)
            argv = _bwrap_argv(bwrap, limits, root) + ["--", *launcher]
            cwd = "/tmp"
            env: dict[str, str] = {}
        else:
            tmpdir = tempfile.mkdtemp(prefix="stream-dapo-sandbox-")
            cwd = tmpdir
            argv = launcher
            env = {}
            if uid is not None:
                os.chown(tmpdir, uid, uid)
                spec["read_search"] = not all(_world_readable(p) for p in interpreter_paths())
            else:
                spec["nproc"] = _tasks_of(os.getuid()) + limits.max_processes
        spec["cwd"] = cwd
        spec["env"] = {"PATH": "/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
        return _supervise(argv, env, tmpdir, json.dumps(spec).encode(), limits, started)
    finally:
        if tmpdir is not None:
            if uid is not None:
                _kill_uid(uid)  # the launcher does it too, unless it was killed with the group
            shutil.rmtree(tmpdir, ignore_errors=True)


def _supervise(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    spec: bytes,
    limits: SandboxLimits,
    started: float,
) -> SandboxResult:
    """Start the sandbox, feed it the spec, read its output under the limits, and classify the end."""
    status_r, status_w = os.pipe()
    report_r, report_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [*argv, str(status_w), str(report_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(status_w, report_w),
            start_new_session=True,
            env=env,
            cwd=cwd,
        )
    except OSError as exc:
        os.close(status_r)
        os.close(report_r)
        return _error(f"could not start the sandbox: {exc}", started)
    finally:
        os.close(status_w)
        os.close(report_w)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    streams = {
        proc.stdin.fileno(): "spec",
        proc.stdout.fileno(): "stdout",
        proc.stderr.fileno(): "stderr",
        report_r: "report",
        status_r: "status",
    }
    got: dict[str, bytearray] = {name: bytearray() for name in streams.values()}
    total_output = 0
    killed_for: str | None = None
    settle_by: float | None = None  # when the pipes must have closed (after a kill or the report)
    deadline = started + limits.wall_s
    sel = selectors.DefaultSelector()
    try:
        for fd, name in streams.items():
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_WRITE if name == "spec" else selectors.EVENT_READ, name)
        pending = memoryview(spec)
        while sel.get_map():
            now = time.monotonic()
            if killed_for is None and now >= deadline:
                killed_for = "timeout"
            if killed_for is not None and settle_by is None:
                _killpg(proc.pid)
                settle_by = now + _DRAIN_S
            if settle_by is not None and now >= settle_by:
                break  # something outside the group still holds a pipe (rlimits mode, not root)
            wait_until = settle_by if settle_by is not None else deadline
            for key, _ in sel.select(max(0.0, wait_until - now)):
                fd, name = key.fd, key.data
                if name == "spec":
                    try:
                        pending = pending[os.write(fd, pending) :]
                    except (BrokenPipeError, BlockingIOError) as exc:
                        if isinstance(exc, BlockingIOError):
                            continue
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        proc.stdin.close()
                    continue
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    if name == "status" and settle_by is None:
                        settle_by = time.monotonic() + _DRAIN_S
                    continue
                if name == "status":
                    got[name] += chunk
                    continue
                total_output += len(chunk)
                if name == "stdout":
                    got[name] += chunk[: max(0, limits.output_bytes - len(got[name]))]
                elif name == "stderr":
                    got[name] = (got[name] + chunk)[-_STDERR_TAIL:]
                else:
                    got[name] += chunk[: max(0, REPORT_CAP - len(got[name]))]
                if total_output > limits.output_bytes and killed_for is None:
                    killed_for = "output_limit"
    finally:
        sel.close()
        _killpg(proc.pid)  # before the wait: the unreaped leader keeps the group id from being reused
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        os.close(status_r)
        os.close(report_r)
        proc.wait()
    return _classify(got, killed_for, limits, started)


def _classify(
    got: dict[str, bytearray], killed_for: str | None, limits: SandboxLimits, started: float
) -> SandboxResult:
    stdout = bytes(got["stdout"]).decode("utf-8", "replace")
    stderr = bytes(got["stderr"]).decode("utf-8", "replace")
    lines = bytes(got["status"]).decode("utf-8", "replace").splitlines()
    final: dict[str, object] | None = None
    for line in lines:
        if line.startswith("setup_error"):
            return _error(f"the sandbox launcher failed: {line}\n{stderr}", started)
        if line.startswith("{"):
            final = json.loads(line)
    exit_code = final.get("exit") if final else None
    sig = final.get("signal") if final else None
    cpu_s = final.get("cpu_s") if final else None

    def result(reason: str) -> SandboxResult:
        return SandboxResult(
            reason,
            exit_code if isinstance(exit_code, int) else None,
            sig if isinstance(sig, int) else None,
            stdout,
            stderr,
            bytes(got["report"]),
            float(cpu_s) if isinstance(cpu_s, int | float) else None,
            _since(started),
        )

    if killed_for is not None:
        return result(killed_for)
    if final is None:
        if "started" in lines:
            return result("killed")  # the launcher was killed (rlimits mode as the same user)
        return _error(f"the sandbox did not start: {stderr.strip() or 'no message'}", started)
    if sig is not None:
        hit_cpu = isinstance(cpu_s, int | float) and cpu_s >= limits.cpu_s - 0.05
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and hit_cpu):
            return result("cpu_limit")
        if sig == signal.SIGXFSZ:
            return result("output_limit")
        return result("killed")
    if exit_code == 0:
        return result("ok")
    if "MemoryError" in stderr[-300:]:
        return result("memory")
    return result("exit_nonzero")


def _missing_bwrap() -> str:
    return (
        "the code sandbox's isolation = 'namespaces' needs bubblewrap (bwrap), which is not on PATH: "
        f"install Debian's bubblewrap ({BWRAP_INSTALL}) or set isolation = 'rlimits' to accept weaker "
        "isolation (no namespaces: the program sees the host's files and network)"
    )


@functools.lru_cache(maxsize=8)
def _probe(isolation: str, bwrap: str | None) -> str | None:
    del bwrap  # part of the cache key: a PATH that changes finds another binary
    limits = SandboxLimits(wall_s=_PROBE_TIMEOUT_S)
    probe = "import sys; sys.stdout.write(sys.stdin.read())"
    outcome = run_program(probe, "probe", limits=limits, isolation=isolation)
    if outcome.reason == "ok" and outcome.stdout == "probe":
        return None
    detail = outcome.stderr_tail.strip() or f"reason {outcome.reason}, stdout {outcome.stdout!r}"
    if isolation == "namespaces":
        return (
            f"the code sandbox (bubblewrap) cannot run a program here: {detail}. Allow namespaces "
            "(unprivileged user namespaces: sysctl kernel.unprivileged_userns_clone=1; in a container, a "
            "seccomp/AppArmor profile that permits unshare and mount) or set isolation = 'rlimits' to "
            "accept weaker isolation"
        )
    return f"the code sandbox cannot run a program even with isolation = 'rlimits': {detail}"


def sandbox_problem(isolation: str) -> str | None:
    """What stops ``isolation`` from working here, as a message naming the fix; None if nothing does.

    Runs one probe program the first time (cached per isolation and bwrap binary).
    """
    if isolation not in ISOLATIONS:
        return (
            f"unknown code sandbox isolation {isolation!r}; set isolation to one of {', '.join(ISOLATIONS)}"
        )
    if not sys.platform.startswith("linux"):
        return f"the code sandbox needs Linux (rlimits, memfd, namespaces); this is {sys.platform}"
    bwrap = shutil.which("bwrap")
    if isolation == "namespaces" and bwrap is None:
        return _missing_bwrap()
    return _probe(isolation, bwrap)
