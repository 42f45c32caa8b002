"""Short arithmetic word problems in the DAPO-Math-17k schema: template-disjoint train and eval splits.

Why this source exists. A 135M instruct model gets almost no GSM8K-style problem right (0.4-5% on
GSM-Symbolic's held-out templates after a supervised warm-up, `docs/results/real-model.md`): every
group is all wrong, dynamic sampling drops it, and RL has nothing to learn from. On one- and two-step
word problems with small numbers the same warm model is right on about one sample in six and on at
least one of four samples for ~40% of the prompts, so most groups are mixed: the headroom the DAPO
recipe needs. The problems are natural-language forms of the synthetic task's arithmetic (add,
subtract, multiply, divide, in one or two steps), written here as templates.

Each template is a function of a seeded ``random.Random`` returning the question, a worked solution
(for a supervised warm-up, kept in ``extra_info["solution"]``) and the answer. Train and eval
templates are disjoint (a seeded split), so eval measures problem wordings and operation
combinations the policy never trained on, not only new numbers. Files are written once per setting,
under a key of every setting that shapes them, like ``stream_dapo.data.gsm_symbolic``'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stream_dapo.config import WordProblemsConfig
from stream_dapo.errors import ConfigError

__all__ = ["TEMPLATES", "WordProblemFiles", "ensure_word_problem_data", "render", "split_names"]

log = logging.getLogger(__name__)

DATA_SOURCE = "word_problems"
_MANIFEST = "manifest.json"
BOXED_INSTRUCTION = (
    "Solve the following math problem step by step. Put your final numeric answer (without units, "
    "currency symbols, or percentage signs) in \\boxed{}, for example: \\boxed{42}."
)
ANSWER_INSTRUCTION = (
    "Solve the following math problem step by step. The last line of your response should be of the "
    'form "Answer: $Answer" (without quotes) where $Answer is the final number, without units.'
)

NAMES = ("Tom", "Anna", "Liam", "Mia", "Noah", "Emma", "Omar", "Sara", "Ben", "Lucy", "Ravi", "Nina")
THINGS = ("apples", "marbles", "stickers", "pencils", "cookies", "books", "shells", "cards", "stamps", "toys")

Problem = tuple[str, str, int]  # question, worked solution (without the final line), answer


@dataclass(frozen=True)
class Template:
    name: str
    steps: int
    make: Callable[[random.Random], Problem]


def _people(r: random.Random, n: int) -> list[str]:
    return r.sample(NAMES, n)


def _add(r: random.Random) -> Problem:
    (p,), o, a, b = _people(r, 1), r.choice(THINGS), r.randint(3, 30), r.randint(2, 20)
    return (f"{p} has {a} {o}. {p} buys {b} more {o}. How many {o} does {p} have now?",
            f"{p} has {a} + {b} = {a + b} {o} now.", a + b)


def _give(r: random.Random) -> Problem:
    (p, q), o, b = _people(r, 2), r.choice(THINGS), r.randint(2, 15)
    a = b + r.randint(2, 25)
    return (f"{p} had {a} {o} and gave {b} of them to {q}. How many {o} does {p} have left?",
            f"{p} has {a} - {b} = {a - b} {o} left.", a - b)


def _bags(r: random.Random) -> Problem:
    (p,), o, a, b = _people(r, 1), r.choice(THINGS), r.randint(2, 9), r.randint(2, 9)
    return (f"{p} buys {a} bags. Each bag holds {b} {o}. How many {o} did {p} buy?",
            f"{a} bags of {b} {o} is {a} * {b} = {a * b} {o}.", a * b)


def _share(r: random.Random) -> Problem:
    (p,), o, b, each = _people(r, 1), r.choice(THINGS), r.randint(2, 6), r.randint(2, 9)
    t = b * each
    return (f"{p} shares {t} {o} equally among {b} friends. How many {o} does each friend get?",
            f"Each friend gets {t} / {b} = {each} {o}.", each)


def _altogether(r: random.Random) -> Problem:
    o, a, b = r.choice(THINGS), r.randint(5, 30), r.randint(5, 30)
    return (f"There are {a} {o} in a box and {b} {o} on the table. How many {o} are there altogether?",
            f"There are {a} + {b} = {a + b} {o} altogether.", a + b)


def _reading(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(3, 12), r.randint(2, 7)
    return (f"{p} reads {a} pages every day. How many pages does {p} read in {b} days?",
            f"In {b} days {p} reads {a} * {b} = {a * b} pages.", a * b)


def _sold(r: random.Random) -> Problem:
    o, b = r.choice(THINGS), r.randint(2, 20)
    a = b + r.randint(3, 30)
    return (f"A shop had {a} {o}. It sold {b} of them in the morning. How many {o} are left?",
            f"The shop has {a} - {b} = {a - b} {o} left.", a - b)


def _times_as_many(r: random.Random) -> Problem:
    (p, q), o, a, b = _people(r, 2), r.choice(THINGS), r.randint(2, 12), r.randint(2, 5)
    return (f"{p} has {a} {o}. {q} has {b} times as many {o} as {p}. How many {o} does {q} have?",
            f"{q} has {a} * {b} = {a * b} {o}.", a * b)


def _how_many_more(r: random.Random) -> Problem:
    (p, q), o, b = _people(r, 2), r.choice(THINGS), r.randint(3, 25)
    a = b + r.randint(2, 20)
    return (f"{p} has {a} {o} and {q} has {b} {o}. How many more {o} does {p} have than {q}?",
            f"{p} has {a} - {b} = {a - b} more {o}.", a - b)


def _price(r: random.Random) -> Problem:
    item, a, b = r.choice(("pen", "mug", "ticket", "notebook")), r.randint(2, 12), r.randint(2, 8)
    return (f"One {item} costs ${a}. How many dollars do {b} {item}s cost?",
            f"{b} {item}s cost {b} * {a} = {a * b} dollars.", a * b)


def _teams(r: random.Random) -> Problem:
    size, teams = r.randint(2, 8), r.randint(2, 9)
    return (f"{size * teams} children are split into teams of {size}. How many teams are there?",
            f"There are {size * teams} / {size} = {teams} teams.", teams)


def _age(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(5, 40), r.randint(2, 20)
    return (f"{p} is {a} years old. How old will {p} be in {b} years?",
            f"In {b} years {p} will be {a} + {b} = {a + b} years old.", a + b)


def _buy_then_give(r: random.Random) -> Problem:
    (p, q), o, a, b = _people(r, 2), r.choice(THINGS), r.randint(3, 20), r.randint(2, 15)
    c = r.randint(2, a + b - 1)
    return (f"{p} has {a} {o}, buys {b} more, and then gives {c} to {q}. How many {o} does {p} have now?",
            f"After buying, {p} has {a} + {b} = {a + b} {o}.\nAfter giving {c} away, {p} has "
            f"{a + b} - {c} = {a + b - c} {o}.", a + b - c)


def _bags_plus_loose(r: random.Random) -> Problem:
    (p,), o, a, b, c = _people(r, 1), r.choice(THINGS), r.randint(2, 6), r.randint(2, 9), r.randint(1, 9)
    return (f"{p} has {a} boxes with {b} {o} in each box and {c} loose {o}. How many {o} does {p} have?",
            f"The boxes hold {a} * {b} = {a * b} {o}.\nWith the loose ones, {p} has {a * b} + {c} = "
            f"{a * b + c} {o}.", a * b + c)


def _change(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(2, 9), r.randint(2, 5)
    c = (a * b // 10 + 1 + r.randint(0, 2)) * 10
    return (f"{p} buys {b} sandwiches at ${a} each and pays with ${c}. How many dollars of change does {p} get?",
            f"The sandwiches cost {b} * {a} = {a * b} dollars.\nThe change is {c} - {a * b} = "
            f"{c - a * b} dollars.", c - a * b)


def _together(r: random.Random) -> Problem:
    (p, q), o, a, b = _people(r, 2), r.choice(THINGS), r.randint(3, 20), r.randint(2, 10)
    return (f"{p} has {a} {o}. {q} has {b} more {o} than {p}. How many {o} do they have together?",
            f"{q} has {a} + {b} = {a + b} {o}.\nTogether they have {a} + {a + b} = {2 * a + b} {o}.",
            2 * a + b)


def _savings(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(2, 10), r.randint(2, 6)
    c = r.randint(1, a * b - 1)
    return (f"{p} saves ${a} every week for {b} weeks and then spends ${c}. How many dollars are left?",
            f"{p} saves {a} * {b} = {a * b} dollars.\nAfter spending {c}, {a * b} - {c} = {a * b - c} "
            "dollars are left.", a * b - c)


def _share_after_buying(r: random.Random) -> Problem:
    (p,), o, c, each = _people(r, 1), r.choice(THINGS), r.randint(2, 5), r.randint(2, 8)
    total = c * each
    b = r.randint(1, total - 1)
    a = total - b
    return (f"{p} had {a} {o} and bought {b} more. {p} shares them equally among {c} friends. "
            f"How many {o} does each friend get?",
            f"{p} has {a} + {b} = {total} {o}.\nEach friend gets {total} / {c} = {each} {o}.", each)


def _chairs(r: random.Random) -> Problem:
    a, b = r.randint(2, 9), r.randint(2, 9)
    c = r.randint(1, a * b - 1)
    return (f"A hall has {a} rows of {b} chairs. {c} chairs are taken away. How many chairs are left?",
            f"The hall had {a} * {b} = {a * b} chairs.\nNow {a * b} - {c} = {a * b - c} chairs are left.",
            a * b - c)


def _twice_then_more(r: random.Random) -> Problem:
    (p, q, s), o, a, b = _people(r, 3), r.choice(THINGS), r.randint(2, 15), r.randint(2, 10)
    return (f"{p} has {a} {o}. {q} has twice as many {o} as {p}, and {s} has {b} more {o} than {q}. "
            f"How many {o} does {s} have?",
            f"{q} has 2 * {a} = {2 * a} {o}.\n{s} has {2 * a} + {b} = {2 * a + b} {o}.", 2 * a + b)


def _two_days(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(3, 20), r.randint(2, 10)
    return (f"{p} read {a} pages on Monday and {b} more pages on Tuesday than on Monday. "
            f"How many pages did {p} read in the two days?",
            f"On Tuesday {p} read {a} + {b} = {a + b} pages.\nIn the two days {p} read {a} + {a + b} = "
            f"{2 * a + b} pages.", 2 * a + b)


def _pens_and_bag(r: random.Random) -> Problem:
    (p,), a, b, c = _people(r, 1), r.randint(2, 6), r.randint(2, 9), r.randint(3, 20)
    return (f"{p} buys {a} pens at ${b} each and a bag for ${c}. How many dollars does {p} spend?",
            f"The pens cost {a} * {b} = {a * b} dollars.\nWith the bag, {p} spends {a * b} + {c} = "
            f"{a * b + c} dollars.", a * b + c)


def _eggs(r: random.Random) -> Problem:
    (p,), a, b = _people(r, 1), r.randint(2, 6), r.randint(2, 7)
    c = r.randint(1, a * b - 1)
    return (f"{p}'s hens lay {a} eggs a day. After {b} days {p} has used {c} eggs. How many eggs are left?",
            f"The hens laid {a} * {b} = {a * b} eggs.\n{a * b} - {c} = {a * b - c} eggs are left.",
            a * b - c)


def _half_then_give(r: random.Random) -> Problem:
    (p, q, s), o, half = _people(r, 3), r.choice(THINGS), r.randint(3, 20)
    c = r.randint(1, half - 1)
    return (f"{p} has {2 * half} {o} and gives half of them to {q}. Then {p} gives {c} {o} to {s}. "
            f"How many {o} does {p} have left?",
            f"Half of {2 * half} is {2 * half} / 2 = {half}.\n{p} has {half} - {c} = {half - c} {o} left.",
            half - c)


TEMPLATES: tuple[Template, ...] = tuple(
    Template(fn.__name__.lstrip("_"), steps, fn)
    for steps, fns in (
        (1, (_add, _give, _bags, _share, _altogether, _reading, _sold, _times_as_many, _how_many_more,
             _price, _teams, _age)),
        (2, (_buy_then_give, _bags_plus_loose, _change, _together, _savings, _share_after_buying, _chairs,
             _twice_then_more, _two_days, _pens_and_bag, _eggs, _half_then_give)),
    )
    for fn in fns
)


@dataclass(frozen=True)
class WordProblemFiles:
    """Where the two splits were written, and which templates went where."""

    train: Path
    eval: Path
    info: dict[str, Any] = field(default_factory=dict)


def render(template: Template, rng: random.Random, answer_format: str) -> dict[str, Any]:
    """One instance of ``template`` as a DAPO-schema row."""
    question, solution, answer = template.make(rng)
    instruction = BOXED_INSTRUCTION if answer_format == "boxed" else ANSWER_INSTRUCTION
    final = f"The answer is \\boxed{{{answer}}}." if answer_format == "boxed" else f"Answer: {answer}"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{instruction}\n\n{question}"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(answer), "style": "rule"},
        "extra_info": {"steps": template.steps, "solution": f"{solution}\n{final}", "template": template.name},
    }


def _instances(template: Template, count: int, cfg: WordProblemsConfig, split: str) -> list[dict[str, Any]]:
    rng = random.Random(f"{cfg.seed}-{split}-{template.name}")
    seen: set[str] = set()
    rows: list[dict[str, Any]] = []
    for _ in range(count * 20):  # a template's distinct instances are finite: stop after enough tries
        row = render(template, rng, cfg.answer_format)
        text = row["prompt"][0]["content"]
        if text in seen:
            continue
        seen.add(text)
        row["extra_info"]["index"] = f"{split}-{template.name}-{len(rows)}"
        rows.append(row)
        if len(rows) == count:
            break
    return rows


def split_names(cfg: WordProblemsConfig) -> tuple[list[str], list[str]]:
    """The seeded, template-disjoint (train, eval) split of the templates with at most max_steps."""
    names = sorted(t.name for t in TEMPLATES if t.steps <= cfg.max_steps)
    if not 0 < cfg.eval_templates < len(names):
        raise ConfigError(
            f"data.word_problems.eval_templates = {cfg.eval_templates} must leave templates on both sides "
            f"of the split ({len(names)} templates have at most {cfg.max_steps} steps); choose 1..{len(names) - 1}"
        )
    shuffled = list(names)
    random.Random(f"word-problems-split-{cfg.seed}").shuffle(shuffled)
    return sorted(shuffled[cfg.eval_templates :]), sorted(shuffled[: cfg.eval_templates])


def ensure_word_problem_data(cfg: WordProblemsConfig) -> WordProblemFiles:
    """Write the two splits once (the manifest last, so its presence means both are complete)."""
    folder = cfg.folder()
    files = {name: folder / f"{name}.jsonl" for name in ("train", "eval")}
    manifest = folder / _MANIFEST
    if manifest.is_file() and all(p.is_file() for p in files.values()):
        return WordProblemFiles(files["train"], files["eval"], json.loads(manifest.read_text()))
    from stream_dapo.data.synthetic import _write_jsonl_atomic

    by_name = {t.name: t for t in TEMPLATES}
    train_names, eval_names = split_names(cfg)
    rows: dict[str, list[dict[str, Any]]] = {"train": [], "eval": []}
    for split, names, count in (("train", train_names, cfg.per_template), ("eval", eval_names, cfg.eval_per_template)):
        for name in names:
            rows[split].extend(_instances(by_name[name], count, cfg, split))
    random.Random(f"word-problems-order-{cfg.seed}").shuffle(rows["train"])  # templates interleaved
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in files.items():
        _write_jsonl_atomic(path, rows[name])
    digest = hashlib.sha256("".join(t.name for t in TEMPLATES).encode()).hexdigest()[:8]
    info = {
        "key": cfg.cache_key(),
        "settings": cfg.model_dump(mode="json"),
        "train_templates": train_names,
        "eval_templates": eval_names,
        "rows": {k: len(v) for k, v in rows.items()},
        "templates_digest": digest,
    }
    tmp = manifest.with_name(f".{_MANIFEST}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, manifest)
    log.info("word problems: %s rows in %s", info["rows"], folder)
    return WordProblemFiles(files["train"], files["eval"], info)
