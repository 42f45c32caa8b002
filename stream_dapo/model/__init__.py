"""The embedded default policy: the tiny model (``tiny``) and its supervised warm-up (``warmup``).

Both modules import torch and transformers lazily, so ``stream-dapo --help`` stays instant.
"""
