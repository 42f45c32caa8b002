"""Fault drill over real processes: kill -9 the generator, the learner and the buffer mid-run,
restart each, and account for every group. Shared by tests/integration/test_faults.py (which asserts
on the report) and bench/drills/drill.py (which prints it).

The services are started one by one (as systemd would), not through `stream-dapo run`, whose
supervisor stops a run when a child dies. The drill checks the design's promises: the run goes on
without a generator and a restarted one rejoins with current weights; a restarted learner resumes at
its checkpoint's version and no group is trained twice in the surviving lineage; a restarted buffer
still holds everything it acknowledged. After the run it reads the buffer's persisted state and the
learner's trained-group log: every acknowledged group is trained, still held, or counted as dropped
stale; anything else is lost.

Recovery times, per service, from `kill -9`:

    generator  a new generator samples from the learner's current weights and the buffer accepted a
               group after the restart
    learner    the new learner resumed at its checkpoint's version and took a step past it
    buffer     the new buffer answers, still counts everything it acknowledged, accepted a new group,
               and the learner took a step since the kill

`restart_to_ready_s` is from the restart to the service's /metrics answering; `restart_to_recovered_s`
from the restart to the condition above; `downtime_s` from the kill to it (it includes the drill's
own pause of `GENERATOR_PAUSE_S` for the generator, which shows the learner survives alone).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stream_dapo.config import Config, config_to_toml, load_config
from stream_dapo.runtime.ports import read_bound_ports
from stream_dapo.testing.services import HeldPorts, tiny_overrides
from stream_dapo.tools.launch import Child, Supervisor, child_env, service_argv, tail
from stream_dapo.tools.prometheus import metric_sum, scrape

GENERATOR_PAUSE_S = 2.0
SERVICE_PORTS = {
    "buffer": ("transport.samples_port", "transport.batches_port", "metrics.buffer_port"),
    "learner": ("transport.weights_port", "metrics.learner_port"),
}
"""The listening sockets the drill holds for each service, by setting."""
WAIT_S = 240.0


class DrillError(RuntimeError):
    """A recovery did not happen in time; the message holds the services' last log lines."""


@dataclass
class Recovery:
    service: str
    killed_at_step: int
    restart_to_ready_s: float
    restart_to_recovered_s: float
    downtime_s: float
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class DrillReport:
    total_steps: int
    recoveries: list[Recovery]
    learner_exit_code: int | None
    trained_versions: list[int]
    max_staleness_trained: int
    max_staleness_allowed: int
    groups_acknowledged: int
    groups_trained: int
    groups_trained_twice: int
    groups_still_held: int
    groups_dropped_stale: int
    groups_lost: int
    groups_trained_unacknowledged: int

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for r in out["recoveries"]:
            for key in ("restart_to_ready_s", "restart_to_recovered_s", "downtime_s"):
                r[key] = round(r[key], 2)
        return out


def scrape_url(url: str | None) -> dict[str, float]:
    """`scrape`, or nothing for a service that has not reported its port yet."""
    return scrape(url) if url else {}


