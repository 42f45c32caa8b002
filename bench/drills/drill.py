"""Fault drill: a short real run that loses each service to `kill -9` in turn and recovers.

    .venv/bin/python -m bench.drills.drill [--model DIR] [--out DIR] [--json OUT]

Buffer, learner and one generator run as separate processes on the tiny model (as systemd would
start them). Mid-run the generator, then the learner (after a checkpoint), then the buffer are
killed with SIGKILL and restarted, and the run is stopped as `stream-dapo run` stops it (SIGTERM,
drain order). The report: per service, when it was killed, seconds from the
restart to ready and to recovered, and the downtime; then every group the buffer acknowledged,
accounted for from its persisted state and the learner's trained-group log: trained, trained twice
(must be 0), still held, dropped as stale, lost (must be 0). stream_dapo/testing/drills.py defines each
figure; tests/integration/test_faults.py runs the same drill and asserts on it.

With `--elastic` it runs the elastic-fleet drill instead (stream_dapo/testing/drills.py `ElasticDrill`): 1 -> 3
-> 1 generators during one run (one leaves by SIGTERM to its process group, one by kill -9), then the last one replaced by
a generator with a new index; per change, the seconds until the newcomers delivered or the
departed generator's credits were back in the admission line, then the same group accounting.

It starts vLLM and DeepSpeed: a few minutes on two CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import save_json  # noqa: E402
from stream_dapo.testing.drills import LEASE_S, DrillReport, ElasticDrill, FaultDrill  # noqa: E402


def warm_model(path: Path | None) -> Path:
    """The given model directory as it is, else the embedded default's warm tiny model (built once)."""
    if path is not None:
        return path.resolve()
    default = REPO / "runs" / "tiny-model" / "warm"
    if (default / "config.json").is_file():
        return default
    from stream_dapo.config import load_config
    from stream_dapo.model.warmup import ensure_warm_model

    cfg = load_config([REPO / "configs" / "tiny-cpu.toml"], [f"model.path={default}"], environ={})
    return ensure_warm_model(cfg)


def print_report(report: DrillReport) -> None:
    print()
    print(
        f"{'service':<10} {'killed at step':>14} {'restart->ready s':>16} {'restart->recovered s':>20} {'downtime s':>10}"
    )
    for r in report.recoveries:
        print(
            f"{r.service:<10} {r.killed_at_step:>14} {r.restart_to_ready_s:>16.1f} "
            f"{r.restart_to_recovered_s:>20.1f} {r.downtime_s:>10.1f}"
        )
    print()
    print(
        f"groups acknowledged {report.groups_acknowledged}, trained {report.groups_trained}, "
        f"lost {report.groups_lost}, trained twice {report.groups_trained_twice}, still held "
        f"{report.groups_still_held}, dropped stale {report.groups_dropped_stale}"
    )
    print(
        f"learner versions {report.trained_versions[0] if report.trained_versions else '-'}.."
        f"{report.trained_versions[-1] if report.trained_versions else '-'} "
        f"({len(report.trained_versions)} steps), exit code {report.learner_exit_code}, max staleness trained "
        f"{report.max_staleness_trained} (bound {report.max_staleness_allowed})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="model directory (default: the cached warm tiny model)")
    parser.add_argument("--out", type=Path, help="run directory, must not exist (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--elastic", action="store_true", help="the elastic-fleet drill instead")
    args = parser.parse_args()
    if args.elastic:
        return elastic(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="stream-dapo-drill-")) / "run"
    report = FaultDrill(warm_model(args.model), out).run()
    print_report(report)
    print(f"run directory: {out}")
    steps = len(report.trained_versions)  # the drill stops the run (SIGTERM) once its kills are done
    return _verdict(report.to_json(), report, steps, out, args.json)


def _verdict(data: dict[str, Any], drill: DrillReport, steps: int, out: Path, json_path: Path | None) -> int:
    """Exit code 0 iff no group was lost or trained twice, the learner exited 0 and it trained
    versions 1..steps, each once; the report (``data`` with the verdict) goes to ``json_path``."""
    data["run_dir"] = str(out)
    data["ok"] = (
        drill.groups_lost == 0
        and drill.groups_trained_twice == 0
        and drill.learner_exit_code == 0
        and drill.trained_versions == list(range(1, steps + 1))
    )
    save_json(json_path, data)
    return 0 if data["ok"] else 1


def elastic(args: argparse.Namespace) -> int:
    out = args.out or Path(tempfile.mkdtemp(prefix="stream-dapo-elastic-")) / "run"
    report = ElasticDrill(warm_model(args.model), out).run()
    print(f"\nlease {LEASE_S:.0f} s (buffer.generator_lease_s), heartbeat every 1 s")
    print(f"{'event':<42} {'at step':>8} {'to delivering s':>16} {'credits held':>13} {'to reclaimed s':>15}")
    for e in report.events:
        cells = [
            e[k] if e[k] is not None else "-"
            for k in ("to_delivering_s", "credits_at_departure", "to_reclaimed_s")
        ]
        print(f"{e['event']:<42} {e['at_step']:>8} {cells[0]:>16} {cells[1]:>13} {cells[2]:>15}")
    print_report(report.drill)
    steps = len(report.drill.trained_versions)  # the elastic drill runs until its events are done
    drained = [e for e in report.events if "SIGTERM" in e["event"]]
    for e in drained:
        print(f"{e['event']}: exit code {e['exit_code']}")
    code = _verdict(report.to_json(), report.drill, steps, out, args.json)
    return code or int(any(e["exit_code"] != 0 for e in drained))  # a SIGTERM is a drain: exit 0


if __name__ == "__main__":
    sys.exit(main())
