"""Typed reads of parsed JSON for `read`: each names where its value is when it is wrong, in one
sentence (`BadRecording`), and bounds every text, list and number.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from .format import MAX_SECONDS, MAX_TEXT, BadRecording

# What a text may hold: a label the recording gives itself (a device, a name, a date) no control
# character but tab and line breaks; a setting as the visitor sent it any but NUL; the model's
# own output (a token's piece, an answer) anything, as it came (every panel escapes it).
TextKind = Literal["label", "sent", "output"]
_FORBIDDEN = {"label": re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"), "sent": re.compile(r"\x00"),
              "output": None}


class Reader:
    """Typed reads of a parsed JSON object, each naming where it is (`where`) when wrong. Every
    one of `fields` must be there; one of `optional` may be missing (a field a later writer added,
    which a file written before it lacks)."""

    def __init__(self, obj: Any, where: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        if not isinstance(obj, dict):
            raise BadRecording(f"{where} must be an object, not {kind_of(obj)}")
        unknown = sorted(set(obj) - set(fields) - set(optional))
        if unknown:
            raise BadRecording(f"{where} has a field this version does not know: {cut(unknown[0])!r}")
        missing = [f for f in fields if f not in obj]
        if missing:
            raise BadRecording(f"{where} lacks the field {missing[0]!r}")
        self.obj, self.where = obj, where

    def get(self, name: str) -> Any:
        return self.obj[name]

    def optional(self, name: str, default: Any) -> Any:
        """One of the `optional` fields, or `default` where the file lacks it."""
        return self.obj.get(name, default)

    def text(self, name: str, limit: int = MAX_TEXT, kind: TextKind = "label") -> str:
        return as_text(self.obj[name], f"{self.where}.{name}", limit, kind)

    def whole(self, name: str, low: int = 0, high: int | None = None) -> int:
        return as_whole(self.obj[name], f"{self.where}.{name}", low, high)

    def number(self, name: str, low: float = 0.0, high: float = MAX_SECONDS) -> float:
        return as_number(self.obj[name], f"{self.where}.{name}", low, high)

    def flag(self, name: str) -> bool:
        return as_flag(self.obj[name], f"{self.where}.{name}")

    def items(self, name: str, limit: int) -> list:
        return as_list(self.obj[name], f"{self.where}.{name}", limit)


def kind_of(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true or false", type(None): "null",
            int: "a whole number", float: "a number"}.get(type(value), type(value).__name__)


def cut(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "…"


def as_text(value: Any, where: str, limit: int = MAX_TEXT, kind: TextKind = "label") -> str:
    if not isinstance(value, str):
        raise BadRecording(f"{where} must be text, not {kind_of(value)}")
    if len(value) > limit:
        raise BadRecording(f"{where} is {len(value)} characters long, more than the {limit} it may have")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRecording(f"{where} holds a lone surrogate, which is no text") from None
    forbidden = _FORBIDDEN[kind]
    found = forbidden.search(value) if forbidden is not None else None
    if found:
        raise BadRecording(f"{where} holds the control character U+{ord(found.group()):04X} at {found.start()}, "
                           "which no such text holds")
    return value


def as_whole(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRecording(f"{where} must be a whole number, not {kind_of(value)}")
    if value < low or (high is not None and value > high):
        raise BadRecording(f"{where} = {value} is out of range: {low} <= value" + (f" <= {high}" if high is not None
                                                                                     else ""))
    return value


def as_number(value: Any, where: str, low: float = 0.0, high: float = MAX_SECONDS) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecording(f"{where} must be a number, not {kind_of(value)}")
    if not (math.isfinite(value) and low <= value <= high):
        raise BadRecording(f"{where} = {value} is out of range: {low:g} <= value <= {high:g}")
    return float(value)


def as_flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BadRecording(f"{where} must be true or false, not {kind_of(value)}")
    return value


def as_list(value: Any, where: str, limit: int) -> list:
    if not isinstance(value, list):
        raise BadRecording(f"{where} must be a list, not {kind_of(value)}")
    if len(value) > limit:
        raise BadRecording(f"{where} has {len(value)} items, more than the {limit} it may have")
    return value


def as_choice(value: Any, where: str, allowed: tuple) -> Any:
    if not isinstance(value, (str, type(None))) or value not in allowed:
        shown = ", ".join("null" if a is None else str(a) for a in allowed)
        raise BadRecording(f"{where} must be one of {shown}, not {cut(repr(value))}")
    return value
