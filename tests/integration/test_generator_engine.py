"""RolloutEngine on a real vLLM engine (CPU build) with a tiny Qwen2 model, checked against transformers.

One engine is started for the whole module (20-60 s). The two test models are random tiny Qwen2
models with tied embeddings whose embeddings are scaled up so that logits are peaked (greedy decoding
then has clear winners and cannot flip between implementations on rounding), and whose EOS row is
zeroed so that greedy runs never stop early.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from stream_dapo.config import Config  # noqa: E402
from stream_dapo.data.dataset import PromptItem  # noqa: E402
from stream_dapo.generator.engine import RolloutEngine  # noqa: E402
from stream_dapo.generator.rollout import FinishedGroup  # noqa: E402
from stream_dapo.model.tiny import EOS_TOKEN, TinyModelSpec, build_tiny_model, build_tokenizer  # noqa: E402

if TYPE_CHECKING:
    from torch import nn

pytestmark = pytest.mark.slow

G = 4
MAX_NEW = 48
SPEC = TinyModelSpec(hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=256)
LOGPROB_TOL = 1e-4
LONG_QUESTION = "Add all of these numbers: " + " ".join(str(n) for n in range(10, 70)) + "."


def _build_model(tokenizer: Any, seed: int, out: Path) -> Path:
    """A tiny model with peaked logits and EOS never the greedy choice, saved with its tokenizer."""
    model = build_tiny_model(tokenizer, SPEC, seed)
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    with torch.no_grad():
        embed = cast("nn.Embedding", model.get_input_embeddings()).weight
        embed.mul_(4.0)
        embed[eos].zero_()
    assert model.lm_head.weight.data_ptr() == embed.data_ptr(), "the test needs tied embeddings"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _state_dict_file(model_dir: Path, out: Path) -> Path:
    """The learner's publication format: full state dict, tied lm_head dropped, one safetensors file."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(tensors, str(out))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("gen-engine")
    tokenizer = build_tokenizer()
    m0 = _build_model(tokenizer, 0, root / "m0")
    m1 = _build_model(tokenizer, 1, root / "m1")
    cfg = Config.model_validate(
        {
            "model": {"path": str(m0), "max_prompt_len": 256},
            "algo": {"group_size": G, "max_response_len": MAX_NEW, "overlong_cache_len": 8},
            "generator": {"kv_cache_gib": 0.25, "max_num_seqs": 32},
            "learner": {"micro_batch_tokens": 512},
            "buffer": {"capacity_groups": 512},  # a whole config validates; only the engine runs here
        }
    )
    engine = RolloutEngine.start(cfg)
    hf = {
        0: AutoModelForCausalLM.from_pretrained(m0, dtype=torch.float32).eval(),
        1: AutoModelForCausalLM.from_pretrained(m1, dtype=torch.float32).eval(),
    }
    files = {
        0: _state_dict_file(m0, root / "v0.safetensors"),
        1: _state_dict_file(m1, root / "v1.safetensors"),
    }
    prompts = [
        PromptItem(
            prompt_id=f"p{i}",
            messages=[{"role": "user", "content": q}],
            prompt_token_ids=list(
                cast(
                    "list[int]",  # tokenize=True, return_dict=False: the ids
                    tokenizer.apply_chat_template(
                        [{"role": "user", "content": q}],
                        add_generation_prompt=True,
                        tokenize=True,
                        return_dict=False,
                    ),
                )
            ),
            gold=str(i),
            data_source="test",
        )
        for i, q in enumerate(["What is 2 + 3?", "Compute 7 * 6 - 5.", "What is 12 + 30?", LONG_QUESTION])
    ]
    # vLLM's CPU KV blocks hold 128 tokens; only a longer prompt exercises the prefix cache.
    assert len(prompts[3].prompt_token_ids) > 128 + 8
    try:
        yield engine, hf, files, prompts
    finally:
        engine.close()


def _run_until_done(engine: RolloutEngine, want: int) -> list[FinishedGroup]:
    out: list[FinishedGroup] = []
    for _ in range(10_000):
        out.extend(engine.step())
        if len(out) >= want:
            return out
    raise AssertionError(f"only {len(out)} of {want} groups finished")


@torch.no_grad()
def _hf_logprobs(model: Any, prompt: list[int], response: list[int]) -> np.ndarray:
    ids = torch.tensor([prompt + response])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
    return lp.numpy()


@torch.no_grad()
def _hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


