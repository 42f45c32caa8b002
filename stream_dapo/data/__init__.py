"""Prompt data: the DAPO-Math-17k loader with the sharded prompt stream, and the synthetic task."""

from stream_dapo.data.dataset import (
    LoadStats,
    PromptItem,
    PromptStream,
    SchemaError,
    StreamState,
    check_data_file,
    load_prompts,
)
from stream_dapo.data.synthetic import ensure_synthetic_data

__all__ = [
    "LoadStats",
    "PromptItem",
    "PromptStream",
    "SchemaError",
    "StreamState",
    "check_data_file",
    "ensure_synthetic_data",
    "load_prompts",
]
