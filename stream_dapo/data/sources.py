"""A run's data sources as the services use them: rows, reward, weight and budget of each.

``[[data.sources]]`` in the config (or, when it is empty, ``data.train_path`` / the synthetic task as
one source named "default") becomes a list of ``DataSource`` in ``stream_dapo.config.sources``; the
generator mixes their prompts (``data.mixing``), scores each response with its source's reward (the
verifier pool holds one reward per source, under the source's name) and labels its figures with the
source's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_dapo.rewards.spec import RewardSpec

__all__ = ["DEFAULT_SOURCE", "DataSource"]

DEFAULT_SOURCE = "default"
"""The name of the one source of a config without ``[[data.sources]]``."""


@dataclass(frozen=True)
class DataSource:
    """One source of a run.

    Attributes:
        name: the source's name (metrics label, reward name in the pool, prompt-position key).
        train_path: its training rows; None only for the default source of the synthetic task,
            whose file the generator writes on first use.
        eval_path: its held-out rows, or None.
        reward: how its responses are scored.
        weight: its share of the prompts started, relative to the other sources' weights.
        max_response_len: its response budget; None: the run's.
        data_source: keep only rows whose ``data_source`` is one of these; None: every row.
    """

    name: str
    train_path: str | None
    eval_path: str | None
    reward: RewardSpec
    weight: float = 1.0
    max_response_len: int | None = None
    data_source: tuple[str, ...] | None = None
