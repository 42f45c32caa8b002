"""Rewards a user brings: verl's compute_score from a file or a module, run in the verifier pool.

Every failure of a user's function (an exception, a hang, a crash of its worker, NaN, a non-number)
gives the sample its reward's failure score with a named reason, and the pool goes on scoring.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from stream_dapo.data.sources import DataSource
from stream_dapo.errors import ConfigError
from stream_dapo.rewards.probe import probe_rewards
from stream_dapo.rewards.scorers import load_user_function, result_of_user_value
from stream_dapo.rewards.spec import RewardSpec, parse_reward
from stream_dapo.verifier.pool import ScoreItem, VerifierPool

USER_FILE = '''
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    """verl's signature: the fraction of the gold's words found, a dict with a second figure."""
    words = ground_truth.split()
    found = sum(w in solution_str for w in words)
    return {"score": found / len(words), "words": len(words), "note": "ignored, not a number"}

def by_source(data_source, solution_str, ground_truth, extra_info):
    return 2.0 if data_source == "mine" and extra_info.get("bonus") else 0.25

def raises(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("no such field")

def nan(data_source, solution_str, ground_truth, extra_info):
    return math.nan

def junk(data_source, solution_str, ground_truth, extra_info):
    return "high"

def no_score(data_source, solution_str, ground_truth, extra_info):
    return {"value": 1.0}

def hangs(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        time.sleep(3600)
    return 1

def crashes(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "crash":
        os._exit(3)
    return -0.5

def kwargs_only(**kwargs):
    return len(kwargs["solution_str"])

def two_args(a, b):
    return 0.0

async def coroutine(data_source, solution_str, ground_truth, extra_info):
    return 1.0

NOT_A_FUNCTION = 3
'''


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FILE)
    return path


def spec(path: Path, name: str, **settings: object) -> RewardSpec:
    return parse_reward(f"python:{path}:{name}", setting="data.sources[mine].reward", **settings)


def test_reward_names_parse_to_their_kind() -> None:
    assert parse_reward("math").kind == "math"
    assert parse_reward("math-verify").kind == "math-verify"
    assert parse_reward("code").kind == "code"
    file_spec = parse_reward("rewards/mine.py:compute_score")
    assert (file_spec.kind, file_spec.target, file_spec.function) == (
        "python",
        "rewards/mine.py",
        "compute_score",
    )
    assert parse_reward("python:rewards/mine.py:f").target == "rewards/mine.py"
    module_spec = parse_reward("my_pkg.rewards:score")
    assert (module_spec.target, module_spec.function) == ("my_pkg.rewards", "score")
    for bad in ("", "mathh", "file.py", "file.py:", "a b:c", "dir/file.txt:f", "mod:1f"):
        with pytest.raises(ConfigError, match="reward"):
            parse_reward(bad)


def test_what_a_user_function_returns_becomes_a_score_or_a_named_failure() -> None:
    s = RewardSpec(kind="python", target="x.py", function="f", failure_score=-2.0)
    assert result_of_user_value(0.75, s).reward == 0.75
    assert result_of_user_value(True, s).reward == 1.0
    assert result_of_user_value(np.float32(0.5), s).reward == 0.5
    with_extras = result_of_user_value({"score": -0.25, "format": 1, "flag": True, "name": "x"}, s)
    assert (with_extras.reward, with_extras.extras, with_extras.reason) == (-0.25, {"format": 1.0}, "scored")
    assert not with_extras.correct  # score > 0 is correct for a user's function by default
    assert result_of_user_value(0.01, s).correct
    for value, reason in (
        (math.nan, "reward_nan"),
        (math.inf, "reward_nan"),
        ("1", "reward_not_number"),
        (None, "reward_not_number"),
        ({"value": 1}, "reward_not_number"),
        ([1.0], "reward_not_number"),
    ):
        result = result_of_user_value(value, s)
        assert (result.reward, result.reason, result.correct) == (-2.0, reason, False)


def test_a_threshold_decides_what_counts_as_correct() -> None:
    s = RewardSpec(kind="python", target="x.py", function="f", correct_threshold=0.5)
    assert [result_of_user_value(v, s).correct for v in (0.49, 0.5, 0.9)] == [False, True, True]


def test_loading_names_the_setting_and_the_fix(user_file: Path, tmp_path: Path) -> None:
    assert load_user_function(spec(user_file, "compute_score"))("s", "a b", "a b c", {})["score"] == 2 / 3
    kwargs_only = load_user_function(spec(user_file, "kwargs_only"))
    assert kwargs_only(data_source="s", solution_str="abc", ground_truth="g", extra_info={}) == 3
    cases = {
        "missing": "has no 'missing' (its functions: ",
        "two_args": "cannot be called as compute_score(data_source, solution_str, ground_truth, extra_info)",
        "coroutine": "is `async def`",
        "NOT_A_FUNCTION": "is a int, not a function",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError, match="data.sources\\[mine\\].reward") as info:
            load_user_function(spec(user_file, name))
        assert message in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_user_function(spec(tmp_path / "nope.py", "f"))
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(ConfigError, match="importing .*broken.py raised ModuleNotFoundError"):
        load_user_function(spec(broken, "f"))
    with pytest.raises(ConfigError, match="module 'no_such_pkg.rewards' cannot be imported"):
        load_user_function(parse_reward("no_such_pkg.rewards:f"))


def test_a_module_reward_is_found_on_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "team_rewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "gsm.py").write_text(
        "def score(data_source, solution_str, ground_truth, extra_info):\n    return 0.5\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_user_function(parse_reward("team_rewards.gsm:score"))("", "", "", {}) == 0.5


@pytest.mark.process
@pytest.mark.timeout(120)
def test_the_pool_runs_each_items_reward_and_contains_every_failure(user_file: Path) -> None:
    rewards = {
        "words": spec(user_file, "compute_score"),
        "mine": spec(user_file, "by_source"),
        "raises": spec(user_file, "raises", failure_score=-3.0),
        "nan": spec(user_file, "nan"),
        "junk": spec(user_file, "junk"),
        "no_score": spec(user_file, "no_score"),
        "hangs": spec(user_file, "hangs", timeout_s=1.0, failure_score=-5.0),
        "crashes": spec(user_file, "crashes"),
    }
    items = [
        ScoreItem("words", "a c", "a b c d", "src", {}),
        ScoreItem("mine", "x", "g", "mine", {"bonus": True}),
        ScoreItem("mine", "x", "g", "other", {"bonus": True}),
        ScoreItem("raises", "x", "g"),
        ScoreItem("nan", "x", "g"),
        ScoreItem("junk", "x", "g"),
        ScoreItem("no_score", "x", "g"),
        ScoreItem("hangs", "hang", "g"),
        ScoreItem("hangs", "fine", "g"),
        ScoreItem("crashes", "crash", "g"),
        ScoreItem("crashes", "fine", "g"),
        ScoreItem("default", "Answer: 7", "7"),
    ]
    with VerifierPool(num_workers=2, rewards=rewards) as pool:
        results = pool.score_batch(items)
        counters = pool.counters
        again = pool.score_batch([ScoreItem("words", "a b c d", "a b c d")])  # workers were replaced
    got = [(r.reward, r.reason) for r in results]
    assert got == [
        (0.5, "scored"),
        (2.0, "scored"),
        (0.25, "scored"),
        (-3.0, "reward_error"),
        (-1.0, "reward_nan"),
        (-1.0, "reward_not_number"),
        (-1.0, "reward_not_number"),
        (-5.0, "timeout"),
        (1.0, "scored"),
        (-1.0, "worker_crashed"),
        (-0.5, "scored"),
        (1.0, "exact"),
    ]
    assert results[0].extras == {"words": 4.0}
    assert "KeyError" in str(results[3].extracted)
    assert counters["scored"] == 5 and counters["timeout"] == 1 and counters["worker_crashed"] == 1
    assert [(r.reward, r.reason) for r in again] == [(1.0, "scored")]


@pytest.mark.process
@pytest.mark.timeout(120)
def test_a_reward_that_cannot_load_stops_the_pool_with_its_message(user_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"data.sources\[mine\].reward: .* has no 'missing'"):
        VerifierPool(num_workers=1, rewards={"mine": spec(user_file, "missing")})


@pytest.mark.process
@pytest.mark.timeout(120)
def test_the_start_up_probe_calls_each_function_once_on_its_first_row(
    user_file: Path, tmp_path: Path
) -> None:
    rows = tmp_path / "rows.jsonl"
    row = {
        "prompt": [{"role": "user", "content": "q"}],
        "reward_model": {"ground_truth": "a b"},
        "data_source": "mine",
        "extra_info": {"bonus": True},
    }
    rows.write_text(json.dumps(row) + "\n")

    def source(name: str, fn: str, **settings: object) -> DataSource:
        return DataSource(name, str(rows), None, spec(user_file, fn, **settings))

    good = [source("words", "compute_score"), source("mine", "by_source")]
    bad = {
        "raises": "it raised KeyError: 'no such field'",
        "junk": "it returned str 'high', which is not a number",
        "hangs": None,
    }
    with VerifierPool(num_workers=1, rewards={s.name: s.reward for s in good}) as pool:
        probe_rewards(pool, good)  # low scores for an empty response are fine
    for name, message in bad.items():
        sources = [source(name, name, timeout_s=1.0)]
        with VerifierPool(num_workers=1, rewards={name: sources[0].reward}) as pool:
            if message is None:  # "hangs" returns at once for an empty response
                probe_rewards(pool, sources)
                continue
            with pytest.raises(ConfigError, match=r"data.sources\[" + name + r"\].reward = python:") as info:
                probe_rewards(pool, sources)
            assert message in str(info.value) and str(rows) in str(info.value)


def test_user_file_example_is_verls_shape() -> None:
    """The example the docs point at keeps verl's signature and returns a dict with a score."""
    path = Path(__file__).resolve().parents[2] / "examples" / "rewards" / "length_budget.py"
    fn = load_user_function(parse_reward(f"{path}:compute_score"))
    short = fn("word_problems", "So 3 + 4 = 7.\nAnswer: 7", "7", {})
    wrong = fn("word_problems", "Answer: 8", "7", {})
    rambling = fn("word_problems", "word " * 400 + "\nAnswer: 7", "7", {})
    assert short["score"] == 1.0 and wrong["score"] == -1.0
    assert rambling["score"] == 0.0 and rambling["words"] == 402  # correct, but 342 words over 60
    half = fn("word_problems", "word " * 88 + "\nAnswer: 7", "7", {})  # 90 words: 30 over the 60
    assert half["score"] == 0.5
    assert fn("word_problems", "word " * 88 + "\nAnswer: 7", "7", {"word_budget": 100})["score"] == 1.0


