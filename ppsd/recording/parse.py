"""A recording's bytes as parsed JSON, strictly (`parse`): at most MAX_BYTES, UTF-8, nesting and
the count of objects and lists bounded before the parser builds anything, then JSON with no
NaN, Infinity or repeated key. What the values mean is `read`'s.
"""

from __future__ import annotations

import json
from typing import Any

from .format import MAX_BYTES, MAX_CONTAINERS, MAX_DEPTH, BadRecording


def parse(data: bytes) -> Any:
    """The JSON value in `data`; BadRecording says the first thing wrong."""
    if not isinstance(data, (bytes, bytearray)):
        raise BadRecording("a recording is read as bytes")
    if len(data) > MAX_BYTES:
        raise BadRecording(f"the file is {len(data) / 1e6:.1f} MB, over the {MAX_BYTES / 1e6:.1f} MB a recording "
                           "may have")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadRecording(f"the file is not UTF-8 text (byte {error.start} is 0x{data[error.start]:02x}): "
                           "not a recording") from None
    _check_structure(text)
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_one_of_each)
    except json.JSONDecodeError as error:
        raise BadRecording(f"the file is not JSON (line {error.lineno}, column {error.colno}: {error.msg}): "
                           "not a recording") from None


def _no_constant(name: str) -> Any:
    raise BadRecording(f"the file holds {name}, which is no number a recording may hold")


def _one_of_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are each given once: a parser keeps the last of two, so a file could
    show one reader one value and another reader another."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise BadRecording(f"the file gives the key {twice[:40]!r} twice in one object: not a recording")
    return found


def _check_structure(text: str) -> None:
    """BadRecording when brackets outside strings nest deeper than MAX_DEPTH (a parser recurses
    once per level, and 100,000 levels would exhaust its stack) or open more than MAX_CONTAINERS
    objects and lists (each costs the parser far more memory than its two bytes)."""
    depth, opened, in_string, escaped = 0, 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            opened += 1
            if depth > MAX_DEPTH:
                raise BadRecording(f"the file nests deeper than {MAX_DEPTH} levels: not a recording")
            if opened > MAX_CONTAINERS:
                raise BadRecording(f"the file holds more than {MAX_CONTAINERS:,} objects and lists: more than a "
                                   "recording does")
        elif ch in "]}":
            depth -= 1
