"""Smoke test of bench/drills/fuzz.py: a few thousand fuzzed messages per socket against the real services.

The full run (100,000 per socket) is `python -m bench.drills.fuzz`; this checks that the fuzzer and the
services still agree: nothing crashes, every rejection is counted under the reason the codec gives,
nothing fuzzed is accepted, and valid traffic afterwards is served intact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def test_fuzzed_sockets_survive_count_rejections_and_still_serve(tmp_path: Path) -> None:
    report_path = tmp_path / "fuzz.json"
    argv = [sys.executable, "-m", "bench.drills.fuzz", "--messages", "2000", "--seed", "1"]
    argv += ["--json", str(report_path), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110)
    assert report_path.is_file(), proc.stdout + proc.stderr
    report = json.loads(report_path.read_text())
    by_socket = {s["socket"]: s for s in report["sockets"]}
    assert set(by_socket) == {"samples", "batches", "weights", "credits"}
    for name, s in by_socket.items():
        assert s["messages"] == 2000, name
        assert s["crashes"] == 0, f"{name}: {s['crash_detail']}"
        assert s["probes_answered"] >= 2, name
        # The service's own counters, read from its /metrics, equal what the codec says of each message.
        assert s["rejections_match_oracle"], (name, s["rejections"], s["expected_rejections"])
        assert sum(s["rejections"].values()) > 1000, name
        # Only the samples socket takes messages with arrays (groups): elsewhere a mutated groups
        # message is refused by its type before its arrays are looked at.
        reasons = {"malformed", "bad_schema"} | ({"bad_array"} if name == "samples" else set())
        assert reasons <= set(s["rejections"]), name
        assert s["after_fuzzing_ok"], (name, s["after_fuzzing"])
    for name in ("samples", "batches"):
        after = by_socket[name]["after_fuzzing"]
        # Nothing fuzzed was accepted; the valid groups sent afterwards were, once, and came back intact.
        assert after["accepted_before_check"] == 0
        assert after["accepted_total"] == after["valid_groups_sent"] == 3
        assert after["served_intact"] and after["resend_acked_as_duplicate"]
    assert by_socket["samples"]["groups_rejected"].get("wrong_group_size", 0) > 0
    assert by_socket["weights"]["after_fuzzing"]["downloaded_sha256_matches"]
    assert report["ok"], proc.stdout
