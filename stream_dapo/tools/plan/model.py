"""The planner's fluid model (the numbered steps of `stream_dapo.tools.plan`): inputs, one function
per step, and `plan()`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

from stream_dapo.config import Config
from stream_dapo.core.admission import AdmissionRule

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
with 16, a least-squares a of 0.49 over 1-16 groups, 0.38 in a rerun (bench/perf/engine_scaling.py,
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
