"""Logging set-up shared by every service: readable text by default, JSON lines as an option."""

from __future__ import annotations

import json
import logging
import os
import sys
import time


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, plus any `extra={...}` fields."""

    _STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in self._STANDARD})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", *, json_logs: bool = False, service: str | None = None) -> None:
    """Configure the root logger once per process (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        handler.setFormatter(JsonFormatter())
    else:
        tag = service or os.environ.get("STREAM_DAPO_SERVICE", "stream-dapo")
        fmt = logging.Formatter(f"%(asctime)s {tag} %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        fmt.converter = time.localtime
        handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # DeepSpeed and vLLM are chatty at INFO; keep their warnings.
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