def test_groups_have_g_samples_with_logprobs_equal_to_transformers(setup: Any) -> None:
    engine, hf, _, prompts = setup
    engine.temperature = 1.0
    ids = [engine.add_group(p) for p in prompts[:3]]
    assert engine.num_in_flight == 3
    groups = _run_until_done(engine, 3)
    assert sorted(g.group_id for g in groups) == sorted(ids)
    assert engine.num_in_flight == 0
    by_prompt = {p.prompt_id: p for p in prompts}
    for group in groups:
        assert len(group.samples) == G
        prompt = by_prompt[group.prompt_id].prompt_token_ids
        assert group.prompt_token_ids.tolist() == prompt
        for s in group.samples:
            assert 1 <= len(s) <= MAX_NEW
            assert (
                s.token_ids.dtype == np.int32
                and s.logprobs.dtype == np.float32
                and s.versions.dtype == np.int32
            )
            assert np.isfinite(s.logprobs).all() and (s.logprobs <= 0).all()
            assert (s.versions == 0).all()
            assert s.truncated == (len(s) == MAX_NEW and s.finish_reason == "length")
            ref = _hf_logprobs(hf[0], prompt, s.token_ids.tolist())
            np.testing.assert_allclose(s.logprobs, ref, atol=LOGPROB_TOL, rtol=0)
    # Sampling at temperature 1 gives different responses within a group.
    assert any(len({tuple(s.token_ids.tolist()) for s in g.samples}) > 1 for g in groups)


def _swap_under_group(engine: RolloutEngine, prompt: PromptItem, path: Path, version: int) -> str:
    """Start a group, let it generate a few tokens, then update the weights while it runs."""
    gid = engine.add_group(prompt)
    start = engine.tokens_generated
    while engine.tokens_generated < start + 3 * G:
        assert not engine.step(), "the group finished before the update; raise MAX_NEW"
    seconds = engine.update_weights(path, version=version)
    assert seconds > 0 and engine.version == version
    return gid


def test_update_mid_request_switches_versions_at_the_swap_token(setup: Any) -> None:
    engine, hf, files, prompts = setup
    engine.temperature = 0.0
    long_prompt = prompts[3]
    prompt = long_prompt.prompt_token_ids
    engine.add_group(long_prompt)
    _run_until_done(engine, 1)  # leaves the prompt's first KV block in the prefix cache (version 0)
    before = engine.weights_checksum()

    gid = _swap_under_group(engine, long_prompt, files[1], version=1)
    assert engine.weights_checksum() != before
    (group,) = _run_until_done(engine, 1)
    assert group.group_id == gid
    # The swapped group did reuse the cached version-0 block, so a stale cache would be visible below.
    assert max(s.cached_prompt_tokens for s in group.samples) >= 128
    for s in group.samples:
        tokens = s.token_ids.tolist()
        assert len(tokens) == MAX_NEW and s.truncated
        k = int((s.versions == 0).sum())
        assert 1 <= k < MAX_NEW, "the update must land while the sample is being generated"
        assert s.versions.tolist() == [0] * k + [1] * (MAX_NEW - k)
        # Tokens before the swap are the old model's greedy choices, after it the new model's given the
        # prefix (in-flight KV is recomputed with the new weights), and so are their log-probs.
        assert tokens[:k] == _hf_greedy(hf[0], prompt, k)
        assert tokens[k:] == _hf_greedy(hf[1], prompt + tokens[:k], MAX_NEW - k)
        np.testing.assert_allclose(
            s.logprobs[:k], _hf_logprobs(hf[0], prompt, tokens)[:k], atol=LOGPROB_TOL, rtol=0
        )
        np.testing.assert_allclose(
            s.logprobs[k:], _hf_logprobs(hf[1], prompt, tokens)[k:], atol=LOGPROB_TOL, rtol=0
        )

    # A group started after the update is the new model's greedy output everywhere (tied LM head
    # included): the prompt's cached version-0 block was invalidated.
    engine.add_group(long_prompt)
    (fresh,) = _run_until_done(engine, 1)
    expected = _hf_greedy(hf[1], prompt, MAX_NEW)
    for s in fresh.samples:
        assert s.token_ids.tolist() == expected
        assert (s.versions == 1).all()


