"""`stream-dapo run`: buffer, learner and N generators on one machine, from one config.

The launcher is a supervisor, not a trainer: it prepares the run directory and the model, starts
each service as a child process (the same commands systemd or Kubernetes would run), shows a live
view scraped from their /metrics endpoints, and, when the learner finishes, stops the rest and
writes `summary.json` and the run's `report.md` with its plots (`stream_dapo.tools.report`). Every child
runs in its own session so that a stop (or Ctrl-C) takes its whole process tree — vLLM's engine processes included — with it: no orphans.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from stream_dapo.config import Config, config_to_toml
from stream_dapo.runtime.metrics import (
    FINAL_METRICS_DIR,
    BufferMetrics,
    GeneratorMetrics,
    LearnerMetrics,
    catalogue,
    final_metrics_path,
    sample_name,
)
from stream_dapo.runtime.ports import ServiceExited, read_bound_ports, wait_bound_ports
from stream_dapo.tools.prometheus import histogram_quantile, metric_sum, scrape

log = logging.getLogger("stream_dapo.tools.launch")

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "recipes" / "tiny-cpu.toml"
"""The embedded default recipe (package data; configs/tiny-cpu.toml links to it)."""


# --------------------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------------------


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


@dataclass
class StopOutcome:
    """How a child ended when the launcher stopped it (summary.json's ``service_stops``)."""

    exit_code: int | None
    killed: bool
    """It outlived its bound after SIGTERM and got SIGKILL: it wrote none of its shutdown files."""


@dataclass
class Supervisor:
    """Starts children in their own sessions and stops their whole process groups."""

    run_dir: Path
    children: list[Child] = field(default_factory=list)
    stops: dict[str, StopOutcome] = field(default_factory=dict)
    """How each child stopped, by name, in the order `stop_all` stopped them."""

    def start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> Child:
        """`pass_fds`: listening sockets the child inherits (`stream_dapo/runtime/ports.py`)."""
        log_path = self.run_dir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_file = open(log_path, "ab")  # noqa: SIM115 (closed in stop_all)
        popen = subprocess.Popen(
            list(argv),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
        child = Child(name, popen, log_path, log_file)
        self.children.append(child)
        log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if c.popen.poll() is not None]

    def stop(self, child: Child, timeout_s: float) -> StopOutcome:
        """SIGTERM the child (the service drains), then SIGKILL its whole process group: systemd's
        KillMode=mixed. Only the service itself gets SIGTERM, so that the processes it owns (vLLM's
        engine) keep working while it drains; whatever is left of the group after it exits, or after
        timeout_s, is killed. A child that was killed, or exited other than 0, is logged with its
        log's last lines: its final metrics may be missing from the summary."""
        already = child.popen.poll() is not None
        outcome = stop_process_group(child.popen, child.name, timeout_s)
        child.log_file.close()
        self.stops[child.name] = outcome
        if not already and not outcome.killed and outcome.exit_code != 0:
            log.warning(
                "%s exited with code %s while stopping; its final metrics may be missing. Last lines of "
                "%s:\n%s",
                child.name,
                outcome.exit_code,
                child.log_path,
                tail(child.log_path),
            )
        return outcome

    def stop_all(self, timeout_s: float | Mapping[str, float] = 30.0) -> None:
        """Stop every child in drain order, each waited for before the next gets SIGTERM: generators
        first (they stop taking credits), then the learner (its final commit needs the buffer), the
        buffer last (it persists). ``timeout_s``: one bound, or one per service (`stop_timeouts`)."""
        order = {"generator": 0, "learner": 1, "buffer": 2}
        for child in sorted(self.children, key=lambda c: order.get(c.name.split("-")[0], 0)):
            service = child.name.split("-")[0]
            bound = timeout_s if isinstance(timeout_s, (int, float)) else timeout_s.get(service, 30.0)
            self.stop(child, bound)


def stop_timeouts(cfg: Config) -> dict[str, float]:
    """How long each service may drain after SIGTERM before it is killed: a generator finishes its
    groups in flight and waits for their acks (each bounded by transport.timeout_s), the learner its
    step, checkpoint and commit (run.learner_stop_timeout_s), the buffer persists; each then waits up
    to metrics.final_scrape_wait_s for Prometheus."""
    scrape = cfg.metrics.final_scrape_wait_s
    return {
        "generator": 2 * cfg.transport.timeout_s + _ENGINE_SHUTDOWN_S + scrape,
        "learner": cfg.run.learner_stop_timeout_s + scrape,
        "buffer": _BUFFER_STOP_S + scrape,
    }


_ENGINE_SHUTDOWN_S = 30.0  # vLLM's processes and the verifier pool
_BUFFER_STOP_S = 60.0  # close the sockets, persist the state, write the final figures


def stop_process_group(popen: subprocess.Popen[Any], name: str, timeout_s: float) -> StopOutcome:
    """SIGTERM the leader of a child started in its own session, wait up to `timeout_s` for it, then
    SIGKILL whatever is left of its process group (see `Supervisor.stop`)."""
    killed = False
    if popen.poll() is None:
        try:
            popen.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            killed = True
            log.warning(
                "%s did not stop within %.0f s of SIGTERM (its drain bound): killing it; what it "
                "writes at shutdown (its final metrics) is missing",
                name,
                timeout_s,
            )
    # Whatever the leader did, nothing of its group may outlive the run.
    _signal_group(popen.pid, signal.SIGKILL)
    popen.wait()
    return StopOutcome(popen.returncode, killed)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Endpoints:
    buffer: str
    learner: str
    generators: list[str]

    @classmethod
    def from_ports(cls, cfg: Config, ports: Mapping[str, Mapping[str, int]]) -> Endpoints:
        """The /metrics URLs of the ports the services reported (`stream_dapo/runtime/ports.py`), by service
        name ("buffer", "learner", "generator-<i>"); a service not (yet) reported gets ""."""
        base = f"http://{cfg.metrics.host}:"

        def url(service: str, setting: str) -> str:
            port = ports.get(service, {}).get(setting)
            return f"{base}{port}/metrics" if port else ""

        return cls(
            buffer=url("buffer", "metrics.buffer_port"),
            learner=url("learner", "metrics.learner_port"),
            generators=[
                url(f"generator-{i}", "metrics.generator_port") for i in range(cfg.generator.num_generators)
            ],
        )

    def snapshot(self) -> dict[str, dict[str, float]]:
        snap = {"buffer": _scrape(self.buffer), "learner": _scrape(self.learner)}
        for i, url in enumerate(self.generators):
            snap[f"generator-{i}"] = _scrape(url)
        return snap


def _scrape(url: str) -> dict[str, float]:
    return scrape(url) if url else {}


def generator_totals(snap: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    gens = [v for k, v in snap.items() if k.startswith("generator")]
    gm = catalogue(GeneratorMetrics)
    groups = sample_name(gm.groups)
    return {
        "samples": sum(metric_sum(g, sample_name(gm.samples)) for g in gens),
        "tokens": sum(metric_sum(g, sample_name(gm.tokens)) for g in gens),
        "groups_kept": sum(metric_sum(g, groups, outcome="mixed") for g in gens),
        "groups_all_correct": sum(metric_sum(g, groups, outcome="all_correct") for g in gens),
        "groups_all_wrong": sum(metric_sum(g, groups, outcome="all_wrong") for g in gens),
        "weight_updates": sum(metric_sum(g, sample_name(gm.weight_sync_seconds, "_count")) for g in gens),
        "weight_sync_seconds": sum(metric_sum(g, sample_name(gm.weight_sync_seconds, "_sum")) for g in gens),
        "policy_version_min": min((metric_sum(g, sample_name(gm.policy_version)) for g in gens), default=0.0),
    }


def source_totals(
    snap: Mapping[str, Mapping[str, float]], names: Sequence[str]
) -> dict[str, dict[str, float]]:
    """Per data source, the generators' cumulative counts: samples, correct ones, the score's sum,
    groups finished and kept, truncated samples, reward failures and response tokens (what
    metrics.jsonl's ``sources`` holds; the run report plots their per-step ratios)."""
    gens = [v for k, v in snap.items() if k.startswith("generator")]
    gm = catalogue(GeneratorMetrics)
    names_of = {
        "samples": sample_name(gm.source_samples),
        "correct": sample_name(gm.source_correct),
        "score_sum": sample_name(gm.source_score, "_sum"),
        "groups": sample_name(gm.source_groups),
        "truncated": sample_name(gm.source_truncated),
        "reward_failures": sample_name(gm.reward_failures),
        "response_tokens": sample_name(gm.source_response_length, "_sum"),
    }
    out: dict[str, dict[str, float]] = {}
    for name in names:
        figures = {
            key: sum(metric_sum(g, metric, source=name) for g in gens) for key, metric in names_of.items()
        }
        figures["groups_kept"] = sum(
            metric_sum(g, names_of["groups"], source=name, outcome="mixed") for g in gens
        )
        out[name] = {key: round(value, 4) for key, value in figures.items()}
    return out


STARVING_FILTERED_FRAC = 0.9
"""Dynamic sampling that drops this share of groups leaves the learner next to nothing to train on."""


def starvation_warning(row: Mapping[str, Any], cfg: Config) -> str | None:
    """The warning to log when dynamic sampling starves the learner, naming the likely cause and
    the fixes; None while it does not (or before 4 rollout batches of groups have finished)."""
    wrong, right, kept = row["groups_all_wrong"], row["groups_all_correct"], row["groups_kept"]
    finished = wrong + right + kept
    if finished < 4 * cfg.learner.rollout_batch_prompts or row["filtered_frac"] < STARVING_FILTERED_FRAC:
        return None
    head = (
        f"dynamic sampling drops {row['filtered_frac']:.0%} of groups ({wrong} all wrong, {right} all "
        f"correct, {kept} kept of {finished}): the learner gets a rollout batch only every "
        f"~{finished / max(kept, 1) * cfg.learner.rollout_batch_prompts:.0f} groups"
    )
    if wrong >= right:
        return (
            f"{head}. The policy is almost never right on these prompts. Fixes: easier training data, a "
            "supervised warm-up on worked solutions ([sft]), a lower generator.temperature, a larger "
            "algo.group_size, a longer algo.max_response_len if responses are truncated; check that "
            "the verifier extracts the answer format the prompts ask for (`stream-dapo verify`)"
        )
    return (
        f"{head}. The policy is almost always right on these prompts: use harder data, or stop (it "
        "has learned this set)"
    )


def format_duration(seconds: float | None) -> str:
    """3725 -> '1h02m05s', 125 -> '2m05s', 7 -> '7s', None -> '?'."""
    if seconds is None:
        return "?"
    total = max(0, round(seconds))
    h, rest = divmod(total, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{sec:02d}s"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def format_status(row: Mapping[str, Any], total_steps: int) -> str:
    """The live view's status line from one metrics.jsonl row of the launcher."""
    step = row["step"]
    pct = 100 * step / total_steps if total_steps else 0.0
    stale = row["staleness_p95"]
    tok_s = row.get("generator_tokens_per_s")
    return (
        f"step {step}/{total_steps} ({pct:.0f}%) gen-v {row['version_generators']} | "
        f"{row['samples_per_s']:.1f} samples/s {tok_s if tok_s is not None else 0:.0f} tok/s | "
        f"reward {row['reward']:+.3f} acc {row['accuracy']:.3f} | "
        f"stale-p95 {'-' if stale is None else f'{stale:g}'} filtered {row['filtered_frac']:.0%} "
        f"buffer {row['buffer_waiting']} | {format_duration(row['t'])} elapsed, ETA {format_duration(row['eta_s'])}"
        + _sources_status(row.get("sources"))
    )


def _sources_status(sources: Mapping[str, Mapping[str, float]] | None) -> str:
    """ " | words acc 0.41 score +0.18, concise ...": each source's accuracy and mean score so far."""
    if not sources:
        return ""
    parts = []
    for name, figures in sources.items():
        n = figures.get("samples", 0.0)
        if n:
            parts.append(f"{name} acc {figures['correct'] / n:.2f} score {figures['score_sum'] / n:+.2f}")
        else:
            parts.append(f"{name} -")
    return " | " + ", ".join(parts)


def rewrites_in_place(stream: IO[str]) -> bool:
    """A terminal gets one status line rewritten in place; logs and pipes get a line per update."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False
    return tty and os.environ.get("TERM", "") != "dumb"


def status_text(line: str, in_place: bool, width: int) -> str:
    """What to write for one update: in place, return to the line start, clear it and cut the line to
    the terminal's width (a wrapped line cannot be rewritten); otherwise the line and a newline."""
    if not in_place:
        return line + "\n"
    if len(line) > width - 1:
        line = line[: max(width - 2, 0)] + "…"
    return "\r\x1b[2K" + line


class LiveView:
    """A status line every few seconds, and the same figures appended to metrics.jsonl.

    On a terminal the one line is rewritten in place (`rewrites_in_place`); to a log or a pipe
    each update is a line of its own."""

    def __init__(
        self, cfg: Config, endpoints: Endpoints, run_dir: Path, quiet: bool, stream: IO[str] | None = None
    ) -> None:
        self.cfg = cfg
        self.endpoints = endpoints
        self.path = run_dir / "metrics.jsonl"
        self.quiet = quiet
        self.stream = stream if stream is not None else sys.stdout
        self.in_place = rewrites_in_place(self.stream)
        self._drawn = False
        self.t0 = time.monotonic()
        self.last: dict[str, dict[str, float]] = {}
        self._prev: tuple[float, dict[str, float]] | None = None
        self._warned_starving = False

    def update(self) -> dict[str, Any]:
        snap = self.endpoints.snapshot()
        if any(snap.values()):
            self.last = {k: v or self.last.get(k, {}) for k, v in snap.items()}
        row = self.record(self.last)
        warning = None if self._warned_starving else starvation_warning(row, self.cfg)
        if warning is not None:
            log.warning("%s", warning)
            self._warned_starving = True
        if not self.quiet:
            self.show(format_status(row, self.cfg.learner.total_steps))
        return row

    def record(self, snap: Mapping[str, Mapping[str, float]], step: int | None = None) -> dict[str, Any]:
        """Append the row of `snap` to metrics.jsonl. At the end: the services' final metrics with
        the learner's last version (`step`; the learner may have taken its last steps between two
        scrapes), so that the run's last steps have a row."""
        row = self.row(snap, time.monotonic() - self.t0, step)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return row

    def row(
        self, snap: Mapping[str, Mapping[str, float]], elapsed: float, step: int | None = None
    ) -> dict[str, Any]:
        """One metrics.jsonl row from a scrape; rates are over the time since the previous row.
        `step` overrides the learner step the scrape shows."""
        gen = generator_totals(snap)
        lrn, buf = snap.get("learner", {}), snap.get("buffer", {})
        lm, bm = catalogue(LearnerMetrics), catalogue(BufferMetrics)
        if step is None:
            step = int(metric_sum(lrn, sample_name(lm.step)))
        finished = gen["groups_kept"] + gen["groups_all_correct"] + gen["groups_all_wrong"]
        prev_t, prev = self._prev if self._prev is not None else (0.0, dict.fromkeys(gen, 0.0))
        dt = elapsed - prev_t
        updates = gen["weight_updates"] - prev["weight_updates"]
        row = {
            "t": round(elapsed, 1),
            "step": int(step),
            "version_generators": int(gen["policy_version_min"]),
            "samples_per_s": round(gen["samples"] / elapsed, 2) if elapsed > 0 else 0.0,
            "generator_tokens": int(gen["tokens"]),
            "generator_tokens_per_s": round((gen["tokens"] - prev["tokens"]) / dt, 1) if dt > 0 else 0.0,
            "reward": round(metric_sum(lrn, sample_name(lm.reward)), 3),
            "accuracy": round(metric_sum(lrn, sample_name(lm.accuracy)), 3),
            "staleness_p95": histogram_quantile(lrn, sample_name(lm.staleness), 0.95),
            "filtered_frac": round(1 - gen["groups_kept"] / finished, 3) if finished else 0.0,
            "groups_kept": int(gen["groups_kept"]),
            "groups_all_correct": int(gen["groups_all_correct"]),
            "groups_all_wrong": int(gen["groups_all_wrong"]),
            "generator_weight_sync_seconds": (
                round((gen["weight_sync_seconds"] - prev["weight_sync_seconds"]) / updates, 4)
                if updates > 0
                else None
            ),
            "generator_weight_loads": int(gen["weight_updates"]),
            "generator_weight_load_seconds_total": round(gen["weight_sync_seconds"], 4),
            "buffer_waiting": int(metric_sum(buf, sample_name(bm.depth), state="waiting")),
            "dropped_stale": int(metric_sum(buf, sample_name(bm.dropped_stale))),
        }
        if self.cfg.data.sources:
            row["sources"] = source_totals(snap, [s.name for s in self.cfg.data.sources])
        total = self.cfg.learner.total_steps
        eta = (elapsed / step * (total - step)) if step > 0 else None
        row["eta_s"] = round(eta) if eta is not None else None
        self._prev = (elapsed, gen)
        return row

    def show(self, line: str) -> None:
        width = shutil.get_terminal_size().columns if self.in_place else 0
        self.stream.write(status_text(line, self.in_place, width))
        self.stream.flush()
        self._drawn = True

    def finish(self) -> None:
        """End the rewritten line, so that what is printed next starts on a line of its own."""
        if self.in_place and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def prepare_run_dir(cfg: Config, resume: bool) -> Path:
    """Create run.out_dir; an old run there is moved aside unless --resume."""
    run_dir = Path(cfg.run.out_dir)
    # Only a run's own files make it an earlier run: the synthetic data (run_dir/data) that
    # `stream-dapo warmup` writes there before the first run is kept in place.
    earlier = any((run_dir / name).exists() for name in ("config.toml", "buffer", "checkpoints", "logs"))
    if earlier and not resume:
        aside = run_dir.with_name(f"{run_dir.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        log.warning("%s holds an earlier run: moving it to %s (pass --resume to continue it)", run_dir, aside)
        shutil.move(str(run_dir), aside)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(config_to_toml(cfg))
    return run_dir


def prepare_model(cfg: Config) -> None:
    """Import model.source when one is set (into model.path, or sft.base under [sft]), then warm it
    up into model.path when sft.enabled (both once: stream_dapo.model.importer, .sft); else
    build the tiny warm model when model.path is the embedded default's empty cache; use an
    existing model as it is; refuse (ConfigError) a model.path elsewhere that holds no model.

    A run never retrains the policy it was pointed at: when the cached tiny model was built with
    other warm-up settings, say so and leave the rebuild to `stream-dapo warmup`.
    """
    from stream_dapo.model.tiny import read_marker
    from stream_dapo.model.warmup import ensure_warm_model, tiny_spec, warmup_key

    path = Path(cfg.model.path)
    if cfg.model.source is not None or cfg.sft.enabled:
        from stream_dapo.model.importer import ensure_imported_model
        from stream_dapo.model.sft import ensure_sft_model

        if cfg.model.source is not None:
            ensure_imported_model(cfg.model.source, cfg.sft.base if cfg.sft.enabled else path)
        if cfg.sft.enabled:
            write_generated_data(cfg)  # [sft] trains on these files: a caller may not have run check_data
            ensure_sft_model(cfg)
        return
    if not (path / "config.json").is_file():
        ensure_warm_model(cfg)
        return
    marker = read_marker(path)
    if marker is not None and marker.get("key") != warmup_key(cfg, tiny_spec(cfg)):
        log.warning(
            "%s was warmed up with other settings than this config's; using it as it is "
            "(run `stream-dapo warmup` to rebuild it)",
            path,
        )


def write_generated_data(cfg: Config) -> None:
    """Write data.gsm_symbolic's and data.word_problems' files when set; each is written once per
    setting (cached), so calling this again is cheap."""
    if cfg.data.gsm_symbolic is not None:
        from stream_dapo.data.gsm_symbolic import ensure_gsm_symbolic_data

        ensure_gsm_symbolic_data(cfg.data.gsm_symbolic)
    if cfg.data.word_problems is not None:
        from stream_dapo.data.word_problems import ensure_word_problem_data

        ensure_word_problem_data(cfg.data.word_problems)


def check_data(cfg: Config) -> None:
    """Write data.gsm_symbolic's and data.word_problems' files when set (cached); then validate
    data.train_path, and data.eval_path when the run evaluates, row by row before any
    service starts: a bad line or a missing column stops the run with the file, line and fix (a
    ConfigError), not a generator at start-up."""
    from stream_dapo.data.dataset import check_data_file

    write_generated_data(cfg)
    files = {"data.train_path": cfg.data.train_path}
    if cfg.run.eval_before_after:
        files["data.eval_path"] = cfg.data.eval_path
    for source in cfg.data.sources:
        files[f"data.sources[{source.name}].train_path"] = source.train_path
        if cfg.run.eval_before_after:
            files[f"data.sources[{source.name}].eval_path"] = source.eval_path
    for setting, path in files.items():
        if path is not None:
            rows = check_data_file(path, setting)
            log.info("%s: %d rows in the DAPO schema", path, rows)
    check_rewards(cfg)


def check_rewards(cfg: Config) -> None:
    """Build every source's reward in a one-worker verifier pool and call each user function once on
    its first row (``rewards.probe``), before any service starts: a reward file that is missing, does
    not import, has the wrong signature or raises stops the run here with the setting and the fix."""
    if not cfg.data.sources:
        return  # the built-in verifier alone: nothing a user wrote
    from stream_dapo.config.sources import data_sources
    from stream_dapo.rewards.probe import probe_rewards, warn_weak_sandbox
    from stream_dapo.verifier import VerifierPool

    sources = data_sources(cfg)
    warn_weak_sandbox(sources)
    with VerifierPool(num_workers=1, rewards={s.name: s.reward for s in sources}) as pool:
        probe_rewards(pool, sources)


class PortInUse(RuntimeError):
    """A port the services need is taken (a configuration problem: exit code 2)."""


def fixed_ports(cfg: Config) -> dict[str, tuple[str, int]]:
    """The ports the config fixes (setting -> (host, port)); a 0 binds any free port, never taken."""
    wanted = {
        "transport.samples_port": (cfg.transport.host, cfg.transport.samples_port),
        "transport.batches_port": (cfg.transport.host, cfg.transport.batches_port),
        "transport.weights_port": (cfg.transport.host, cfg.transport.weights_port),
        "metrics.buffer_port": (cfg.metrics.host, cfg.metrics.buffer_port),
        "metrics.learner_port": (cfg.metrics.host, cfg.metrics.learner_port),
    }
    if cfg.weights.method == "nccl":  # the learner's rank 0 hosts the weight group's TCP store
        wanted["transport.nccl_port"] = (cfg.transport.host, cfg.transport.nccl_port)
    if cfg.metrics.generator_port:
        for i in range(cfg.generator.num_generators):
            wanted[f"metrics.generator_port (+{i})"] = (cfg.metrics.host, cfg.metrics.generator_port + i)
    return {key: where for key, where in wanted.items() if where[1]}


def check_ports_free(cfg: Config) -> None:
    """Fail before starting anything if a port the config fixes is taken (a clear message now
    rather than a service's exit later; ports set to 0 need no check)."""
    for key, (host, port) in fixed_ports(cfg).items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                raise PortInUse(
                    f"{host}:{port} ({key}) is in use — another run may be going; stop it, "
                    f"choose another port with --set {key.split(' ')[0]}=<port>, or set it to 0 (any free port)"
                ) from None


LAUNCHER_VARS = frozenset(
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
)


def child_env(cfg: Config, service: str, index: int = 0) -> dict[str, str]:
    """Thread budgets: on a small CPU box every process gets few threads, pinned apart."""
    env = dict(os.environ)
    env["STREAM_DAPO_SERVICE"] = service if service != "generator" else f"generator-{index}"
    env.setdefault("DS_ACCELERATOR", "cpu")
    env["OMP_NUM_THREADS"] = str(cfg.learner.torch_threads if service == "learner" else 1)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if service == "generator":
        cores = os.cpu_count() or 1
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(index % cores))
    # Children must not inherit our stray env overrides of the resolved config (it is in config.toml),
    # nor torch.distributed launcher variables: the one-machine learner is a world of one, and a
    # parent's MASTER_PORT may still be held by the parent.
    for key in [k for k in env if k.startswith("STREAM_DAPO__") or k in LAUNCHER_VARS]:
        del env[key]
    return env


def service_argv(service: str, config_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "stream_dapo.cli", service, "--config", str(config_path), *extra]


def evaluate_subprocess(cfg: Config, config_path: Path, model_dir: Path, label: str, run_dir: Path) -> dict:
    """Run `stream-dapo eval` in a child (vLLM needs its own process) and return its JSON.

    The child runs in its own session, like a service: when the launcher is stopped meanwhile, it
    gets SIGTERM (it stops its vLLM engine, `running_llm`) and then its process group SIGKILL. A plain
    kill of the child alone would leave vLLM's engine-core and worker processes running."""
    out_path = run_dir / f"eval_{label}.json"
    log_path = run_dir / "logs" / f"eval_{label}.log"
    log_path.parent.mkdir(exist_ok=True)
    argv = service_argv("eval", config_path, "--model", str(model_dir))
    log.info("evaluating %s policy (%s)", label, model_dir)
    # stdout to a file, not a pipe: vLLM logs there, and nothing reads a pipe while the child stops.
    with open(log_path, "wb") as stderr, tempfile.TemporaryFile() as stdout:
        popen = subprocess.Popen(
            argv, stdout=stdout, stderr=stderr, env=child_env(cfg, "eval"), start_new_session=True
        )
        try:
            popen.wait()
        except BaseException:  # StopRequested, or anything else that ends the launcher here
            stop_process_group(popen, f"eval-{label}", _ENGINE_SHUTDOWN_S)
            raise
        _signal_group(popen.pid, signal.SIGKILL)  # anything it left behind
        stdout.seek(0)
        printed = stdout.read().decode(errors="replace")
    if popen.returncode != 0:
        raise ServiceFailed(
            f"evaluation of {model_dir} failed (exit code {popen.returncode}); last lines of "
            f"{log_path}:\n" + tail(log_path)
        )
    result = json.loads(printed.strip().splitlines()[-1])
    out_path.write_text(json.dumps(result, indent=2))
    return result


def learner_log_stats(run_dir: Path) -> dict[str, Any]:
    """Groups trained and worst staleness from the learner's trained-group log."""
    path = run_dir / "learner" / "trained_groups.jsonl"
    groups: list[str] = []
    max_stale = 0
    last_version = 0
    if path.exists():
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            groups.extend(row["group_ids"])
            max_stale = max(max_stale, int(row.get("max_staleness", 0)))
            last_version = max(last_version, int(row["version"]))
    return {
        "groups_trained": len(groups),
        "groups_trained_twice": len(groups) - len(set(groups)),
        "max_staleness_trained": max_stale,
        "final_version": last_version,
    }


def start_services(sup: Supervisor, cfg: Config, config_path: Path) -> dict[str, dict[str, int]]:
    """Start the buffer, the learner and the generators. A service whose peers connect to a port it
    binds as 0 (any free port) is waited for until it reports what it bound (`stream_dapo/runtime/ports.py`),
    and the ports are passed on with --set, so a port set to 0 works like a fixed one. Returns the
    ports waited for, by service name; the rest are read while the run goes (`reported_ports`)."""
    bound: dict[str, dict[str, int]] = {}
    for name in ("buffer", "learner"):
        peers = [f"{key}={port}" for reported in bound.values() for key, port in reported.items()]
        child = sup.start(name, service_argv(name, config_path, *_sets(peers)), child_env(cfg, name))
        if peers_need_reported_ports(cfg, name):
            bound[name] = _wait_ports(cfg, child)
    peers = [f"{key}={port}" for reported in bound.values() for key, port in reported.items()]
    for i in range(cfg.generator.num_generators):
        argv = service_argv("generator", config_path, "--index", str(i), *_sets(peers))
        sup.start(f"generator-{i}", argv, child_env(cfg, "generator", i))
    return bound


def peers_need_reported_ports(cfg: Config, service: str) -> bool:
    """Whether a later service connects to a port `service` binds as 0: the buffer's two sockets,
    the learner's weight server (not with weights.method = "shared_dir")."""
    t = cfg.transport
    if service == "buffer":
        return not (t.samples_port and t.batches_port)
    return service == "learner" and cfg.weights.method != "shared_dir" and not t.weights_port


def _sets(overrides: Sequence[str]) -> list[str]:
    return [arg for item in overrides if not item.startswith("metrics.") for arg in ("--set", item)]


def _wait_ports(cfg: Config, child: Child) -> dict[str, int]:
    try:
        return wait_bound_ports(cfg.run.out_dir, child.name, child.popen.poll, pid=child.popen.pid)
    except (ServiceExited, TimeoutError) as exc:
        raise ServiceFailed(f"{exc}; last lines of {child.log_path}:\n{tail(child.log_path)}") from None


def reported_ports(cfg: Config, sup: Supervisor) -> dict[str, dict[str, int]]:
    """The ports each running child has reported so far, by service name."""
    out: dict[str, dict[str, int]] = {}
    for child in sup.children:
        ports = read_bound_ports(cfg.run.out_dir, child.name, pid=child.popen.pid)
        if ports is not None:
            out[child.name] = ports
    return out


class ServiceFailed(RuntimeError):
    """A service exited before the learner finished; the message has its exit code and log tail."""


class StopRequested(Exception):
    """SIGTERM or SIGINT reached the launcher: stop the services in drain order, write the summary."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_signals() -> None:
    """The first SIGTERM/SIGINT raises StopRequested in the main thread; later ones are ignored so
    that they cannot cut the drain short (each service still gets SIGKILL after its timeout)."""

    def handler(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log.warning(
            "received %s: stopping the services (generators, learner, buffer)", signal.Signals(signum).name
        )
        raise StopRequested(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def exit_hint(returncode: int | None) -> str:
    """What a service's exit code says beyond its log: SIGKILL from nobody in the run is, on one
    machine, almost always the kernel's out-of-memory killer, which leaves no line in the log."""
    if returncode == -signal.SIGKILL:
        return (
            " (SIGKILL: most likely the kernel's out-of-memory killer, see `dmesg`; lower "
            "learner.micro_batch_tokens or generator.kv_cache_gib, and compare `stream-dapo plan --memory` "
            "with the machine's free memory)"
        )
    return ""


def wait_for_an_exit(popens: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> None:
    """Return as soon as one of `popens` exits (or has exited and is not reaped yet), or after
    timeout_s: each one's pidfd turns readable when it exits. Where pidfds are missing (not Linux,
    or a kernel before 5.3), a plain sleep."""
    fds: list[int] = []
    try:
        for popen in popens:
            if popen.poll() is not None:
                return
            fds.append(os.pidfd_open(popen.pid))
    except (AttributeError, OSError):  # no os.pidfd_open, or the kernel refuses it
        for fd in fds:
            os.close(fd)
        time.sleep(timeout_s)
        return
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(timeout_s * 1000)
    finally:
        for fd in fds:
            os.close(fd)


def supervise(sup: Supervisor, view: LiveView, cfg: Config, period_s: float = 5.0) -> None:
    """Wait for the learner to finish; fail loudly if any other service dies first. An exit is
    seen when it happens (`wait_for_an_exit`); the live view is updated every period_s."""
    learner = next(c for c in sup.children if c.name == "learner")
    while True:
        view.endpoints = Endpoints.from_ports(cfg, reported_ports(cfg, sup))
        view.update()
        for child in sup.dead():
            if child is learner and child.popen.returncode == 0:
                return
            raise ServiceFailed(
                f"{child.name} exited with code {child.popen.returncode}{exit_hint(child.popen.returncode)}; "
                f"last lines of {child.log_path}:\n" + tail(child.log_path)
            )
        wait_for_an_exit([c.popen for c in sup.children], period_s)


def service_stops(stops: Mapping[str, StopOutcome], run_dir: Path) -> dict[str, dict[str, Any]]:
    """summary.json's ``service_stops``: each service's exit code, whether it was killed, and
    whether it wrote its final metrics (`write_final_metrics`; without them the summary's figures
    for it are its last scrape, which a drain's last counts may have missed). A missing file is
    logged with the service's name and why."""
    out: dict[str, dict[str, Any]] = {}
    for name, outcome in stops.items():
        wrote = final_metrics_path(run_dir, name).is_file()
        out[name] = {**asdict(outcome), "final_metrics": wrote}
        if not wrote:
            why = "it was killed" if outcome.killed else f"it exited with code {outcome.exit_code}"
            log.warning("%s wrote no final metrics (%s): the summary uses its last scrape", name, why)
    return out


def final_snapshot(last: Mapping[str, Mapping[str, float]], run_dir: Path) -> dict[str, Mapping[str, float]]:
    """The last scrape, overridden by what each service wrote at shutdown (`write_final_metrics`)."""
    snap = dict(last)
    for path in sorted((run_dir / FINAL_METRICS_DIR).glob("*.json")):
        try:
            snap[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s (%s); using the last scrape of %s", path, exc, path.stem)
    return snap


def train(cfg: Config, config_path: Path, run_dir: Path, summary: dict[str, Any], quiet: bool) -> None:
    """Start the services, supervise them until the learner is done, stop them in drain order.

    `summary` gets the training figures even when a service failed or a stop signal came."""
    sup = Supervisor(run_dir)
    view = LiveView(cfg, Endpoints.from_ports(cfg, {}), run_dir, quiet)
    t0 = time.monotonic()
    try:
        start_services(sup, cfg, config_path)
        supervise(sup, view, cfg)
    finally:
        train_seconds = time.monotonic() - t0
        summary["ports"] = reported_ports(cfg, sup)
        view.finish()
        sup.stop_all(stop_timeouts(cfg))
        summary["service_stops"] = service_stops(sup.stops, run_dir)
        final = final_snapshot(view.last, run_dir)
        view.record(final, step=learner_log_stats(run_dir)["final_version"])
        summary.update(build_summary(final, run_dir, train_seconds))


def build_summary(
    snap: Mapping[str, Mapping[str, float]], run_dir: Path, train_seconds: float
) -> dict[str, Any]:
    gen = generator_totals(snap)
    buf = snap.get("buffer", {})
    stats = learner_log_stats(run_dir)
    return {
        "learner_steps": stats["final_version"],
        "final_version": stats["final_version"],
        "groups_accepted": int(metric_sum(buf, sample_name(catalogue(BufferMetrics).groups_accepted))),
        "groups_filtered": int(gen["groups_all_correct"] + gen["groups_all_wrong"]),
        "groups_filtered_all_correct": int(gen["groups_all_correct"]),
        "groups_filtered_all_wrong": int(gen["groups_all_wrong"]),
        "groups_trained": stats["groups_trained"],
        "groups_trained_twice": stats["groups_trained_twice"],
        "groups_dropped_stale": int(metric_sum(buf, sample_name(catalogue(BufferMetrics).dropped_stale))),
        "learner_holds": int(metric_sum(buf, sample_name(catalogue(BufferMetrics).learner_holds))),
        "learner_holds_expired": int(
            metric_sum(buf, sample_name(catalogue(BufferMetrics).learner_holds_expired))
        ),
        "max_staleness_trained": stats["max_staleness_trained"],
        "samples_generated": int(gen["samples"]),
        "generator_weight_updates": int(gen["weight_updates"]),
        "generator_policy_version": int(gen["policy_version_min"]),
        "samples_per_second": round(gen["samples"] / train_seconds, 3) if train_seconds else 0.0,
        "train_seconds": round(train_seconds, 1),
    }
