"""The launcher's port check: every port `stream-dapo run` will bind, the NCCL store port included."""

from __future__ import annotations

import socket

import pytest

from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.testing.services import port_overrides
from stream_dapo.tools.launch import PortInUse, check_ports_free, fixed_ports, peers_need_reported_ports


def _config(method: str, nccl_port: int, weights_port: int = 5557):  # -> Config
    fixed = [f"transport.weights_port={weights_port}"] if method == "nccl" else []
    return load_config(
        overrides=[f"weights.method={method}", f"transport.nccl_port={nccl_port}", *port_overrides(), *fixed],
        environ={},
    )


def test_a_taken_nccl_port_stops_an_nccl_run_naming_the_key() -> None:
    # NCCL needs a fixed weights port: one this test holds, bound with SO_REUSEADDR and not listening,
    # so the launcher's check can bind it too and no other process can take it meanwhile.
    with socket.socket() as taken, socket.socket() as weights:
        weights.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        weights.bind(("127.0.0.1", 0))
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        nccl = _config("nccl", port, weights.getsockname()[1])
        with pytest.raises(PortInUse, match=rf"127.0.0.1:{port} \(transport.nccl_port\) is in use") as err:
            check_ports_free(nccl)
        assert "--set transport.nccl_port=<port>" in str(err.value)
        check_ports_free(_config("zmq", port))  # nothing binds it unless weights.method = "nccl"


def test_the_nccl_group_meets_at_the_configured_port() -> None:
    from stream_dapo.weights.nccl import nccl_group_spec

    assert nccl_group_spec(_config("nccl", 6123)).port == 6123  # nothing is bound here


def test_the_nccl_port_must_differ_from_the_other_transport_ports() -> None:
    with pytest.raises(ConfigError, match="transport ports must differ"):
        load_config(overrides=["weights.method=nccl", "transport.nccl_port=5557"], environ={})
    assert load_config(overrides=["transport.nccl_port=5557"], environ={}).transport.nccl_port == 5557


def test_ports_set_to_0_never_clash_and_need_no_check() -> None:
    """0 binds a port of the kernel's choosing (`stream_dapo/runtime/ports.py`): several 0s are not one port,
    and the launcher has nothing to check for them."""
    cfg = load_config(overrides=port_overrides(), environ={})
    assert cfg.transport.samples_port == cfg.transport.batches_port == cfg.transport.weights_port == 0
    assert fixed_ports(cfg) == {}
    check_ports_free(cfg)


def test_the_launcher_waits_only_for_ports_that_later_services_connect_to() -> None:
    zero = load_config(overrides=port_overrides(), environ={})
    assert peers_need_reported_ports(zero, "buffer") and peers_need_reported_ports(zero, "learner")
    fixed = load_config(
        overrides=[
            *port_overrides(),
            "transport.samples_port=5555",
            "transport.batches_port=5556",
            "transport.weights_port=5557",
        ],
        environ={},
    )
    assert not peers_need_reported_ports(fixed, "buffer") and not peers_need_reported_ports(fixed, "learner")
    shared = load_config(overrides=[*port_overrides(), "weights.method=shared_dir"], environ={})
    assert not peers_need_reported_ports(shared, "learner"), "generators read weights from files"


def test_nccl_needs_a_fixed_weights_port_naming_the_fix() -> None:
    with pytest.raises(ConfigError, match="set transport.weights_port = 5557"):
        load_config(overrides=["weights.method=nccl", "transport.weights_port=0"], environ={})
