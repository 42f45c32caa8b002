"""The workload the benchmarks share: the embedded tiny-cpu config, its model and its task.

- ``tiny_config``: configs/tiny-cpu.toml with its paths made absolute (any working directory).
- ``warm_model_dir``: the warm tiny model (built by `stream-dapo warmup` on first use, minutes).
- ``init_model_dir``: the untrained model of the same architecture (seconds): enough where only
  speed matters, not what the weights say.
- ``task_prompts``: synthetic-task prompts under the model's chat template.
- ``rollout_groups``: groups shaped like the generators' output (prompt of the task, G responses
  whose lengths follow the task's worked solutions, which is what the warm model imitates: its
  evaluation responses average ~20 tokens, the solutions ~20 as well).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

REPO = Path(__file__).resolve().parents[1]

from stream_dapo.config import Config, load_config  # noqa: E402
from stream_dapo.transport.messages import Group, Sample  # noqa: E402

if TYPE_CHECKING:
    from stream_dapo.data.dataset import PromptItem

__all__ = [
    "TINY_CONFIG",
    "init_model_dir",
    "rollout_groups",
    "task_prompts",
    "task_responses",
    "tiny_config",
    "warm_model_dir",
]

TINY_CONFIG = REPO / "configs" / "tiny-cpu.toml"


def tiny_config(overrides: list[str] | None = None, config: Path = TINY_CONFIG) -> Config:
    """``config`` with the model and run directories resolved against the repository."""
    base = load_config([config], environ={})
    fixed = [
        f"model.path={(REPO / base.model.path).resolve()}",
        f'run.out_dir="{(REPO / base.run.out_dir).resolve()}"',
    ]
    return load_config([config], [*fixed, *(overrides or [])], environ={})


def warm_model_dir(cfg: Config) -> Path:
    from stream_dapo.model.warmup import ensure_warm_model

    return ensure_warm_model(cfg).resolve()


def init_model_dir(cfg: Config) -> Path:
    from stream_dapo.model.tiny import default_init_dir, init_model

    return init_model(default_init_dir(cfg.model.path)).resolve()


def task_prompts(cfg: Config, model_dir: Path, split: str = "eval") -> list[PromptItem]:
    """The synthetic task's ``split`` ("train" or "eval") prompts, tokenized with ``model_dir``'s
    chat template (written under run.out_dir/data on first use)."""
    from transformers import AutoTokenizer

    from stream_dapo.data.dataset import load_prompts
    from stream_dapo.data.synthetic import ensure_synthetic_data
    from stream_dapo.model.warmup import synthetic_data_dir

    train, evaluation = ensure_synthetic_data(cfg.data, synthetic_data_dir(cfg))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    items, _ = load_prompts(train if split == "train" else evaluation, tokenizer, cfg.model.max_prompt_len)
    return items


def task_responses(items: list[PromptItem], model_dir: Path) -> list[np.ndarray]:
    """Worked solution + EOS of each item as int32 token ids (what a correct rollout looks like)."""
    from transformers import AutoTokenizer

    from stream_dapo.model.warmup import build_examples

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [
        np.asarray(ids[prompt_len:], dtype=np.int32) for ids, prompt_len in build_examples(items, tokenizer)
    ]


def rollout_groups(
    items: list[PromptItem],
    responses: list[np.ndarray],
    *,
    num_groups: int,
    group_size: int,
    seed: int,
) -> list[Group]:
    """``num_groups`` groups of ``group_size`` samples: a random prompt each, and responses drawn
    from ``responses`` (so lengths vary within a group as rollouts do). Half of each group is
    "correct" (advantage +1), half not (-1); behaviour log-probs are plausible negatives."""
    rng = np.random.default_rng(seed)
    groups = []
    for _ in range(num_groups):
        item = items[int(rng.integers(len(items)))]
        samples = []
        for i in range(group_size):
            tokens = responses[int(rng.integers(len(responses)))]
            sign = 1.0 if i % 2 == 0 else -1.0
            samples.append(
                Sample(
                    tokens=tokens,
                    logprobs=-rng.exponential(1.0, len(tokens)).astype(np.float32),
                    versions=np.zeros(len(tokens), dtype=np.int32),
                    reward=sign,
                    correct=sign > 0,
                    truncated=False,
                    advantage=sign,
                )
            )
        groups.append(
            Group(
                group_id=uuid.uuid4().hex,
                prompt_id=item.prompt_id,
                generator_id="bench",
                gold=item.gold,
                prompt_tokens=np.asarray(item.prompt_token_ids, dtype=np.int32),
                created_at=0.0,
                samples=samples,
            )
        )
    return groups
