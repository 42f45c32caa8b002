"""A plan as text (the command's output) and as JSON (`--json`)."""

from __future__ import annotations

import textwrap
from dataclasses import asdict
from typing import Any

from stream_dapo.tools.plan.model import Plan


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _num(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min"


def format_plan(p: Plan, sources: dict[str, str]) -> str:
    """The human-readable table."""
    r, x, st = p.recipe, p.rates, p.staleness
    n = r.num_generators
    rows: list[tuple[str, str, str]] = [
        ("generator replica", f"{_num(x.gen_tps)} response tokens/s", sources["gen_tps"]),
        ("learner", f"{_num(x.learn_tps)} trained tokens/s", sources["learn_tps"]),
        ("mean response length", f"{_num(x.mean_response_len)} tokens", sources["mean_response_len"]),
        ("prompt length", f"{_num(x.prompt_len)} tokens", sources["prompt_len"]),
        ("kept fraction", f"{x.keep_fraction:.2f}", sources["keep_fraction"]),
        ("weight sync", f"{x.weight_sync_s:.1f} s per publication", sources["weight_sync_s"]),
        ("engine scaling", f"tokens/s ~ groups^{x.gen_scaling:g}", sources["gen_scaling"]),
        ("token age", f"{x.token_age:.2f} of a group's time", sources["token_age"]),
    ]
    out = ["Inputs"]
    out += [f"  {a:<31}{b:<30}{c}" for a, b, c in rows]
    out.append(
        f"  recipe: G = {r.group_size}, {r.rollout_batch_prompts} prompts per rollout batch, "
        f"{r.mini_batch_samples} samples ({r.groups_per_version} groups) per optimizer step,\n          "
        f"{r.steps_per_rollout} steps per rollout batch, sync every {r.sync_every}, max_staleness "
        f"{r.max_staleness} (admission line {r.capacity} groups),\n          {_replicas(n)} x "
        f"{r.max_groups_in_flight} groups in flight"
    )
    per_step = [
        ("over-generation factor", f"{p.over_generation:.2f} x", "1 / kept fraction"),
        ("learner tokens", _num(p.learner_tokens), "prompt + response"),
        ("generator tokens", _num(p.generator_tokens), "responses, filtered groups included"),
        ("learner time", f"{p.learner_s:.1f} s", "t_L, weight sync included"),
        ("generator time, one replica", f"{p.replica_s:.1f} s", "t_1"),
        (f"generator time, {_replicas(n)}", f"{p.generators_s:.1f} s", "t_G, weight sync included"),
        (
            "groups per engine",
            f"{p.engine_groups:.1f} of {r.max_groups_in_flight}",
            "m, the fewest that keep up",
        ),
        ("one group in an engine", f"{p.group_s:.1f} s", f"D(m); {p.full_group_s:.1f} s in a full engine"),
        ("admission line limit", f"{p.line_s:.1f} s", "t_line"),
    ]
    out += ["", "Per optimizer step"]
    out += [f"  {a:<31}{b:<30}{c}" for a, b, c in per_step]
    run_time = (
        f"; learner.total_steps {r.total_steps} in {_duration(r.total_steps * p.step_s)}"
        if r.total_steps
        else ""
    )
    result = [
        (
            "replicas per learner",
            f"{p.replicas_to_match:.2f} -> {p.replicas_needed} keep the learner busy (configured: {n})",
        ),
        ("bottleneck", p.bottleneck),
        ("step time", f"{p.step_s:.1f} s ({3600 / p.step_s:.1f} steps/h{run_time})"),
        ("learner busy", f"{p.learner_busy:.0%}"),
        (f"generators busy ({n})", f"{p.generators_busy:.0%}"),
        ("admission line", f"{p.in_flight_groups:.0f} groups in flight + {p.waiting_groups:.0f} waiting"),
        (
            "expected staleness",
            f"{st.total:.1f} versions mean per token (every token <= algo.max_staleness = {r.max_staleness})",
        ),
        (
            "",
            f"= {st.weight_lag:.1f} weight lag + {st.in_flight:.1f} in flight + {st.queue:.1f} waiting "
            f"+ {st.batch_position:.1f} position in rollout batch",
        ),
        (
            "staleness bound needed",
            f"algo.max_staleness >= {p.max_staleness_needed} keeps the line from limiting {_replicas(n)}",
        ),
    ]
    out += ["", "Result"]
    out += [f"  {a:<31}{b}" for a, b in result]
    if p.warnings:
        out += ["", "Warnings"]
        out += [textwrap.fill(w, 100, initial_indent="  - ", subsequent_indent="    ") for w in p.warnings]
    return "\n".join(out)


def plan_to_json(p: Plan, sources: dict[str, str]) -> dict[str, Any]:
    data = asdict(p)
    data["recipe"].update(  # the admission rule's derived numbers, under the rule's own names
        groups_per_version=p.recipe.groups_per_version,
        steps_per_rollout=p.recipe.steps_per_rollout,
        capacity=p.recipe.capacity,
    )
    data["staleness"]["total"] = p.staleness.total
    data["sources"] = sources
    data["warnings"] = list(p.warnings)
    return data