class FaultDrill:
    """One run directory, one config, the three services under a `Supervisor`."""

    def __init__(self, model: Path, out: Path, total_steps: int = 100_000) -> None:
        self.out = out
        # The buffer's and the learner's listening sockets are held here and handed to every
        # incarnation (STREAM_DAPO_LISTEN_FDS), so that a restarted service is where its peers look
        # and nothing else can take its port while it is down; generators bind any free port.
        self.held = HeldPorts(*SERVICE_PORTS["buffer"], *SERVICE_PORTS["learner"])
        overrides = (
            tiny_overrides(model, out)
            + self.held.overrides()
            + [
                f"learner.total_steps={total_steps}",
                "learner.checkpoint_every=2",
                "algo.dynamic_sampling=false",  # progress must not hinge on the tiny model's accuracy here
            ]
        )
        self.cfg: Config = load_config(overrides=overrides, environ={})
        out.mkdir(parents=True)
        self.config_path = out / "config.toml"
        self.config_path.write_text(config_to_toml(self.cfg))
        m = self.cfg.metrics
        self.learner_url = f"http://{m.host}:{m.learner_port}/metrics"
        self.buffer_url = f"http://{m.host}:{m.buffer_port}/metrics"
        self.sup = Supervisor(out)
        self.children: dict[str, Child] = {}

    # ------------------------------------------------------------------------------ the drill

    def run(self) -> DrillReport:
        try:
            for name in ("buffer", "learner", "generator-0"):
                self.start(name)
            self.wait_for("learner version 2", lambda: self.learner_step() >= 2)
            recoveries = [self.kill_generator(), self.kill_learner(), self.kill_buffer()]
            learner = self.children["learner"]
            if learner.popen.poll() is not None:
                raise DrillError(
                    f"the learner finished before the drill did: raise total_steps\n{self.logs()}"
                )
        finally:
            # Drain order, like `stream-dapo run` at the end: generators, then the learner (it
            # finishes its step and checkpoints), then the buffer (it persists). The run is stopped
            # here, not by the learner's step budget, so that no kill races the end of the run.
            self.sup.stop_all(timeout_s=60)
            self.held.close()
        return self.account(recoveries, learner.popen.returncode)

    def kill_generator(self) -> Recovery:
        """The learner keeps running without it; a new one joins with the current weights."""
        step = self.learner_step()
        killed = self.kill9("generator-0")
        time.sleep(GENERATOR_PAUSE_S)
        if self.children["learner"].popen.poll() is not None:
            raise DrillError(f"the learner died with the generator:\n{self.logs()}")
        accepted = self.accepted()
        restarted = self.start("generator-0")
        version = self.learner_step()
        ready = self.wait_for("the restarted generator's /metrics", lambda: bool(scrape_url(self.gen_url(0))))

        def recovered() -> bool:
            current = (
                metric_sum(scrape_url(self.gen_url(0)), "stream_dapo_generator_policy_version") >= version
            )
            return current and self.accepted() > accepted

        done = self.wait_for("the restarted generator to sample from current weights and deliver", recovered)
        return Recovery("generator", step, ready - restarted, done - restarted, done - killed)

    def kill_learner(self) -> Recovery:
        """Killed after a checkpoint: it resumes at the checkpoint's version and trains on."""
        # The event itself, not the step gauge: the gauge moves before the step's checkpoint is written.
        self.wait_for("a checkpoint at version >= 4", lambda: self.latest_checkpoint() >= 4)
        step = self.learner_step()
        killed = self.kill9("learner")
        latest = (self.out / "checkpoints" / "latest").read_text().strip()
        ckpt_version = int(latest.rsplit("_", 1)[1])
        if ckpt_version < 4:
            raise DrillError(f"the latest checkpoint is {latest}, expected version >= 4")
        restarted = self.start("learner")
        log_path = self.children["learner"].log_path
        self.wait_for(
            f"the learner to resume at version {ckpt_version}",
            lambda: f"at version {ckpt_version}" in tail(log_path, 400),
        )
        ready = self.wait_for(
            "the resumed learner to serve metrics", lambda: self.learner_step() >= ckpt_version
        )
        done = self.wait_for("the resumed learner to take a step", lambda: self.learner_step() > ckpt_version)
        detail = {"checkpoint_version": ckpt_version}
        return Recovery("learner", step, ready - restarted, done - restarted, done - killed, detail)

    def kill_buffer(self) -> Recovery:
        """What the buffer acknowledged survives its restart; generators and learner carry on."""
        accepted_before = self.accepted()
        if accepted_before <= 0:
            raise DrillError("the buffer had accepted nothing before it was killed")
        step = self.learner_step()
        killed = self.kill9("buffer")
        restarted = self.start("buffer")
        ready = self.wait_for("the buffer to come back", lambda: bool(scrape(self.buffer_url)))
        # Its counters continue from the persisted state: what it acknowledged is still there.
        self.wait_for(
            "the buffer to restore what it acknowledged", lambda: self.accepted() >= accepted_before, 60
        )
        accepted_after = self.accepted()

        def recovered() -> bool:
            return self.accepted() > accepted_before and self.learner_step() > step

        done = self.wait_for("the generator and the learner to work through the new buffer", recovered)
        detail = {"acknowledged_before_kill": accepted_before, "acknowledged_after_restart": accepted_after}
        return Recovery("buffer", step, ready - restarted, done - restarted, done - killed, detail)

    # ------------------------------------------------------------------------------ accounting

    def account(self, recoveries: list[Recovery], learner_exit_code: int | None) -> DrillReport:
        """Every group the buffer acknowledged: trained, still held, dropped stale, or lost."""
        from stream_dapo.buffer.journal import Journal
        from stream_dapo.buffer.replay import ReplayBuffer
        from stream_dapo.buffer.service import persist_path

        journal = Journal(persist_path(self.cfg))
        try:
            buffer = ReplayBuffer.restore(self.cfg.admission_policy(), journal.load())
        finally:
            journal.close()
        # Counted, not listed: the buffer forgets the ids its senders can no longer resend (issue 41
        # item 5), but its `accepted` counter survives every restart. Every acknowledged group is
        # trained, still held or dropped as stale, each exactly one of them: so
        # |trained | held| + dropped equals what it acknowledged, and any excess was trained without
        # being acknowledged, any shortfall lost.
        acknowledged = int(buffer.stats()["accepted"])
        held = set(buffer.waiting_ids()) | set(buffer.leased_ids())
        log_path = self.out / "learner" / "trained_groups.jsonl"
        rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
        trained = [gid for r in rows for gid in r["group_ids"]]
        dropped = int(buffer.stats()["dropped_stale"])
        return DrillReport(
            total_steps=self.cfg.learner.total_steps,
            recoveries=recoveries,
            learner_exit_code=learner_exit_code,
            trained_versions=[int(r["version"]) for r in rows],
            max_staleness_trained=max((int(r["max_staleness"]) for r in rows), default=0),
            max_staleness_allowed=self.cfg.algo.max_staleness,
            groups_acknowledged=acknowledged,
            groups_trained=len(trained),
            groups_trained_twice=len(trained) - len(set(trained)),
            groups_still_held=len(held),
            groups_dropped_stale=dropped,
            groups_lost=max(0, acknowledged - len(set(trained) | held) - dropped),
            groups_trained_unacknowledged=max(0, len(set(trained) | held) + dropped - acknowledged),
        )

    # ------------------------------------------------------------------------------ helpers

    def start(self, name: str) -> float:
        service, _, index = name.partition("-")
        extra = ("--index", index) if service == "generator" else ()
        argv = service_argv(service, self.config_path, *extra)
        env = child_env(self.cfg, service, int(index) if index else 0)
        settings = SERVICE_PORTS.get(service, ())
        env.update(self.held.env(*settings))
        self.children[name] = self.sup.start(name, argv, env, pass_fds=self.held.fds(*settings))
        return time.monotonic()

    def gen_url(self, index: int) -> str | None:
        """Generator `index`'s /metrics, once its running process has reported its port."""
        child = self.children.get(f"generator-{index}")
        ports = read_bound_ports(self.out, f"generator-{index}", child.popen.pid) if child else None
        return f"http://{self.cfg.metrics.host}:{ports['metrics.generator_port']}/metrics" if ports else None

    def kill9(self, name: str) -> float:
        child = self.children.pop(name)
        os.killpg(child.popen.pid, signal.SIGKILL)
        child.popen.wait()
        self.sup.children.remove(child)
        child.log_file.close()
        return time.monotonic()

    def wait_for(self, what: str, cond: Callable[[], bool], timeout_s: float = WAIT_S) -> float:
        """Poll `cond` every 0.25 s; return the monotonic time it held, or raise DrillError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return time.monotonic()
            time.sleep(0.25)
        raise DrillError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {c.name}\n{tail(c.log_path, 25)}" for c in self.sup.children)

    def latest_checkpoint(self) -> int:
        """The version `checkpoints/latest` names (0 before the first checkpoint)."""
        try:
            return int((self.out / "checkpoints" / "latest").read_text().strip().rsplit("_", 1)[1])
        except (OSError, ValueError, IndexError):
            return 0

    def learner_step(self) -> int:
        return int(metric_sum(scrape(self.learner_url), "stream_dapo_learner_step"))

    def accepted(self) -> int:
        return int(metric_sum(scrape(self.buffer_url), "stream_dapo_buffer_groups_accepted_total"))


# --------------------------------------------------------------------------------------------------
# The elastic fleet
# --------------------------------------------------------------------------------------------------

LEASE_S = 10.0
HEARTBEAT_S = 1.0
JOIN_WAIT_S = 900.0


@dataclass
class ElasticReport:
    """What the elastic drill saw: per membership change, how long until the buffer's view of the
    fleet (live generators, credits) was right again, then the whole run's group accounting."""

    events: list[dict[str, Any]]
    lease_s: float
    drill: DrillReport

    def to_json(self) -> dict[str, Any]:
        return {"lease_s": self.lease_s, "events": self.events, **self.drill.to_json()}


