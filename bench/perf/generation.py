"""Generator throughput: the project's vLLM engine vs transformers ``generate``, same work.

    .venv/bin/python -m bench.perf.generation [--quick] [--config configs/tiny-cpu.toml] [--prompts 16]
        [--repeats 5] [--json FILE]

Both sample the warm tiny model on the same synthetic-task prompts (chat template), G = group_size
samples per prompt, at most algo.max_response_len tokens, temperature 1 / top-p 1 (top-k off),
with the config's settings (tiny-cpu by default; configs/tiny-longcot-cpu.toml measures long,
long-tailed responses, where one ``generate`` batch runs until its longest row ends):

- vLLM: `RolloutEngine` (what the generator service runs): one n=1 request per sample with the
  sampled token's log-prob, prefix caching, the config's KV cache, max_num_seqs, eager mode and its
  core binding (generator.threads cores for the worker); every prompt of a repeat is in flight at
  once, as with max_groups_in_flight.
- transformers: ``model.generate`` (the warm-up's pass@1 helper, `stream_dapo.model.warmup`) on one
  left-padded batch of all prompts x G, with torch limited to the same generator.threads threads,
  and once more with a thread per usable core (vLLM's scheduler and output handling run in
  processes of their own, beside the worker's bound cores, so it uses more than its threads).

The figure is response tokens per second (EOS counted, padding not), median over interleaved
repeats; engine start-up (vLLM: engine processes + KV cache; transformers: loading the model) is
timed separately and excluded. One warm-up round first (vLLM compiles its sampler on first use).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from bench.report import bench_parser, interleave, paired_ratio, save_json, summary  # noqa: E402
from bench.workload import task_prompts, tiny_config, warm_model_dir  # noqa: E402

__all__ = ["measure_generation"]


def measure_generation(
    quick: bool = False, config: Path | None = None, num_prompts: int = 16, repeats: int = 5
) -> dict[str, Any]:
    """Response tokens/s of vLLM and transformers, interleaved repeats; ratio vLLM / transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.model.warmup import _generate

    if quick:
        num_prompts, repeats = 4, 2
    cfg = tiny_config() if config is None else tiny_config(config=config)
    model_dir = warm_model_dir(cfg)
    cfg = tiny_config([f"model.path={model_dir}"], **({} if config is None else {"config": config}))
    group_size, max_tokens = cfg.algo.group_size, cfg.algo.max_response_len
    threads = cfg.generator.threads
    prompts = task_prompts(cfg, model_dir, split="eval")
    if len(prompts) < num_prompts * (repeats + 1):
        raise RuntimeError(f"need {num_prompts * (repeats + 1)} eval prompts, have {len(prompts)}")

    engine = RolloutEngine.start(cfg)
    start = time.perf_counter()
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    hf_startup = time.perf_counter() - start

    all_cores = len(os.sched_getaffinity(0))
    variants = {"vllm": None, "transformers": threads, "transformers_all_cores": all_cores}
    lengths: dict[str, list[int]] = {name: [] for name in variants}
    rounds = dict.fromkeys(variants, 0)

    def batch_for(name: str) -> list[Any]:
        # Round r of every variant samples the same prompts; warm-up is round 0.
        r = rounds[name]
        rounds[name] += 1
        return prompts[r * num_prompts : (r + 1) * num_prompts]

    def run_vllm() -> float:
        batch = batch_for("vllm")
        start = time.perf_counter()
        for item in batch:
            engine.add_group(item)
        done = []
        while engine.num_in_flight:
            done.extend(engine.step())
        seconds = time.perf_counter() - start
        got = [len(s.token_ids) for g in done for s in g.samples]
        lengths["vllm"].extend(got)
        return sum(got) / seconds

    def run_transformers(name: str) -> float:
        batch = batch_for(name)
        torch.set_num_threads(variants[name] or 1)
        ids = [item.prompt_token_ids for item in batch for _ in range(group_size)]
        start = time.perf_counter()
        out = _generate(
            model,
            tokenizer,
            ids,
            sample=True,
            max_new_tokens=max_tokens,
            seed=rounds[name],
            batch_size=len(ids),
        )
        seconds = time.perf_counter() - start
        # `_generate` strips EOS: a row shorter than the limit ended with one, count it as vLLM does.
        got = [len(row) + (len(row) < max_tokens) for row in out]
        lengths[name].extend(got)
        return sum(got) / seconds

    try:
        rates = interleave(
            {
                "vllm": run_vllm,
                "transformers": lambda: run_transformers("transformers"),
                "transformers_all_cores": lambda: run_transformers("transformers_all_cores"),
            },
            repeats,
            warmup=1,
        )
    finally:
        engine.close()
    warm_samples = num_prompts * group_size  # the warm-up round's samples are not in the figures

    def length_stats(values: list[int]) -> dict[str, float]:
        timed = values[warm_samples:]
        return {
            "mean": sum(timed) / len(timed),
            "truncated_fraction": sum(v >= max_tokens for v in timed) / len(timed),
        }

    return {
        "config": None if config is None else str(config),
        "model_dir": str(model_dir),
        "prompts_per_repeat": num_prompts,
        "group_size": group_size,
        "samples_per_repeat": num_prompts * group_size,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "threads": threads,
        "all_cores": all_cores,
        "repeats": repeats,
        "startup_seconds": {"vllm": engine.startup_seconds, "transformers": hf_startup},
        "tokens_per_second": {name: summary(values) for name, values in rates.items()},
        "ratio_vllm_vs_transformers": paired_ratio(rates["vllm"], rates["transformers"]),
        "ratio_vllm_vs_transformers_all_cores": paired_ratio(rates["vllm"], rates["transformers_all_cores"]),
        "response_length": {name: length_stats(values) for name, values in lengths.items()},
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--config", type=Path, default=None, help="default: configs/tiny-cpu.toml")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per repeat (x group_size samples)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    result = measure_generation(args.quick, args.config, args.prompts, args.repeats)
    print(json.dumps(result, indent=1))
    save_json(args.json, result)


if __name__ == "__main__":
    main()
