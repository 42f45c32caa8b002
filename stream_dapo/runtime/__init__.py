"""What every long-running service shares at run time: the service runner (start, serve, drain,
exit code), exit codes, signals, logging, disk checks, the Prometheus metrics and HTTP server, the
ports a service bound, and run tracking (JSONL, W&B, TensorBoard)."""
