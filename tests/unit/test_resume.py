"""What a resume may change (`stream_dapo/learner/resume.py`), on hand-made configuration trees."""

from __future__ import annotations

from stream_dapo.config import load_config
from stream_dapo.learner.resume import FIXED_ON_RESUME, Change, config_changes, refusal, split_changes


def test_changes_are_listed_by_dotted_key_and_split_into_applied_and_refused() -> None:
    old = {"learner": {"lr": 2e-4, "total_steps": 10}, "algo": {"group_size": 8}, "run": {"out_dir": "a"}}
    new = {"learner": {"lr": 1e-4, "total_steps": 20}, "algo": {"group_size": 4}, "run": {"out_dir": "a"}}
    changes = config_changes(old, new)
    assert changes == [
        Change("algo.group_size", 8, 4),
        Change("learner.lr", 2e-4, 1e-4),
        Change("learner.total_steps", 10, 20),
    ]
    applied, refused = split_changes(changes)
    assert [c.key for c in applied] == ["learner.lr", "learner.total_steps"]
    assert refused == [Change("algo.group_size", 8, 4)]
    message = refusal(refused, "runs/x/checkpoints/step_000014", "runs/x")
    assert "algo.group_size 8 -> 4" in message and "another run.out_dir (now runs/x)" in message


def test_every_fixed_key_is_a_setting_of_the_config() -> None:
    tree = load_config(environ={}).model_dump(mode="json")
    keys = {c.key for c in config_changes({}, tree)}
    assert set(FIXED_ON_RESUME) <= keys, set(FIXED_ON_RESUME) - keys
