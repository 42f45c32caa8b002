"""Activation checkpointing and DeepSpeed offload: validated at load, wired into the engine, and
checkpointing leaves the step's loss and gradients unchanged."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from stream_dapo.config import Config, load_config
from stream_dapo.errors import ConfigError
from stream_dapo.learner.trainer import Learner, deepspeed_config
from stream_dapo.testing.learner import BackwardOnlyEngine
from stream_dapo.testing.services import tiny_qwen2
from tests.unit.test_chunked_logprobs import _cfg, _groups


@pytest.mark.parametrize(
    ("overrides", "fix"),
    [
        (['learner.offload_optimizer="cpu"'], "set learner.zero_stage = 1, 2 or 3"),
        (['learner.offload_param="cpu"', "learner.zero_stage=2"], "set learner.zero_stage = 3"),
        (['learner.offload_optimizer="nvme"', "learner.zero_stage=2"], "set learner.offload_nvme_path"),
        (
            ['learner.offload_param="nvme"', 'learner.offload_optimizer="nvme"', "learner.zero_stage=3"],
            "set learner.offload_nvme_path",
        ),
        (['learner.offload_nvme_path="/nvme"', "learner.zero_stage=2"], 'offload_param) = "nvme"'),
        (['learner.offload_optimizer="disk"', "learner.zero_stage=2"], "'none', 'cpu' or 'nvme'"),
    ],
)
def test_impossible_offload_settings_fail_at_load_naming_the_fix(overrides: list[str], fix: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config([], overrides, environ={})
    assert fix in str(info.value)


def test_deepspeed_config_carries_the_offload_switches() -> None:
    cfg = load_config(
        [],
        [
            "learner.zero_stage=3",
            'learner.offload_optimizer="nvme"',
            'learner.offload_param="cpu"',
            'learner.offload_nvme_path="/local_nvme/sd"',
        ],
        environ={},
    )
    zo = deepspeed_config(cfg, world_size=16, on_gpu=True)["zero_optimization"]
    assert zo["offload_optimizer"] == {"device": "nvme", "pin_memory": True, "nvme_path": "/local_nvme/sd"}
    assert zo["offload_param"] == {"device": "cpu", "pin_memory": True}
    assert deepspeed_config(cfg, world_size=16, on_gpu=True)["optimizer"]["params"]["torch_adam"] is False
    plain = deepspeed_config(load_config([], [], environ={}), world_size=1, on_gpu=False)
    assert "offload_optimizer" not in plain["zero_optimization"]
    assert "offload_param" not in plain["zero_optimization"]


@pytest.mark.process
def test_cpu_optimizer_offload_trains_like_no_offload() -> None:
    """ZeRO-2 with the optimizer state offloaded to the CPU takes the same step (torch AdamW on
    this CPU-only machine; DeepSpeed's CPU Adam on GPU)."""
    results = []
    for offload in ("none", "cpu"):
        cfg = _cfg(4)
        cfg.learner.zero_stage = 2
        cfg.learner.offload_optimizer = offload
        learner = Learner(cfg, tiny_qwen2(seed=3), source_dir=".")
        if offload == "cpu":
            assert learner.engine.zero_cpu_offload()
        m = learner.train_step(_groups(seed=6))
        results.append((m, learner.gather_state_dict()))
    (m0, s0), (m1, s1) = results
    assert m1.loss == pytest.approx(m0.loss, rel=1e-6) and m1.grad_norm == pytest.approx(
        m0.grad_norm, rel=1e-5
    )
    assert s0 is not None and s1 is not None
    for name, value in s0.items():
        torch.testing.assert_close(s1[name], value, rtol=1e-5, atol=1e-6, msg=name)


def _grads(cfg: Config) -> tuple[dict[str, float], dict[str, torch.Tensor], Any]:
    learner = Learner(cfg, tiny_qwen2(seed=1), make_engine=BackwardOnlyEngine)
    learner.engine.module.double()
    acc = learner.accumulate_gradients(learner.prepare(_groups(seed=4)))
    grads = {n: p.grad.clone() for n, p in learner.engine.module.named_parameters()}
    return acc.sums, grads, learner.engine.module


@pytest.mark.parametrize("chunk", [0, 5])
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(chunk: int) -> None:
    cfg = _cfg(chunk, entropy_coef=0.01)
    off_sums, off_grads, off_model = _grads(cfg)
    cfg.learner.gradient_checkpointing = True
    on_sums, on_grads, on_model = _grads(cfg)
    assert not off_model.is_gradient_checkpointing and on_model.is_gradient_checkpointing
    assert on_sums["loss"] == pytest.approx(off_sums["loss"], rel=1e-12)
    for name, g in off_grads.items():
        torch.testing.assert_close(on_grads[name], g, rtol=1e-10, atol=1e-13, msg=name)


def test_gradient_checkpointing_recomputes_the_decoder_layers() -> None:
    """With checkpointing on, every decoder layer starts twice per micro-batch (forward, and again
    in backward); off, once. (A pre-hook: torch's recomputation stops early, once it has rebuilt
    what backward needs, so a post-forward hook would not see it.)"""
    for on, expected in ((False, 1), (True, 2)):
        cfg = _cfg(5)
        cfg.learner.gradient_checkpointing = on
        learner = Learner(cfg, tiny_qwen2(seed=1), make_engine=BackwardOnlyEngine)
        calls: list[int] = []
        layer = learner.engine.module.model.layers[0]
        layer.register_forward_pre_hook(lambda *_, seen=calls: seen.append(1))
        batch = learner.prepare(_groups(seed=4))
        learner.accumulate_gradients(batch, prox=[torch.zeros_like(mb.mask) for mb in batch.micro_batches])
        assert len(calls) == expected * len(batch.micro_batches)


@pytest.mark.process
def test_zero3_step_with_checkpointing_and_chunks_equals_the_plain_step() -> None:
    """DeepSpeed ZeRO-3 gathers parameters per module, also in checkpointing's recomputation and in
    the chunked head's backward: the step must equal ZeRO-3 with neither."""
    results = []
    for on in (False, True):
        cfg = _cfg(4 if on else 0, entropy_coef=0.01)
        cfg.learner.zero_stage = 3
        cfg.learner.gradient_checkpointing = on
        learner = Learner(cfg, tiny_qwen2(seed=7), source_dir=".")
        m = learner.train_step(_groups(seed=8))
        results.append((m, learner.gather_state_dict()))
    (m0, s0), (m1, s1) = results
    assert m1.loss == pytest.approx(m0.loss, rel=1e-5, abs=1e-7)
    assert m1.grad_norm == pytest.approx(m0.grad_norm, rel=1e-4)
    assert s0 is not None and s1 is not None
    for name, value in s0.items():
        torch.testing.assert_close(s1[name], value, rtol=1e-5, atol=1e-6, msg=name)
