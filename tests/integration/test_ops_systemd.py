"""ops/systemd: the units pass `systemd-analyze verify` and `security`, and keep their promises.

`systemd-analyze verify` refuses a unit whose ExecStart binary does not exist, so the units are
checked as temporary copies with `/opt/stream-dapo/.venv/bin/` pointed at stand-in executables;
everything else is verified as shipped.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from stream_dapo.config import load_config
from tests.integration.ops_helpers import require_tool

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "ops" / "systemd"
ENV_DIR = UNITS / "env"
INSTALL_BIN = "/opt/stream-dapo/.venv/bin/"
SERVICES = ("stream-dapo-buffer.service", "stream-dapo-learner.service", "stream-dapo-generator@.service")
GPU_SERVICES = SERVICES[1:]
RECIPE = ROOT / "configs" / "dapo-qwen2.5-32b.toml"


def _systemd_analyze() -> str:
    return require_tool("systemd-analyze", "apt-get install -y systemd")


def _systemd_version() -> int:
    out = subprocess.run([_systemd_analyze(), "--version"], capture_output=True, text=True, check=True).stdout
    found = re.match(r"systemd (\d+)", out)
    assert found is not None, out
    return int(found.group(1))


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (systemd keys repeat), with backslash continuations joined."""
    sections: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    section = ""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        sections[section][key.strip()].append(value.strip())
    return sections


def parse_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{path.name}: bad line {raw!r}"
        assert "#" not in value, f"{path.name}: systemd does not strip inline comments: {raw!r}"
        env[key] = value
    return env


