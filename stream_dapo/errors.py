"""Errors every layer may raise; a leaf module (it imports nothing of stream_dapo)."""


class ConfigError(ValueError):
    """A configuration problem, with a message that says how to fix it."""
