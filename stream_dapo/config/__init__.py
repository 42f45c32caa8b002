"""Typed, layered configuration for every stream-dapo service.

Layers, later ones win:

1. the defaults in `schema` (they are the embedded tiny CPU default);
2. TOML files, in the order given (``--config a.toml --config b.toml``);
3. environment variables ``STREAM_DAPO__SECTION__KEY=value`` (for systemd ``EnvironmentFile``
   and Kubernetes ``env``), nested sections joined with ``__``;
4. dotted overrides ``--set section.key=value``.

Values from the environment and ``--set`` are parsed as TOML values (``3``, ``0.28``, ``true``,
``"text"``, ``[1, 2]``); anything that is not valid TOML is taken as a plain string.

Every field is documented once, by the docstring under it (pydantic turns those docstrings into
field descriptions, which ``stream-dapo config docs`` renders). Unknown keys are errors that name
the nearest valid key.

The package is split by job: `schema` (the sections and their checks), `loader` (layering, overrides,
TOML out) and `reference` (the generated key reference); everything is importable from here.
"""

from stream_dapo.config.loader import ENV_PREFIX, config_to_toml, load_config
from stream_dapo.config.reference import config_docs
from stream_dapo.config.schema import (
    AlgoConfig,
    BufferConfig,
    Config,
    DataConfig,
    EvalConfig,
    GeneratorConfig,
    GsmSymbolicConfig,
    LearnerConfig,
    MetricsConfig,
    ModelConfig,
    RunConfig,
    SftConfig,
    SyntheticTaskConfig,
    TrackingConfig,
    TransportConfig,
    VerifierConfig,
    WarmupConfig,
    WeightsConfig,
    WordProblemsConfig,
    from_section,
)
from stream_dapo.errors import ConfigError

__all__ = [
    "AlgoConfig",
    "BufferConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "ENV_PREFIX",
    "EvalConfig",
    "GeneratorConfig",
    "GsmSymbolicConfig",
    "WordProblemsConfig",
    "LearnerConfig",
    "MetricsConfig",
    "ModelConfig",
    "RunConfig",
    "SftConfig",
    "SyntheticTaskConfig",
    "TrackingConfig",
    "TransportConfig",
    "VerifierConfig",
    "WarmupConfig",
    "WeightsConfig",
    "config_docs",
    "config_to_toml",
    "from_section",
    "load_config",
]
