"""`stream-dapo plan --memory`: the per-GPU estimate, item by item, against numbers worked by hand.

The shape: 2 layers, hidden 8, intermediate 16, 2 heads, 1 key/value head (width 4), vocabulary 32,
tied. A layer has q 8x8+8, k and v 8x4+4 each, o 8x8, MLP 3x8x16, two norms of 8: 608 parameters;
the model 32x8 + 2x608 + 8 = 1480.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from stream_dapo.cli import main
from stream_dapo.tools.memory_plan import (
    GIB,
    KNOWN_SHAPES,
    MemoryPlanError,
    ModelShape,
    Settings,
    estimate,
    largest_micro_batch_tokens,
    shape_for,
)

SHAPE = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=32, tied=True)
FP32 = Settings(
    dtype_bytes=4,
    zero_stage=0,
    micro_batch_tokens=100,
    logprob_chunk_tokens=0,
    gradient_checkpointing=False,
    offload_optimizer="none",
    offload_param="none",
)


def test_parameter_count() -> None:
    assert SHAPE.kv_width == 4 and SHAPE.layer_params == 608 and SHAPE.params == 1480
    assert replace(SHAPE, tied=False).params == 1480 + 256
    # Qwen2.5-0.5B: 494M parameters as published (tied).
    assert KNOWN_SHAPES["qwen2.5-0.5b"].params == pytest.approx(494.0e6, rel=0.002)


def test_float32_zero0_full_logits_item_by_item() -> None:
    e = estimate(SHAPE, FP32, gpus=1, reserve_gib=0)
    assert e.weights == 4 * 1480
    assert e.gradients == 4 * 1480  # no ZeRO: no reduce bucket
    assert e.optimizer == 8 * 1480  # Adam moments; float32 needs no master copy
    # Per token: a layer 4 x (4x16 + 5x8 + 2x4) + 8x8 = 512; model level 4x2x8 + 4x8 = 96.
    assert e.activations == 100 * (2 * 512 + 96)
    assert e.loss_path == 100 * 32 * 12
    assert e.total == 5920 + 5920 + 11840 + 112000 + 38400
    assert e.cpu_offloaded == 0


def test_checkpointing_keeps_layer_inputs_and_one_layer() -> None:
    e = estimate(SHAPE, replace(FP32, gradient_checkpointing=True), gpus=1, reserve_gib=0)
    assert e.activations == 100 * (2 * 4 * 8 + 512 + 96)


def test_chunked_loss_path_is_flat_in_tokens() -> None:
    for tokens in (100, 1000):
        e = estimate(SHAPE, replace(FP32, logprob_chunk_tokens=10, micro_batch_tokens=tokens), 1, 0)
        assert e.loss_path == 10 * 32 * 8 + 4 * 32 * 8
    bf16 = estimate(SHAPE, replace(FP32, dtype_bytes=2, zero_stage=1, logprob_chunk_tokens=10), 1, 0)
    assert bf16.loss_path == 10 * 32 * (8 + 2) + 4 * 32 * 8


def test_bfloat16_zero3_partitions_and_offloads() -> None:
    s = replace(FP32, dtype_bytes=2, zero_stage=3)
    e = estimate(SHAPE, s, gpus=4, reserve_gib=1)
    assert e.weights == 2 * 1480 / 4 + 2 * (608 + 608)  # shard + working set (a layer, prefetch one)
    assert e.gradients == 4 * 1480 / 4 + 2 * 1480  # fp32 partition + bucket (capped at b P)
    assert e.optimizer == 12 * 1480 / 4  # moments + fp32 master weights
    assert e.overhead == GIB
    off = estimate(SHAPE, replace(s, offload_optimizer="cpu", offload_param="cpu"), gpus=4, reserve_gib=0)
    assert (off.weights, off.gradients, off.optimizer) == (2 * 1216, 2 * 1480, 0)
    assert off.cpu_offloaded == 2 * 1480 / 4 + 4 * 1480 / 4 + 12 * 1480 / 4


def test_zero1_keeps_full_gradients_and_zero2_partitions_them() -> None:
    s = replace(FP32, dtype_bytes=2)
    assert estimate(SHAPE, replace(s, zero_stage=1), 4, 0).gradients == 4 * 1480 + 2 * 1480
    assert estimate(SHAPE, replace(s, zero_stage=2), 4, 0).gradients == 4 * 1480 / 4 + 2 * 1480
    assert estimate(SHAPE, replace(s, zero_stage=1), 4, 0).optimizer == 12 * 1480 / 4


def test_largest_micro_batch_tokens() -> None:
    # Fixed 23680 bytes + 1504 per token; a budget of exactly 1000 tokens -> 960 (multiples of 64).
    budget_gib = (23680 + 1504 * 1000) / GIB
    assert largest_micro_batch_tokens(SHAPE, FP32, 1, budget_gib, reserve_gib=0) == 960
    assert largest_micro_batch_tokens(SHAPE, FP32, 1, (23680 + 1504 * 1024) / GIB, reserve_gib=0) == 1024
    assert largest_micro_batch_tokens(SHAPE, FP32, 1, 1000 / GIB, reserve_gib=0) == 0


def test_shape_from_model_dir_name_or_flag(tmp_path) -> None:
    assert shape_for("/models/Qwen2.5-32B")[0] == KNOWN_SHAPES["qwen2.5-32b"]
    assert shape_for("/x", "Qwen2.5-1.5B")[0] == KNOWN_SHAPES["qwen2.5-1.5b"]
    (tmp_path / "config.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, '
        '"num_key_value_heads": 1, "vocab_size": 32, "tie_word_embeddings": true}'
    )
    assert shape_for(str(tmp_path))[0] == SHAPE
    with pytest.raises(MemoryPlanError, match="pass --model-shape"):
        shape_for("/models/mystery")
    with pytest.raises(MemoryPlanError, match="is not one of"):
        shape_for("/x", "llama-9b")


def test_cli_says_what_makes_the_32b_recipe_fit(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["plan", "--memory", "--config", "configs/dapo-qwen2.5-32b.toml", "--gpus", "16", "--gpu-gib", "80"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "32.76B parameters" in out
    assert "fits: as configured" in out and "gradient_checkpointing=true" in out
    rc = main(
        [
            "plan",
            "--memory",
            "--config",
            "configs/dapo-qwen2.5-32b.toml",
            "--set",
            "learner.gradient_checkpointing=false",
            "--gpus",
            "16",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "fits: + activation checkpointing" in out
    assert main(["plan", "--memory", "--model-shape", "nope"]) == 2
    assert "is not one of" in capsys.readouterr().err


def test_cli_names_a_smaller_micro_batch_where_nothing_fits_at_the_configured_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "plan",
        "--memory",
        "--config",
        "configs/dapo-qwen2.5-32b.toml",
        "--gpus",
        "16",
        "--gpu-gib",
        "40",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nothing fits at micro_batch_tokens = 32768; + optimizer offload to CPU" in out
    assert "(one sequence needs 22528)" in out
    assert main([*args[:-4], "--gpus", "1", "--gpu-gib", "16"]) == 1
    assert "nothing here fits one sequence (22528 tokens)" in capsys.readouterr().out


def test_a_shape_round_trips_through_its_hugging_face_config() -> None:
    for shape in KNOWN_SHAPES.values():
        assert ModelShape.from_hf_config(shape.to_hf_config()) == shape
    qwen_05b = KNOWN_SHAPES["qwen2.5-0.5b"].to_hf_config()
    assert (
        qwen_05b["num_hidden_layers"],
        qwen_05b["num_key_value_heads"],
        qwen_05b["tie_word_embeddings"],
    ) == (
        24,
        2,
        True,
    )
    # Keys a config.json may omit take Hugging Face's defaults.
    partial = {k: v for k, v in qwen_05b.items() if k not in ("num_key_value_heads", "tie_word_embeddings")}
    assert ModelShape.from_hf_config(partial) == replace(
        KNOWN_SHAPES["qwen2.5-0.5b"], kv_heads=14, tied=False
    )


def test_settings_take_the_learner_keys_and_the_dtype() -> None:
    from stream_dapo.config import load_config

    cfg = load_config(
        overrides=["model.dtype=bfloat16", "learner.zero_stage=3", 'learner.offload_param="cpu"'], environ={}
    )
    s = Settings.from_config(cfg)
    assert (s.dtype_bytes, s.zero_stage, s.offload_param, s.offload_optimizer) == (2, 3, "cpu", "none")
    assert (s.micro_batch_tokens, s.logprob_chunk_tokens) == (8192, 1024)
