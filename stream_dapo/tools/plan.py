"""`stream-dapo plan`: how many generator replicas keep a learner busy, and what it costs in staleness.

    stream-dapo plan --config configs/dapo-qwen2.5-32b.toml --gen-tps 6000 --learn-tps 15000
    stream-dapo plan --memory --config configs/dapo-qwen2.5-32b.toml --gpus 16 --gpu-gib 80

(``--memory``: the learner's per-GPU memory instead, `stream_dapo.tools.memory_plan`.)
    stream-dapo plan --config my.toml --from-prometheus http://prometheus:9090 --window 30m

A steady-state fluid model of the asynchronous pipeline: averages only, no queueing variance, so
size with some margin. Notation: G group size, B_v = mini_batch_samples / G groups per optimizer
step, R = rollout_batch_prompts groups per rollout batch, S = R G / mini_batch_samples steps per
rollout batch, C the admission capacity (`stream_dapo.core.admission`), k the kept fraction of
dynamic sampling, L_r the mean response length, L_p the prompt length, N generator replicas, M =
generator.max_groups_in_flight, e = learner.sync_every, w seconds per weight publication.

1. Over-generation: one kept group costs 1/k attempts; filtered groups are generated in full.
2. Learner time per step: t_L = B_v G (L_p + L_r) / learn_tps + w / e (publishing pauses training).
3. Generator time per step: one replica needs t_1 = B_v G L_r / (k gen_tps); N replicas need
   t_G = t_1 / N + w / e (loading weights pauses generation). t_1 / (t_L - w/e) replicas match
   the learner.
4. Group residence: a replica holding m groups makes T(m) = gen_tps (m/M)^a response tokens/s,
   where a = --gen-scaling says how its throughput grows with the batch: 1 when a sequence decodes
   as fast in a full batch as alone (a GPU decoding memory-bound batches: tokens/s grows with the
   batch), near 0 when tokens/s hardly depends on the batch (fewer sequences each decode faster).
   A group then spends D(m) = m G L_r / T(m) = D_M (m/M)^(1-a) seconds in the engine, with
   D_M = M G L_r / gen_tps (Little's law). At step time t a replica must make the fraction
   u = t_1 / (N t) of its full rate, and it holds the fewest groups that do it, m(t) = M u^(1/a),
   at least one (with less the engine idles between groups) and at most M: with more it would
   finish groups faster than the learner takes them, and admission stops crediting it. With a = 1,
   D = D_M whatever the load (the replica's groups are fewer, not faster).
5. Admission line: waiting + in-flight groups <= C. In flight on average: the attempt rate times D,
   B_v D(m(t)) / (k t) at step time t. Waiting on average: the learner takes groups only between
   rollout batches, so kept groups finished while it trains (S t_L seconds) wait half that, which
   is (R/2) (t_L/t)^2 groups. The line sustains step time t only if
   B_v D(m(t)) / (k t) + (R/2) (t_L/t)^2 <= C; both terms fall as t grows, and the smallest such t
   is t_line.
6. Step time t = max(t_L, t_G, t_line); the largest names the bottleneck: the learner, the
   generators, or the admission line (algo.max_staleness too tight for the generators' engines).
7. Mean staleness of a token, in versions (which advance only while the learner steps):
   (e - 1)/2 (generator weights lag the learner) + rho D / t (a token waits rho of its group's
   residence D = D(m(t)) for the group to finish: rho is just under 1/2 when a group's responses are
   equally long, and more when they are not, since short responses finish early and their tokens
   wait for the longest; the generators count it, --token-age) + queue + (S - 1)/2 (the j-th mini-batch of a rollout
   batch is trained j versions after the batch was taken). queue = C/B_v - D/(k t_L) when the
   learner is the bottleneck (generators keep the line full; Little's law) and (t_L/t) S/2
   otherwise (groups finished while the learner trains wait for its batch to end, the others are
   taken at once).
   Admission keeps every token within algo.max_staleness whatever the rates: a bound that is too
   tight shows up as the admission-line bottleneck, not as dropped groups.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from stream_dapo.config import Config
from stream_dapo.core.admission import AdmissionRule
from stream_dapo.runtime.metrics import GeneratorMetrics, LearnerMetrics, catalogue, sample_name

__all__ = [
    "DEFAULT_KEEP_FRACTION",
    "DEFAULT_PROMPT_FRACTION",
    "DEFAULT_RESPONSE_FRACTION",
    "ENGINE_SCALING",
    "Plan",
    "PlanError",
    "Rates",
    "Recipe",
    "Staleness",
    "capacity_for_step",
    "check_rates",
    "engine_groups",
    "expected_staleness",
    "generator_tokens_per_step",
    "generators_step_seconds",
    "group_residence_seconds",
    "in_flight_groups",
    "learner_step_seconds",
    "learner_tokens_per_step",
    "line_step_seconds",
    "max_staleness_for_capacity",
    "measure_from_prometheus",
    "over_generation_factor",
    "plan",
    "prometheus_query",
    "replica_step_seconds",
    "sync_seconds_per_step",
    "token_age_from_counts",
]

DEFAULT_RESPONSE_FRACTION = 0.25
"""Mean response length when neither --mean-response-len nor Prometheus gives it: this fraction of
algo.max_response_len (5120 of the 32B recipe's 20480; long chain-of-thought grows during a run)."""
DEFAULT_PROMPT_FRACTION = 0.125
"""Prompt length when --prompt-len is not given: this fraction of model.max_prompt_len (256 of 2048;
DAPO-Math prompts with the template are a few hundred tokens)."""
DEFAULT_KEEP_FRACTION = 0.5
"""Kept fraction of dynamic sampling when neither --keep-fraction nor Prometheus gives it. The DAPO
paper filters heavily, and more as the model masters the data; measure it."""
DEFAULT_WINDOW = "30m"
ENGINE_SCALING = {"gpu": 1.0, "cpu": 0.5}
"""Named values of --gen-scaling (a in tokens/s ~ groups in flight^a, step 4). gpu (the default): a
replica's tokens/s grows in proportion to the groups it holds, each sequence decoding as fast as
alone, which is how a GPU decodes memory-bound batches, and the cautious choice for the admission
line (a group takes as long in a light engine as in a full one). cpu: the vLLM CPU engine of the
long-CoT recipe on 2 cores, one worker thread: 930 tokens/s with 1 group of 8 in flight, 3,392
with 16, a least-squares a of 0.49 over 1-16 groups, 0.38 in a rerun (bench/engine_scaling.py,
docs/results/engine_scaling*.json; it flattens above 8 groups, so a power law is a rough fit).
Measure your own engine with that bench."""

Bottleneck = Literal["learner", "generators", "admission line"]


class PlanError(ValueError):
    """Inputs the planner cannot work with; the message names the flag or key that fixes it."""


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Recipe(AdmissionRule):
    """The numbers of a resolved `Config` the plan depends on: the admission rule's (so C, B_v and S
    are `capacity`, `groups_per_version` and `steps_per_rollout`, from `stream_dapo.core.admission`)
    and the sizes of the generators and responses."""

    max_response_len: int
    max_prompt_len: int
    num_generators: int
    max_groups_in_flight: int
    dynamic_sampling: bool = True
    total_steps: int = 0

    @classmethod
    def from_config(cls, cfg: Config) -> Recipe:
        return cls(
            **asdict(cfg.admission),
            max_response_len=cfg.algo.max_response_len,
            max_prompt_len=cfg.model.max_prompt_len,
            num_generators=cfg.generator.num_generators,
            max_groups_in_flight=cfg.generator.max_groups_in_flight,
            dynamic_sampling=cfg.algo.dynamic_sampling,
            total_steps=cfg.learner.total_steps,
        )


@dataclass(frozen=True)
class Rates:
    """Measured (or assumed) rates and lengths."""

    gen_tps: float
    """Response tokens per second of one generator replica with its engine full."""
    learn_tps: float
    """Trained tokens (prompt + response) per second of the learner while it has data."""
    mean_response_len: float
    """L_r, over all generated responses (filtered groups included)."""
    prompt_len: float
    """L_p, tokens per prompt after the chat template."""
    keep_fraction: float
    """k, fraction of groups dynamic sampling keeps."""
    weight_sync_s: float = 0.0
    """Seconds one weight publication pauses the learner (and the generators loading it)."""
    gen_scaling: float = 1.0
    """a: a replica holding m of its M groups makes gen_tps (m/M)^a tokens/s (step 4). 1: tokens/s
    in proportion to the groups (a GPU); 0: the same tokens/s at any load (fewer groups each finish
    sooner)."""
    token_age: float = 0.5
    """rho: a response token's mean wait for its group to finish, as a share of the group's time in
    the engine (step 7). 1/2 when a group's responses are equally long; with long-tailed lengths
    more, since the short responses' tokens wait for the longest. The generators measure it
    (`token_age_from_counts`)."""


def check_rates(recipe: Recipe, rates: Rates) -> None:
    """Raise PlanError, naming the flag, for rates the model cannot use."""
    if not rates.gen_tps > 0:
        raise PlanError(f"generator throughput must be > 0 tokens/s (got {rates.gen_tps}); pass --gen-tps")
    if not rates.learn_tps > 0:
        raise PlanError(f"learner throughput must be > 0 tokens/s (got {rates.learn_tps}); pass --learn-tps")
    if not 0 < rates.mean_response_len <= recipe.max_response_len:
        raise PlanError(
            f"mean response length {rates.mean_response_len:g} is outside (0, algo.max_response_len = "
            f"{recipe.max_response_len}]; pass --mean-response-len"
        )
    if not rates.prompt_len >= 0:
        raise PlanError(f"prompt length must be >= 0 tokens (got {rates.prompt_len}); pass --prompt-len")
    if not 0 < rates.keep_fraction <= 1:
        raise PlanError(
            f"kept fraction {rates.keep_fraction:g} is outside (0, 1]: no group would reach the learner; "
            "pass --keep-fraction"
        )
    if not rates.weight_sync_s >= 0:
        raise PlanError(f"weight sync must be >= 0 s (got {rates.weight_sync_s}); pass --weight-sync-seconds")
    if not 0 <= rates.token_age < 1:
        raise PlanError(
            f"token age {rates.token_age:g} is outside [0, 1) (a token's wait for its group as a share of "
            "the group's time in the engine; 0.5 for equally long responses); pass --token-age"
        )
    if not 0 <= rates.gen_scaling <= 1:
        raise PlanError(
            f"engine scaling {rates.gen_scaling:g} is outside [0, 1] (1: tokens/s in proportion to the groups "
            "in flight, 0: the same at any load); pass --gen-scaling (or gpu, cpu)"
        )


# --------------------------------------------------------------------------------------------------
# The model, one function per numbered step of the module docstring
# --------------------------------------------------------------------------------------------------


def token_age_from_counts(tail_tokens: float, tokens: float, longest_tokens: float, groups: float) -> float:
    """rho from the generators' counters (or their rates): the mean decode steps a token waits for
    its group (group_tail_tokens / response tokens) over the mean steps a group runs (the
    group_longest_tokens histogram's sum / count). Decode steps stand for seconds because a group's
    responses decode side by side."""
    if not (tokens > 0 and groups > 0 and longest_tokens > 0):
        raise PlanError("no finished groups to measure the token age from; pass --token-age")
    return (tail_tokens / tokens) / (longest_tokens / groups)


def over_generation_factor(keep_fraction: float) -> float:
    """1. Groups generated per group trained."""
    return 1.0 / keep_fraction


def sync_seconds_per_step(recipe: Recipe, rates: Rates) -> float:
    """w / e: weight-publication pause per optimizer step."""
    return rates.weight_sync_s / recipe.sync_every


def learner_tokens_per_step(recipe: Recipe, rates: Rates) -> float:
    """B_v G (L_p + L_r) = mini_batch_samples (L_p + L_r)."""
    return recipe.mini_batch_samples * (rates.prompt_len + rates.mean_response_len)


def generator_tokens_per_step(recipe: Recipe, rates: Rates) -> float:
    """Response tokens generated per optimizer step, filtered groups included."""
    return recipe.mini_batch_samples * rates.mean_response_len * over_generation_factor(rates.keep_fraction)


def learner_step_seconds(recipe: Recipe, rates: Rates) -> float:
    """2. t_L."""
    return learner_tokens_per_step(recipe, rates) / rates.learn_tps + sync_seconds_per_step(recipe, rates)


def replica_step_seconds(recipe: Recipe, rates: Rates) -> float:
    """3. t_1: one replica's generation time per optimizer step (no weight loads)."""
    return generator_tokens_per_step(recipe, rates) / rates.gen_tps


def generators_step_seconds(recipe: Recipe, rates: Rates, replicas: int) -> float:
    """3. t_G = t_1 / N + w / e."""
    return replica_step_seconds(recipe, rates) / replicas + sync_seconds_per_step(recipe, rates)


def engine_groups(recipe: Recipe, rates: Rates, step_s: float, replicas: int | None = None) -> float:
    """4. m(t): groups one replica holds at step time t, M u^(1/a) with u = t_1 / (N t), within
    [1, M]. `replicas` N defaults to the configured generator.num_generators."""
    full = float(recipe.max_groups_in_flight)
    share = replica_step_seconds(recipe, rates) / ((replicas or recipe.num_generators) * step_s)
    if share >= 1:
        return full
    groups = full * share ** (1 / rates.gen_scaling) if rates.gen_scaling > 0 else 0.0
    return min(full, max(1.0, groups))


def group_residence_seconds(recipe: Recipe, rates: Rates, groups: float | None = None) -> float:
    """4. D(m) = D_M (m/M)^(1-a), D_M = M G L_r / gen_tps; m defaults to M (a full engine)."""
    full = recipe.max_groups_in_flight
    d_full = full * recipe.group_size * rates.mean_response_len / rates.gen_tps
    return d_full * ((full if groups is None else groups) / full) ** (1 - rates.gen_scaling)


def in_flight_groups(
    recipe: Recipe, rates: Rates, step_s: float, replicas: int | None = None
) -> tuple[float, float]:
    """5. (groups in flight over all replicas, D) at step time t: B_v D(m(t)) / (k t), D(m(t))."""
    group_s = group_residence_seconds(recipe, rates, engine_groups(recipe, rates, step_s, replicas))
    return recipe.groups_per_version * group_s / (rates.keep_fraction * step_s), group_s


def capacity_for_step(
    recipe: Recipe, rates: Rates, step_s: float, learner_s: float, replicas: int | None = None
) -> float:
    """5. Groups the line holds on average at step time t: B_v D(m(t))/(k t) + (R/2)(t_L/t)^2."""
    in_flight, _ = in_flight_groups(recipe, rates, step_s, replicas)
    return in_flight + recipe.rollout_batch_prompts / 2 * (learner_s / step_s) ** 2


def line_step_seconds(recipe: Recipe, rates: Rates, learner_s: float, replicas: int | None = None) -> float:
    """5. t_line: the shortest step time the admission line sustains (`capacity_for_step` = C).

    `capacity_for_step` falls from infinity to 0 as t grows (fewer attempts per second, each
    holding its replica's groups no longer; a shorter learner share), so bisection on log t finds
    the one crossing.
    """
    cap = recipe.capacity
    if cap <= 0:
        return math.inf

    def over(t: float) -> bool:
        return capacity_for_step(recipe, rates, t, learner_s, replicas) > cap

    lo = hi = max(learner_s, group_residence_seconds(recipe, rates), 1e-9)
    while over(hi):
        hi *= 2
    while not over(lo):
        lo /= 2
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if over(mid) else (lo, mid)
    return hi


def max_staleness_for_capacity(recipe: Recipe, capacity: float) -> int:
    """The smallest algo.max_staleness whose admission capacity holds `capacity` groups
    (`AdmissionRule.min_max_staleness`, the inverse of its formula)."""
    return recipe.min_max_staleness(capacity)


@dataclass(frozen=True)
class Staleness:
    """7. Mean token staleness in versions, by cause."""

    weight_lag: float
    """(e - 1)/2: the generators' weights lag the learner between publications."""
    in_flight: float
    """rho D / t: versions that pass while a token waits for its group to finish."""
    queue: float
    """Versions a finished group waits in the buffer."""
    batch_position: float
    """(S - 1)/2: the j-th mini-batch of a rollout batch is trained j versions after it was taken."""

    @property
    def total(self) -> float:
        return self.weight_lag + self.in_flight + self.queue + self.batch_position


def expected_staleness(
    recipe: Recipe,
    keep_fraction: float,
    step_s: float,
    learner_s: float,
    group_s: float,
    learner_bound: bool,
    token_age: float,
) -> Staleness:
    """7. Mean staleness of a token at its gradient step (`token_age`: rho, `Rates.token_age`)."""
    b_v, s = recipe.groups_per_version, recipe.steps_per_rollout
    if learner_bound:
        queue = recipe.capacity / b_v - group_s / (keep_fraction * learner_s)
    else:
        queue = learner_s / step_s * s / 2
    return Staleness(
        weight_lag=(recipe.sync_every - 1) / 2,
        in_flight=token_age * group_s / step_s,
        queue=max(0.0, queue),
        batch_position=(s - 1) / 2,
    )


@dataclass(frozen=True)
class Plan:
    """Everything `stream-dapo plan` reports. Times are seconds per optimizer step."""

    recipe: Recipe
    rates: Rates
    over_generation: float
    learner_tokens: float
    """Tokens the learner trains per step (prompt + response)."""
    generator_tokens: float
    """Response tokens generated per step, filtered groups included."""
    learner_s: float
    """t_L."""
    replica_s: float
    """t_1: one replica alone."""
    generators_s: float
    """t_G with the configured replicas."""
    engine_groups: float
    """m(t): groups one replica holds while it generates, at the step time (at least one: below
    that it idles between groups, and in_flight_groups counts the average)."""
    group_s: float
    """D(m): seconds a group spends in a generator's engine at that occupancy."""
    full_group_s: float
    """D_M: the same in a full engine (M groups)."""
    line_s: float
    """t_line: the admission line's limit."""
    step_s: float
    bottleneck: Bottleneck
    replicas_to_match: float
    """Replicas whose generation time equals the learner's compute time."""
    replicas_needed: int
    """ceil(replicas_to_match): the fewest that keep the learner busy (line permitting)."""
    learner_busy: float
    """t_L / t."""
    generators_busy: float
    """t_G / t: the share of the replicas' full-engine throughput the step uses (with
    gen_scaling < 1 they generate all the time, holding fewer groups)."""
    in_flight_groups: float
    """Average groups being generated, all replicas."""
    waiting_groups: float
    """Average kept groups waiting in the buffer."""
    staleness: Staleness
    max_staleness_needed: int
    """Smallest algo.max_staleness whose admission line does not limit the configured replicas (and
    holds a rollout batch, as the config requires)."""
    warnings: tuple[str, ...] = field(default=())


def plan(recipe: Recipe, rates: Rates) -> Plan:
    """Steps 1-7 of the module docstring for the configured number of replicas."""
    check_rates(recipe, rates)
    k, n = rates.keep_fraction, recipe.num_generators
    t_l = learner_step_seconds(recipe, rates)
    t_1 = replica_step_seconds(recipe, rates)
    t_g = generators_step_seconds(recipe, rates, n)
    t_line = line_step_seconds(recipe, rates, t_l)
    step = max(t_l, t_g, t_line)
    bottleneck: Bottleneck = "learner" if step == t_l else "generators" if step == t_g else "admission line"
    to_match = t_1 / (t_l - sync_seconds_per_step(recipe, rates))
    needed = math.ceil(to_match - 1e-9)
    learner_bound = bottleneck == "learner"
    m = engine_groups(recipe, rates, step)
    in_flight, d = in_flight_groups(recipe, rates, step)
    waiting = (
        recipe.capacity - in_flight if learner_bound else recipe.rollout_batch_prompts / 2 * (t_l / step) ** 2
    )
    staleness = expected_staleness(recipe, k, step, t_l, d, learner_bound, rates.token_age)
    line_needed = capacity_for_step(recipe, rates, max(t_l, t_g), t_l)
    need_ms = max_staleness_for_capacity(recipe, max(line_needed, recipe.rollout_batch_prompts))
    result = Plan(
        recipe=recipe,
        rates=rates,
        over_generation=over_generation_factor(k),
        learner_tokens=learner_tokens_per_step(recipe, rates),
        generator_tokens=generator_tokens_per_step(recipe, rates),
        learner_s=t_l,
        replica_s=t_1,
        generators_s=t_g,
        engine_groups=m,
        group_s=d,
        full_group_s=group_residence_seconds(recipe, rates),
        line_s=t_line,
        step_s=step,
        bottleneck=bottleneck,
        replicas_to_match=to_match,
        replicas_needed=needed,
        learner_busy=t_l / step,
        generators_busy=t_g / step,
        in_flight_groups=in_flight,
        waiting_groups=max(0.0, waiting),
        staleness=staleness,
        max_staleness_needed=need_ms,
    )
    return _with_warnings(result)


def _with_warnings(p: Plan) -> Plan:
    r = p.recipe
    out: list[str] = []
    if p.bottleneck == "generators":
        # The line a busy learner needs with the replicas that keep it busy (each holds fewer
        # groups than these, which with gen_scaling < 1 finish sooner).
        line = capacity_for_step(r, p.rates, p.learner_s, p.learner_s, p.replicas_needed)
        need_ms = max_staleness_for_capacity(r, max(line, r.rollout_batch_prompts))
        also = (
            f" and algo.max_staleness >= {need_ms} so the line holds their groups"
            if need_ms > r.max_staleness
            else ""
        )
        out.append(
            f"the generators are the bottleneck: the learner is busy {p.learner_busy:.0%} of the time; "
            f"set generator.num_generators >= {p.replicas_needed}{also} to keep it busy"
        )
    if p.bottleneck == "admission line":
        out.append(
            f"the admission line ({r.capacity} groups from algo.max_staleness = "
            f"{r.max_staleness}) makes each step {p.step_s / max(p.learner_s, p.generators_s) - 1:.1%} "
            f"slower than learner and generators could go: it must hold the groups in flight and about half "
            f"a rollout batch ({r.rollout_batch_prompts} groups) waiting for the learner. Set "
            f"algo.max_staleness >= {p.max_staleness_needed}, or lower learner.rollout_batch_prompts"
        )
    if p.bottleneck == "learner" and r.num_generators > p.replicas_needed:
        out.append(
            f"{r.num_generators} generators where {p.replicas_needed} keep the learner busy: the spare "
            f"ones (generators busy {p.generators_busy:.0%}) only keep the admission line full, so groups "
            f"wait {p.staleness.queue:.1f} versions on average"
        )
    return replace(p, warnings=tuple(out))


# --------------------------------------------------------------------------------------------------
# Prometheus
# --------------------------------------------------------------------------------------------------

Query = Callable[[str, str, float], float | None]

_WINDOW = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")


def prometheus_query(base_url: str, promql: str, timeout_s: float) -> float | None:
    """One instant query against Prometheus' HTTP API; None when it returns no (finite) sample."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:300]
        raise PlanError(f"Prometheus at {base_url} answered {exc.code} to {promql!r}: {detail}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise PlanError(
            f"cannot reach Prometheus at {base_url} ({reason}); check the URL (e.g. http://prometheus:9090), "
            "or pass the rates yourself: --gen-tps X --learn-tps Y"
        ) from None
    except ValueError:
        raise PlanError(
            f"{base_url} did not answer with Prometheus JSON; is it Prometheus' base URL?"
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else body
        raise PlanError(f"Prometheus at {base_url} rejected {promql!r}: {error}")
    result = body.get("data", {}).get("result", [])
    if not result:
        return None
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise PlanError(f"unexpected Prometheus result for {promql!r}: {result[0]!r}") from None
    return value if math.isfinite(value) else None


MEASURABLE = ("gen_tps", "learn_tps", "mean_response_len", "keep_fraction", "weight_sync_s", "token_age")
_FLAG = {
    "gen_tps": "--gen-tps",
    "learn_tps": "--learn-tps",
    "mean_response_len": "--mean-response-len",
    "keep_fraction": "--keep-fraction",
    "weight_sync_s": "--weight-sync-seconds",
    "prompt_len": "--prompt-len",
    "gen_scaling": "--gen-scaling",
    "token_age": "--token-age",
}


def measure_from_prometheus(
    base_url: str,
    window: str,
    wanted: Iterable[str],
    timeout_s: float = 10.0,
    query: Query = prometheus_query,
    full_engine: tuple[int, float] | None = None,
) -> dict[str, float]:
    """Rates over the last `window` for the `wanted` keys of `MEASURABLE`.

    gen_tps is the average over generator series of rate(tokens). With `full_engine` = (M, a) it is
    scaled to a full engine by the groups the generators held on average, m (their
    groups_in_flight gauge): x (M/m)^a, which is exact for a = 1 (tokens/s in proportion to the
    groups, idle spells included) and a lower bound for a < 1 where the engines idled. learn_tps is the learner's token
    rate divided by the fraction of time it was neither waiting for a batch nor publishing weights.
    """
    if urllib.parse.urlsplit(base_url).scheme not in ("http", "https"):
        raise PlanError(
            f"--from-prometheus {base_url!r}: write the base URL with its scheme, e.g. http://prometheus:9090"
        )
    if not _WINDOW.match(window):
        raise PlanError(f"--window {window!r} is not a Prometheus duration; write e.g. 30m or 2h")

    def need(promql: str, key: str, what: str) -> float:
        value = query(base_url, promql, timeout_s)
        if value is None:
            raise PlanError(
                f"Prometheus at {base_url} has no data for {what} over the last {window} ({promql}); check "
                f"that it scrapes the services (ops/prometheus/prometheus.yml), widen --window, or pass "
                f"{_FLAG[key]}"
            )
        return value

    def rate(metric: str, agg: str = "sum", selector: str = "") -> str:
        return f"{agg}(rate({metric}{selector}[{window}]))"

    gen, lrn = catalogue(GeneratorMetrics), catalogue(LearnerMetrics)
    out: dict[str, float] = {}
    wanted = set(wanted)
    if unknown := wanted - set(MEASURABLE):
        raise PlanError(f"cannot measure {sorted(unknown)} from Prometheus; measurable: {MEASURABLE}")
    if "gen_tps" in wanted:
        tps = need(rate(sample_name(gen.tokens), "avg"), "gen_tps", "generator tokens")
        if tps <= 0:
            raise PlanError(f"the generators produced no tokens over the last {window}; pass --gen-tps")
        out["gen_tps"] = tps
        if full_engine is not None:
            held_q = f"avg(avg_over_time({sample_name(gen.groups_in_flight)}[{window}]))"
            held = query(base_url, held_q, timeout_s)
            if held is not None and held > 0:
                full, scaling = full_engine
                out["gen_tps"] = tps * (full / min(held, full)) ** scaling
                out["gen_groups_held"] = min(held, full)
    if "learn_tps" in wanted:
        tokens = need(rate(sample_name(lrn.tokens)), "learn_tps", "learner tokens")
        waiting = query(base_url, rate(sample_name(lrn.batch_wait_seconds, "_sum")), timeout_s) or 0.0
        syncing = query(base_url, rate(sample_name(lrn.weight_sync_seconds, "_sum")), timeout_s) or 0.0
        busy = 1.0 - waiting - syncing
        if tokens <= 0 or busy < 0.05:
            raise PlanError(
                f"the learner trained {tokens:g} tokens/s and had data {max(busy, 0):.0%} of the last "
                f"{window}: too little to measure its throughput; pass --learn-tps"
            )
        out["learn_tps"] = tokens / busy
    if "mean_response_len" in wanted:
        total = need(rate(sample_name(gen.response_length, "_sum")), "mean_response_len", "response lengths")
        count = need(rate(sample_name(gen.response_length, "_count")), "mean_response_len", "responses")
        if count <= 0:
            raise PlanError(f"no response finished over the last {window}; pass --mean-response-len")
        out["mean_response_len"] = total / count
    if "keep_fraction" in wanted:
        metric = sample_name(gen.groups)
        kept = need(rate(metric, selector='{outcome="mixed"}'), "keep_fraction", "kept (mixed) groups")
        total = need(rate(metric), "keep_fraction", "finished groups")
        if total <= 0 or kept <= 0:
            raise PlanError(
                f"{kept:g} of {total:g} groups/s were kept over the last {window}: nothing to size for; "
                "pass --keep-fraction"
            )
        out["keep_fraction"] = kept / total
    if "weight_sync_s" in wanted:
        metric = sample_name(lrn.weight_sync_seconds)
        seconds = need(rate(metric + "_sum"), "weight_sync_s", "weight-sync time")
        count = need(rate(metric + "_count"), "weight_sync_s", "weight publications")
        if count <= 0:
            raise PlanError(
                f"the learner published no weights over the last {window}; pass --weight-sync-seconds"
            )
        out["weight_sync_s"] = seconds / count
    if "token_age" in wanted:
        # Soft: generators older than these counters leave it to the default.
        counts = [
            query(base_url, rate(sample_name(metric, suffix)), timeout_s)
            for metric, suffix in (
                (gen.group_tail_tokens, ""),
                (gen.response_length, "_sum"),
                (gen.group_longest, "_sum"),
                (gen.group_longest, "_count"),
            )
        ]
        if all(c is not None and c > 0 for c in counts):
            out["token_age"] = token_age_from_counts(*(float(c) for c in counts if c is not None))
    return out


# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Plan generator replicas against the learner from the recipe and measured rates: "
        "over-generation, time per step, bottleneck, utilisation and expected staleness."
    )
    src = parser.add_argument_group("rates (flags win over --from-prometheus)")
    src.add_argument(
        "--from-prometheus", metavar="URL", help="measure the rates with Prometheus' HTTP API at URL"
    )
    src.add_argument(
        "--window",
        default=DEFAULT_WINDOW,
        help=f"rate() window for --from-prometheus (default {DEFAULT_WINDOW})",
    )
    src.add_argument("--timeout", type=float, default=10.0, help="seconds per Prometheus request")
    src.add_argument("--gen-tps", type=float, help="response tokens/s of one generator replica, engine full")
    src.add_argument("--learn-tps", type=float, help="trained tokens/s (prompt + response) of the learner")
    src.add_argument(
        "--mean-response-len",
        type=float,
        metavar="TOKENS",
        help=f"mean response length (default {DEFAULT_RESPONSE_FRACTION} x algo.max_response_len)",
    )
    src.add_argument(
        "--prompt-len",
        type=float,
        metavar="TOKENS",
        help=f"prompt length (default {DEFAULT_PROMPT_FRACTION} x model.max_prompt_len)",
    )
    src.add_argument(
        "--keep-fraction",
        type=float,
        help=f"fraction of groups dynamic sampling keeps (default {DEFAULT_KEEP_FRACTION})",
    )
    src.add_argument(
        "--weight-sync-seconds", type=float, help="seconds one weight publication pauses training (default 0)"
    )
    names = ", ".join(f"{k} = {v:g}" for k, v in ENGINE_SCALING.items())
    src.add_argument(
        "--gen-scaling",
        type=_engine_scaling,
        metavar="A|gpu|cpu",
        help=(
            "how a replica's tokens/s grows with the groups it holds: tokens/s ~ groups^A, 0 <= A <= 1 "
            f"({names}; default gpu). Measure it with bench/engine_scaling.py"
        ),
    )
    src.add_argument(
        "--token-age",
        type=float,
        metavar="RHO",
        help=(
            "a response token's mean wait for its group to finish, as a share of the group's time in the "
            "engine (default 0.5, equal lengths; the generators' group_tail_tokens counters measure it)"
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    from stream_dapo.tools import memory_plan

    memory_plan.add_arguments(parser)


def _engine_scaling(text: str) -> float:
    """--gen-scaling: a number or a name of `ENGINE_SCALING`."""
    if text.lower() in ENGINE_SCALING:
        return ENGINE_SCALING[text.lower()]
    try:
        return float(text)
    except ValueError:
        names = ", ".join(ENGINE_SCALING)
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a number in [0, 1] nor one of {names}"
        ) from None


def resolve_rates(args: argparse.Namespace, recipe: Recipe) -> tuple[Rates, dict[str, str]]:
    """Rates from flags, then Prometheus, then the stated defaults; and where each came from."""
    values: dict[str, float | None] = {
        "gen_tps": args.gen_tps,
        "learn_tps": args.learn_tps,
        "mean_response_len": args.mean_response_len,
        "prompt_len": args.prompt_len,
        "keep_fraction": args.keep_fraction,
        "weight_sync_s": args.weight_sync_seconds,
        "gen_scaling": getattr(args, "gen_scaling", None),
        "token_age": getattr(args, "token_age", None),
    }
    sources = {k: _FLAG[k] for k, v in values.items() if v is not None}
    if not recipe.dynamic_sampling:
        values["keep_fraction"], sources["keep_fraction"] = 1.0, "algo.dynamic_sampling = false"
    scaling = values["gen_scaling"]
    if scaling is None:
        scaling = values["gen_scaling"] = ENGINE_SCALING["gpu"]
        sources["gen_scaling"] = "default: gpu (tokens/s in proportion to groups)"
    missing = [k for k in MEASURABLE if values[k] is None]
    if args.from_prometheus and missing:
        full_engine = (recipe.max_groups_in_flight, scaling)
        measured = measure_from_prometheus(
            args.from_prometheus, args.window, missing, args.timeout, full_engine=full_engine
        )
        held = measured.pop("gen_groups_held", None)
        for key, value in measured.items():
            values[key], sources[key] = value, f"Prometheus, rate over {args.window}"
        if held is not None:
            sources["gen_tps"] += f" x ({recipe.max_groups_in_flight} / {held:.1f} groups held)^{scaling:g}"
    for key in ("gen_tps", "learn_tps"):
        if values[key] is None:
            raise PlanError(
                f"no {'generator' if key == 'gen_tps' else 'learner'} throughput: pass {_FLAG[key]} "
                "(measured tokens/s), or --from-prometheus URL to measure it"
            )
    defaults = {
        "mean_response_len": (
            DEFAULT_RESPONSE_FRACTION * recipe.max_response_len,
            f"default: {DEFAULT_RESPONSE_FRACTION} x algo.max_response_len",
        ),
        "prompt_len": (
            DEFAULT_PROMPT_FRACTION * recipe.max_prompt_len,
            f"default: {DEFAULT_PROMPT_FRACTION} x model.max_prompt_len",
        ),
        "keep_fraction": (DEFAULT_KEEP_FRACTION, "default (an assumption: measure it)"),
        "weight_sync_s": (0.0, "default (weight sync not counted)"),
        "token_age": (Rates.token_age, "default: responses of equal length in a group"),
    }
    for key, (value, source) in defaults.items():
        if values[key] is None:
            values[key], sources[key] = value, source
    rates = Rates(**{k: float(v) for k, v in values.items() if v is not None})
    return rates, sources


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


def run(args: argparse.Namespace) -> int:
    if getattr(args, "memory", False):
        from stream_dapo.tools import memory_plan

        return memory_plan.run(args)
    cfg: Config = args.cfg
    recipe = Recipe.from_config(cfg)
    try:
        rates, sources = resolve_rates(args, recipe)
        result = plan(recipe, rates)
    except PlanError as exc:
        print(f"stream-dapo plan: {exc}", file=sys.stderr)
        return 2
    if cfg.run.mode == "sync":
        print(
            "stream-dapo plan: run.mode = sync alternates generation and training; this plan models the "
            "async pipeline",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(plan_to_json(result, sources), indent=2))
    else:
        print(format_plan(result, sources))
    return 0
