"""A newcomer's checkout on a busy machine: `make run` once, then `make test` several times in a row,
in a fresh clone, with a load running beside it; a tally of what failed in which run.

    python -m bench.busy_suite [--commit HEAD] [--runs 3] [--busy-cmd 'CMD ...'] [--skip-run]
        [--make-test-args 'tests/integration/test_curve.py'] [--out runs/busy-suite]

The commit (default HEAD of this checkout) is cloned into a temporary directory, so nothing of this
checkout (its .venv, runs/, untracked files) helps the suite. `--busy-cmd` is the load, run for the
whole session and stopped at the end; by default a small built-in one (`--load`): it churns
ephemeral ports on 127.0.0.1 (bind port 0, listen, connect, accept, close, in a loop), so a test
that closes a "free" port and binds it later can lose it, and burns part of one core, so a test
that bounds a wait by wall-clock time can run out of it. `--no-busy` runs without a load.

A test that fails in some runs and not in others is flaky (its outcome depends on scheduling); one
that fails in every run is broken. The whole loop takes over an hour on two cores; a short check
passes `--skip-run` and a few test files in `--make-test-args` (make's PYTEST_ARGS). `--venv` lets
make use an installed virtual environment instead of building one in the clone (quicker, and no
longer what a newcomer sees): make is told the install is done, and is not asked to redo it.

Each make's output goes to OUT/run.log and OUT/test-N.log, the tally to OUT/tally.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STAMP = ".stream-dapo-installed"
"""The Makefile's install stamp in a virtual environment (`make install` writes it)."""

OUTCOMES = ("failed", "passed", "skipped", "xfailed", "xpassed", "error", "deselected", "warnings")
_SUMMARY = re.compile(r"^=*\s*(?P<counts>(?:\d+ [a-z]+(?:, )?)+) in (?P<secs>[\d.]+)s")
_COUNT = re.compile(r"(\d+) ([a-z]+)")
_NO_TESTS = re.compile(r"^=*\s*no tests ran in (?P<secs>[\d.]+)s")
_FAILED_ID = re.compile(r"^(?:FAILED|ERROR) (?P<id>.+?)(?: - .*)?$")
"""A short-summary line: FAILED tests/x.py::test_y[a b] - AssertionError: ... (the id may hold spaces)."""


# --------------------------------------------------------------------------------------------------
# The load
# --------------------------------------------------------------------------------------------------


def load(seconds: float, ports: int, cpu: float) -> None:
    """The built-in load: for `seconds`, churn `ports` loopback connections per slice of 100 ms
    (each a listening socket on port 0, a client connected to it, the accepted socket; all closed)
    and spin for `cpu` of each slice."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        for _ in range(ports):
            with socket.socket() as server:
                server.bind(("127.0.0.1", 0))
                server.listen(1)
                with socket.create_connection(server.getsockname(), timeout=1.0) as client:
                    peer, _ = server.accept()
                    client.sendall(b"x")
                    peer.close()
        while time.monotonic() - t0 < 0.1 * cpu:
            random.random()
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t0)))


def builtin_busy_cmd() -> list[str]:
    """This file, run as a script with `--load`: it needs nothing but the standard library."""
    return [sys.executable, str(Path(__file__).resolve()), "--load"]


# --------------------------------------------------------------------------------------------------
# Reading pytest's output
# --------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one `make test` reported: pytest's summary counts, the ids of failed and erroring
    tests (its short summary, on by default), and pytest's own time (None: no summary line, e.g.
    make failed before pytest ran or pytest was killed)."""

    counts: dict[str, int] = field(default_factory=dict)
    failed_ids: list[str] = field(default_factory=list)
    pytest_seconds: float | None = None

    @property
    def failures(self) -> int:
        return self.counts.get("failed", 0) + self.counts.get("error", 0)


