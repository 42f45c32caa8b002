"""`stream-dapo eval`: avg@k / pass@k of a model on an eval set with vLLM (`stream_dapo.tools.evaluate`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stream_dapo.config import Config
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
    from transformers import AutoTokenizer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.generator.vllm_utils import running_llm
    from stream_dapo.verifier import VerifierPool

    cfg: Config = args.cfg
    model = str(_pick(args.model, cfg.model.path))
    if not (Path(model) / "config.json").is_file():
        raise FileNotFoundError(
            f"no model at {model} (config.json missing); pass --model DIR, or build the tiny default "
            "with `stream-dapo warmup`"
        )
    data = Path(args.data) if args.data is not None else resolve_eval_data(cfg)
    k = _pick(args.k, cfg.eval.k)
    max_tokens = _pick(args.max_tokens, cfg.algo.max_response_len)
    max_prompts = _pick(args.max_prompts, cfg.eval.max_prompts)
    if k < 1 or max_prompts < 1 or max_tokens < 1:
        raise ValueError("--k, --max-prompts and --max-tokens must be >= 1")

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts, _ = load_prompts(data, tokenizer, cfg.model.max_prompt_len)
    prompts = prompts[:max_prompts]
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
        VerifierPool.from_config(cfg.verifier) as pool,
    ):
        result = evaluate(
            llm,
            prompts,
            k=k,
            n=args.n,
            temperature=_pick(args.temperature, cfg.eval.temperature),
            top_p=_pick(args.top_p, cfg.eval.top_p),
            top_k=_pick(args.top_k, cfg.eval.top_k),
            min_p=_pick(args.min_p, cfg.eval.min_p),
            max_tokens=max_tokens,
            seed=args.seed,
            verifier=pool,
        )
    print(json.dumps({**result, "model": model, "data": str(data)}))
    return 0


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value
