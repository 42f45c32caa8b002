"""The embedded default policy: a tiny Qwen2-architecture causal LM and its tokenizer, built offline.

``stream-dapo init-model --out DIR [--seed S]`` writes a directory that ``AutoTokenizer``,
``AutoModelForCausalLM`` and vLLM load unchanged (``config.json``, ``model.safetensors``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``).
Nothing is downloaded; the same seed gives byte-identical weights.

Choices, and why:

- **Tokenizer**: byte-level BPE trained with ``tokenizers`` on a fixed corpus of the arithmetic task's
  text, under exactly Qwen2's normaliser and pre-tokenizer (``AutoTokenizer`` loads the directory as
  ``Qwen2Tokenizer``, which rebuilds those from its own code), so every digit is its own token. BPE folds the constant
  instruction into a handful of tokens, which keeps prompts short for a 512-position model; splitting
  digits keeps number spelling uniform (``36`` is always ``3``,``6``), so the model can learn digit-wise
  arithmetic instead of memorising arbitrary merges such as ``36`` vs ``3``,``61``. Byte-level means any
  text (LaTeX from DAPO-Math-17k included) encodes without unknown tokens. The corpus does not depend
  on the task config or the seed, so every tiny model shares one vocabulary.
- **Chat template**: Qwen's ``<|im_start|>role\\n...<|im_end|>\\n``; ``<|im_end|>`` is EOS and
  ``<|endoftext|>`` is PAD.
- **Architecture**: 4 layers, width 128, 4 query / 2 key-value heads of head_dim 32 (vLLM's CPU
  attention backend supports 32, 64, 80, ... 256 and 512), tied input/output embeddings (the
  weight-sync path must handle the shared tensor: safetensors holds only ``embed_tokens``),
  512 positions, 0.83M parameters.
- **dtype float32**: vLLM's CPU log-probs agree with transformers' to ~1e-5 in fp32; in bf16 they
  differ by 0.02-0.05 nats and greedy outputs diverge, which would read as spurious staleness in the
  importance ratios. The model is small enough that fp32 costs nothing that matters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "MARKER_FILE",
    "PAD_TOKEN",
    "TinyModelSpec",
    "build_tiny_model",
    "build_tokenizer",
    "check_replaceable",
    "default_init_dir",
    "fingerprint",
    "init_key",
    "init_model",
    "publish_dir",
    "read_marker",
    "write_marker",
]

log = logging.getLogger(__name__)

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)

# Qwen2's pre-tokenizer regex: words with their leading space, every digit on its own (\p{N}), runs
# of punctuation, newlines.
QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""Qwen-style chat template (no default system prompt: every token counts in a 512-token context)."""

MARKER_FILE = "stream_dapo_model.json"
"""Written last into every directory this package builds; its ``key`` says what the directory holds."""

_TOKENIZER_VERSION = 2
_TOKENIZER_VOCAB = 512


