"""avg@k / pass@k: the estimator by hand, and ``evaluate`` and ``stream-dapo eval`` on the shared vLLM
engine running the reduced warm-up's model (see test_tiny_model.py)."""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

from stream_dapo.cli import eval as eval_cli
from stream_dapo.tools.evaluate import evaluate, pass_at_k
from tests.integration.test_tiny_model import reduced_config, shared_eval_prompts, shared_llm, shared_warmup


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    return shared_warmup(tmp_path_factory)


@pytest.fixture(scope="module")
def llm(request, warm):
    cfg, result = warm
    return shared_llm(request, cfg, result.path)


@pytest.fixture(scope="module")
def prompts(warm):
    cfg, result = warm
    return shared_eval_prompts(cfg, result.path)


def test_pass_at_k_matches_hand_computed_values():
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(32, 4, 8) == pytest.approx(1 - math.comb(28, 8) / math.comb(32, 8))
    with pytest.raises(ValueError, match="k <= samples"):
        pass_at_k(3, 1, 4)


def test_evaluate_counts_and_bounds(llm, prompts):
    result = evaluate(llm, prompts[:16], k=4, temperature=1.0, top_p=1.0, max_tokens=64, seed=0)
    assert (result["k"], result["n"], result["num_prompts"], result["num_samples"]) == (4, 4, 16, 64)
    assert 0.0 <= result["avg_at_k"] <= result["pass_at_k"] <= 1.0
    # avg@k is a multiple of 1/64 and pass@k of 1/16 (n == k: any-correct per prompt).
    assert (result["avg_at_k"] * 64) == pytest.approx(round(result["avg_at_k"] * 64))
    assert (result["pass_at_k"] * 16) == pytest.approx(round(result["pass_at_k"] * 16))
    assert 0.0 < result["avg_at_k"] < 1.0  # the warm model solves part of the set
    assert 1.0 < result["mean_response_len"] < 64
    assert 0.0 <= result["truncation_rate"] <= 1.0
    # Format and solving told apart: correct / all = (correct / answered) x (answered / all).
    assert 0.0 < result["answered_rate"] <= 1.0
    assert result["accuracy_when_answered"] * result["answered_rate"] == pytest.approx(result["avg_at_k"])
    # Per-request seeds: the same call gives the same numbers.
    again = evaluate(llm, prompts[:16], k=4, temperature=1.0, top_p=1.0, max_tokens=64, seed=0)
    assert again == result


def test_many_seeded_requests_survive_prompts_split_across_steps(llm, prompts):
    # 64 prompts x 4 samples is more prompt tokens than one scheduler step takes (2048): with chunked
    # prefill, vLLM's CPU engine died on seeded requests ("CPU Generator does not use offset").
    result = evaluate(llm, prompts, k=4, temperature=1.0, top_p=0.7, max_tokens=64, seed=0)
    assert (result["num_prompts"], result["num_samples"]) == (64, 256)
    assert 0.0 < result["avg_at_k"] <= result["pass_at_k"] <= 1.0


def test_engine_kwargs_for_cpu_and_gpu(warm, tmp_path):
    from stream_dapo.generator.vllm_utils import cpu_thread_env, vllm_engine_kwargs

    cfg, result = warm
    gen = cfg.generator.model_copy(update={"kv_cache_gib": 0.5, "threads": 1})
    cpu = vllm_engine_kwargs(str(result.path), gen, dtype="float32", max_model_len=224, seed=3, cpu=True)
    assert cpu["kv_cache_memory_bytes"] == 512 * 1024**2
    assert cpu["enable_chunked_prefill"] is False and cpu["enable_prefix_caching"] is True
    assert (cpu["dtype"], cpu["max_model_len"], cpu["seed"], cpu["enforce_eager"]) == (
        "float32",
        224,
        3,
        True,
    )
    assert "gpu_memory_utilization" not in cpu
    gpu = vllm_engine_kwargs(str(result.path), gen, dtype="bfloat16", max_model_len=224, seed=3, cpu=False)
    assert gpu["gpu_memory_utilization"] == gen.gpu_memory_utilization
    assert "kv_cache_memory_bytes" not in gpu and "enable_chunked_prefill" not in gpu
    with pytest.raises(FileNotFoundError, match="stream-dapo warmup"):
        vllm_engine_kwargs(str(tmp_path), gen, dtype="float32", max_model_len=224, seed=0, cpu=True)
    # Generators get their own cores, round-robin; an operator's binding wins.
    cores = sorted(os.sched_getaffinity(0))
    assert cpu_thread_env(gen, index=0, environ={}) == {"VLLM_CPU_OMP_THREADS_BIND": str(cores[0])}
    assert cpu_thread_env(gen, index=1, environ={}) == {
        "VLLM_CPU_OMP_THREADS_BIND": str(cores[1 % len(cores)])
    }
    assert cpu_thread_env(gen, index=0, environ={"VLLM_CPU_OMP_THREADS_BIND": "0-1"}) == {}


