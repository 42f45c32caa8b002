"""A short supervised warm-up of a pretrained model on worked solutions, cached like the tiny model's.

Why: RL needs groups that are sometimes right. SmolLM2-135M-Instruct answers almost no GSM8K
problem at temperature 1 and seldom writes its answer in ``\\boxed{}``; dynamic sampling then drops
nearly every group and the learner starves. A few hundred steps of supervised training on the
*train* templates' worked solutions (the eval templates never appear) teach the answer format and the
GSM8K style, so RL starts where it has headroom. What RL adds afterwards is measured against this
warm model, not against the raw import.

``[sft]`` sets it up: ``base`` is the model it starts from (the import of ``model.source``), the
result goes to ``model.path``. The loss is the token-mean cross-entropy of the solution tokens
(``stream_dapo.model.warmup.train_supervised``, the tiny model's warm-up loop), on ``examples``
train rows drawn with ``seed``. The output is keyed by a digest of the base model, the data file and
every setting: ``sft.json`` is written last, a second call with the same key returns at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from stream_dapo.config import Config
from stream_dapo.errors import ConfigError
from stream_dapo.model.importer import file_digest, install_dir

__all__ = ["SFT_MARKER", "ensure_sft_model", "sft_key"]

log = logging.getLogger(__name__)

SFT_MARKER = "sft.json"


def _base_digest(base: Path) -> str:
    """The import's recorded source digest when there is one (cheap), else the weights' digest."""
    marker = base / "import.json"
    if marker.is_file():
        return str(json.loads(marker.read_text())["source_sha256"])[:16]
    return file_digest(base / "model.safetensors")[:16]


def sft_data(cfg: Config) -> Path:
    """The file of worked solutions the warm-up trains on (sft.data)."""
    if cfg.sft.data == "gsm_symbolic":
        if cfg.data.gsm_symbolic is None:
            raise ConfigError(
                'sft.data = "gsm_symbolic" needs a [data.gsm_symbolic] section; add one or set sft.data = "train"'
            )
        return cfg.data.gsm_symbolic.folder() / "train.jsonl"
    if cfg.data.train_path is None:
        raise ConfigError(
            "[sft] trains on data.train_path's worked solutions; set data.train_path, data.gsm_symbolic "
            "or data.word_problems"
        )
    return Path(cfg.data.train_path)


def sft_key(cfg: Config) -> str:
    """Hash of the base model, the training file and the [sft] settings."""
    payload = {
        "base": _base_digest(Path(cfg.sft.base)),
        "data": file_digest(sft_data(cfg))[:16],
        "sft": cfg.sft.model_dump(mode="json", exclude={"base", "threads", "data"}),
        "max_prompt_len": cfg.model.max_prompt_len,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _train(cfg: Config, out: Path, key: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.model.warmup import build_examples, train_supervised

    sft = cfg.sft
    start = time.perf_counter()
    torch.manual_seed(sft.seed)
    tokenizer = AutoTokenizer.from_pretrained(sft.base)
    items, _ = load_prompts(str(sft_data(cfg)), tokenizer, cfg.model.max_prompt_len)
    random.Random(sft.seed).shuffle(items)
    examples = [e for e in build_examples(items, tokenizer) if len(e[0]) <= sft.max_tokens][: sft.examples]
    if len(examples) < sft.batch_size:
        raise ConfigError(
            f"[sft] found {len(examples)} examples of at most sft.max_tokens = {sft.max_tokens} tokens; "
            "raise sft.max_tokens or add training data"
        )
    steps = max(1, sft.epochs * len(examples) // sft.batch_size)
    model = AutoModelForCausalLM.from_pretrained(sft.base, dtype="float32")
    loss = train_supervised(
        model,
        examples,
        steps=steps,
        batch_size=sft.batch_size,
        lr=sft.lr,
        seed=sft.seed,
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        threads=sft.threads,
        log_every=4,
        by_length=True,
    )
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    model.generation_config.save_pretrained(str(tmp))
    info = {
        "key": key,
        "base": sft.base,
        "examples": len(examples),
        "tokens": sum(len(ids) for ids, _ in examples),
        "steps": steps,
        "final_loss": loss,
        "seconds": round(time.perf_counter() - start, 1),
        "settings": sft.model_dump(mode="json"),
    }
    install_dir(tmp, out, SFT_MARKER, info)
    log.info(
        "[sft] %d steps on %d examples in %.0f s, final loss %.3f -> %s",
        steps,
        len(examples),
        info["seconds"],
        loss,
        out,
    )
    return info


def ensure_sft_model(cfg: Config) -> dict[str, Any]:
    """Warm ``cfg.sft.base`` up into ``model.path`` unless a warm-up with the same key is there."""
    out = Path(cfg.model.path)
    key = sft_key(cfg)
    marker = out / SFT_MARKER
    if marker.is_file():
        info: dict[str, Any] = json.loads(marker.read_text())
        if info.get("key") == key:
            return info
        log.warning("%s holds a warm-up with other settings; training it again", out)
    elif (out / "config.json").is_file():
        raise ConfigError(
            f"model.path = {out} holds a model that [sft] did not write; point model.path at a new "
            "folder for the warm-up's output, or set sft.enabled = false to train that model as it is"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    return _train(cfg, out, key)
