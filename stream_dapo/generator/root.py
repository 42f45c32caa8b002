"""The generator's composition root: the one place that reads the configuration for
`stream-dapo generator --index I`.

`build_generator(cfg, index)` builds `GeneratorSettings` (what the service reads) and
`ConfiguredCollaborators` (how its ``start()`` builds the prompts, the verifier pool, the vLLM engine
and the weight source from ``data``, ``verifier``, ``model`` and ``weights``), then the
`GeneratorService`, which never sees the `Config`. Tests and benchmarks build the service from their
own settings or collaborators, or pass ready collaborators here.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from stream_dapo.config import Config
from stream_dapo.config.sources import data_sources
from stream_dapo.generator.prompts import MixCursor, PromptCursor, ShardLayout
from stream_dapo.generator.rollout import RolloutSettings
from stream_dapo.generator.service import GeneratorService, GeneratorSettings, StartupError
from stream_dapo.rewards.probe import warn_weak_sandbox
from stream_dapo.weights.factory import make_source, shared_dir_path

if TYPE_CHECKING:
    from stream_dapo.data.dataset import PromptItem, PromptStream
    from stream_dapo.data.mixing import MixedStream
    from stream_dapo.generator.engine import RolloutEngine
    from stream_dapo.verifier import VerifierPool
    from stream_dapo.weights.base import RelayMetrics, WeightSource

__all__ = ["ConfiguredCollaborators", "build_generator", "generator_settings"]

log = logging.getLogger("stream_dapo.generator")


def generator_settings(cfg: Config, index: int = 0) -> GeneratorSettings:
    """What generator `index` reads of `cfg` (StartupError for an index the config does not allow)."""
    return GeneratorSettings(
        index=index,
        generator=cfg.generator,
        transport=cfg.transport,
        metrics=cfg.metrics,
        out_dir=cfg.run.out_dir,
        model_path=cfg.model.path,
        generator_lease_s=cfg.buffer.generator_lease_s,
        weights_method=cfg.weights.method,
        shared_dir=shared_dir_path(cfg),
        rollout=RolloutSettings.from_config(
            cfg.algo, budgets={source.name: source.max_response_len for source in data_sources(cfg)}
        ),
        admission=cfg.admission,
    )


def build_generator(
    cfg: Config,
    index: int = 0,
    *,
    engine: RolloutEngine | None = None,
    verifier: VerifierPool | None = None,
    prompts: Iterator[PromptItem] | None = None,
    weights: WeightSource | None = None,
) -> GeneratorService:
    """Generator `index` of `cfg`, not started: the collaborators given are used as they are, the
    others are built from `cfg` by ``start()``, in its order."""
    settings = generator_settings(cfg, index)
    return GeneratorService(
        settings,
        ConfiguredCollaborators(cfg, settings),
        engine=engine,
        verifier=verifier,
        prompts=prompts,
        weights=weights,
    )


class ConfiguredCollaborators:
    """`GeneratorCollaborators` from the configuration: what `stream-dapo generator` runs with."""

    def __init__(self, cfg: Config, settings: GeneratorSettings) -> None:
        self.cfg = cfg
        self.index = settings.index
        self.generator_id = settings.generator_id

    def load_prompts(self, alive: Callable[[], None]) -> tuple[PromptStream, PromptCursor]:
        """data.train_path (or the synthetic task), indexed in one pass and tokenized as served, so
        that this generator tokenizes only its shard's prompts; the position is kept in
        run.out_dir/generators/<generator id>.prompts.json. With [[data.sources]]: every source's
        file the same way, mixed by weight, the positions in <generator id>.sources.json."""
        if self.cfg.data.sources:
            return self._load_sources(alive)  # type: ignore[return-value]
        from transformers import AutoTokenizer

        from stream_dapo.data.dataset import LazyPrompts
        from stream_dapo.data.synthetic import ensure_synthetic_data

        cfg, data = self.cfg, self.cfg.data
        path = data.train_path
        if path is None:
            path = str(ensure_synthetic_data(data, Path(cfg.run.out_dir) / "data")[0])
        elif not Path(path).is_file():
            raise StartupError(
                f"data.train_path = {path} does not exist; point it at a .parquet or .jsonl file"
            )
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)

        def progress(rows: int, fraction: float) -> None:
            alive()  # a huge file takes a while
            log.info("indexing the prompts of %s: %d rows, %.0f%% of the file", path, rows, 100 * fraction)

        items = LazyPrompts(path, tokenizer, cfg.model.max_prompt_len, progress=progress)
        layout = ShardLayout.of(str(path), len(items), data.seed, cfg.generator.num_generators, self.index)
        cursor = PromptCursor(
            Path(cfg.run.out_dir) / "generators" / f"{self.generator_id}.prompts.json", layout
        )
        return cursor.stream(items), cursor

    def _load_sources(self, alive: Callable[[], None]) -> tuple[MixedStream, MixCursor]:
        from transformers import AutoTokenizer

        from stream_dapo.data.dataset import LazyPrompts

        cfg = self.cfg
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
        prompts, layouts, weights, budgets = {}, {}, {}, {}
        for source in data_sources(cfg):
            path = str(source.train_path)
            if not Path(path).is_file():
                raise StartupError(
                    f"data.sources[{source.name}].train_path = {path} does not exist; point it at a "
                    ".parquet or .jsonl file"
                )

            def progress(rows: int, fraction: float, path: str = path) -> None:
                alive()
                log.info(
                    "indexing the prompts of %s: %d rows, %.0f%% of the file", path, rows, 100 * fraction
                )

            items = LazyPrompts(
                path, tokenizer, cfg.model.max_prompt_len, progress=progress, data_sources=source.data_source
            )
            prompts[source.name] = items
            key = path if source.data_source is None else f"{path}?data_source={','.join(source.data_source)}"
            # A seed of its own per source: two sources over one file do not serve it in one order.
            seed = cfg.data.seed + int(hashlib.sha256(source.name.encode()).hexdigest()[:8], 16)
            layouts[source.name] = ShardLayout.of(
                key, len(items), seed, cfg.generator.num_generators, self.index
            )
            weights[source.name] = source.weight
            budgets[source.name] = source.max_response_len
        cursor = MixCursor(
            Path(cfg.run.out_dir) / "generators" / f"{self.generator_id}.sources.json", layouts
        )
        return cursor.stream(prompts, weights, budgets), cursor

    def start_verifier(self) -> VerifierPool:
        from stream_dapo.rewards.probe import probe_rewards
        from stream_dapo.verifier import VerifierPool

        sources = data_sources(self.cfg)
        warn_weak_sandbox(sources)
        pool = VerifierPool.from_config(self.cfg.verifier, rewards={s.name: s.reward for s in sources})
        try:
            probe_rewards(pool, sources)
        except BaseException:
            pool.close()
            raise
        return pool

    def start_engine(self) -> RolloutEngine:
        from stream_dapo.generator.engine import RolloutEngine

        return RolloutEngine.start(self.cfg, index=self.index)

    def weight_source(self, relay_metrics: RelayMetrics) -> WeightSource:
        return make_source(self.cfg, self.index, relay_metrics)
