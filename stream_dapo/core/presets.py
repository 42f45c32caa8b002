"""Named sets of config overrides that `stream-dapo ablate` runs side by side: three families.

``PRESETS``: the ablation ladder of the DAPO paper's Table 1 (below). ``OFFPOLICY_PRESETS``: the
off-policy corrections of issue 40 (further below). ``LEAVE_ONE_OUT_PRESETS``: full DAPO and DAPO
less one technique each (last). A name belongs to one family only.

Table 1
-------

The rows are cumulative: each preset is the previous one plus one ingredient.

===================  ==============================  ===================
preset               adds                            AIME 2024 avg@32
===================  ==============================  ===================
naive-grpo           (baseline: symmetric clip 0.2,  30
                     per-sequence loss mean)
+overlong-filter     mask truncated samples          36
+clip-higher         eps_high 0.28                   38
+soft-overlong       soft overlong punishment        41
+token-loss          token-level loss mean           42
dapo                 dynamic sampling                50
===================  ==============================  ===================

Choice made here: overlong filtering stays on once added, including in ``dapo``, because Table 1 lists
the rows cumulatively and does not say that soft punishment replaces filtering. With both on, truncated
samples are masked out of the loss (their -1 reward still shapes their group's advantages) and the soft
penalty acts on the responses that finished inside the punishment window. The authors' released verl
recipe runs soft punishment without loss masking; to reproduce that, override
``algo.overlong_filter = false``.

Only the five switches Table 1 varies are set here; everything else (eps_low 0.2, no KL, the overlong
window, the off-policy corrections) comes from the recipe config.

Off-policy corrections
----------------------

Each arm is the recipe's DAPO loss with one correction of the gap between the generators' behaviour
policy mu and the learner (`stream_dapo.core.loss`). Every arm sets every key any arm changes, so
no recipe file's value leaks into one arm and not another:

=============  ==========================================================================
arm            what it sets
=============  ==========================================================================
token-tis      today's default: token weight min(pi_prox/mu, 2) (Yao et al. 2025)
geo-mask       geometric sequence mask: a sample is dropped when the geometric mean of its
               pi_prox/mu leaves [1/1.01, 1.01] = [0.9901, 1.01] (SkyRL's recommendation,
               [0.99, 1.01]; the mask band is [1/C, C], so C = 1.01 moves its lower end by 1e-4)
icepop         token mask outside [0.5, 5], weight pi_prox/mu inside (IcePop, Ring-1T)
gspo           GSPO's length-normalised sequence ratio, clipped to [1 - 3e-4, 1 + 4e-4], with
               seq-mean-token-mean aggregation (Zheng et al. 2025); token TIS as token-tis
=============  ==========================================================================

SkyRL pairs its geometric mask with token TIS at 2; here one behaviour weight is chosen per run, so
geo-mask is the mask alone. GSPO keeps the token TIS weight, so against token-tis only the policy
ratio, its clip range and the aggregation change.

Leave one out
-------------

``dapo-all`` is Table 1's ``dapo`` (all five switches on); each other arm turns one of them back to
naive GRPO's value: ``no-overlong-filter``, ``no-clip-higher`` (eps_high 0.2, symmetric with the
recipe's eps_low), ``no-soft-overlong``, ``no-token-loss`` (seq-mean-token-mean) and
``no-dynamic-sampling``. The
paper's Figures 2, 5 and 6 each compare a run with and without one technique; these arms do the same
on top of the whole recipe.
"""

from __future__ import annotations

import copy

__all__ = [
    "LEAVE_ONE_OUT_PRESETS",
    "OFFPOLICY_PRESETS",
    "PAPER_AIME",
    "PRESETS",
    "PRESET_FAMILIES",
    "preset_family",
    "preset_overrides",
]


def _ladder() -> dict[str, dict[str, object]]:
    steps: list[tuple[str, dict[str, object]]] = [
        (
            "naive-grpo",
            {
                "algo.eps_high": 0.2,
                "algo.overlong_filter": False,
                "algo.soft_overlong": False,
                "algo.agg_mode": "seq-mean-token-mean",
                "algo.dynamic_sampling": False,
            },
        ),
        ("+overlong-filter", {"algo.overlong_filter": True}),
        ("+clip-higher", {"algo.eps_high": 0.28}),
        ("+soft-overlong", {"algo.soft_overlong": True}),
        ("+token-loss", {"algo.agg_mode": "token-mean"}),
        ("dapo", {"algo.dynamic_sampling": True}),
    ]
    presets: dict[str, dict[str, object]] = {}
    current: dict[str, object] = {}
    for name, change in steps:
        current = {**current, **change}
        presets[name] = dict(current)
    return presets


