"""ops/k8s: every overlay renders with `kubectl kustomize`, every object validates offline against
Kubernetes 1.30's schemas (strict: unknown fields are errors), and the rendered workloads are
wired the way the services expect (probes, ranks, addresses, volumes, GPUs, scraping).

Commands are not just grepped: the learner's torchrun line is parsed by torchrun's own parser,
every stream-dapo command line by the stream-dapo CLI, the generator's shell wrapper is run by
/bin/sh, and each pod's environment plus the overlay's TOML is resolved by `load_config`.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_dapo.config import Config, MetricsConfig, TransportConfig, load_config
from tests.integration.ops_helpers import require_tool

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "k8s"
K8S_VERSION = "1.30.0"
OVERLAYS = {
    "base": (K8S / "base", ROOT / "configs" / "tiny-cpu.toml"),
    "cpu-demo": (K8S / "overlays" / "cpu-demo", ROOT / "configs" / "tiny-cpu.toml"),
    "gpu": (K8S / "overlays" / "gpu", ROOT / "configs" / "dapo-qwen2.5-32b.toml"),
}
WORKLOADS = {"buffer": "Deployment", "learner": "StatefulSet", "generator": "StatefulSet"}
CONFIG_PATH = "/etc/stream-dapo/config.toml"


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = require_tool("kubectl", "https://kubernetes.io/docs/tasks/tools/ (kubectl includes kustomize)")
    proc = subprocess.run([kubectl, "kustomize", str(OVERLAYS[overlay][0])], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def find(overlay: str, kind: str, name: str) -> dict[str, Any]:
    (obj,) = [d for d in render(overlay) if d["kind"] == kind and d["metadata"]["name"] == name]
    return obj


def workload(overlay: str, component: str) -> dict[str, Any]:
    return find(overlay, WORKLOADS[component], f"stream-dapo-{component}")


def container(overlay: str, component: str) -> dict[str, Any]:
    (c,) = [
        c
        for c in workload(overlay, component)["spec"]["template"]["spec"]["containers"]
        if c["name"] == component
    ]
    return c


def env_of(overlay: str, component: str) -> dict[str, str]:
    """The container's environment: envFrom ConfigMaps, then literal env values (later wins)."""
    c = container(overlay, component)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(find(overlay, "ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
    return env


def env_source(overlay: str, component: str, name: str) -> dict[str, Any]:
    (entry,) = [e for e in container(overlay, component)["env"] if e["name"] == name]
    return entry


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command/args ($$ escapes a dollar)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


# --------------------------------------------------------------------------------------------------
# Schema validation
# --------------------------------------------------------------------------------------------------


def _check_podmonitor(obj: dict[str, Any], overlay: str) -> None:
    """PodMonitor is a prometheus-operator CRD, absent from kubernetes-validate's schemas: check the
    fields the operator reads, and that it selects every workload's pods on a real port."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    allowed_spec = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
    assert set(obj["spec"]) <= allowed_spec
    selector = obj["spec"]["selector"]["matchLabels"]
    endpoints = obj["spec"]["podMetricsEndpoints"]
    allowed_endpoint = {
        "port",
        "path",
        "interval",
        "scrapeTimeout",
        "relabelings",
        "metricRelabelings",
        "scheme",
    }
    allowed_relabel = {
        "sourceLabels",
        "separator",
        "regex",
        "targetLabel",
        "replacement",
        "action",
        "modulus",
    }
    for ep in endpoints:
        assert set(ep) <= allowed_endpoint, ep
        for rule in ep.get("relabelings", []):
            assert set(rule) <= allowed_relabel, rule
            assert rule.get("action", "replace") in {
                "replace",
                "keep",
                "drop",
                "labelmap",
                "labeldrop",
                "labelkeep",
            }
            re.compile(rule.get("regex", "(.*)"))
    for component in WORKLOADS:
        labels = workload(overlay, component)["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"the PodMonitor does not select the {component} pods"
        ports = {p["name"] for p in container(overlay, component)["ports"]}
        assert {ep["port"] for ep in endpoints} <= ports, component


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_object_validates_against_kubernetes_schemas(overlay: str) -> None:
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is missing: `pip install kubernetes-validate` (the `dev` extra)")
    checked = 0
    for obj in render(overlay):
        if obj["kind"] == "PodMonitor":
            _check_podmonitor(obj, overlay)
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
        checked += 1
    assert checked >= 10


def test_strict_validation_catches_a_misspelt_field() -> None:
    import kubernetes_validate

    broken = yaml.safe_load(yaml.safe_dump(workload("base", "generator")))
    probe = broken["spec"]["template"]["spec"]["containers"][0].pop("readinessProbe")
    broken["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = probe
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_prometheus_operator_objects_only_where_the_component_is_used() -> None:
    assert [d for d in render("gpu") if d["kind"] == "PodMonitor"]
    for overlay in ("base", "cpu-demo"):  # clusters without the operator's CRDs
        assert not [d for d in render(overlay) if d["apiVersion"].startswith("monitoring.coreos.com")]


# --------------------------------------------------------------------------------------------------
# Configuration: the copies of configs/, and each pod's environment resolved by load_config
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_configmap_holds_the_recipe_unchanged(overlay: str) -> None:
    (cm,) = [
        d
        for d in render(overlay)
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("stream-dapo-config")
    ]
    assert cm["data"]["config.toml"] == OVERLAYS[overlay][1].read_text(), (
        f"the {overlay} ConfigMap drifted from {OVERLAYS[overlay][1].name}: copy configs/ into ops/k8s again"
    )


def resolved_config(overlay: str, component: str, overrides: Iterable[str] = ()) -> Config:
    return load_config([OVERLAYS[overlay][1]], overrides, environ=env_of(overlay, component))


@pytest.mark.parametrize("overlay", list(OVERLAYS))
@pytest.mark.parametrize("component", list(WORKLOADS))
def test_pod_environment_resolves_and_matches_the_topology(overlay: str, component: str) -> None:
    cfg = resolved_config(overlay, component)
    assert cfg.transport.host == "0.0.0.0" and cfg.metrics.host == "0.0.0.0"
    generators = workload(overlay, "generator")["spec"]["replicas"]
    env = env_of(overlay, component)
    if component == "buffer":  # credits are leases: the buffer serves whatever generators connect
        assert "STREAM_DAPO__GENERATOR__NUM_GENERATORS" not in env
    else:
        assert cfg.generator.num_generators == generators, "generator.num_generators must equal the replicas"
    # The connect addresses name the Services that exist in the rendered output.
    services = {d["metadata"]["name"] for d in render(overlay) if d["kind"] == "Service"}
    assert env["STREAM_DAPO__TRANSPORT__BUFFER_HOST"] in services
    pod, service = env["STREAM_DAPO__TRANSPORT__LEARNER_HOST"].split(".")
    assert pod == "stream-dapo-learner-0" and service in services


def test_curve_is_on_in_the_gpu_overlay_and_each_role_mounts_only_its_keys() -> None:
    for component in WORKLOADS:
        assert env_of("gpu", component)["STREAM_DAPO__TRANSPORT__CURVE_DIR"] == "/etc/stream-dapo/curve"
        assert "STREAM_DAPO__TRANSPORT__CURVE_DIR" not in env_of("cpu-demo", component)

    def files(component: str) -> set[str]:
        (vol,) = [
            v
            for v in workload("gpu", component)["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "curve"
        ]
        assert vol["secret"]["secretName"] == "stream-dapo-curve"
        return {item["path"] for item in vol["secret"]["items"]}

    assert files("buffer") == {"server.key", "server.key_secret", "clients/client.key"}
    assert files("generator") == {"server.key", "client.key", "client.key_secret"}
    assert {"server.key_secret", "client.key_secret", "clients/client.key"} <= files("learner")
    assert not [d for d in render("gpu") if d["kind"] == "Secret"], "keys are never rendered from the repo"


# --------------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------------


def _generator_argv(overlay: str, index: int, tmp_path: Path) -> list[str]:
    """Run the container's shell command with a stand-in `stream-dapo` that prints its argv."""
    c = container(overlay, "generator")
    assert c["command"] == ["/bin/sh", "-c"]
    env = {**env_of(overlay, "generator"), "POD_INDEX": str(index)}
    script = k8s_expand(c["args"][0], env)
    stub = tmp_path / "stream-dapo"
    stub.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    stub.chmod(0o755)
    out = subprocess.run(
        ["/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        env={**env, "PATH": f"{tmp_path}:/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    return ["stream-dapo", *out.stdout.splitlines()]


@pytest.mark.parametrize("overlay", ["cpu-demo", "gpu"])
def test_generator_index_is_the_pod_ordinal_and_metrics_land_on_the_probed_port(
    overlay: str, tmp_path: Path
) -> None:
    from stream_dapo.cli import build_parser

    source = env_source(overlay, "generator", "POD_INDEX")["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "metadata.labels['apps.kubernetes.io/pod-index']"
    metrics_port = next(
        p["containerPort"] for p in container(overlay, "generator")["ports"] if p["name"] == "metrics"
    )
    assert metrics_port == MetricsConfig().generator_port
    replicas = workload(overlay, "generator")["spec"]["replicas"]
    for index in sorted({0, replicas - 1}):
        argv = _generator_argv(overlay, index, tmp_path)
        args = build_parser(argv[1:]).parse_args(argv[1:])
        assert args.command == "generator" and args.index == index and args.config == [CONFIG_PATH]
        cfg = resolved_config(overlay, "generator", args.overrides)
        assert cfg.metrics.generator_port + index == metrics_port, "generator i serves generator_port + i"


PROBE_PATHS = {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_every_service_has_health_probes_on_its_metrics_port(overlay: str) -> None:
    """Readiness and startup ask /readyz, liveness asks /livez: a generator whose buffer is away is
    taken out of service but not restarted."""
    for component in ("buffer", "generator"):
        c = container(overlay, component)
        for probe, path in PROBE_PATHS.items():
            assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, (component, probe)
        # A slow start (model load, waiting for the learner's first weights) must not be killed.
        start = c["startupProbe"]
        assert start["periodSeconds"] * start["failureThreshold"] >= 300
    # Learner: only node rank 0 serves HTTP, so its probe asks rank 0 and passes elsewhere.
    c = container(overlay, "learner")
    port = MetricsConfig().learner_port
    for probe, path in PROBE_PATHS.items():
        command = c[probe]["exec"]["command"]
        assert f"http://127.0.0.1:{port}{path}" in command[-1] and "NODE_RANK" in command[-1]


@pytest.mark.parametrize("probe_name", ["readinessProbe", "livenessProbe"])
def test_learner_probe_follows_rank_0_health_and_passes_on_other_ranks(probe_name: str) -> None:
    """The probe script run against a real metrics server (stream_dapo.runtime.metrics) on a free port."""
    import sys

    from stream_dapo.runtime.metrics import start_metrics

    command = container("base", "learner")[probe_name]["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    _, health, server = start_metrics("127.0.0.1", 0, stall_after_s=60.0)
    try:
        script = command[2].replace(f":{MetricsConfig().learner_port}/", f":{server.port}/")

        def probe(rank: str) -> int:
            return subprocess.run(
                [sys.executable, "-c", script], env={"NODE_RANK": rank}, capture_output=True
            ).returncode

        assert probe("1") == 0, "other ranks serve no HTTP and must pass"
        if probe_name == "readinessProbe":
            assert probe("0") != 0, "rank 0 not ready yet: /readyz answers 503"
            health.ready = True
        else:
            assert probe("0") == 0, "a live rank 0 that is not ready yet must not be restarted"
            health.last_progress -= 120.0
            assert probe("0") != 0, "rank 0 stalled for longer than stall_after_s: /livez answers 503"
            health.beat()
        assert probe("0") == 0
    finally:
        server.stop()


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_pods_drain_on_sigterm_within_a_grace_period(overlay: str) -> None:
    grace = {
        c: workload(overlay, c)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        for c in WORKLOADS
    }
    timeout = TransportConfig().timeout_s
    assert grace["generator"] >= 2 * timeout + 60, "generators drain for up to 2 x transport.timeout_s"
    assert grace["buffer"] >= 60
    assert grace["learner"] >= 900, "the learner finishes its step and checkpoints"
    for component in WORKLOADS:
        assert "lifecycle" not in container(overlay, component), "SIGTERM itself starts the drain"


# --------------------------------------------------------------------------------------------------
# Learner
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_learner_is_a_torchrun_job_ranked_by_pod_ordinal(overlay: str) -> None:
    from torch.distributed.run import get_args_parser

    from stream_dapo.cli import build_parser

    sts = workload(overlay, "learner")
    spec = sts["spec"]
    service = find(overlay, "Service", spec["serviceName"])
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert spec["podManagementPolicy"] == "Parallel", "ranks must start together to rendezvous"

    env = env_of(overlay, "learner")
    source = env_source(overlay, "learner", "NODE_RANK")["valueFrom"]["fieldRef"]["fieldPath"]
    assert source == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert env["MASTER_ADDR"] == f"{sts['metadata']['name']}-0.{spec['serviceName']}"
    assert int(env["NNODES"]) == spec["replicas"], "NNODES must follow the replica count"

    c = container(overlay, "learner")
    assert c["command"] == ["torchrun"]
    args = [k8s_expand(a, {**env, "NODE_RANK": "0"}) for a in c["args"]]
    launch = get_args_parser().parse_args(args)
    assert launch.nnodes == env["NNODES"] and launch.node_rank == 0
    assert launch.nproc_per_node == env["NPROC_PER_NODE"]
    assert launch.master_addr == env["MASTER_ADDR"] and launch.master_port == int(env["MASTER_PORT"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["rendezvous"] == launch.master_port
    assert launch.no_python and launch.max_restarts == 0
    assert launch.shutdown_timeout < spec["template"]["spec"]["terminationGracePeriodSeconds"]
    cli = [launch.training_script, *launch.training_script_args]
    parsed = build_parser(cli[1:]).parse_args(cli[1:])
    assert cli[0] == "stream-dapo" and parsed.command == "learner" and parsed.config == [CONFIG_PATH]

    cfg = resolved_config(overlay, "learner")
    assert ports["weights"] == cfg.transport.weights_port and ports["metrics"] == cfg.metrics.learner_port
    assert ports["weights-nccl"] == cfg.transport.nccl_port  # weights.nccl's store port
    svc_ports = {p["name"] for p in service["spec"]["ports"]}
    assert {"rendezvous", "weights", "weights-nccl", "metrics"} <= svc_ports


def test_gpu_overlay_sizes_ranks_and_gpus_from_the_recipe() -> None:
    recipe = tomllib.loads(OVERLAYS["gpu"][1].read_text())
    learner, gen = container("gpu", "learner"), container("gpu", "generator")
    env = env_of("gpu", "learner")
    assert int(env["NNODES"]) == workload("gpu", "learner")["spec"]["replicas"] == 2
    assert gen["resources"]["limits"]["nvidia.com/gpu"] == str(recipe["generator"]["tensor_parallel_size"])
    assert learner["resources"]["limits"]["nvidia.com/gpu"] == env["NPROC_PER_NODE"] == "8"
    assert workload("gpu", "generator")["spec"]["replicas"] == recipe["generator"]["num_generators"]
    for component in ("learner", "generator"):
        pod = workload("gpu", component)["spec"]["template"]["spec"]
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
        mounts = {m["mountPath"] for m in container("gpu", component)["volumeMounts"]}
        assert {"/models", "/data", "/dev/shm"} <= mounts
        cfg = resolved_config("gpu", component)
        assert cfg.data.train_path is not None
        assert cfg.model.path.startswith("/models/") and cfg.data.train_path.startswith("/data/")
    for overlay in ("base", "cpu-demo"):
        for component in WORKLOADS:
            assert "nvidia.com/gpu" not in str(container(overlay, component)["resources"])


# --------------------------------------------------------------------------------------------------
# Buffer, storage, scraping
# --------------------------------------------------------------------------------------------------


def _mounts(overlay: str, component: str) -> dict[str, str]:
    """mountPath -> claimName for the PVC-backed mounts of a workload."""
    pod = workload(overlay, component)["spec"]["template"]["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in pod["volumes"]
        if "persistentVolumeClaim" in v
    }
    return {
        m["mountPath"]: claims[m["name"]]
        for m in container(overlay, component)["volumeMounts"]
        if m["name"] in claims
    }


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_buffer_is_a_single_recreated_pod_with_its_state_on_a_volume(overlay: str) -> None:
    deploy = workload(overlay, "buffer")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    cfg = resolved_config(overlay, "buffer")
    persist_path = cfg.buffer.persist_path
    assert persist_path is not None
    claims = {d["metadata"]["name"] for d in render(overlay) if d["kind"] == "PersistentVolumeClaim"}
    state_mount = [path for path in _mounts(overlay, "buffer") if persist_path.startswith(path + "/")]
    assert state_mount, "buffer.persist_path must be on a PVC"
    assert _mounts(overlay, "buffer")[state_mount[0]] in claims
    svc = find(overlay, "Service", "stream-dapo-buffer")
    ports = {p["name"]: p["port"] for p in svc["spec"]["ports"]}
    assert ports["samples"] == cfg.transport.samples_port and ports["batches"] == cfg.transport.batches_port
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_checkpoints_and_weights_live_on_persistent_volumes(overlay: str) -> None:
    learner = _mounts(overlay, "learner")
    cfg = resolved_config(overlay, "learner")
    out_mount = [p for p in learner if cfg.run.out_dir.startswith(p + "/")]
    assert out_mount and learner[out_mount[0]] == "stream-dapo-checkpoints", "checkpoints go to run.out_dir"
    shared = cfg.weights.shared_dir
    assert shared is not None
    for component in ("learner", "generator"):
        mounts = _mounts(overlay, component)
        assert any(shared.startswith(p + "/") and c == "stream-dapo-weights" for p, c in mounts.items()), (
            component
        )
    pvcs = {d["metadata"]["name"]: d for d in render(overlay) if d["kind"] == "PersistentVolumeClaim"}
    if workload(overlay, "learner")["spec"]["replicas"] > 1:
        assert pvcs["stream-dapo-checkpoints"]["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_pods_carry_prometheus_scrape_annotations_for_their_metrics_port(overlay: str) -> None:
    for component in WORKLOADS:
        notes = workload(overlay, component)["spec"]["template"]["metadata"]["annotations"]
        port = next(
            p["containerPort"] for p in container(overlay, component)["ports"] if p["name"] == "metrics"
        )
        assert notes == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics",
        }


def test_podmonitor_job_names_match_the_alert_rules() -> None:
    (monitor,) = [d for d in render("gpu") if d["kind"] == "PodMonitor"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (job_rule,) = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    alerts = (ROOT / "ops" / "prometheus" / "alerts.yml").read_text()
    for component in WORKLOADS:
        job = job_rule["replacement"].replace("$1", component)
        assert f'job="{job}"' in alerts
    (drop,) = [r for r in endpoint["relabelings"] if r.get("action") == "drop"]
    pattern = re.compile(f"^(?:{drop['regex']})$")
    assert pattern.match("learner;1") and pattern.match("learner;12")
    assert not pattern.match("learner;0") and not pattern.match("generator;3")


@pytest.mark.parametrize("overlay", list(OVERLAYS))
def test_pods_run_unprivileged_with_a_read_only_root(overlay: str) -> None:
    for obj in render(overlay):
        template = obj.get("spec", {}).get("template")
        if not template:
            continue
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["image"] != "stream-dapo", "the images transformer must pin every container's image"


def test_cpu_demo_warms_the_model_up_before_learner_and_generators_start() -> None:
    job = find("cpu-demo", "Job", "stream-dapo-warmup")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    from stream_dapo.cli import build_parser

    parsed = build_parser(c["command"][1:]).parse_args(c["command"][1:])
    assert c["command"][0] == "stream-dapo" and parsed.command == "warmup"
    model_path = resolved_config("cpu-demo", "generator").model.path
    for component in ("learner", "generator"):
        (init,) = workload("cpu-demo", component)["spec"]["template"]["spec"]["initContainers"]
        assert f"{model_path}/config.json" in init["args"][0]
