"""Fault drill over real processes: kill -9 the generator, the learner and the buffer mid-run.

The services are started one by one (as systemd would), not through `stream-dapo run`, whose
supervisor stops a run when a child dies. The drill checks the design's promises: the run goes
on without a generator and a restarted one rejoins with current weights; a restarted learner
resumes at its checkpoint's version and no group is trained twice in the surviving lineage; a
restarted buffer still holds everything it acknowledged.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_dapo.config import config_to_toml, load_config
from stream_dapo.launcher import Child, Supervisor, child_env, metric_sum, scrape, service_argv, tail
from tests.helpers import free_ports, tiny_overrides

pytestmark = pytest.mark.timeout(900)


def wait_for(what: str, cond: Callable[[], bool], sup: Supervisor, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    logs = "\n".join(f"--- {c.name}\n{tail(c.log_path, 25)}" for c in sup.children)
    pytest.fail(f"timed out waiting for {what}\n{logs}")


def kill9(sup: Supervisor, child: Child) -> None:
    import os

    os.killpg(child.popen.pid, signal.SIGKILL)
    child.popen.wait()
    sup.children.remove(child)
    child.log_file.close()


def test_kill_each_service_and_recover(tmp_path: Path, warm_model: Path) -> None:
    out = tmp_path / "run"
    ports = free_ports(8)
    overrides = tiny_overrides(warm_model, out, ports) + [
        "learner.total_steps=10",
        "learner.checkpoint_every=2",
        "algo.dynamic_sampling=false",  # progress must not hinge on the tiny model's accuracy here
    ]
    cfg = load_config(overrides=overrides, environ={})
    out.mkdir(parents=True)
    config_path = out / "config.toml"
    config_path.write_text(config_to_toml(cfg))
    m = cfg.metrics
    learner_url = f"http://{m.host}:{m.learner_port}/metrics"
    buffer_url = f"http://{m.host}:{m.buffer_port}/metrics"
    gen_url = f"http://{m.host}:{m.generator_port}/metrics"

    def learner_step() -> int:
        return int(metric_sum(scrape(learner_url), "stream_dapo_learner_step"))

    def start(name: str) -> Child:
        service = name.split("-")[0]
        extra = ("--index", "0") if service == "generator" else ()
        return sup.start(name, service_argv(service, config_path, *extra), child_env(cfg, service))

    sup = Supervisor(out)
    try:
        buffer, learner, gen = start("buffer"), start("learner"), start("generator-0")
        wait_for("learner version 2", lambda: learner_step() >= 2, sup)

        # 1. Generator dies: the learner keeps running; a new generator joins with current weights.
        kill9(sup, gen)
        time.sleep(2.0)
        assert learner.popen.poll() is None
        gen = start("generator-0")
        v_at_restart = learner_step()
        wait_for(
            "the restarted generator to sample from current weights",
            lambda: metric_sum(scrape(gen_url), "stream_dapo_generator_policy_version") >= v_at_restart,
            sup,
        )

        # 2. Learner dies after a checkpoint: it resumes at the checkpoint's version.
        wait_for("a checkpoint at version >= 4", lambda: learner_step() >= 4, sup)
        kill9(sup, learner)
        latest = (out / "checkpoints" / "latest").read_text().strip()
        ckpt_version = int(latest.rsplit("_", 1)[1])
        assert ckpt_version >= 4
        learner = start("learner")
        wait_for(
            f"the learner to resume at version {ckpt_version}",
            lambda: f"at version {ckpt_version}" in tail(learner.log_path, 400),
            sup,
        )
        wait_for("the resumed learner to serve metrics", lambda: learner_step() >= ckpt_version, sup)

        # 3. Buffer dies: what it acknowledged survives the restart.
        accepted_before = metric_sum(scrape(buffer_url), "stream_dapo_buffer_groups_accepted_total")
        assert accepted_before > 0
        kill9(sup, buffer)
        buffer = start("buffer")
        wait_for("the buffer to come back", lambda: bool(scrape(buffer_url)), sup)
        accepted_after = metric_sum(scrape(buffer_url), "stream_dapo_buffer_groups_accepted_total")
        assert accepted_after >= accepted_before

        # The run finishes on its own.
        wait_for("the learner to finish", lambda: learner.popen.poll() is not None, sup, timeout_s=400)
        assert learner.popen.returncode == 0, tail(learner.log_path)
    finally:
        sup.stop_all(timeout_s=20)

    rows = [json.loads(line) for line in (out / "learner" / "trained_groups.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == list(range(1, 11))
    trained = [gid for r in rows for gid in r["group_ids"]]
    assert len(trained) == len(set(trained)), "a group was trained twice in the surviving lineage"
    assert max(r["max_staleness"] for r in rows) <= cfg.algo.max_staleness