@pytest.mark.process
@pytest.mark.timeout(300)
def test_the_code_reward_in_the_pool_contains_hostile_programs_and_goes_on() -> None:
    """The verifier pool, as a generator uses it: a fork bomb, a program that kills its parents, one
    that sleeps past the wall limit and one that floods stdout each score the failure score with a
    named reason, and the same pool then scores a correct program 1."""
    from stream_dapo.config.schema import CodeSandboxConfig, VerifierConfig
    from stream_dapo.config.sources import code_options
    from stream_dapo.data.humaneval import load_problems

    problem = load_problems()[2]  # truncate_number: return number % 1.0
    gold = json.dumps({"entry_point": problem["entry_point"], "test": problem["test"]})
    good = f"```python\n{problem['prompt']}{problem['canonical_solution']}\n```"
    verifier = VerifierConfig(code=CodeSandboxConfig(wall_s=3.0, cpu_s=2, max_processes=8))
    code = parse_reward("code", code=code_options(verifier), timeout_s=60.0, failure_score=-1.0)
    partial = parse_reward("code", code=code_options(verifier), timeout_s=60.0, partial_credit=True)
    hostile = {
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
        "kill_parents": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill(-1, signal.SIGKILL)\n",
        "sleeps": "import time\ntime.sleep(3600)\n",
        "floods": "while True:\n    print('x' * 1000)\n",
        "exits_early": "import sys\nsys.exit(0)\n",
    }
    items = [ScoreItem("code", f"```python\n{src}```", gold) for src in hostile.values()]
    apps = json.dumps({"inputs": ["1 2\n", "3 4\n", "5 5\n"], "outputs": ["3\n", "7\n", "11\n"]})
    adder = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    with VerifierPool(num_workers=1, rewards={"code": code, "partial": partial}) as pool:
        results = pool.score_batch(
            [
                *items,
                ScoreItem("code", good, gold),
                ScoreItem("partial", adder, apps),
                ScoreItem("code", adder, apps),
            ]
        )
    verdicts = dict(zip(hostile, results, strict=False))
    assert all(r.reward == -1.0 and not r.correct for r in verdicts.values()), verdicts
    assert verdicts["sleeps"].reason == "code_timeout" and verdicts["floods"].reason == "code_output_limit"
    assert verdicts["exits_early"].reason == "code_early_exit"
    good_result, partial_result, strict_result = results[len(hostile) :]
    assert (good_result.reward, good_result.reason, good_result.correct) == (1.0, "code_passed", True)
    assert partial_result.reward == pytest.approx(2 / 3) and not partial_result.correct  # 5 + 5 is not 11
    assert strict_result.reward == -1.0 and strict_result.extras["tests_total"] == 3.0


