"""stream-dapo: an asynchronous off-policy streaming RL trainer implementing the DAPO recipe."""

__version__ = "0.1.0"
