"""How a generator's start-up ends early: one home for both, raised by the service and its
collaborators, caught by `stream-dapo generator` (``cli/generator.py``)."""

from __future__ import annotations

__all__ = ["StartupError", "StoppedBeforeStart"]


class StoppedBeforeStart(Exception):
    """A stop request came while start-up waited: exit 0 without having sent anything as this id."""


class StartupError(RuntimeError):
    """The service cannot start; the message names what is missing and the fix."""
