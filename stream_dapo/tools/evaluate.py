"""avg@k and pass@k of a policy on an eval set, sampled with vLLM and scored by the verifier.

``stream-dapo eval --model DIR --data FILE --k K`` prints one JSON object::

    {"avg_at_k": 0.31, "pass_at_k": 0.62, "k": 4, "num_prompts": 200, "num_samples": 800,
     "mean_response_len": 38.2, "truncation_rate": 0.0, "model": "...", "data": "..."}

- avg@k: mean correctness over all samples (the paper's avg@32 on AIME);
- pass@k: fraction of prompts with at least one correct answer among k. When ``n > k`` samples are
  drawn per prompt, the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` is used (Chen et al. 2021);
- truncation_rate: fraction of samples that hit ``max_tokens`` before EOS;
- response_len_quantiles: p50, p90, p99 and max of the response lengths in tokens (nearest rank):
  where to put ``algo.max_response_len`` and its soft-punishment ramp so that a chosen share of a
  policy's responses reach them.

Defaults come from ``[eval]`` (the paper: k=32, temperature 1.0, top-p 0.7), which is independent of
the training rollouts' ``[generator]`` sampling settings. Every request carries
its own seed, so the numbers do not depend on how vLLM batches the requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream_dapo.config import Config
from stream_dapo.data.dataset import PromptItem
from stream_dapo.rewards.spec import FAILURE_REASONS
from stream_dapo.verifier.core import REASONS as MATH_REASONS
from stream_dapo.verifier.core import VerifyResult
from stream_dapo.verifier.pool import DEFAULT_REWARD, ScoreItem

if TYPE_CHECKING:
    import vllm

    from stream_dapo.verifier import VerifierPool

__all__ = ["evaluate", "length_quantiles", "pass_at_k", "summarise"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct among ``n`` samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= correct <= samples, got correct={c}, samples={n}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= samples per prompt, got k={k}, samples={n}")
    if n - c < k:
        return 1.0
    # The product form avoids the huge binomials of large n.
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _request_seed(seed: int, index: int, n: int) -> int:
    # vLLM gives the j-th of n samples seed + j; spacing prompts n apart keeps every sample's seed
    # distinct, so no two prompts share a random stream.
    return (seed * 1_000_003 + index * n) % (2**31)


def evaluate(
    llm: vllm.LLM,
    prompts: Sequence[PromptItem],
    *,
    k: int,
    temperature: float,
    top_p: float,
    max_tokens: int,
    seed: int,
    top_k: int = 0,
    min_p: float = 0.0,
    n: int | None = None,
    verifier: VerifierPool | None = None,
    reward: str = DEFAULT_REWARD,
) -> dict[str, Any]:
    """Sample ``n`` (default ``k``) responses per prompt, score them, and summarise.

    Args:
        llm: a started engine (``stream_dapo.generator.vllm_utils.make_llm``).
        prompts: items from ``load_prompts`` (their token ids are sent as they are).
        verifier: a running pool to score with; None starts a one-worker pool for this call.
        reward: the pool's reward to score with (a data source's name); correct is its verdict
            (``correct_threshold``), and ``mean_score`` the mean of its scores.

    Returns:
        avg_at_k, pass_at_k, k, n, num_prompts, num_samples, mean_response_len, truncation_rate,
        response_len_quantiles, answered_rate (share of responses with an extractable answer), accuracy_when_answered, and
        ``by_group`` per template when the prompts' rows name one (see `summarise`).
    """
    from vllm import SamplingParams, TokensPrompt

    from stream_dapo.verifier import VerifierPool

    n = k if n is None else n
    if not prompts:
        raise ValueError("no prompts to evaluate; check --data and --max-prompts")
    if n < k:
        raise ValueError(f"n ({n}) samples per prompt cannot estimate pass@{k}; use n >= k")
    # One n=1 request per sample, prompt-major: vLLM refuses n > 1 with greedy sampling, and the
    # G requests of a prompt still share its prefix in the cache.
    requests = [TokensPrompt(prompt_token_ids=list(p.prompt_token_ids)) for p in prompts for _ in range(n)]
    params = [
        SamplingParams(
            n=1,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            min_p=min_p,
            max_tokens=max_tokens,
            seed=_request_seed(seed, i, n) + j,
        )
        for i in range(len(prompts))
        for j in range(n)
    ]
    outputs = llm.generate(requests, params, use_tqdm=False)

    items: list[ScoreItem] = []
    lengths: list[int] = []
    truncated = 0
    for idx, out in enumerate(outputs):
        item = prompts[idx // n]
        for completion in out.outputs:
            items.append(ScoreItem(reward, completion.text, item.gold, item.data_source, item.extra_info))
            lengths.append(len(completion.token_ids))
            truncated += completion.finish_reason == "length"

    if verifier is not None:
        results = verifier.score_batch(items)
    else:
        with VerifierPool(num_workers=1) as pool:
            results = pool.score_batch(items)

    summary = summarise(
        [bool(r.correct) for r in results],
        [_answered(r) for r in results],
        lengths,
        truncated,
        k=k,
        n=n,
        groups=[str(p.extra_info.get("template", "")) for p in prompts],
    )
    summary["mean_score"] = sum(r.reward for r in results) / len(results)
    summary["reward_failures"] = sum(r.reason in FAILURE_REASONS for r in results)
    return summary


def _answered(result: VerifyResult) -> bool:
    """An answer the reward could judge: the math verifier found one; any other reward ran."""
    if result.reason in MATH_REASONS:
        return result.extracted is not None
    return result.reason not in FAILURE_REASONS


def summarise(
    correct: Sequence[bool],
    answered: Sequence[bool],
    lengths: Sequence[int],
    truncated: int,
    *,
    k: int,
    n: int,
    groups: Sequence[str] = (),
) -> dict[str, Any]:
    """The eval's figures from per-sample outcomes in prompt-major order (``n`` per prompt).

    ``groups``: one name per prompt (a word problem's template, from its row's ``extra_info``); when
    any is non-empty the result has ``by_group``: per name, prompts, avg@k, pass@k, answered_rate and
    accuracy_when_answered, so a gain on a held-out set can be told apart by problem structure.
    """
    num_prompts = len(correct) // n
    if num_prompts * n != len(correct) or not num_prompts:
        raise ValueError(f"{len(correct)} outcomes are not a positive multiple of n={n}")
    per_prompt = [sum(correct[i * n : (i + 1) * n]) for i in range(num_prompts)]
    out: dict[str, Any] = {
        **_rates(per_prompt, answered, n, k),
        "k": k,
        "n": n,
        "num_prompts": num_prompts,
        "num_samples": len(correct),
        "mean_response_len": sum(lengths) / len(lengths),
        "truncation_rate": truncated / len(lengths),
        "response_len_quantiles": length_quantiles(lengths),
    }
    if any(groups):
        if len(groups) != num_prompts:
            raise ValueError(f"{len(groups)} group names for {num_prompts} prompts")
        by: dict[str, list[int]] = {}
        for i, name in enumerate(groups):
            by.setdefault(name, []).append(i)
        out["by_group"] = {
            name: {
                "prompts": len(idx),
                **_rates(
                    [per_prompt[i] for i in idx],
                    [a for i in idx for a in answered[i * n : (i + 1) * n]],
                    n,
                    k,
                ),
            }
            for name, idx in sorted(by.items())
        }
    return out


def length_quantiles(lengths: Sequence[int]) -> dict[str, int]:
    """p50, p90, p99 and max of ``lengths``, nearest rank: the smallest length with at least that
    share of the lengths at or below it (always a length that occurred, never interpolated)."""
    if not lengths:
        raise ValueError("no response lengths to summarise")
    ranked = sorted(lengths)
    # rank ceil(pct * N / 100), counted in integers
    pick = {f"p{pct}": ranked[max(-(-pct * len(ranked) // 100), 1) - 1] for pct in (50, 90, 99)}
    return {**pick, "max": ranked[-1]}


def _rates(per_prompt: Sequence[int], answered: Sequence[bool], n: int, k: int) -> dict[str, float]:
    right, said = sum(per_prompt), sum(answered)
    return {
        "avg_at_k": right / (n * len(per_prompt)),
        "pass_at_k": sum(pass_at_k(n, c, k) for c in per_prompt) / len(per_prompt),
        # Learning the answer format and learning to solve, told apart: the share of responses with
        # an answer the verifier could extract, and the accuracy among those.
        "answered_rate": said / len(answered),
        "accuracy_when_answered": right / said if said else 0.0,
    }


# --------------------------------------------------------------------------------------------------
# CLI: stream-dapo eval
# --------------------------------------------------------------------------------------------------


def resolve_eval_data(cfg: Config) -> Path:
    """``data.eval_path``, or the synthetic eval split (written on first use)."""
    if cfg.data.eval_path is not None:
        return Path(cfg.data.eval_path)
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.warmup import synthetic_data_dir

    return ensure_synthetic_data(cfg.data, synthetic_data_dir(cfg))[1]