def parse_pytest_output(text: str) -> Outcome:
    """The last summary line ("2 failed, 10 passed, 1 skipped in 12.34s", with or without its
    ===== frame; "errors" counted as "error") and every FAILED/ERROR line of the short summary."""
    out = Outcome()
    for line in text.splitlines():
        line = line.strip()
        found = _FAILED_ID.match(line)
        if found and found["id"] not in out.failed_ids:
            out.failed_ids.append(found["id"])
            continue
        summary = _SUMMARY.match(line)
        if summary:
            counts: dict[str, int] = {}
            for n, word in _COUNT.findall(summary["counts"]):
                word = {"errors": "error", "warning": "warnings"}.get(word, word)
                counts[word] = counts.get(word, 0) + int(n)
            out.counts, out.pytest_seconds = counts, float(summary["secs"])
        elif empty := _NO_TESTS.match(line):
            out.counts, out.pytest_seconds = {}, float(empty["secs"])
    return out


@dataclass
class Run:
    """One `make test` of the session."""

    index: int
    returncode: int
    seconds: float
    outcome: Outcome
    log: str


def tally(runs: Sequence[Run]) -> dict:
    """Per run: exit code, failures, failing ids, time; over the runs: each failing id with how many
    runs it failed in, split into flaky (some runs) and broken (every run)."""
    failing = Counter(test_id for run in runs for test_id in run.outcome.failed_ids)
    return {
        "runs": len(runs),
        "runs_failed": sum(run.returncode != 0 for run in runs),
        "per_run": [
            {
                "run": run.index,
                "returncode": run.returncode,
                "seconds": round(run.seconds, 1),
                "pytest_seconds": run.outcome.pytest_seconds,
                "counts": run.outcome.counts,
                "failures": run.outcome.failures,
                "failed_ids": run.outcome.failed_ids,
                "log": run.log,
            }
            for run in runs
        ],
        "failing_ids": dict(sorted(failing.items(), key=lambda kv: (-kv[1], kv[0]))),
        "flaky_ids": sorted(test_id for test_id, n in failing.items() if n < len(runs)),
        "broken_ids": sorted(test_id for test_id, n in failing.items() if n == len(runs)),
    }