class ElasticDrill(FaultDrill):
    """1 -> 3 -> 1 generators during one run, then the last one replaced by one with a new index.

    Generators 1 and 2 join mid-run (any index joins: the fleet is whatever connects); then 1 leaves
    with SIGTERM to its whole process group (an operator's ``kill -TERM -<pgid>``: vLLM's processes
    get it too; it drains without them, exits 0 and hands its unused credits back) and 2 with kill -9
    (a preempted node: its credits come back when its lease expires); then 0 is killed and 3 starts in
    its place. Then the run is stopped as `stream-dapo run` stops it (SIGTERM, drain order), so the
    drill does not race the learner's step budget. Every acknowledged group must be trained, held or
    dropped stale, none trained twice, and each departure's credits back in the admission line.
    """

    def __init__(self, model: Path, out: Path, total_steps: int = 100_000) -> None:
        super().__init__(model, out, total_steps)
        self.cfg = load_config(
            overrides=[
                *tiny_overrides(model, out),
                *self.held.overrides(),
                f"learner.total_steps={total_steps}",
                "learner.checkpoint_every=2",
                "algo.dynamic_sampling=false",
                f"generator.heartbeat_s={HEARTBEAT_S}",
                f"buffer.generator_lease_s={LEASE_S}",
            ],
            environ={},
        )
        self.config_path.write_text(config_to_toml(self.cfg))
        m = self.cfg.metrics
        self.learner_url = f"http://{m.host}:{m.learner_port}/metrics"
        self.buffer_url = f"http://{m.host}:{m.buffer_port}/metrics"

    def run(self) -> ElasticReport:  # type: ignore[override]
        events: list[dict[str, Any]] = []
        try:
            for name in ("buffer", "learner", "generator-0"):
                self.start(name)
            self.wait_for("learner version 2", lambda: self.learner_step() >= 2)
            events.append(self.scale_up([1, 2]))
            events.append(self.leave(1, signal.SIGTERM, group=True))
            events.append(self.leave(2, signal.SIGKILL))
            events.append(self.replace(0, 3))
            if self.finished():
                raise DrillError(
                    f"the learner finished before the drill did: raise total_steps\n{self.logs()}"
                )
            learner = self.children["learner"]
        finally:
            # Drain order, like `stream-dapo run` at the end: generators, then the learner (it
            # finishes its step and checkpoints), then the buffer (it persists).
            self.sup.stop_all(timeout_s=60)
            self.held.close()
        return ElasticReport(events, LEASE_S, self.account([], learner.popen.returncode))

    # ------------------------------------------------------------------------------ membership

    def scale_up(self, indices: list[int]) -> dict[str, Any]:
        step, t0 = self.learner_step(), time.monotonic()
        for i in indices:
            self.start(f"generator-{i}")
        # Several vLLM start-ups at once on a busy machine take minutes: wait longer than WAIT_S.
        self.wait_for(
            f"{1 + len(indices)} live generators", lambda: self.live() == 1 + len(indices), JOIN_WAIT_S
        )
        done = self.wait_for(
            "every newcomer to deliver a group", lambda: all(self.acked(i) > 0 for i in indices), JOIN_WAIT_S
        )
        return {
            "event": f"scale 1 -> {1 + len(indices)}",
            "at_step": step,
            "to_delivering_s": round(done - t0, 2),
            "to_reclaimed_s": None,
            "credits_at_departure": None,
        }

    def leave(self, index: int, sig: int, group: bool = False) -> dict[str, Any]:
        """Generator `index` leaves; its credits must return to the line (at once after a drain,
        within the lease after kill -9) while the run goes on. SIGTERM goes to the service alone
        (systemd's KillMode=mixed), or with ``group`` to its whole process group."""
        step = self.learner_step()
        credits = self.credits_held_by(index)
        child = self.children.pop(f"generator-{index}")
        t0 = time.monotonic()
        if sig == signal.SIGTERM and group:
            os.killpg(child.popen.pid, sig)
            child.popen.wait(timeout=120)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.popen.pid, signal.SIGKILL)  # whatever is left of vLLM's processes
            child.log_file.close()
        elif sig == signal.SIGTERM:
            self.sup.stop(child, timeout_s=120)  # as systemd stops it (KillMode=mixed)
        else:
            os.killpg(child.popen.pid, sig)
            child.popen.wait(timeout=120)
            child.log_file.close()
        self.sup.children.remove(child)
        reclaimed = self.wait_for(
            f"generator-{index}'s credits back in the line",
            lambda: self.credits_held_by(index) == 0,
            timeout_s=LEASE_S * 4 + 60,
        )
        self.wait_for(
            "the learner to take a step without it", lambda: self.learner_step() > step or self.finished()
        )
        how = "kill -9" if sig != signal.SIGTERM else "SIGTERM to its group" if group else "SIGTERM (drain)"
        return {
            "event": f"generator-{index} leaves by {how}",
            "at_step": step,
            "to_delivering_s": None,
            "to_reclaimed_s": round(reclaimed - t0, 2),
            "credits_at_departure": credits,
            "exit_code": child.popen.returncode,
        }

    def replace(self, old: int, new: int) -> dict[str, Any]:
        step = self.learner_step()
        credits = self.credits_held_by(old)
        t0 = self.kill9(f"generator-{old}")
        self.start(f"generator-{new}")
        reclaimed = self.wait_for(
            f"generator-{old}'s credits back in the line",
            lambda: self.credits_held_by(old) == 0,  # at once if it held none
            timeout_s=LEASE_S * 4 + 60,
        )
        done = self.wait_for(f"generator-{new} to deliver a group", lambda: self.acked(new) > 0)
        return {
            "event": f"generator-{old} replaced by generator-{new}",
            "at_step": step,
            "to_delivering_s": round(done - t0, 2),
            "to_reclaimed_s": round(reclaimed - t0, 2),
            "credits_at_departure": credits,
        }

    # ------------------------------------------------------------------------------ probes

    def finished(self) -> bool:
        return self.children["learner"].popen.poll() is not None

    def buffer_metric(self, name: str) -> float:
        return metric_sum(scrape(self.buffer_url), name)

    def live(self) -> int:
        return int(self.buffer_metric("stream_dapo_buffer_live_generators"))

    def expired(self) -> int:
        return int(self.buffer_metric("stream_dapo_buffer_generators_expired_total"))

    def acked(self, index: int) -> int:
        return int(metric_sum(scrape_url(self.gen_url(index)), "stream_dapo_generator_groups_acked_total"))

    def credits_held_by(self, index: int) -> int:
        """Credits the buffer counts as generator `index`'s (its /healthz lists every lease)."""
        import urllib.request

        url = self.buffer_url.replace("/metrics", "/healthz")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read())
        except OSError:
            return -1
        return int(body.get("generators", {}).get(f"generator-{index}", {}).get("credits", 0))
