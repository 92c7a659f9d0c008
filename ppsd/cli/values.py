"""Every command-line value that can be checked on its own, checked in one place each, with
one message: argparse types (whole numbers in a range, seconds, thread counts) and the files a
command reads or writes (checked before the work, written whole or not at all).

Boundary: strings and paths in, checked values out; no model, no weights. The decoding flags
against a model's shape are `options`.
"""

from __future__ import annotations

import argparse
import math
import os
import stat
from pathlib import Path
from typing import Callable

from ..model_source import shown  # cut: a name may be 10,000 characters
from ..paths import problem


def thread_count(text: str) -> int:
    """argparse type of a `--threads` option: a whole number from 1 to the machine's cores (torch
    refuses 0 with a traceback, and OpenBLAS segfaults on 100000)."""
    value = _parsed(text, int, "a whole number")
    cores = os.cpu_count() or 1
    if not 1 <= value <= cores:
        raise argparse.ArgumentTypeError(f"{value} is out of range: 1 <= threads <= {cores} (this machine's cores)")
    return value


MIN_TIMEOUT = 1.0  # seconds: a worker's answer takes milliseconds, but gloo's own calls need more
MAX_TIMEOUT = 7 * 24 * 3600.0  # a week: far past any run, far below what a wait or timedelta can hold


def seconds(text: str) -> float:
    """argparse type of a timeout: a finite number of seconds from MIN_TIMEOUT to MAX_TIMEOUT (0,
    -1 or NaN would reach the process group as a traceback, 0.001 fails the workers' first call or
    hangs, and 1e10 overflows a thread's wait)."""
    value = _parsed(text, float, "a number")
    if not (math.isfinite(value) and MIN_TIMEOUT <= value <= MAX_TIMEOUT):
        raise argparse.ArgumentTypeError(f"{text} is out of range: {MIN_TIMEOUT:g} <= seconds <= {MAX_TIMEOUT:g} "
                                         "(a week)")
    return value


def whole(low: int, high: int | None = None, *, why: str = "") -> Callable[[str], int]:
    """argparse type of a whole number from `low` to `high` (None: no limit); `why` says what the
    range comes from. A value out of range would fail late (after the model loads or the
    benchmark runs) or never (0 repeats time nothing)."""
    def parse(text: str) -> int:
        value = _parsed(text, int, "a whole number")
        if value < low or (high is not None and value > high):
            bound = f"{low} <= value" + (f" <= {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{value} is out of range: {bound}{f' ({why})' if why else ''}")
        return value
    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


def check_output_folder(path: str, what: str) -> None:
    """ValueError unless `path` is, or can be made, a writable folder: checked before a long run
    (a benchmark, a training), whose results would otherwise be lost at the end."""
    target = Path(path)
    try:
        if target.exists() and not target.is_dir():
            raise ValueError(f"{what} {shown(path)} is a file, not a folder: give a folder")
        target.mkdir(parents=True, exist_ok=True)
        if not os.access(target, os.W_OK):
            raise ValueError(f"{what} {shown(path)} is not writable")
    except OSError as error:
        raise ValueError(f"{what} {shown(path)} cannot be made a folder: {error.strerror or error}") from None


def check_output_file(path: str | None, what: str) -> None:
    """ValueError unless `path` can be written as a file: checked before a long run, whose
    result would otherwise be lost at the end. The file is opened for appending (and removed
    again when it was not there), so whatever the file system refuses (a name too long, a
    read-only folder) is found now; a device (/dev/full) is refused as no regular file. A link is
    written through (`write_result`); one that leads nowhere is refused: checking it would make
    an empty file where it points."""
    if path is None:
        return
    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
        if target.is_symlink() and not target.exists():
            raise ValueError(f"{what} {shown(path)} is a link to {shown(os.readlink(target))}, which does not "
                             "exist: give the file itself, or make the file it points to first")
        if target.is_dir():
            raise ValueError(f"{what} {shown(path)} is a directory: give a file name")
        if not folder.is_dir():
            raise ValueError(f"{what} {shown(path)}: folder {shown(str(folder))} does not exist")
        existed = target.exists()
        if existed and not target.is_file():
            raise ValueError(f"{what} {shown(path)} is not a regular file")
        with open(target, "a"):
            pass
        if not existed:
            target.unlink()
    except OSError as error:
        raise ValueError(f"{what} {shown(path)} cannot be written: {error.strerror or error}") from None


def check_input_file(path: str | None, what: str) -> None:
    """ValueError unless `path` (when given) is a readable regular file: checked before any work,
    and before it is opened (a FIFO would wait for ever, /dev/zero never end)."""
    if path is None:
        return
    wrong = problem(path, "file")
    if wrong is not None:
        raise ValueError(f"{what} {shown(path)} {wrong}")


def write_result(path: str, text: str, what: str) -> None:
    """Write `text` to `path` whole or not at all: into a new file beside it, renamed over it
    once complete, so a full disk leaves neither an empty nor a cut file (and an older result
    stands). A link is written through (the file it points to is replaced, the link stays), and
    a file that was there keeps its mode (a 0600 file stays 0600; a new one gets the umask's).
    ValueError, one line, when it cannot be written."""
    target = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        mode = stat.S_IMODE(target.stat().st_mode) if target.is_file() else None
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else 0o600)
        with open(descriptor, "w", encoding="utf-8") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
        os.replace(partial, target)
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise ValueError(f"{what} {shown(path)} could not be written: {error.strerror or error}") from None


def _parsed(text: str, kind: type, what: str):
    """`kind(text)`, or argparse's error saying `text` is not `what` ("a whole number")."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