def _verify(argv: list[str]) -> int:
    import argparse

    from stream_dapo.cli.verify import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(argv))


@pytest.mark.process
@pytest.mark.timeout(120)
def test_verify_scores_with_a_users_file_a_row_or_a_configs_source(
    user_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = tmp_path / "row.json"
    row.write_text(
        json.dumps(
            {
                "data_source": "mine",
                "prompt": [{"role": "user", "content": "q"}],
                "reward_model": {"ground_truth": "a b c d"},
                "extra_info": {"bonus": 1},
            }
        )
    )
    assert _verify(["--reward", f"{user_file}:compute_score", "--row", str(row), "--text", "a b"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert (verdict["score"], verdict["reason"], verdict["extras"]) == (0.5, "scored", {"words": 4.0})
    assert verdict["seconds"] >= 0
    assert _verify(["--reward", f"python:{user_file}:by_source", "--row", str(row), "--text", "x"]) == 0
    assert json.loads(capsys.readouterr().out)["score"] == 2.0  # data_source and extra_info from the row
    config = tmp_path / "mix.toml"
    config.write_text(
        f'[[data.sources]]\nname = "mine"\ntrain_path = "x.jsonl"\nreward = "{user_file}:raises"\n'
        '[[data.sources]]\nname = "words"\ntrain_path = "x.jsonl"\n'
    )
    assert _verify(["--config", str(config), "--source", "words", "--gold", "7", "--text", "Answer: 7"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "exact"
    assert _verify(["--config", str(config), "--source", "mine", "--gold", "7", "--text", "x"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "reward_error"


@pytest.mark.process
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--reward", "nonsense", "--gold", "1", "--text", "x"], "names no reward"),
        (["--reward", "/nope/r.py:f", "--gold", "1", "--text", "x"], "does not exist"),
        (["--text", "x"], "no gold answer"),
        (["--row", "/nope/row.json", "--text", "x"], "no such file"),
        (["--source", "a", "--gold", "1", "--text", "x"], "--source needs --config"),
    ],
)
def test_verify_refuses_what_it_cannot_use_with_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _verify(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
