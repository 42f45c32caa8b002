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

The package: `model` (the fluid model), `measure` (rates from Prometheus), `format` (text and
JSON); the command is `stream_dapo.cli.plan`.
"""

from stream_dapo.tools.plan.format import format_plan, plan_to_json
from stream_dapo.tools.plan.measure import MEASURABLE, measure_from_prometheus, prometheus_query
from stream_dapo.tools.plan.model import (
    DEFAULT_KEEP_FRACTION,
    DEFAULT_PROMPT_FRACTION,
    DEFAULT_RESPONSE_FRACTION,
    DEFAULT_WINDOW,
    ENGINE_SCALING,
    Plan,
    PlanError,
    Rates,
    Recipe,
    Staleness,
    capacity_for_step,
    check_rates,
    engine_groups,
    expected_staleness,
    generator_tokens_per_step,
    generators_step_seconds,
    group_residence_seconds,
    in_flight_groups,
    learner_step_seconds,
    learner_tokens_per_step,
    line_step_seconds,
    max_staleness_for_capacity,
    over_generation_factor,
    plan,
    replica_step_seconds,
    sync_seconds_per_step,
    token_age_from_counts,
)

__all__ = [
    "DEFAULT_KEEP_FRACTION",
    "DEFAULT_PROMPT_FRACTION",
    "DEFAULT_RESPONSE_FRACTION",
    "DEFAULT_WINDOW",
    "ENGINE_SCALING",
    "MEASURABLE",
    "Plan",
    "PlanError",
    "Rates",
    "Recipe",
    "Staleness",
    "capacity_for_step",
    "check_rates",
    "engine_groups",
    "expected_staleness",
    "format_plan",
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
    "plan_to_json",
    "prometheus_query",
    "replica_step_seconds",
    "sync_seconds_per_step",
    "token_age_from_counts",
]
