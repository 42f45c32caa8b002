"""Fail at start-up, not at step 500: every source's reward is built and called once before a run.

``VerifierPool`` already builds every reward in each worker when it starts (a user's file that is
missing or does not import stops it with a ``ConfigError``). ``probe_rewards`` then calls each user
function once on the first row of its source's train file, with an empty response, through the
pool (so with its timeout): an exception, a hang or a return value that is not a number stops the
start with the setting, the row and the fix; an ordinary low score is what an empty response
deserves and passes. ``warn_weak_sandbox`` says at every start that a code source runs without
namespaces.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from stream_dapo.data.dataset import parsed_rows
from stream_dapo.data.sources import DataSource
from stream_dapo.errors import ConfigError
from stream_dapo.verifier.pool import ScoreItem, VerifierPool

__all__ = ["PROBE_FAILURES", "probe_rewards", "warn_weak_sandbox"]

log = logging.getLogger(__name__)

PROBE_FAILURES = {
    "reward_error": "raised {detail}",
    "reward_not_number": "returned {detail}, which is not a number nor a dict with a numeric 'score'",
    "reward_nan": "returned NaN or infinity",
    "timeout": "did not return within {timeout} s (the source's timeout_s)",
    "worker_crashed": "crashed the verifier worker (a segfault or os._exit in the function)",
}


def _first_row(source: DataSource) -> tuple[str, str, dict[str, object]] | None:
    if source.train_path is None:
        return None
    for row, _, gold in parsed_rows(source.train_path):
        data_source = str(row.get("data_source") or "")
        if source.data_source is not None and data_source not in source.data_source:
            continue
        extra = row.get("extra_info")
        return data_source, gold, dict(extra) if isinstance(extra, dict) else {}
    return None


def probe_rewards(pool: VerifierPool, sources: Sequence[DataSource]) -> None:
    """Call every "python" reward once on its source's first row (see the module docstring).

    Raises:
        ConfigError: naming ``data.sources[<name>].reward``, the file's first row and the fix.
    """
    items: list[ScoreItem] = []
    probed: list[DataSource] = []
    for source in sources:
        if source.reward.kind != "python":
            continue
        first = _first_row(source)
        if first is None:
            continue
        data_source, gold, extra = first
        items.append(ScoreItem(source.name, "", gold, data_source, extra))
        probed.append(source)
    for source, result in zip(probed, pool.score_batch(items), strict=True):
        failure = PROBE_FAILURES.get(result.reason)
        if failure is None:
            continue
        what = failure.format(detail=result.extracted or "?", timeout=source.reward.timeout_s)
        raise ConfigError(
            f"data.sources[{source.name}].reward = {source.reward.label}: called on the first row of "
            f"{source.train_path} with an empty response, it {what}; fix the function (it must return a "
            "float, or a dict with a numeric 'score', for any response) or name another reward"
        )
    for source in probed:
        log.info("source %s: reward %s imported and called once", source.name, source.reward.label)


def warn_weak_sandbox(sources: Sequence[DataSource]) -> None:
    """Log a warning for every code source whose programs run with rlimits only."""
    for source in sources:
        if source.reward.kind == "code" and source.reward.code.get("isolation") == "rlimits":
            log.warning(
                "source %s: verifier.code.isolation = 'rlimits': model-written programs run WITHOUT "
                "namespaces (they can read this host's files and open network connections); install "
                "bubblewrap and set isolation = 'namespaces' unless this machine is disposable",
                source.name,
            )