PRESETS: dict[str, dict[str, object]] = _ladder()
"""Preset name -> flat dict of dotted config overrides, in Table 1 order."""

PAPER_AIME: dict[str, int] = {
    "naive-grpo": 30,
    "+overlong-filter": 36,
    "+clip-higher": 38,
    "+soft-overlong": 41,
    "+token-loss": 42,
    "dapo": 50,
}
"""AIME 2024 avg@32 reported in DAPO Table 1 (Qwen2.5-32B base), per preset."""


_TOKEN_TIS: dict[str, object] = {
    "algo.ratio_mode": "decoupled",
    "algo.is_level": "token",
    "algo.is_mode": "truncate",
    "algo.is_cap": 2.0,
    "algo.icepop_low": 0.5,
    "algo.icepop_high": 5.0,
    "algo.ratio_level": "token",
    "algo.surrogate": "clip",
    "algo.agg_mode": "token-mean",
    "algo.eps_low": 0.2,
    "algo.eps_high": 0.28,
}

OFFPOLICY_PRESETS: dict[str, dict[str, object]] = {
    "token-tis": dict(_TOKEN_TIS),
    "geo-mask": {**_TOKEN_TIS, "algo.is_level": "geometric", "algo.is_mode": "mask", "algo.is_cap": 1.01},
    "icepop": {**_TOKEN_TIS, "algo.is_mode": "icepop"},
    "gspo": {
        **_TOKEN_TIS,
        "algo.ratio_level": "sequence",
        "algo.agg_mode": "seq-mean-token-mean",
        "algo.eps_low": 3e-4,
        "algo.eps_high": 4e-4,
    },
}
"""Arm name -> flat dict of dotted config overrides; the first (token-tis) is the baseline."""


def _leave_one_out() -> dict[str, dict[str, object]]:
    full = PRESETS["dapo"]
    off: list[tuple[str, str, object]] = [
        ("no-overlong-filter", "algo.overlong_filter", False),
        ("no-clip-higher", "algo.eps_high", PRESETS["naive-grpo"]["algo.eps_high"]),
        ("no-soft-overlong", "algo.soft_overlong", False),
        ("no-token-loss", "algo.agg_mode", PRESETS["naive-grpo"]["algo.agg_mode"]),
        ("no-dynamic-sampling", "algo.dynamic_sampling", False),
    ]
    return {"dapo-all": dict(full), **{name: {**full, key: value} for name, key, value in off}}


LEAVE_ONE_OUT_PRESETS: dict[str, dict[str, object]] = _leave_one_out()
"""Arm name -> flat dict of dotted config overrides: full DAPO (``dapo-all``, the same switches as
Table 1's ``dapo``), then DAPO with one technique turned back to naive GRPO's setting. Each arm is
read against ``dapo-all``, so a difference belongs to one technique; Table 1's cumulative rows mix
the step's technique with everything added before it."""

PRESET_FAMILIES: dict[str, dict[str, dict[str, object]]] = {
    "table1": PRESETS,
    "offpolicy": OFFPOLICY_PRESETS,
    "leave-one-out": LEAVE_ONE_OUT_PRESETS,
}
"""Family name -> its presets, in table order; the first preset of a family is its baseline."""


def preset_family(name: str) -> str:
    """The family preset ``name`` belongs to (ValueError naming every valid preset if none)."""
    for family, presets in PRESET_FAMILIES.items():
        if name in presets:
            return family
    valid = ", ".join(preset for presets in PRESET_FAMILIES.values() for preset in presets)
    raise ValueError(f"unknown preset {name!r}; valid presets: {valid}")


def preset_overrides(name: str, family: str | None = None) -> dict[str, object]:
    """A fresh copy of the overrides of preset ``name`` (safe to mutate), of ``family`` when given,
    else of whichever family holds it."""
    if family is not None and name not in PRESET_FAMILIES[family]:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESET_FAMILIES[family])}")
    return copy.deepcopy(PRESET_FAMILIES[preset_family(name)][name])
