"""generator.engine_process: where vLLM's engine core runs."""

from __future__ import annotations

import os

import pytest

from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.generator.vllm_utils import apply_engine_process_env


def test_inline_turns_vllm_multiprocessing_off_and_separate_leaves_the_environment_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    separate = load_config(environ={}).generator
    assert separate.engine_process == "separate"
    apply_engine_process_env(separate)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the operator's own choice stays
    apply_engine_process_env(separate)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    inline = load_config(overrides=['generator.engine_process="inline"'], environ={}).generator
    apply_engine_process_env(inline)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_an_unknown_engine_process_is_refused_with_the_choices() -> None:
    with pytest.raises(ConfigError, match="inline"):
        load_config(overrides=['generator.engine_process="thread"'], environ={})