def render(t: dict) -> str:
    lines = [f"{'run':>3}  {'exit':>4}  {'failures':>8}  {'time':>9}  counts"]
    for row in t["per_run"]:
        counts = ", ".join(f"{n} {word}" for word, n in row["counts"].items()) or "(no pytest summary)"
        lines.append(
            f"{row['run']:>3}  {row['returncode']:>4}  {row['failures']:>8}  {row['seconds']:>8.1f}s  {counts}"
        )
        lines.extend(f"       {test_id}" for test_id in row["failed_ids"])
    lines.append(f"{t['runs']} runs, {t['runs_failed']} failed")
    for test_id, n in t["failing_ids"].items():
        kind = "broken" if n == t["runs"] else "flaky"
        lines.append(f"  {n}/{t['runs']} {kind:6s} {test_id}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# The session
# --------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.busy_suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repo", type=Path, default=REPO, help="the repository to clone (default: this one)")
    parser.add_argument("--commit", default="HEAD", help="what to check out in the clone (default: HEAD)")
    parser.add_argument("--runs", type=int, default=3, help="`make test` runs in a row (default: 3)")
    busy = parser.add_mutually_exclusive_group()
    busy.add_argument(
        "--busy-cmd",
        type=shlex.split,
        default=None,
        help="the load to run beside the suite, one shell-quoted command (default: the built-in --load)",
    )
    busy.add_argument("--no-busy", action="store_true", help="run without a load")
    parser.add_argument("--skip-run", action="store_true", help="leave out the `make run` before the tests")
    parser.add_argument(
        "--make-test-args", default="", help="passed to `make test` as PYTEST_ARGS (pytest's arguments)"
    )
    parser.add_argument(
        "--venv",
        type=Path,
        default=None,
        help="an installed virtual environment for make (VENV=) instead of one built in the clone",
    )
    parser.add_argument("--make", default="make", help="the make program (default: make)")
    parser.add_argument(
        "--make-arg",
        action="append",
        default=[],
        help="one more argument for every make (repeatable), e.g. --make-arg=-o --make-arg=ops-tools",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/busy-suite"), help="logs and tally.json")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    # The built-in load, when this file runs as the load.
    parser.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load-seconds", type=float, default=6 * 3600, help=argparse.SUPPRESS)
    parser.add_argument("--load-ports", type=int, default=32, help=argparse.SUPPRESS)
    parser.add_argument("--load-cpu", type=float, default=0.3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if not 0.0 <= args.load_cpu <= 1.0:
        parser.error(f"--load-cpu is a share of one core, 0..1, got {args.load_cpu}")
    if args.busy_cmd == []:
        parser.error("--busy-cmd is empty: give a command, or --no-busy")
    if not args.no_busy and args.busy_cmd is None:
        args.busy_cmd = builtin_busy_cmd()
    return args


def make_argv(args: argparse.Namespace, target: str) -> list[str]:
    """`make TARGET` as the session runs it: with --venv, make uses that environment and takes its
    install as done (-o: the stamp is not remade, whatever the clone's pyproject.toml's date)."""
    argv = [args.make, target, *args.make_arg]
    if args.venv is not None:
        venv = args.venv.resolve()
        argv += [f"VENV={venv}", "-o", str(venv / STAMP)]
    if target == "test":
        argv.append(f"PYTEST_ARGS={args.make_test_args}")
    return argv


def clone(repo: Path, commit: str, into: Path) -> str:
    """Clone `repo` into `into` and check out `commit` (resolved in `repo` first); its full id."""
    sha = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run(["git", "clone", "--quiet", "--no-checkout", str(repo), str(into)], check=True)
    if subprocess.run(["git", "-C", str(into), "cat-file", "-e", sha], capture_output=True).returncode:
        subprocess.run(["git", "-C", str(into), "fetch", "--quiet", "origin", sha], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "--quiet", "--detach", sha], check=True)
    return sha


def run_make(argv: list[str], cwd: Path, log: Path) -> tuple[int, float]:
    """Run make in `cwd`, its output to `log` and echoed line by line; (exit code, seconds)."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    t0 = time.monotonic()
    with open(log, "w") as sink:
        sink.write(f"$ {shlex.join(argv)}\n")
        sink.flush()
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            sys.stdout.write(line)
        code = proc.wait()
    return code, time.monotonic() - t0


def start_busy(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The load, in its own session so that `stop_busy` reaches whatever it starts."""
    with open(log, "wb") as sink:
        return subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def stop_busy(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def session(args: argparse.Namespace) -> dict:
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="busy-suite-"))
    checkout = work / "clone"
    busy: subprocess.Popen[bytes] | None = None
    runs: list[Run] = []
    try:
        sha = clone(args.repo.resolve(), args.commit, checkout)
        print(
            f"busy-suite: {sha[:12]} in {checkout}; load: {shlex.join(args.busy_cmd) if args.busy_cmd else 'none'}"
        )
        if args.busy_cmd:
            busy = start_busy(args.busy_cmd, out / "busy.log")
        make_run: dict | None = None
        if not args.skip_run:
            code, secs = run_make(make_argv(args, "run"), checkout, out / "run.log")
            make_run = {"returncode": code, "seconds": round(secs, 1), "log": str(out / "run.log")}
            print(f"busy-suite: make run exited {code} after {secs:.0f} s")
        for i in range(1, args.runs + 1):
            log = out / f"test-{i}.log"
            code, secs = run_make(make_argv(args, "test"), checkout, log)
            runs.append(Run(i, code, secs, parse_pytest_output(log.read_text(errors="replace")), str(log)))
            print(f"busy-suite: make test {i}/{args.runs} exited {code} after {secs:.0f} s")
        if busy is not None and busy.poll() is not None:
            print(f"busy-suite: warning: the load exited early ({busy.returncode}); see {out / 'busy.log'}")
    finally:
        if busy is not None:
            stop_busy(busy)
        if args.keep:
            print(f"busy-suite: clone kept at {checkout}")
        else:
            subprocess.run(["rm", "-rf", str(work)], check=False)
    result = {
        "commit": sha,
        "busy_cmd": args.busy_cmd,
        "make_test_args": args.make_test_args,
        "make_run": make_run,
        **tally(runs),
        "per_run_outcomes": [asdict(run.outcome) for run in runs],
    }
    (out / "tally.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.load:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        load(args.load_seconds, args.load_ports, args.load_cpu)
        return 0
    result = session(args)
    print(render(result))
    print(f"busy-suite: tally in {args.out.resolve() / 'tally.json'}")
    return 0 if result["runs_failed"] == 0 and (result["make_run"] or {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