def _seconds(span: str) -> float:
    units = {"s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+)\s*([a-z]*)", span):
        total += int(number) * units[unit or "s"]
    return total


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The units with ExecStart pointed at stand-ins, plus an instance of the generator template."""
    root = tmp_path_factory.mktemp("systemd")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name in ("stream-dapo", "torchrun"):
        exe = bin_dir / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    units = root / "units"
    units.mkdir()
    for src in sorted(UNITS.glob("*.service")) + sorted(UNITS.glob("*.target")):
        (units / src.name).write_text(src.read_text().replace(INSTALL_BIN, f"{bin_dir}/"))
    shutil.copy(units / "stream-dapo-generator@.service", units / "stream-dapo-generator@3.service")
    return units


def test_units_pass_systemd_analyze_verify(staged: Path) -> None:
    files = sorted(str(p) for p in staged.iterdir())
    proc = subprocess.run(
        [_systemd_analyze(), "verify", "--man=no", *files], capture_output=True, text=True, cwd=staged
    )
    ours = [line for line in proc.stderr.splitlines() if "stream-dapo" in line]
    assert proc.returncode == 0 and not ours, proc.stderr


@pytest.mark.parametrize(
    ("unit", "threshold"),
    [("stream-dapo-buffer.service", "2.0"), *((u, "4.0") for u in GPU_SERVICES)],
)
def test_units_stay_under_their_security_exposure(staged: Path, unit: str, threshold: str) -> None:
    name = unit.replace("@.", "@3.")
    proc = subprocess.run(
        [_systemd_analyze(), "security", "--offline=yes", f"--threshold={float(threshold) * 10:.0f}", name],
        capture_output=True,
        text=True,
        cwd=staged,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr


def test_exponential_restart_keys_only_where_systemd_knows_them() -> None:
    if _systemd_version() >= 254:
        return  # RestartSteps/RestartMaxDelaySec would be understood; verify covers the rest
    for unit in SERVICES:
        service = parse_unit(UNITS / unit)["Service"]
        assert "RestartSteps" not in service and "RestartMaxDelaySec" not in service, unit


@pytest.mark.parametrize("unit", SERVICES)
def test_services_restart_with_back_off_and_drain_on_sigterm(unit: str) -> None:
    sections = parse_unit(UNITS / unit)
    service, head = sections["Service"], sections["Unit"]
    assert service["Restart"] == ["on-failure"]
    assert _seconds(service["RestartSec"][0]) >= 5
    assert _seconds(head["StartLimitIntervalSec"][0]) >= 600 and int(head["StartLimitBurst"][0]) >= 3
    assert service["KillSignal"] == ["SIGTERM"]
    # SIGTERM to the main process only, so vLLM engines, verifier workers and torchrun's ranks are
    # stopped by the service itself, in order, rather than all at once.
    assert service["KillMode"] == ["mixed"]
    assert _seconds(service["TimeoutStopSec"][0]) >= 120
    assert head["PartOf"] == ["stream-dapo.target"]
    assert sections["Install"]["WantedBy"] == ["stream-dapo.target"]


@pytest.mark.parametrize("unit", SERVICES)
def test_services_are_hardened(unit: str) -> None:
    service = parse_unit(UNITS / unit)["Service"]
    for key, value in {
        "User": "stream-dapo",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == [value], (unit, key)
    assert "/srv/stream-dapo" in service["ReadWritePaths"]
    assert service["StateDirectory"] == ["stream-dapo"]


@pytest.mark.parametrize("unit", GPU_SERVICES)
def test_gpu_services_can_open_nvidia_devices_and_nothing_else(unit: str) -> None:
    service = parse_unit(UNITS / unit)["Service"]
    assert service.get("PrivateDevices", ["no"]) == ["no"]
    assert service["DevicePolicy"] == ["closed"]
    allowed = {v.split()[0] for v in service["DeviceAllow"]}
    assert {"char-nvidia-frontend", "char-nvidia-uvm"} <= allowed
    assert "MemoryDenyWriteExecute" not in service  # CUDA and Triton JIT need W+X pages


def test_buffer_has_no_devices() -> None:
    service = parse_unit(UNITS / "stream-dapo-buffer.service")["Service"]
    assert service["PrivateDevices"] == ["yes"]
    assert "DeviceAllow" not in service


@pytest.mark.parametrize(
    ("unit", "command"),
    [
        ("stream-dapo-buffer.service", "stream-dapo buffer --config ${STREAM_DAPO_CONFIG}"),
        ("stream-dapo-generator@.service", "stream-dapo generator --index %i --config ${STREAM_DAPO_CONFIG}"),
        ("stream-dapo-learner.service", "stream-dapo learner --config ${STREAM_DAPO_CONFIG}"),
    ],
)
def test_exec_start_runs_the_installed_cli_with_the_config_from_the_environment_file(
    unit: str, command: str
) -> None:
    service = parse_unit(UNITS / unit)["Service"]
    (exec_start,) = service["ExecStart"]
    assert exec_start.startswith(INSTALL_BIN)
    assert exec_start.endswith(INSTALL_BIN + command)
    env_files = service["EnvironmentFile"]
    name = unit.split("@")[0].split(".")[0].removeprefix("stream-dapo-")
    assert f"/etc/stream-dapo/{name}.env" in env_files, "the service's own env file must be required"
    assert "-/etc/stream-dapo/common.env" in env_files

    # Every ${VAR} the command line uses is defined by the example env files it reads.
    defined = {**parse_env_file(ENV_DIR / "common.env"), **parse_env_file(ENV_DIR / f"{name}.env")}
    for var in re.findall(r"\$\{(\w+)\}", exec_start):
        assert var in defined, f"{unit}: ExecStart uses ${{{var}}}, which ops/systemd/env/ does not set"


def test_generator_template_pins_its_gpu_and_allows_per_instance_overrides() -> None:
    service = parse_unit(UNITS / "stream-dapo-generator@.service")["Service"]
    assert "CUDA_VISIBLE_DEVICES=%i" in service["Environment"]
    # Later EnvironmentFile= entries win, so the per-instance file overrides the shared one.
    assert service["EnvironmentFile"][-1] == "-/etc/stream-dapo/generator-%i.env"


def test_learner_outlasts_torchruns_shutdown_timeout() -> None:
    service = parse_unit(UNITS / "stream-dapo-learner.service")["Service"]
    (exec_start,) = service["ExecStart"]
    found = re.search(r"--shutdown-timeout=(\d+)", exec_start)
    assert found is not None, exec_start
    torchrun_grace = int(found.group(1))
    assert torchrun_grace >= 600, "a step plus a checkpoint of a large model needs minutes"
    assert _seconds(service["TimeoutStopSec"][0]) > torchrun_grace
    assert "--max-restarts=0" in exec_start  # systemd restarts; torchrun must not hide failures


def test_stop_order_drains_generators_then_learner_then_buffer() -> None:
    # systemd stops units in the reverse of their After= order.
    gen = parse_unit(UNITS / "stream-dapo-generator@.service")["Unit"]
    learner = parse_unit(UNITS / "stream-dapo-learner.service")["Unit"]
    gen_after = " ".join(gen["After"]).split()
    assert "stream-dapo-buffer.service" in gen_after and "stream-dapo-learner.service" in gen_after
    assert "stream-dapo-buffer.service" in " ".join(learner["After"]).split()
    # Ordering only: a generator host must not start a stray buffer of its own.
    for unit in (gen, learner):
        assert "stream-dapo-buffer.service" not in " ".join(unit.get("Wants", []) + unit.get("Requires", []))


@pytest.mark.parametrize("service", ["buffer", "learner", "generator"])
def test_env_examples_resolve_with_the_recipe(service: str) -> None:
    env = {**parse_env_file(ENV_DIR / "common.env"), **parse_env_file(ENV_DIR / f"{service}.env")}
    assert env["STREAM_DAPO_CONFIG"].startswith("/etc/stream-dapo/")
    cfg = load_config([RECIPE], environ=env)
    assert cfg.transport.host == "0.0.0.0" and cfg.metrics.host == "0.0.0.0"
    assert cfg.run.out_dir.startswith("/srv/stream-dapo/"), "run dirs must be under ReadWritePaths"


def test_env_files_set_the_connect_addresses() -> None:
    env = {**parse_env_file(ENV_DIR / "common.env"), **parse_env_file(ENV_DIR / "generator.env")}
    cfg = load_config([RECIPE], environ=env)
    assert cfg.transport.buffer_host == "10.0.0.10"


@pytest.mark.parametrize("unit", SERVICES)
def test_exec_start_parses_with_torchrun_and_the_stream_dapo_cli(unit: str) -> None:
    from torch.distributed.run import get_args_parser

    from stream_dapo.cli import build_parser

    service = parse_unit(UNITS / unit)["Service"]
    name = unit.split("@")[0].split(".")[0].removeprefix("stream-dapo-")
    env = {**parse_env_file(ENV_DIR / "common.env"), **parse_env_file(ENV_DIR / f"{name}.env")}
    line = re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], service["ExecStart"][0]).replace("%i", "3")
    argv = shlex.split(line)
    if argv[0] == INSTALL_BIN + "torchrun":
        launch = get_args_parser().parse_args(argv[1:])
        assert launch.no_python and launch.max_restarts == 0
        assert (launch.nnodes, launch.node_rank) == (env["LEARNER_NNODES"], int(env["LEARNER_NODE_RANK"]))
        assert launch.nproc_per_node == env["LEARNER_NPROC_PER_NODE"]
        assert (launch.master_addr, launch.master_port) == (env["MASTER_ADDR"], int(env["MASTER_PORT"]))
        argv = [launch.training_script, *launch.training_script_args]
    assert argv[0] == INSTALL_BIN + "stream-dapo"
    args = build_parser(argv[1:]).parse_args(argv[1:])
    assert args.command == name and args.config == [env["STREAM_DAPO_CONFIG"]]
    if name == "generator":
        assert args.index == 3
