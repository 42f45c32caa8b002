"""The tiny model end to end: init-model output loads in transformers and vLLM and both agree (fp32);
a reduced warm-up learns part of an easy task; a second warm-up is served from the cache.

One vLLM engine serves this module and test_eval.py (``shared_llm``); it runs the reduced warm-up's
model, so greedy continuations are real answers rather than an untrained model's repeats.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from stream_dapo.cli import init_model as init_model_cli
from stream_dapo.cli import warmup as warmup_cli
from stream_dapo.config import Config, load_config
from stream_dapo.data.dataset import PromptItem, load_prompts
from stream_dapo.model import tiny, warmup
from stream_dapo.model.tiny import MARKER_FILE, init_model, read_marker
from stream_dapo.model.warmup import WarmupResult

# An easier task (1-2 operations) and a short warm-up without the folded temperature: about a minute on
# 2 cores, before the copy circuit fully forms, so the model answers part of the eval set (~10-15%).
REDUCED = [
    "data.synthetic.num_train=3000",
    "data.synthetic.num_eval=64",
    "data.synthetic.min_ops=1",
    "data.synthetic.max_ops=2",
    "data.synthetic.max_operand=9",
    "data.synthetic.max_result=99",
    "warmup.steps=400",
    "warmup.eval_prompts=64",
    "warmup.fold_temperature=1.0",
    "model.max_prompt_len=128",
    "generator.kv_cache_gib=0.25",
]

_SHARED: dict[str, Any] = {}


def reduced_config(root: Path) -> Config:
    return load_config(
        overrides=[*REDUCED, f'run.out_dir="{root}"', f'model.path="{root / "tiny" / "warm"}"'], environ={}
    )


def shared_warmup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Config, WarmupResult]:
    """The reduced warm-up, run once per test session."""
    if "warm" not in _SHARED:
        cfg = reduced_config(tmp_path_factory.mktemp("tiny"))
        _SHARED["warm"] = (cfg, warmup.warmup(cfg))
    return _SHARED["warm"]


def shared_eval_prompts(cfg: Config, model_dir: Path) -> list[PromptItem]:
    from transformers import AutoTokenizer

    from stream_dapo.tools.evaluate import resolve_eval_data

    items, _ = load_prompts(
        resolve_eval_data(cfg), AutoTokenizer.from_pretrained(model_dir), cfg.model.max_prompt_len
    )
    return items


def shared_llm(request: pytest.FixtureRequest, cfg: Config, model_dir: Path) -> Any:
    """One vLLM engine on the warm model for the whole session, shut down at the end."""
    if "llm" not in _SHARED:
        from stream_dapo.generator.vllm_utils import make_llm, shutdown_llm

        llm = make_llm(
            str(model_dir),
            cfg.generator,
            dtype="float32",
            max_model_len=cfg.model.max_prompt_len + cfg.algo.max_response_len,
            seed=0,
        )
        _SHARED["llm"] = llm
        request.config.add_cleanup(lambda: shutdown_llm(llm))
    return _SHARED["llm"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Config, WarmupResult]:
    return shared_warmup(tmp_path_factory)


@pytest.fixture(scope="module")
def llm(request, warm):
    cfg, result = warm
    return shared_llm(request, cfg, result.path)


# --------------------------------------------------------------------------------------------------
# init-model
# --------------------------------------------------------------------------------------------------


def test_init_model_is_deterministic_and_loads_in_transformers(tmp_path, capsys):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(environ={})
    assert init_model_cli.run(argparse.Namespace(cfg=cfg, out=tmp_path / "a", seed=3)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"] == str(tmp_path / "a") and printed["seed"] == 3
    init_model(tmp_path / "b", seed=3)
    init_model(tmp_path / "c", seed=4)
    a, b, c = (load_file(tmp_path / d / "model.safetensors") for d in "abc")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)

    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "a")
    assert model.dtype == torch.float32
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.hidden_size // model.config.num_attention_heads in (32, 64)
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    # Digits are single tokens, so numbers are spelled digit by digit.
    assert [tok.decode([i]) for i in tok("1234", add_special_tokens=False)["input_ids"]] == [
        "1",
        "2",
        "3",
        "4",
    ]
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_init_model_reuses_its_output_and_refuses_foreign_directories(tmp_path):
    out = init_model(tmp_path / "m", seed=0)
    stamp = (out / MARKER_FILE).stat().st_mtime_ns
    init_model(out, seed=0)
    assert (out / MARKER_FILE).stat().st_mtime_ns == stamp
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "weights.bin").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="not built by stream-dapo"):
        init_model(foreign, seed=0)


# --------------------------------------------------------------------------------------------------
# warm-up
# --------------------------------------------------------------------------------------------------


def test_reduced_warmup_solves_part_of_the_eval_split(warm):
    _, result = warm
    assert not result.cached
    score = result.pass_at_1
    assert score is not None and score.num_prompts == 64
    assert 0.0 < score.sampled < 1.0
    assert 0.0 < score.greedy < 1.0
    assert result.final_loss is not None and result.final_loss < 1.0
    marker = read_marker(result.path)
    assert marker is not None and marker["kind"] == "warm" and marker["pass_at_1"]["sampled"] == score.sampled


def test_second_warmup_with_the_same_settings_comes_from_the_cache(warm, capsys):
    cfg, first = warm
    stamp = (first.path / MARKER_FILE).stat().st_mtime_ns
    weights = (first.path / "model.safetensors").stat().st_mtime_ns
    again = warmup.warmup(cfg)
    assert again.cached and again.path == first.path
    assert again.pass_at_1 == first.pass_at_1
    assert (first.path / MARKER_FILE).stat().st_mtime_ns == stamp
    assert (first.path / "model.safetensors").stat().st_mtime_ns == weights
    # The CLI reports the cached result too; --steps changes the key, so it is not passed here.
    assert warmup_cli.run(argparse.Namespace(cfg=cfg, out=None, steps=None, seed=None)) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cached"] is True and printed["pass_at_1_t1"] == first.pass_at_1.sampled
    assert warmup.ensure_warm_model(cfg) == first.path
    assert (first.path / MARKER_FILE).stat().st_mtime_ns == stamp
    # Another setting is another key.
    other = cfg.model_copy(update={"warmup": cfg.warmup.model_copy(update={"steps": 401})})
    assert warmup.warmup_key(other, tiny.TinyModelSpec()) != read_marker(first.path)["key"]


def _small_task(tmp_path: Path):
    """The default task at 64 train prompts: the untrained model's dir, its tokenizer, the train
    prompts and their warm-up examples."""
    from transformers import AutoTokenizer

    from stream_dapo.data.synthetic import ensure_synthetic_data

    cfg = load_config(overrides=["data.synthetic.num_train=64", "data.synthetic.num_eval=8"], environ={})
    train, _ = ensure_synthetic_data(cfg.data, tmp_path / "data")
    init = init_model(tmp_path / "init", seed=0)
    tok = AutoTokenizer.from_pretrained(init)
    items, _ = load_prompts(train, tok, 128)
    examples = warmup.build_examples(items, tok)
    return init, tok, items, examples


def test_supervised_training_is_deterministic_for_a_seed(tmp_path):
    from transformers import AutoModelForCausalLM

    init, tok, items, examples = _small_task(tmp_path)
    # Labels cover exactly the response: solution tokens plus EOS.
    ids, prompt_len = examples[0]
    assert tok.decode(ids[prompt_len:]) == items[0].extra_info["solution"] + "<|im_end|>"

    def train(seed: int) -> dict[str, torch.Tensor]:
        model = AutoModelForCausalLM.from_pretrained(init)
        warmup.train_supervised(
            model, examples, steps=4, batch_size=8, lr=1e-3, seed=seed, pad_id=tok.pad_token_id
        )
        return {k: v.clone() for k, v in model.state_dict().items()}

    a, b, c = train(0), train(0), train(1)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_slipped_examples_rework_chain_solutions_at_the_rate_seeded_by_prompt(tmp_path):
    from transformers import AutoTokenizer

    from stream_dapo.data.longcot import ChainProblem
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.verifier import verify

    cfg = load_config(
        overrides=[
            "data.synthetic.kind=chain",
            "data.synthetic.min_ops=5",
            "data.synthetic.max_ops=26",
            "data.synthetic.num_train=200",
            "data.synthetic.num_eval=8",
        ],
        environ={},
    )
    train, _ = ensure_synthetic_data(cfg.data, tmp_path / "data")
    tok = AutoTokenizer.from_pretrained(init_model(tmp_path / "init", seed=0))
    items, _ = load_prompts(train, tok, 2048)

    def responses(rate: float, seed: int) -> list[str]:
        return [
            tok.decode(ids[n:-1]) for ids, n in warmup.build_examples(items, tok, slip_rate=rate, seed=seed)
        ]

    reference, slipped = responses(0.0, 0), responses(0.1, 0)
    assert reference == [item.extra_info["solution"] for item in items]
    assert slipped == responses(0.1, 0) and slipped != responses(0.1, 1)
    lines = wrong_lines = wrong_answers = 0
    for item, ref, text in zip(items, reference, slipped, strict=True):
        problem = ChainProblem.parse(item.messages[-1]["content"])
        forward = len(problem.ops)
        lines += forward
        wrong_lines += sum(
            a != b for a, b in zip(ref.splitlines()[:forward], text.splitlines()[:forward], strict=True)
        )
        wrong_answers += not verify(text, item.gold).correct
        assert len(text.splitlines()) == len(ref.splitlines())  # same shape, only numbers differ
    # A slip rewrites its line and every forward line after it: more wrong lines than slips.
    assert 0.1 * lines < wrong_lines
    assert 0.3 * len(items) < wrong_answers < 0.9 * len(items)


def chain_warmup(root: Path, *extra: str) -> WarmupResult:
    """A 3-step warm-up on 2-4 term chains (seconds): for what the phases do, not what they teach."""
    cfg = load_config(
        overrides=[
            "data.synthetic.kind=chain",
            "data.synthetic.min_ops=2",
            "data.synthetic.max_ops=4",
            "data.synthetic.num_train=64",
            "data.synthetic.num_eval=4",
            "warmup.steps=3",
            "warmup.batch_size=4",
            "warmup.eval_prompts=2",
            "warmup.fold_temperature=1.0",
            "algo.max_response_len=16",
            "algo.overlong_cache_len=4",
            f'run.out_dir="{root}"',
            f'model.path="{root / "warm"}"',
            *extra,
        ],
        environ={},
    )
    return warmup.warmup(cfg)


def test_the_slip_phase_trains_on_after_the_reference_steps_and_keys_the_cache(tmp_path):
    from safetensors.torch import load_file

    plain = chain_warmup(tmp_path / "plain")
    slipped = chain_warmup(tmp_path / "slipped", "warmup.slip_rate=0.2", "warmup.slip_steps=2")
    assert read_marker(plain.path)["key"] != read_marker(slipped.path)["key"]
    a, b = load_file(plain.path / "model.safetensors"), load_file(slipped.path / "model.safetensors")
    # Same init and the same first 3 steps; the 2 slip steps then move every trained weight.
    assert a.keys() == b.keys() and all(not torch.equal(a[k], b[k]) for k in a)
    # Tracking greedy pass@1 every 2 steps (and at each phase's end) leaves the weights bit for bit.
    tracked = chain_warmup(
        tmp_path / "tracked",
        "warmup.slip_rate=0.2",
        "warmup.slip_steps=2",
        "warmup.track_every=2",
        "warmup.track_prompts=3",
    )
    c = load_file(tracked.path / "model.safetensors")
    assert all(torch.equal(b[k], c[k]) for k in b)
    progress = read_marker(tracked.path)["progress"]
    assert [(p["phase"], p["step"]) for p in progress] == [("reference", 2), ("reference", 3), ("slips", 2)]
    assert all(0.0 <= p["greedy"] <= 1.0 and p["mean_response_len"] > 0 for p in progress)
    assert "progress" not in read_marker(slipped.path)


def test_the_reference_floor_runs_more_rounds_from_the_weights_reached_and_fails_cleanly(
    tmp_path, monkeypatch
):
    from safetensors.torch import load_file

    def floored(root: Path, *extra: str) -> WarmupResult:
        return chain_warmup(root, "warmup.track_prompts=2", *extra)

    # Three steps cannot teach the task, so the real greedy figure is 0; the floor's round logic is
    # driven by scripted figures for the end-of-round checks, the final pass@1 is measured for real.
    real_accuracy = warmup.accuracy
    script: list[float] = []

    def scripted_accuracy(*args: Any, **kwargs: Any) -> tuple[float, list[int]]:
        greedy, lengths = real_accuracy(*args, **kwargs)
        return (script.pop(0) if script else greedy), lengths

    monkeypatch.setattr(warmup, "accuracy", scripted_accuracy)
    plain = floored(tmp_path / "plain")
    script[:] = [0.75]
    first = floored(tmp_path / "first", "warmup.reference_min_greedy=0.5")
    script[:] = [0.25, 0.75]
    second = floored(tmp_path / "second", "warmup.reference_min_greedy=0.5")
    a, b, c = (load_file(r.path / "model.safetensors") for r in (plain, first, second))
    # Reached in round 1: the weights of the schedule without a floor, bit for bit.
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert read_marker(first.path)["reference_rounds"] == [0.75]
    # Reached in round 2: 3 more steps from where round 1 left the weights move every one of them.
    assert all(not torch.equal(b[k], c[k]) for k in b)
    marker = read_marker(second.path)
    assert marker["reference_rounds"] == [0.25, 0.75]
    assert [(p["phase"], p["step"]) for p in marker["progress"]] == [("reference", 3), ("reference-2", 3)]
    assert "reference_rounds" not in read_marker(plain.path)

    # Not reached in its one round: no warm model, and the weights reached are kept aside. The same
    # build with 2 rounds goes on from them: round 2 only, and the uninterrupted build's weights.
    script[:] = [0.25]
    with pytest.raises(warmup.FloorNotReached, match=r"1 round\(s\) at greedy pass@1 0.250.*kept in"):
        floored(tmp_path / "resumed", "warmup.reference_min_greedy=0.5", "warmup.reference_max_rounds=1")
    kept = warmup.below_floor_dir(tmp_path / "resumed" / "warm")
    assert read_marker(tmp_path / "resumed" / "warm") is None
    assert read_marker(kept)["kind"] == "below-floor" and read_marker(kept)["reference_rounds"] == [0.25]
    script[:] = [0.75]
    resumed = floored(
        tmp_path / "resumed", "warmup.reference_min_greedy=0.5", "warmup.reference_max_rounds=2"
    )
    assert not script  # one end-of-round check: round 1 did not run again
    d = load_file(resumed.path / "model.safetensors")
    assert all(torch.equal(c[k], d[k]) for k in c)
    marker = read_marker(resumed.path)
    assert marker["reference_rounds"] == [0.25, 0.75] and marker["rounds_resumed"] == 1
    assert [(p["phase"], p["step"]) for p in marker["progress"]] == [("reference", 3), ("reference-2", 3)]
    assert not kept.exists()  # gone on into the warm model

    # Never reached: a FloorNotReached (a ConfigError: no traceback on the CLI), no warm model.
    monkeypatch.setattr(warmup, "accuracy", real_accuracy)
    never = ("warmup.reference_min_greedy=1.0", "warmup.reference_max_rounds=2")
    with pytest.raises(warmup.FloorNotReached, match=r"2 round\(s\) at greedy pass@1 0.000, 0.000"):
        floored(tmp_path / "never", *never)
    assert read_marker(tmp_path / "never" / "warm") is None
    kept_marker = read_marker(warmup.below_floor_dir(tmp_path / "never" / "warm"))
    assert kept_marker["reference_rounds"] == [0.0, 0.0]
    # Asked again with no more rounds: the same error at once, and the kept weights left as they were.
    with pytest.raises(warmup.FloorNotReached, match="kept in"):
        floored(tmp_path / "never", *never)
    assert read_marker(warmup.below_floor_dir(tmp_path / "never" / "warm")) == kept_marker


def test_supervised_training_runs_every_step_at_the_given_thread_count_and_reports_each_loss(tmp_path):
    # The weights depend on the thread count (two threads split reductions differently from one), so
    # the warm-up never changes it mid-run: every step runs at exactly `threads`.
    from transformers import AutoModelForCausalLM

    init, tok, items, examples = _small_task(tmp_path)
    previous = torch.get_num_threads()
    seen: list[tuple[int, float, int]] = []
    try:
        for threads in (1, 2):
            model = AutoModelForCausalLM.from_pretrained(init)
            tail = warmup.train_supervised(
                model,
                examples,
                steps=10,
                stop_after=4,
                batch_size=8,
                lr=1e-3,
                seed=0,
                pad_id=tok.pad_token_id,
                threads=threads,
                on_step=lambda step, loss: seen.append((step, loss, torch.get_num_threads())),
            )
            assert tail == seen[-1][1]  # the last 10% of 4 steps is the last step
    finally:
        torch.set_num_threads(previous)
    assert [s for s, _, _ in seen] == [0, 1, 2, 3] * 2  # stop_after: 4 of the 10 steps
    assert [t for _, _, t in seen] == [1] * 4 + [2] * 4
    assert seen[0][1] == seen[4][1]  # same init, same first batch


def test_warmup_key_holds_the_thread_count_except_at_the_default():
    cfg = load_config(environ={})
    spec = tiny.TinyModelSpec()
    at = {
        t: warmup.warmup_key(
            cfg.model_copy(update={"warmup": cfg.warmup.model_copy(update={"threads": t})}), spec
        )
        for t in (1, 2, 3)
    }
    assert at[2] == warmup.warmup_key(cfg, spec)  # caches built before the key held it stay valid
    assert len(set(at.values())) == 3
    tracked = cfg.model_copy(
        update={"warmup": cfg.warmup.model_copy(update={"track_every": 5, "track_prompts": 3})}
    )
    assert warmup.warmup_key(tracked, spec) == at[2]  # tracking does not change the weights


def test_fold_temperature_divides_every_logit(tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(init_model(tmp_path / "init", seed=0)).eval()
    x = torch.tensor([[1, 5, 9, 30, 7]])
    with torch.no_grad():
        before = model(x).logits
        warmup.fold_temperature(model, 1.9)
        after = model(x).logits
    torch.testing.assert_close(after, before / 1.9, rtol=1e-5, atol=1e-6)
    assert torch.equal(before.argmax(-1), after.argmax(-1))  # greedy answers do not change


# --------------------------------------------------------------------------------------------------
# vLLM agrees with transformers
# --------------------------------------------------------------------------------------------------


def test_vllm_and_transformers_agree_on_greedy_text_and_logprobs(warm, llm):
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams, TokensPrompt

    cfg, result = warm
    prompts = shared_eval_prompts(cfg, result.path)[:6]
    params = SamplingParams(temperature=0.0, max_tokens=48, logprobs=0)
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p.prompt_token_ids) for p in prompts], params, use_tqdm=False
    )
    model = AutoModelForCausalLM.from_pretrained(result.path, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    worst = 0.0
    for item, out in zip(prompts, outputs, strict=True):
        completion = out.outputs[0]
        ids = list(completion.token_ids)
        assert completion.finish_reason == "stop" and ids[-1] == eos  # the warm model ends its answers
        with torch.no_grad():
            hf = model.generate(
                torch.tensor([item.prompt_token_ids]), max_new_tokens=48, do_sample=False, eos_token_id=eos
            )[0, len(item.prompt_token_ids) :].tolist()
        assert hf == ids
        full = torch.tensor([item.prompt_token_ids + ids])
        with torch.no_grad():
            logits = model(full).logits[0, len(item.prompt_token_ids) - 1 : -1]
        hf_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
        vllm_lp = torch.tensor([pos[tok].logprob for pos, tok in zip(completion.logprobs, ids, strict=True)])
        worst = max(worst, (hf_lp - vllm_lp).abs().max().item())
    assert worst < 1e-4
