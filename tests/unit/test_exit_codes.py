"""Exit codes tell a supervisor whether a restart can help (stream_dapo/runtime/exit_codes.py)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import threading
from pathlib import Path

import pytest

from stream_dapo.cli import main
from stream_dapo.config import Config, load_config
from stream_dapo.runtime.exit_codes import ExitCode
from stream_dapo.runtime.ports import endpoint_port, read_bound_ports
from stream_dapo.testing.services import port_overrides, unserved_ports


def test_codes_are_the_documented_numbers() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 69, 130]


def test_a_config_typo_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--set", "algo.eps_hihg=0.3"]) == ExitCode.CONFIG
    assert "algo.eps_high" in capsys.readouterr().err


def test_a_generator_whose_buffer_never_answers_exits_69_and_names_the_fix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from stream_dapo.cli import generator as service

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))  # checked before the engine
    with unserved_ports(2) as (samples, weights):  # where the buffer and the learner would be
        cfg = load_config(
            overrides=[
                f"model.path={model}",
                f'run.out_dir="{tmp_path / "run"}"',
                *port_overrides(),
                f"transport.samples_port={samples}",
                f"transport.weights_port={weights}",
                "transport.timeout_s=0.5",
            ],
            environ={},
        )
        with caplog.at_level(logging.ERROR, logger="stream_dapo"):
            code = service.run(argparse.Namespace(cfg=cfg, index=0))
    assert code == ExitCode.PEER_UNAVAILABLE
    assert "start `stream-dapo buffer` first" in caplog.text


# --------------------------------------------------------------------------------------------------
# Bad data files and model paths: exit 2 with the message alone, before any service starts
# --------------------------------------------------------------------------------------------------

GOOD_ROW = {
    "prompt": [{"role": "user", "content": "What is 2 + 3?"}],
    "reward_model": {"ground_truth": "5", "style": "rule"},
}
BAD_DATA = {
    "malformed line": (
        json.dumps(GOOD_ROW) + '\n{"prompt": [\n',
        r"train\.jsonl:2: not valid JSON",
    ),
    "no prompt column": (
        json.dumps({"reward_model": GOOD_ROW["reward_model"]}) + "\n",
        r"train\.jsonl:1: missing column 'prompt'",
    ),
}


def fake_model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return path


def run_argv(model: Path, out: Path, *extra: str) -> list[str]:
    from stream_dapo.testing.services import tiny_overrides

    sets = [*tiny_overrides(model, out), *extra]
    return ["run", "--no-eval", "--quiet", *(a for s in sets for a in ("--set", s))]


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_run_checks_the_data_before_starting_anything_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    text, message = BAD_DATA[case]
    data = tmp_path / "train.jsonl"
    data.write_text(text)
    out = tmp_path / "run"
    argv = run_argv(fake_model_dir(tmp_path / "model"), out, f'data.train_path="{data}"')
    assert main(argv) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert not out.exists(), "no run directory, no service: the check comes first"


def test_a_generator_given_a_malformed_data_file_exits_2_with_the_message_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    import zmq

    from stream_dapo.cli import generator as service
    from stream_dapo.model.tiny import build_tokenizer
    from stream_dapo.transport import messages as m
    from stream_dapo.transport.sockets import open_endpoint

    model = fake_model_dir(tmp_path / "model")
    build_tokenizer().save_pretrained(model)
    data = tmp_path / "train.jsonl"
    data.write_text(BAD_DATA["malformed line"][0])
    # The buffer only has to answer the hello: prompts are loaded right after it.
    ctx = zmq.Context()
    buffer = open_endpoint(ctx, zmq.ROUTER, bind="tcp://127.0.0.1:*", max_bytes=1 << 20, peer="generator")
    cfg = load_config(
        overrides=[
            f"model.path={model}",
            f'run.out_dir="{tmp_path / "run"}"',
            f'data.train_path="{data}"',
            *port_overrides(),
            f"transport.samples_port={endpoint_port(buffer.address)}",
            "transport.weights_port=1",  # never reached: the prompts fail first
            "transport.timeout_s=10",
        ],
        environ={},
    )
    stop = threading.Event()

    def answer_hellos() -> None:
        while not stop.is_set():
            got = buffer.recv(20)
            if got is not None and got[1].type == m.HELLO:
                buffer.send(m.Credit(0, 0), to=got[0], request_id=got[1].request_id)

    thread = threading.Thread(target=answer_hellos, daemon=True)
    thread.start()
    try:
        with caplog.at_level(logging.ERROR, logger="stream_dapo"):
            code = service.run(argparse.Namespace(cfg=cfg, index=0))
    finally:
        stop.set()
        thread.join(5)
        buffer.close()
        ctx.term()
    assert code == ExitCode.CONFIG
    assert re.search(
        r"generator stopped: .*train\.jsonl:2: not valid JSON .*one JSON object per line", caplog.text
    )
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["empty directory", "missing directory"])
def test_run_refuses_a_model_path_that_holds_no_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    from stream_dapo.model import warmup

    def no_warmup(*args: object, **kwargs: object) -> None:
        raise AssertionError("a tiny model would be warmed up at a model.path that is not the default's")

    monkeypatch.setattr(warmup, "warmup", no_warmup)
    model = tmp_path / "models" / "qwen-7b"
    if kind == "empty directory":
        model.mkdir(parents=True)
    assert main(run_argv(model, tmp_path / "run")) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert f"model.path = {model}" in err and f"stream-dapo warmup --out {model}" in err
    assert "Traceback" not in err
    assert not (tmp_path / "models" / "init").exists() and not (tmp_path / "run").exists()
    assert (list(model.iterdir()) == []) if kind == "empty directory" else not model.exists()


def test_only_the_embedded_default_cache_is_built_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stream_dapo.model import warmup

    built: list[str] = []

    def fake_warmup(cfg: Config) -> argparse.Namespace:
        built.append(cfg.model.path)
        return argparse.Namespace(path=Path(cfg.model.path))

    monkeypatch.setattr(warmup, "warmup", fake_warmup)
    monkeypatch.chdir(tmp_path)
    assert warmup.is_default_model_path("runs/tiny-model/warm")
    assert warmup.is_default_model_path(tmp_path / "runs" / "tiny-model" / "warm")
    assert not warmup.is_default_model_path(tmp_path / "runs" / "tiny-model" / "other")
    cfg = load_config(overrides=["model.path=runs/tiny-model/warm"], environ={})
    assert warmup.ensure_warm_model(cfg) == Path("runs/tiny-model/warm")
    assert built == ["runs/tiny-model/warm"]


# --------------------------------------------------------------------------------------------------
# A full disk: exit 1 (the units restart on it), "no space left on <path>", no traceback
# --------------------------------------------------------------------------------------------------


def test_a_buffer_whose_disk_fills_exits_1_and_says_so_without_a_traceback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import zmq

    from stream_dapo.buffer import journal as journal_module
    from stream_dapo.buffer.journal import Journal
    from stream_dapo.cli import buffer as buffer_service
    from stream_dapo.runtime import service_runner
    from stream_dapo.transport import messages as m
    from stream_dapo.transport.sockets import open_endpoint
    from tests.unit.test_buffer_journal import FullDisk

    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    disk = FullDisk()
    monkeypatch.setattr(journal_module, "open", disk.open, raising=False)
    cfg = load_config(
        overrides=[f'run.out_dir="{tmp_path / "run"}"', *port_overrides()],
        environ={},
    )
    done = threading.Event()

    def learner_says_hello(request_stop) -> None:
        ctx = zmq.Context()
        port = read_bound_ports(tmp_path / "run", "buffer")["transport.batches_port"]  # type: ignore[index]
        learner = open_endpoint(
            ctx, zmq.DEALER, connect=f"tcp://127.0.0.1:{port}", max_bytes=1 << 20, peer="buffer"
        )
        try:
            learner.send(m.LearnerHello(0, 0))  # journalled before its reply: the write hits the full disk
            if not done.wait(30):
                request_stop()  # only when something is broken: end the test instead of hanging it
        finally:
            learner.close()
            ctx.term()

    def fill_the_disk_once_up(request_stop, *_what) -> None:  # stands in for the signal handlers
        disk.fill()
        threading.Thread(target=learner_says_hello, args=(request_stop,), daemon=True).start()

    monkeypatch.setattr(service_runner, "on_stop_signal", fill_the_disk_once_up)
    try:
        with caplog.at_level(logging.ERROR, logger="stream_dapo"):
            code = buffer_service.run(argparse.Namespace(cfg=cfg))
    finally:
        done.set()
    state = tmp_path / "run" / "buffer" / "state.msgpack"
    assert code == ExitCode.FAILURE
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"no space left on {state}.journal" in errors[0], errors
    assert "Traceback" not in capsys.readouterr().err
    assert [p.name for p in state.parent.iterdir() if "tmp" in p.name] == []
    disk.free()
    journal = Journal(state)  # the lock is released and the files load: a restart recovers
    # Only what was synced before the disk filled: the configuration the buffer stored at start.
    assert [r["kind"] for r in journal.load()] == ["config"]
    journal.close()


def test_run_with_a_port_in_use_exits_2_naming_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: a taken port made `stream-dapo run` exit 1 (a systemd restart loop), not 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tmp_path / "run"
        argv = run_argv(fake_model_dir(tmp_path / "model"), out, f"transport.batches_port={port}")
        assert main(argv) == ExitCode.CONFIG
        err = capsys.readouterr().err
        assert f"127.0.0.1:{port} (transport.batches_port) is in use" in err
    assert "--set transport.batches_port=<port>" in err and "Traceback" not in err
    assert not out.exists()
