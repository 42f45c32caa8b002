"""Shared by the ops/ tests: locating external tools and checking PromQL against metrics.py."""

from __future__ import annotations

import re
import shutil
from collections.abc import Collection

import pytest

from stream_dapo.tools.metrics_docs import series_names

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME = re.compile(r"(?<![A-Za-z0-9_:])(stream_dapo[_:][A-Za-z0-9_:]*)")


def require_tool(name: str, install: str) -> str:
    """The tool's path; a failure naming the install command when it is missing (CI installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"`{name}` not found on PATH: install it with `{install}` (the Makefile does this in CI)")
    return path


def referenced_names(expr: str) -> set[str]:
    """stream_dapo metric and recording-rule names in a PromQL expression (label values ignored)."""
    return set(_NAME.findall(_QUOTED.sub('""', expr)))


def unknown_metrics(expr: str, recording_rules: Collection[str] = ()) -> set[str]:
    """Names the expression uses that neither stream_dapo/runtime/metrics.py nor the recording rules define."""
    return {n for n in referenced_names(expr) if n not in series_names() and n not in recording_rules}