@dataclass(frozen=True)
class TinyModelSpec:
    """Architecture of the tiny Qwen2 model (0.83M parameters at the defaults).

    Small on purpose: the warm-up is step-bound, not capacity-bound (the copy and arithmetic circuits
    form after ~1000 optimizer steps whatever the width), so a narrow model that takes 4x cheaper
    steps than a 256-wide one reaches a useful policy in a fraction of the time.
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512
    rope_theta: float = 10_000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def check(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}"
            )
        if self.head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
            raise ValueError(
                f"head_dim {self.head_dim} is not supported by vLLM's CPU attention backend; "
                "choose hidden_size / num_heads in {32, 64, 80, 96, 112, 128, ...}"
            )


# --------------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------------


def _tokenizer_corpus() -> list[str]:
    """A fixed corpus: the task's instruction, questions and worked solutions, plus chat roles.

    Drawn with a fixed private seed and wide task limits, so the vocabulary does not depend on the
    run's task config (changing the difficulty must not change the tokenizer).
    """
    from stream_dapo.config import SyntheticTaskConfig
    from stream_dapo.data.synthetic import INSTRUCTION, sample_problem

    rng = random.Random("stream-dapo/tokenizer-corpus/v1")
    task = SyntheticTaskConfig(min_ops=1, max_ops=6, max_operand=99, max_result=99_999)
    lines: list[str] = []
    while len(lines) < 3000:
        problem = sample_problem(rng, task)
        if problem is not None:
            # The chat layout without its special tokens (those are added whole, never merged).
            lines.append(f"user\n{INSTRUCTION}\n\n{problem.question}\nassistant\n{problem.solution}\n")
    return lines


def build_tokenizer(max_length: int | None = None) -> PreTrainedTokenizerFast:
    """Train the byte-level BPE tokenizer (digits split) and wrap it with the chat template.

    ``max_length``: the model's positions (``model_max_length``); the vocabulary never depends on it.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # Exactly Qwen2's pipeline: AutoTokenizer maps model_type "qwen2" to Qwen2Tokenizer, which rebuilds
    # the normalizer and pre-tokenizer from its own code whatever tokenizer.json says. Training under
    # the same pipeline makes the build-time and the loaded tokenizer encode identically.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=max_length or TinyModelSpec().max_position_embeddings,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def build_tiny_model(tokenizer: PreTrainedTokenizerFast, spec: TinyModelSpec, seed: int) -> Qwen2ForCausalLM:
    """A freshly initialised float32 Qwen2 model; the same seed gives identical weights."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    spec.check()
    eos_id = int(tokenizer.convert_tokens_to_ids(EOS_TOKEN))  # type: ignore[arg-type]
    pad_id = int(tokenizer.convert_tokens_to_ids(PAD_TOKEN))  # type: ignore[arg-type]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_layers,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
    )
    config.dtype = torch.float32
    # fork_rng: building a model must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).float()
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    return model


def fingerprint(payload: dict[str, Any]) -> str:
    """Short stable hash of a JSON-able payload (cache keys)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def init_key(spec: TinyModelSpec, seed: int) -> str:
    """Identity of an init-model output: architecture, seed and tokenizer version."""
    return fingerprint({"kind": "init", "spec": asdict(spec), "seed": seed, "tokenizer": _TOKENIZER_VERSION})


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker of a directory this package built, or None (absent or unreadable)."""
    try:
        return json.loads((Path(folder) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None


def write_marker(folder: Path, info: dict[str, Any]) -> None:
    """Write the marker atomically; call it last, after every other file is in place."""
    path = Path(folder) / MARKER_FILE
    tmp = path.with_name(f".{MARKER_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def check_replaceable(out: Path) -> None:
    """Refuse to overwrite a non-empty directory that this package did not build."""
    if out.exists() and any(out.iterdir()) and read_marker(out) is None:
        raise FileExistsError(
            f"{out} exists and was not built by stream-dapo (no {MARKER_FILE}); refusing to overwrite it. "
            "Choose another --out or remove the directory."
        )


def publish_dir(staging: Path, out: Path) -> None:
    """Move a finished staging directory to ``out``, replacing an older build of ours."""
    check_replaceable(out)
    if out.exists():
        old = out.with_name(f".{out.name}.old.{os.getpid()}")
        os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, out)


def init_model(out: Path, *, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Build the tokenizer and a fresh tiny model into ``out``; reuse it if already built the same way."""
    spec = spec or TinyModelSpec()
    out = Path(out)
    key = init_key(spec, seed)
    marker = read_marker(out)
    if marker is not None and marker.get("key") == key:
        return out
    check_replaceable(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(spec.max_position_embeddings)
    model = build_tiny_model(tokenizer, spec, seed)
    # Build next to the target and rename: a crash never leaves a half-written model at `out`.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        n_params = sum(p.numel() for p in model.parameters())
        write_marker(
            staging, {"kind": "init", "key": key, "seed": seed, "spec": asdict(spec), "params": n_params}
        )
        publish_dir(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("tiny model (%d parameters, vocab %d) written to %s", n_params, len(tokenizer), out)
    return out


# --------------------------------------------------------------------------------------------------
# CLI: stream-dapo init-model
# --------------------------------------------------------------------------------------------------


def default_init_dir(model_path: str) -> Path:
    """Where the untrained model lives: next to the warm one (``runs/tiny-model/init``)."""
    return Path(model_path).parent / "init"
