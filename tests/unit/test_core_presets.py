"""The Table 1 ablation presets."""

from __future__ import annotations

import pytest

from stream_dapo.core.presets import PAPER_AIME, PRESETS, preset_overrides

_KEYS = {
    "algo.eps_high",
    "algo.overlong_filter",
    "algo.soft_overlong",
    "algo.agg_mode",
    "algo.dynamic_sampling",
}


def test_presets_are_the_table_1_rows_in_order_with_the_paper_scores() -> None:
    assert list(PRESETS) == [
        "naive-grpo",
        "+overlong-filter",
        "+clip-higher",
        "+soft-overlong",
        "+token-loss",
        "dapo",
    ]
    assert PAPER_AIME == {
        "naive-grpo": 30,
        "+overlong-filter": 36,
        "+clip-higher": 38,
        "+soft-overlong": 41,
        "+token-loss": 42,
        "dapo": 50,
    }
    assert all(set(overrides) == _KEYS for overrides in PRESETS.values())


def test_naive_grpo_and_dapo_values() -> None:
    assert PRESETS["naive-grpo"] == {
        "algo.eps_high": 0.2,
        "algo.overlong_filter": False,
        "algo.soft_overlong": False,
        "algo.agg_mode": "seq-mean-token-mean",
        "algo.dynamic_sampling": False,
    }
    assert PRESETS["dapo"] == {
        "algo.eps_high": 0.28,
        "algo.overlong_filter": True,
        "algo.soft_overlong": True,
        "algo.agg_mode": "token-mean",
        "algo.dynamic_sampling": True,
    }


def test_each_row_changes_exactly_one_switch_from_the_previous() -> None:
    names = list(PRESETS)
    expected_change = [
        "algo.overlong_filter",
        "algo.eps_high",
        "algo.soft_overlong",
        "algo.agg_mode",
        "algo.dynamic_sampling",
    ]
    for prev, cur, key in zip(names[:-1], names[1:], expected_change, strict=True):
        changed = {k for k in _KEYS if PRESETS[prev][k] != PRESETS[cur][k]}
        assert changed == {key}, (prev, cur)


def test_preset_overrides_returns_a_copy() -> None:
    overrides = preset_overrides("dapo")
    overrides["algo.eps_high"] = 0.5
    assert PRESETS["dapo"]["algo.eps_high"] == 0.28


def test_unknown_preset_lists_the_valid_names() -> None:
    with pytest.raises(
        ValueError, match=r"unknown preset 'grpo'; valid presets: naive-grpo, \+overlong-filter"
    ):
        preset_overrides("grpo")


def test_the_off_policy_family_is_found_by_name_but_algo_preset_names_table_1_only() -> None:
    from stream_dapo.config import ConfigError, load_config
    from stream_dapo.core.presets import OFFPOLICY_PRESETS, preset_family

    assert list(OFFPOLICY_PRESETS) == ["token-tis", "geo-mask", "icepop", "gspo"]
    assert preset_family("icepop") == "offpolicy" and preset_family("dapo") == "table1"
    assert preset_overrides("icepop")["algo.is_mode"] == "icepop"
    with pytest.raises(ValueError, match="valid presets: .*dapo, token-tis"):
        preset_overrides("ppo")
    with pytest.raises(ConfigError, match="algo.preset: unknown preset 'gspo'; valid presets: naive-grpo"):
        load_config([], ['algo.preset="gspo"'], environ={})


def test_each_leave_one_out_arm_turns_exactly_one_dapo_switch_back_to_naive_grpo() -> None:
    from stream_dapo.core.presets import LEAVE_ONE_OUT_PRESETS, preset_family
    from stream_dapo.tools.ablate.settings import preset_changes

    names = list(LEAVE_ONE_OUT_PRESETS)
    assert names[0] == "dapo-all" and LEAVE_ONE_OUT_PRESETS["dapo-all"] == PRESETS["dapo"]
    turned_back = set()
    for name in names[1:]:
        changes = preset_changes(name)  # read against dapo-all
        assert len(changes) == 1, name
        ((key, (full, value)),) = changes.items()
        assert full == PRESETS["dapo"][key] and value == PRESETS["naive-grpo"][key], name
        assert preset_family(name) == "leave-one-out"
        turned_back.add(key)
    assert turned_back == set(PRESETS["dapo"])  # every switch Table 1 varies has its arm
    assert LEAVE_ONE_OUT_PRESETS["no-clip-higher"]["algo.eps_high"] == 0.2
    assert preset_changes("dapo-all") == {}
