"""Learner passes with and without shared prompts (learner.share_prompt), short responses, long prompts.

    nice -n 19 .venv/bin/python -m bench.perf.learner_share_prompt [--quick] [--repeats N] [--layers N]

The word-problem recipe's learner step (configs/smollm2-words-cpu.toml: groups of 8, 32 samples per
mini-batch, micro_batch_tokens 2048, logprob_chunk_tokens 1024, the decoupled DAPO loss) on a model of
SmolLM2-135M's shapes: Llama, hidden 576, `LAYERS` layers, 9 heads / 3 key-value heads, intermediate
1536, vocabulary 49,152, tied embeddings; random weights (seed 0), float32, sdpa attention. The
mini-batch: 4 groups of 8 with prompts of about `PROMPT` tokens and responses of about `RESPONSE`
(uniform within +-`SPREAD`), which is what that recipe's steps measured (~143 tokens per sample, ~96
of them prompt).

Both layouts run the project's `Learner` (an engine that only runs backward: no optimizer step, which
is the same work either way) on the same mini-batch and weights, interleaved (order rotated every
repeat, `bench.report.interleave`), and are timed per pass: the proximal no-grad forward
(`compute_logprobs`) and the training forward + backward of every micro-batch
(`accumulate_gradients`). Reported: median, min and max seconds of each, the paired speed-up
(per-sample / shared, median of per-repeat ratios), tokens the forward processes, micro-batches and
packing efficiency of each layout, and the largest difference of a trained token's log-prob between
the layouts (a check: float rounding only).

Timing on a machine whose cores are busy with other work is not a measurement; run it on a quiet one.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from bench.report import bench_parser, interleave, machine_info, paired_ratio, summary
from stream_dapo.config import Config
from stream_dapo.learner.packing import scatter_to_sequences
from stream_dapo.learner.trainer import Learner, MiniBatch
from stream_dapo.testing.learner import BackwardOnlyEngine
from stream_dapo.testing.services import random_group
from stream_dapo.transport.messages import Group

if TYPE_CHECKING:
    from transformers import PreTrainedModel

LAYERS = 30
PROMPT, RESPONSE, SPREAD = 96, 48, 24
GROUPS, GROUP_SIZE = 4, 8
LAYOUTS = ("per_sample", "shared")


def smollm2_shaped(layers: int) -> PreTrainedModel:
    """SmolLM2-135M's architecture (Llama) with random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=2048,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).float()


def recipe(share: bool) -> Config:
    """The recipe's learner and loss settings (the sections that matter to a learner step)."""
    return Config.model_validate(
        {
            "model": {"max_prompt_len": 256, "path": "unused"},
            "algo": {"group_size": GROUP_SIZE, "max_response_len": 256, "overlong_cache_len": 64},
            "learner": {
                "mini_batch_samples": GROUPS * GROUP_SIZE,
                "rollout_batch_prompts": GROUPS,
                "micro_batch_tokens": 2048,
                "logprob_chunk_tokens": 1024,
                "share_prompt": share,
            },
        }
    )


def mini_batch(seed: int = 0) -> list[Group]:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(GROUPS):
        prompt = int(rng.integers(PROMPT - 16, PROMPT + 17))
        lengths = rng.integers(RESPONSE - SPREAD, RESPONSE + SPREAD + 1, GROUP_SIZE).tolist()
        advantages = rng.normal(size=GROUP_SIZE).tolist()
        groups.append(random_group(rng, f"g{g}", prompt, lengths, advantages, [1.0] * GROUP_SIZE))
    return groups


def measure(repeats: int, warmup: int, layers: int) -> dict[str, Any]:
    groups = mini_batch()
    model = smollm2_shaped(layers)
    learners: dict[str, Learner] = {}
    batches: dict[str, MiniBatch] = {}
    for name in LAYOUTS:
        # Both learners train the same Parameters (nothing is stepped); each packs its own way.
        learners[name] = Learner(recipe(name == "shared"), model, make_engine=BackwardOnlyEngine)
        batches[name] = learners[name].prepare(groups)
    seconds: dict[str, dict[str, list[float]]] = {name: {"prox": [], "train": []} for name in LAYOUTS}
    logprobs: dict[str, list[np.ndarray]] = {}

    def one_pass(name: str) -> float:
        learner, batch = learners[name], batches[name]
        start = time.perf_counter()
        prox = learner.compute_logprobs(batch.micro_batches)
        mid = time.perf_counter()
        learner.accumulate_gradients(batch, prox)
        end = time.perf_counter()
        model.zero_grad(set_to_none=True)
        seconds[name]["prox"].append(mid - start)
        seconds[name]["train"].append(end - mid)
        logprobs[name] = scatter_to_sequences(batch.micro_batches, prox, batch.num_samples)
        return end - start

    totals = interleave({name: partial(one_pass, name) for name in LAYOUTS}, repeats, warmup=warmup)
    for name in LAYOUTS:  # interleave drops warm-up rounds from what it returns; do the same here
        for key in seconds[name]:
            seconds[name][key] = seconds[name][key][warmup:]
    gap = max(
        float(np.abs(a - b).max()) for a, b in zip(logprobs["per_sample"], logprobs["shared"], strict=True)
    )
    return {
        "model": {
            "shape": "SmolLM2-135M (Llama), random init, float32, sdpa",
            "layers": layers,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "mini_batch": {
            "groups": GROUPS,
            "group_size": GROUP_SIZE,
            "samples": batches["shared"].num_samples,
            "prompt_tokens": [len(g.prompt_tokens) for g in groups],
            "response_tokens_mean": float(np.mean([len(s.tokens) for g in groups for s in g.samples])),
            "loss_tokens": batches["shared"].global_tokens,
        },
        "layouts": {
            name: {
                "forward_tokens": batches[name].global_real_tokens,
                "padded_tokens": sum(mb.padded_tokens for mb in batches[name].micro_batches),
                "micro_batches": len(batches[name].micro_batches),
                "packing_efficiency": batches[name].packing_efficiency,
                "seconds": {
                    "prox_forward": summary(seconds[name]["prox"]),
                    "train_forward_backward": summary(seconds[name]["train"]),
                    "both": summary(totals[name]),
                },
            }
            for name in LAYOUTS
        },
        "speedup_shared_vs_per_sample": {
            "prox_forward": paired_ratio(seconds["per_sample"]["prox"], seconds["shared"]["prox"]),
            "train_forward_backward": paired_ratio(
                seconds["per_sample"]["train"], seconds["shared"]["train"]
            ),
            "both": paired_ratio(totals["per_sample"], totals["shared"]),
        },
        "max_logprob_difference": gap,
        "repeats": repeats,
        "warmup": warmup,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_info(),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7; 2 with --quick)")
    parser.add_argument("--layers", type=int, default=LAYERS, help=f"decoder layers (default {LAYERS})")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 7)
    warmup = 0 if args.quick else 1
    out = measure(repeats, warmup, args.layers)
    print(json.dumps(out, indent=1))
    speed = out["speedup_shared_vs_per_sample"]
    print(
        f"\nforward tokens {out['layouts']['per_sample']['forward_tokens']} -> "
        f"{out['layouts']['shared']['forward_tokens']}; speed-up (median of {repeats} paired repeats): "
        f"prox forward {speed['prox_forward']:.2f}x, train forward+backward "
        f"{speed['train_forward_backward']:.2f}x, both {speed['both']:.2f}x"
    )


if __name__ == "__main__":
    main()
