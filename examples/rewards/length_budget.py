"""A reward a user writes: a right answer within a word budget (verl's compute_score signature).

Used by configs/smollm2-words-mix-cpu.toml as the reward of its "concise" source, beside the
built-in math verifier of its "words" source. It imports nothing from stream-dapo: a verl reward
file works the same way, unchanged.

    score = -1                                  wrong (or no) final answer
          =  1                                  right, in at most `word_budget` words
          =  1 - (words - budget) / budget      right but longer, down to 0 at twice the budget

`word_budget` comes from the row's extra_info, 60 when it has none. The dict's other numeric keys
("words", "correct") become per-source metrics.
"""

from __future__ import annotations

import re

_ANSWER = re.compile(r"answer\s*:\s*([^\n]+)", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _final_answer(text: str) -> str | None:
    for pattern in (_ANSWER, _BOXED):
        found = pattern.findall(text[-300:])
        if found:
            return found[-1]
    return None


def _same_number(answer: str, gold: str) -> bool:
    numbers = _NUMBER.findall(answer.replace(",", ""))
    try:
        return bool(numbers) and float(numbers[-1]) == float(gold.replace(",", ""))
    except ValueError:
        return answer.strip() == gold.strip()


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> dict:
    budget = int((extra_info or {}).get("word_budget", 60))
    words = len(solution_str.split())
    answer = _final_answer(solution_str)
    correct = answer is not None and _same_number(answer, ground_truth)
    if not correct:
        score = -1.0
    elif words <= budget:
        score = 1.0
    else:
        score = max(0.0, 1.0 - (words - budget) / budget)
    return {"score": score, "words": words, "correct": float(correct)}