def test_keep_kv_mode_salts_new_requests_and_retries_cache_reset(setup: Any) -> None:
    engine, hf, files, prompts = setup
    engine.temperature = 0.0
    if engine.version != 1:
        # Run alone (-k): the test above leaves files[1] loaded as version 1; start from there too.
        assert engine.update_weights(files[1], version=1) > 0 and engine.version == 1
    engine.kv_on_update = "keep"
    try:
        long_prompt = prompts[3]
        old = _swap_under_group(engine, long_prompt, files[0], version=2)
        assert engine.kv_reset_pending, "reset_prefix_cache refuses while requests hold KV blocks"
        # Same prompt while the old group still holds its version-1 prompt block: no reuse allowed.
        new = engine.add_group(long_prompt)
        tries: list[tuple] = []
        reset = engine._engine.reset_prefix_cache

        def counted_reset(*a: Any, **k: Any) -> Any:
            tries.append(a)
            return reset(*a, **k)

        engine._engine.reset_prefix_cache = counted_reset
        engine._kv_reset_last_try = -math.inf  # a retry would be due at once
        try:
            groups = {g.group_id: g for g in _run_until_done(engine, 2)}
        finally:
            del engine._engine.reset_prefix_cache
        assert tries == [], "a busy engine refuses the reset; it waits for an idle step"
        assert engine.kv_reset_pending
        for s in groups[old].samples:
            k = int((s.versions == 1).sum())
            assert 1 <= k < MAX_NEW and s.versions.tolist() == [1] * k + [2] * (MAX_NEW - k)
        prompt = long_prompt.prompt_token_ids
        expected = _hf_greedy(hf[0], prompt, MAX_NEW)
        reference = _hf_logprobs(hf[0], prompt, expected)
        for s in groups[new].samples:
            assert s.token_ids.tolist() == expected and (s.versions == 2).all()
            # A prefix block computed by the version-1 weights would show here, not in the greedy tokens.
            np.testing.assert_allclose(s.logprobs, reference, atol=LOGPROB_TOL, rtol=0)
        engine._kv_reset_last_try = -math.inf  # do not wait out the retry interval in a test
        engine.step()
        assert not engine.kv_reset_pending
    finally:
        engine.kv_on_update = "recompute"


def test_bad_weights_file_is_refused_before_pausing(setup: Any, tmp_path: Path) -> None:
    engine, _, _, prompts = setup
    version = engine.version
    with pytest.raises(FileNotFoundError, match="does not exist"):
        engine.update_weights(tmp_path / "missing.safetensors", version=99)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a usable safetensors"):
        engine.update_weights(junk, version=99)
    assert engine.version == version
    engine.add_group(prompts[2])
    (group,) = _run_until_done(engine, 1)
    assert (np.concatenate([s.versions for s in group.samples]) == version).all()


def test_weights_handed_over_in_shared_memory_load_exactly_as_the_file_does(setup: Any) -> None:
    """The streaming path: the generator assembles the safetensors image in shared memory and the
    engine's worker (its own process) maps it; the result equals loading the file."""
    from stream_dapo.weights.image import WeightImage

    engine, hf, files, prompts = setup
    engine.temperature = 0.0
    engine.update_weights(files[0], version=10)
    from_file = engine.weights_checksum()
    engine.update_weights(files[1], version=11)
    assert engine.weights_checksum() != from_file
    data = files[0].read_bytes()
    image = WeightImage(len(data))
    image.view[:] = data
    assert engine.update_weights_from_image(image, version=12) > 0 and engine.version == 12
    assert engine.weights_checksum() == from_file
    # The engine copied the weights out of the segment: overwriting it (the generator reuses it for
    # the next version) changes nothing the engine samples from; closed here, the segment is gone.
    assert bytes(image) == data and (Path("/dev/shm") / image.name).exists()
    image.view[:] = bytes(len(data))
    assert engine.weights_checksum() == from_file
    image.close()
    assert not (Path("/dev/shm") / image.name).exists()
    long_prompt = prompts[3]
    engine.add_group(long_prompt)
    (group,) = _run_until_done(engine, 1)
    expected = _hf_greedy(hf[0], long_prompt.prompt_token_ids, MAX_NEW)
    for s in group.samples:
        assert s.token_ids.tolist() == expected and (s.versions == 12).all()
    # A damaged image is refused before the engine pauses: it keeps sampling version 12.
    junk = WeightImage(21)
    junk.view[:] = b"\x10" + bytes(20)
    with pytest.raises(ValueError, match="not a usable safetensors image"):
        engine.update_weights_from_image(junk, version=13)
    junk.close()
    assert engine.version == 12
