"""Services that must agree on the configuration check it (issue 41 item 2): a generator or learner
whose sampling settings differ from the buffer's is refused at hello, and a buffer restarted on its
state with a changed setting applies and logs it, or refuses it with exit 2 naming key, old and new
value and the way out. Real buffer, real sockets, real journal."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest

from stream_dapo.buffer.service import build_buffer
from stream_dapo.cli import buffer as buffer_cli
from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.generator.root import build_generator
from stream_dapo.generator.service import StartupError
from stream_dapo.transport import messages as m
from stream_dapo.transport.sockets import RemoteError
from tests.integration.test_buffer_service import Peers, make_group, overrides, service_in_thread


def test_a_generator_sampling_at_another_temperature_is_refused_at_hello_naming_both_values(
    tmp_path: Path,
) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})  # temperature 1.0, top_p 1.0
    with service_in_thread(cfg) as svc, Peers(svc.bound_ports) as peers:
        ok = peers.ask(peers.gen, m.Hello("gen-0", 0, "A", m.Sampling(1.0, 1.0, 0, 0.0)))
        assert ok.type == m.CREDIT
        with pytest.raises(RemoteError) as refused:
            peers.ask(peers.gen, m.Hello("gen-1", 0, "B", m.Sampling(0.7, 1.0, 0, 0.05)))
        assert refused.value.reason == "sampling_mismatch"
        detail = refused.value.detail
        assert "generator.temperature = 0.7 there, 1.0 here" in detail
        assert "generator.min_p = 0.05 there, 0.0 here" in detail and "top_p" not in detail.split(".")[0]
        assert "give every service the same generator.temperature" in detail
        # Refused before anything changed: gen-1 holds nothing, no hello was journaled for it.
        assert svc.buffer.holder_of("gen-1") is None
        with pytest.raises(RemoteError, match="sampling_mismatch"):
            peers.ask(peers.learner, m.LearnerHello(0, 0, m.Sampling(1.0, 0.9, 0, 0.0)))
        assert peers.ask(peers.learner, m.LearnerHello(0, 0, m.Sampling(1.0, 1.0, 0, 0.0))).type == m.EMPTY
        assert svc.stats()["rejected_messages"] == {"sampling_mismatch": 2}


def test_the_generator_service_exits_on_the_refusal_with_the_buffers_message(tmp_path: Path) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc:
        port = svc.bound_ports["transport.samples_port"]
        gen_cfg = load_config(
            overrides=[*overrides(tmp_path), f"transport.samples_port={port}", "generator.temperature=0.7"],
            environ={},
        )
        generator = build_generator(gen_cfg, 0)  # nothing started: only its hello is under test
        try:
            with pytest.raises(StartupError, match=r"generator\.temperature = 0\.7 there, 1\.0 here"):
                generator.link.connect()
        finally:
            generator.close()


def test_a_restart_with_another_group_size_exits_2_and_a_changed_capacity_is_applied_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(overrides=overrides(tmp_path), environ={})
    with service_in_thread(cfg) as svc, Peers(svc.bound_ports) as peers:
        peers.ask(peers.gen, m.CreditRequest("gen-0", 2))
        assert peers.ask(peers.gen, m.Groups("gen-0", [make_group("g0")])).body.accepted == ["g0"]
    changed = load_config(
        overrides=[*overrides(tmp_path), "algo.group_size=4", "learner.mini_batch_samples=8"], environ={}
    )
    with pytest.raises(ConfigError) as refused:
        build_buffer(changed)
    message = str(refused.value)
    assert "algo.group_size 2 -> 4" in message and "state.msgpack" in message
    assert "put them back" in message and "run.out_dir" in message
    assert buffer_cli.run(argparse.Namespace(cfg=changed)) == 2
    caplog.set_level(logging.INFO)
    bigger = load_config(overrides=[*overrides(tmp_path), "buffer.capacity_groups=300"], environ={})
    with service_in_thread(bigger) as svc:
        assert svc.buffer.waiting_ids() == ["g0"]  # the refused starts changed nothing
        assert svc.buffer.run_config is not None and svc.buffer.run_config["buffer.capacity_groups"] == 300
    assert "applied: buffer.capacity_groups 256 -> 300" in caplog.text
    caplog.clear()
    with service_in_thread(bigger):
        pass
    assert "applied:" not in caplog.text  # stored with the state: the same settings again are no change
