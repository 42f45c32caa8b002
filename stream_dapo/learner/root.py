"""The learner's composition root: the one place that reads the configuration for
`stream-dapo learner`.

`build_learner(cfg)` builds `LearnerSettings` (what the service reads), checks the DeepSpeed settings
(their errors come before any start-up), and `ConfiguredCollaborators` (how its ``start()`` builds
the trainer, the weight publisher of ``weights.method`` and the tracker of ``tracking.backends``),
then the `LearnerService`, which never sees the `Config`. Tests and benchmarks build the service from
their own settings or collaborators. Nothing here imports torch: ``--help`` stays instant.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from stream_dapo.config import Config
from stream_dapo.learner.service import LearnerService, LearnerSettings
from stream_dapo.transport import messages as m

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from stream_dapo.learner.trainer import Learner
    from stream_dapo.runtime.metrics import LearnerMetrics
    from stream_dapo.runtime.tracking import Tracker
    from stream_dapo.weights.base import WeightPublisher

__all__ = ["ConfiguredCollaborators", "build_learner", "learner_settings"]


def learner_settings(cfg: Config, *, max_steps: int | None = None) -> LearnerSettings:
    """What the learner reads of `cfg`; `max_steps` (--max-steps) replaces learner.total_steps."""
    return LearnerSettings(
        learner=cfg.learner,
        transport=cfg.transport,
        metrics=cfg.metrics,
        out_dir=cfg.run.out_dir,
        total_steps=max_steps if max_steps is not None else cfg.learner.total_steps,
        groups_per_version=cfg.admission.groups_per_version,
        group_size=cfg.algo.group_size,
        ratio_mode=cfg.algo.ratio_mode,
        sampling=m.Sampling.of(cfg.generator),
        run_config=cfg.model_dump(mode="json"),
    )


def build_learner(
    cfg: Config, *, model: PreTrainedModel | None = None, max_steps: int | None = None
) -> LearnerService:
    """The learner of `cfg`, not started. `model` replaces loading model.path (tests pass a built
    model); `max_steps` replaces learner.total_steps."""
    settings = learner_settings(cfg, max_steps=max_steps)
    from stream_dapo.learner.trainer import deepspeed_config

    deepspeed_config(cfg, int(os.environ.get("WORLD_SIZE", "1")))  # dtype/ZeRO errors before any start-up
    return LearnerService(settings, ConfiguredCollaborators(cfg, model))


class ConfiguredCollaborators:
    """`LearnerCollaborators` from the configuration: what `stream-dapo learner` runs with."""

    def __init__(self, cfg: Config, model: PreTrainedModel | None = None) -> None:
        self.cfg = cfg
        self.model = model

    def publisher(self, metrics: LearnerMetrics) -> WeightPublisher:
        from stream_dapo.weights.factory import make_publisher

        return make_publisher(
            self.cfg,
            rejected_metric=metrics.messages_rejected,
            refused_metric=metrics.connections_refused,
            sent_metric=metrics.weight_sent_bytes,
        )

    def trainer(self) -> Learner:
        from stream_dapo.learner.trainer import Learner

        return Learner(self.cfg, self.model)

    def tracker(self, resumed_at: int | None) -> Tracker:
        from stream_dapo.runtime.tracking import Tracker

        return Tracker.start(self.cfg, resumed_at=resumed_at)
