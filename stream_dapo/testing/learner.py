"""A learner without DeepSpeed, for tests and benchmarks of the learner's own code paths."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BackwardOnlyEngine"]


class BackwardOnlyEngine:
    """The slice of ``DeepSpeedEngine`` that `Learner.accumulate_gradients` calls, on plain torch
    (no optimizer, one rank): pass it as ``Learner(cfg, model, make_engine=BackwardOnlyEngine)``."""

    def __init__(self, model: torch.nn.Module, cfg: Any) -> None:
        self.module, self.dp_world_size, self.device = model, 1, "cpu"

    def __call__(self, **kwargs: Any) -> Any:
        return self.module(**kwargs)

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        loss.backward()
