"""Two data sources in one real run of the tiny pipeline (vLLM, ZeroMQ, DeepSpeed): one scored by the
built-in verifier, one by a reward function from a user's file with a real-valued score and a budget
of its own. What the protocol guarantees is asserted, not what scheduling happens to give: the mix's
counts (exact by construction), every response of the second source within its budget, each
source's figures in the generator's final metrics, and the groups the learner trained, each once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stream_dapo.config import SyntheticTaskConfig
from stream_dapo.data.synthetic import generate_split, problem_to_row
from stream_dapo.runtime.metrics import final_metrics_path
from stream_dapo.testing.services import tiny_overrides

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info):
    """1 for the right answer line, 0.25 for a response that at least says "Answer:", else 0."""
    if f"Answer: {ground_truth}" in solution_str:
        return {"score": 1.0, "chars": len(solution_str)}
    return {"score": 0.25 if "Answer:" in solution_str else 0.0, "chars": len(solution_str)}
'''


def _rows(path: Path, data_source: str, seed: int) -> Path:
    problems = generate_split(SyntheticTaskConfig(), seed=seed, split="train", count=200)
    with path.open("w") as f:
        for i, problem in enumerate(problems):
            row = problem_to_row(problem, split="train", index=i)
            f.write(json.dumps({**row, "data_source": data_source}) + "\n")
    return path


def test_two_sources_train_in_their_proportions_each_with_its_reward(
    tmp_path: Path, warm_model: Path
) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD)
    config = tmp_path / "mix.toml"
    config.write_text(
        f"""
[[data.sources]]
name = "verified"
train_path = "{_rows(tmp_path / "a.jsonl", "arith_a", seed=11)}"
weight = 1

[[data.sources]]
name = "mine"
train_path = "{_rows(tmp_path / "b.jsonl", "arith_b", seed=12)}"
reward = "{reward}:compute_score"
weight = 1
max_response_len = 32
failure_score = 0.0
"""
    )
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--config", str(config)]
    for item in [*tiny_overrides(warm_model, out), "learner.total_steps=3"]:
        argv += ["--set", item]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((out / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}\n{logs}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups_trained_twice"] == 0 and summary["groups_trained"] >= 6  # 3 steps x 2 groups

    (cursor,) = (out / "generators").glob("*.sources.json")
    counts = json.loads(cursor.read_text())["counts"]
    assert set(counts) == {"verified", "mine"} and abs(counts["verified"] - counts["mine"]) <= 1
    assert counts["verified"] + counts["mine"] >= 6

    (final,) = (p for p in (out / "final-metrics").glob("generator-*.json"))
    assert final == final_metrics_path(out, final.stem)
    series = json.loads(final.read_text())

    def value(name: str, **labels: str) -> float:
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
        return series.get(key, 0.0)

    for source in ("verified", "mine"):
        assert value("stream_dapo_generator_source_samples_total", source=source) > 0, sorted(series)[:40]
    mine_count = value("stream_dapo_generator_source_response_length_tokens_count", source="mine")
    assert mine_count > 0
    # Its own budget: every response of "mine" within 32 tokens (the bucket edge), whatever the run's 64.
    assert (
        value("stream_dapo_generator_source_response_length_tokens_bucket", source="mine", le="32.0")
        == mine_count
    )

    # Its scores are the function's, 0, 0.25 or 1: none in (0.25, 0.75], and the sum is what those
    # counts give. The verifier's are +1 / -1: the sum is (count - at or below 0) - (at or below 0).
    def bucket(source: str, le: str) -> float:
        return value("stream_dapo_generator_source_score_bucket", source=source, le=le)

    assert bucket("mine", "0.75") == bucket("mine", "0.25")
    mine_sum = 0.25 * (bucket("mine", "0.25") - bucket("mine", "0.0")) + (mine_count - bucket("mine", "0.75"))
    assert value("stream_dapo_generator_source_score_sum", source="mine") == pytest.approx(mine_sum)
    verified_count = value("stream_dapo_generator_source_score_count", source="verified")
    wrong = bucket("verified", "0.0")
    assert value("stream_dapo_generator_source_score_sum", source="verified") == pytest.approx(
        verified_count - 2 * wrong
    )
    assert verified_count - wrong == value("stream_dapo_generator_source_correct_total", source="verified")

    groups = [
        json.loads(line)
        for p in (out / "generators").glob("*.groups.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert {g["source"] for g in groups} == {"verified", "mine"}
    means = [g["mean_score"] for g in groups if g["source"] == "mine"]
    # The mean of four scores from {0, 0.25, 1}: a multiple of 1/16 in [0, 1].
    assert means and all(0 <= x <= 1 and abs(16 * x - round(16 * x)) < 1e-4 for x in means)


def test_a_reward_file_that_does_not_import_stops_the_run_before_any_service(
    tmp_path: Path, warm_model: Path
) -> None:
    reward = tmp_path / "broken.py"
    reward.write_text("import not_a_module_anywhere\n")
    config = tmp_path / "mix.toml"
    config.write_text(
        f'[[data.sources]]\nname = "mine"\ntrain_path = "{_rows(tmp_path / "b.jsonl", "b", 3)}"\n'
        f'reward = "{reward}:compute_score"\n'
    )
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "stream_dapo.cli", "run", "--no-eval", "--quiet", "--config", str(config)]
    for item in tiny_overrides(warm_model, out):
        argv += ["--set", item]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "data.sources[mine].reward" in proc.stderr and "ModuleNotFoundError" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "logs" / "generator-0.log").exists()
