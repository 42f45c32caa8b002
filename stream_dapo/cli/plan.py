"""`stream-dapo plan`: the command (`stream_dapo.tools.plan` holds the model; `--memory` is
`stream_dapo.tools.memory_plan`)."""

from __future__ import annotations

import argparse
import json
import sys

from stream_dapo.config import Config

# --------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------
from stream_dapo.tools.memory_plan import (
    DEFAULT_RESERVE_GIB,
    KNOWN_SHAPES,
    MemoryPlanError,
    Settings,
    format_memory_plan,
    memory_plan,
    shape_for,
)
from stream_dapo.tools.plan.format import format_plan, plan_to_json
from stream_dapo.tools.plan.measure import FLAGS, MEASURABLE, measure_from_prometheus
from stream_dapo.tools.plan.model import (
    DEFAULT_KEEP_FRACTION,
    DEFAULT_PROMPT_FRACTION,
    DEFAULT_RESPONSE_FRACTION,
    DEFAULT_WINDOW,
    ENGINE_SCALING,
    PlanError,
    Rates,
    Recipe,
    plan,
)


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
            f"({names}; default gpu). Measure it with bench/perf/engine_scaling.py"
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
    add_memory_arguments(parser)


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
    sources = {k: FLAGS[k] for k, v in values.items() if v is not None}
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
                f"no {'generator' if key == 'gen_tps' else 'learner'} throughput: pass {FLAGS[key]} "
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


def run(args: argparse.Namespace) -> int:
    if getattr(args, "memory", False):
        return run_memory(args)
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


def add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory (--memory)")
    group.add_argument(
        "--memory", action="store_true", help="estimate the learner's per-GPU memory instead of replicas"
    )
    group.add_argument("--gpus", type=int, default=1, help="learner GPUs (data-parallel ranks; default 1)")
    group.add_argument("--gpu-gib", type=float, default=80.0, help="memory of one GPU in GiB (default 80)")
    group.add_argument(
        "--reserve-gib",
        type=float,
        default=DEFAULT_RESERVE_GIB,
        help=f"per-GPU allowance for CUDA context, NCCL and fragmentation (default {DEFAULT_RESERVE_GIB:g})",
    )
    group.add_argument(
        "--model-shape",
        metavar="NAME",
        help=f"model shape when model.path has no config.json here: {', '.join(KNOWN_SHAPES)}",
    )


def run_memory(args: argparse.Namespace) -> int:
    """`stream-dapo plan --memory`: the learner's memory per GPU (`stream_dapo.tools.memory_plan`)."""
    cfg: Config = args.cfg
    try:
        if args.gpu_gib <= 0:
            raise MemoryPlanError(f"--gpu-gib must be > 0, got {args.gpu_gib:g}")
        shape, source = shape_for(cfg.model.path, args.model_shape)
        min_tokens = cfg.model.max_prompt_len + cfg.algo.max_response_len
        result = memory_plan(
            shape, Settings.from_config(cfg), args.gpus, args.gpu_gib, args.reserve_gib, min_tokens
        )
    except MemoryPlanError as exc:
        print(f"stream-dapo plan: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result | {"shape_source": source}, indent=2))
    else:
        print(format_memory_plan(result, source))
    return 0 if result["first_fit"] is not None or result["fits_smaller"] is not None else 1