def test_extra_samples_use_the_unbiased_estimator(llm, prompts):
    result = evaluate(llm, prompts[:8], k=1, n=8, temperature=1.0, top_p=1.0, max_tokens=64, seed=1)
    assert (result["k"], result["n"], result["num_samples"]) == (1, 8, 64)
    # The unbiased pass@1 is each prompt's c/n, averaged: exactly avg@1.
    assert result["pass_at_k"] == pytest.approx(result["avg_at_k"])
    wider = evaluate(llm, prompts[:8], k=4, n=8, temperature=1.0, top_p=1.0, max_tokens=64, seed=1)
    assert wider["avg_at_k"] == result["avg_at_k"]  # same seeds, same samples
    assert wider["pass_at_k"] >= wider["avg_at_k"]


def test_greedy_is_deterministic_and_truncation_is_counted(llm, prompts):
    greedy = evaluate(llm, prompts[:8], k=1, temperature=0.0, top_p=1.0, max_tokens=64, seed=0)
    assert greedy == evaluate(llm, prompts[:8], k=1, temperature=0.0, top_p=1.0, max_tokens=64, seed=5)
    assert greedy["pass_at_k"] == greedy["avg_at_k"]
    truncated = evaluate(llm, prompts[:8], k=1, temperature=0.0, top_p=1.0, max_tokens=2, seed=0)
    assert truncated["truncation_rate"] == 1.0 and truncated["avg_at_k"] == 0.0
    assert truncated["mean_response_len"] == 2.0


def test_eval_cli_prints_one_json_object(llm, warm, monkeypatch, capsys):
    cfg, result = warm
    # Reuse the session's engine instead of starting a second one.
    monkeypatch.setattr("stream_dapo.generator.vllm_utils.make_llm", lambda *a, **kw: llm)
    monkeypatch.setattr("stream_dapo.generator.vllm_utils.shutdown_llm", lambda _llm: None)
    args = argparse.Namespace(
        cfg=cfg,
        model=None,
        data=None,
        k=2,
        n=None,
        temperature=None,
        top_p=None,
        top_k=None,
        min_p=None,
        max_prompts=5,
        max_tokens=None,
        seed=0,
    )
    assert eval_cli.run(args) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(printed) >= {
        "avg_at_k",
        "pass_at_k",
        "k",
        "num_prompts",
        "mean_response_len",
        "truncation_rate",
        "model",
        "data",
    }
    assert (printed["k"], printed["num_prompts"], printed["num_samples"]) == (2, 5, 10)
    assert printed["model"] == cfg.model.path == str(result.path)
    assert printed["data"].endswith("eval.jsonl")


def test_eval_cli_names_the_fix_for_a_missing_model(tmp_path):
    cfg = reduced_config(tmp_path)
    args = argparse.Namespace(
        cfg=cfg, model=str(tmp_path / "none"), data=None, k=None, n=None, temperature=None,
        top_p=None, top_k=None, min_p=None, max_prompts=None, max_tokens=None, seed=0,
    )  # fmt: skip
    with pytest.raises(FileNotFoundError, match="stream-dapo warmup"):
        eval_cli.run(args)
