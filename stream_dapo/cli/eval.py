"""`stream-dapo eval`: avg@k / pass@k of a model on an eval set with vLLM (`stream_dapo.tools.evaluate`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stream_dapo.config import Config
from stream_dapo.config.sources import data_sources, reward_specs
from stream_dapo.data.sources import DEFAULT_SOURCE
from stream_dapo.errors import ConfigError
from stream_dapo.tools.evaluate import evaluate, resolve_eval_data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="model directory (default: model.path)")
    parser.add_argument(
        "--data",
        default=None,
        help="DAPO-schema .parquet/.jsonl (default: data.eval_path, else the synthetic eval split)",
    )
    parser.add_argument(
        "--k", type=int, default=None, help="samples per prompt for avg@k/pass@k (default: eval.k)"
    )
    parser.add_argument("--n", type=int, default=None, help="samples drawn per prompt, n >= k (default: k)")
    parser.add_argument("--temperature", type=float, default=None, help="default: eval.temperature")
    parser.add_argument("--top-p", type=float, default=None, help="default: eval.top_p")
    parser.add_argument("--top-k", type=int, default=None, help="0: off (default: eval.top_k)")
    parser.add_argument("--min-p", type=float, default=None, help="0: off (default: eval.min_p)")
    parser.add_argument("--max-prompts", type=int, default=None, help="default: eval.max_prompts")
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="response budget (default: algo.max_response_len)"
    )
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")


def run(args: argparse.Namespace) -> int:
    """One JSON line: the eval set's figures; with [[data.sources]] (and no --data), each source's
    eval_path scored with its own reward under ``by_source``, and the pooled figures at the top."""
    from stream_dapo.generator.vllm_utils import running_llm
    from stream_dapo.verifier import VerifierPool

    cfg: Config = args.cfg
    model = str(_pick(args.model, cfg.model.path))
    if not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(
            f"no model at {model} (config.json missing); pass --model DIR, or build the tiny default "
            "with `stream-dapo warmup`"
        )
    k = _pick(args.k, cfg.eval.k)
    max_tokens = _pick(args.max_tokens, cfg.algo.max_response_len)
    max_prompts = _pick(args.max_prompts, cfg.eval.max_prompts)
    if k < 1 or max_prompts < 1 or max_tokens < 1:
        raise ValueError("--k, --max-prompts and --max-tokens must be >= 1")
    sets = _eval_sets(cfg, args, max_tokens)
    if not sets:
        raise ConfigError("no data.sources entry has an eval_path; give one an eval_path or pass --data FILE")
    sampling = {
        "k": k,
        "n": args.n,
        "temperature": _pick(args.temperature, cfg.eval.temperature),
        "top_p": _pick(args.top_p, cfg.eval.top_p),
        "top_k": _pick(args.top_k, cfg.eval.top_k),
        "min_p": _pick(args.min_p, cfg.eval.min_p),
        "seed": args.seed,
    }
    # running_llm stops vLLM's engine processes however this ends, SIGTERM (a supervisor, `timeout`,
    # `kill`) included: by default the signal ends only this process and leaves them running.
    with (
        running_llm(
            model,
            cfg.generator,
            dtype=cfg.model.dtype,
            max_model_len=cfg.model.max_prompt_len + max_tokens,
            seed=args.seed,
        ) as llm,
        VerifierPool.from_config(cfg.verifier, rewards=reward_specs(cfg)) as pool,
    ):
        results = {
            name: evaluate(
                llm,
                _load(cfg, model, data, data_source)[:max_prompts],
                max_tokens=budget,
                verifier=pool,
                reward=name,
                **sampling,
            )
            for name, (data, data_source, budget) in sets.items()
        }
    if not cfg.data.sources or args.data is not None:
        (result,) = results.values()
        (data, _, _) = next(iter(sets.values()))
        print(json.dumps({**result, "model": model, "data": str(data)}))
        return 0
    print(json.dumps({**pooled(results), "by_source": results, "model": model}))
    return 0


def _eval_sets(cfg: Config, args: argparse.Namespace, max_tokens: int) -> dict[str, tuple[Path, Any, int]]:
    """(file, data_source filter, response budget) of each eval set, by source name."""
    if args.data is not None or not cfg.data.sources:
        data = Path(args.data) if args.data is not None else resolve_eval_data(cfg)
        return {DEFAULT_SOURCE: (data, None, max_tokens)}
    return {
        s.name: (Path(s.eval_path), s.data_source, min(max_tokens, s.max_response_len or max_tokens))
        for s in data_sources(cfg)
        if s.eval_path is not None
    }


def _load(cfg: Config, model: str, data: Path, data_source: Any) -> list[Any]:
    from transformers import AutoTokenizer

    from stream_dapo.data.dataset import LazyPrompts

    prompts = LazyPrompts(
        data, AutoTokenizer.from_pretrained(model), cfg.model.max_prompt_len, data_sources=data_source
    )
    return [p for p in (prompts[i] for i in range(len(prompts))) if p is not None]


def pooled(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sources' figures over all their samples: means weighted by samples (prompts for pass@k)."""
    samples = {name: r["num_samples"] for name, r in results.items()}
    prompts = {name: r["num_prompts"] for name, r in results.items()}
    total_s, total_p = sum(samples.values()), sum(prompts.values())

    def by_samples(key: str) -> float:
        return sum(results[name][key] * samples[name] for name in results) / total_s

    return {
        "avg_at_k": by_samples("avg_at_k"),
        "pass_at_k": sum(results[name]["pass_at_k"] * prompts[name] for name in results) / total_p,
        "mean_score": by_samples("mean_score"),
        "mean_response_len": by_samples("mean_response_len"),
        "truncation_rate": by_samples("truncation_rate"),
        "answered_rate": by_samples("answered_rate"),
        "num_prompts": total_p,
        "num_samples": total_s,
        "k": next(iter(results.values()))["k"],
    }


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value
