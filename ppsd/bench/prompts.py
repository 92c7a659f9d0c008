"""The prompts of the bench: the shipped prompt files (or a built-in fallback), checked on load,
the subsets that keep every category represented, and the token ids a run starts from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..assets import ASSETS
from ..chat import encode_prompt
from ..paths import problem

PROMPTS_FILE = ASSETS / "prompts" / "prompts.json"
CHAT_PROMPTS_FILE = PROMPTS_FILE.with_name("chat.json")  # questions for instruct models
# Used only when assets/prompts/prompts.json is missing; the report says so. Stdlib-style code,
# reference prose and arithmetic, like the embedded model's held-out prompts.
FALLBACK_PROMPTS = (
    {"name": "gcd", "category": "code",
     "prompt": "def gcd(a, b):\n    \"\"\"Return the greatest common divisor of a and b.\"\"\"\n    while b:\n"},
    {"name": "dedent", "category": "code",
     "prompt": "def dedent(text):\n    \"\"\"Remove any common leading whitespace from every line in text.\n"},
    {"name": "for-statement", "category": "prose",
     "prompt": "The for statement is used to iterate over the elements of a sequence (such as a string,"},
    {"name": "truth-value", "category": "prose",
     "prompt": "Any object can be tested for truth value, for use in an if or while condition or as"},
    {"name": "fractions", "category": "math",
     "prompt": ">>> from fractions import Fraction\n>>> Fraction(3, 4) + Fraction(1, 4)\n"},
    {"name": "mean", "category": "math",
     "prompt": ">>> mean([1, 2, 3, 4, 4])\n2.8\n>>> mean([-1.0, 2.5, 3.25, 5.75])\n"},
)


def load_prompts(path: str | None) -> tuple[list[dict], str]:
    """The prompt set and where it came from. Raises ValueError on a malformed file."""
    file = Path(path) if path else PROMPTS_FILE
    wrong = problem(file, "file")  # before reading: a FIFO would wait for ever
    if wrong is not None and path:
        raise ValueError(f"prompts file {path!r} {wrong}")
    if wrong is not None:
        return [dict(p) for p in FALLBACK_PROMPTS], f"built-in fallback ({PROMPTS_FILE.name} is missing)"
    try:
        prompts = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read prompts file {str(file)!r}: {error}") from None
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, dict) and {"name", "category", "prompt"} <= p.keys() for p in prompts):
        raise ValueError(f"prompts file {str(file)!r} must be a non-empty list of "
                         f'{{"name", "category", "prompt"}} objects')
    return prompts, str(file)


def spread(prompts: Sequence[dict], count: int) -> list[dict]:
    """Up to `count` prompts, taking categories in turn (in order of first appearance) so each
    is represented."""
    by_category: dict[str, list[dict]] = {}
    for prompt in prompts:
        by_category.setdefault(prompt["category"], []).append(prompt)
    chosen: list[dict] = []
    while len(chosen) < count and any(by_category.values()):
        for queue in by_category.values():
            if queue and len(chosen) < count:
                chosen.append(queue.pop(0))
    return chosen


def prompt_ids(tokenizer, text: str, room: int, *, chat: bool = False) -> list[int]:
    """The token ids of `text` (through the chat template when `chat`), at most `room` of them.
    Raises ValueError when it has none."""
    ids = encode_prompt(tokenizer, text, chat=chat)
    if not ids:
        raise ValueError(f"prompt {text[:40]!r} has no tokens")
    return ids[-room:]  # keep the end: it is what the continuation depends on
