"""Command line: `ppsd SUBCOMMAND ...` (or `python -m ppsd ...`), the stable contract other tools use.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`,
imported only when used. Bad input raises ValueError there; here it becomes a one-line
`error: ...` on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
from pathlib import Path
from typing import Callable

SUBCOMMANDS = {
    "generate": ("ppsd.cli.generate", "generate text with AR, EESD or PPSD"),
    "pipeline": ("ppsd.cli.pipeline", "generate on a K-process pipeline (also one rank of a torchrun launch)"),
    "bench": ("ppsd.bench.sweep", "benchmark PPSD against EESD and AR over a sweep of settings"),
    "bench-pipeline": ("ppsd.bench.pipeline", "benchmark AR, HF, EESD and PPSD on a K-worker pipeline"),
    "train-head": ("ppsd.heads.train", "train an early-exit head by self-distillation"),
    "record": ("ppsd.cli.record", "run the page's comparison and write it as a recording the page replays"),
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, status 2
        self.exit(2, f"error: {message}\n")


def thread_count(text: str) -> int:
    """argparse type of a `--threads` option: a whole number from 1 to the machine's cores (torch
    refuses 0 with a traceback, and OpenBLAS segfaults on 100000)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
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
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and MIN_TIMEOUT <= value <= MAX_TIMEOUT):
        raise argparse.ArgumentTypeError(f"{text} is out of range: {MIN_TIMEOUT:g} <= seconds <= {MAX_TIMEOUT:g} "
                                         "(a week)")
    return value


def whole(low: int, high: int | None = None, *, why: str = "") -> Callable[[str], int]:
    """argparse type of a whole number from `low` to `high` (None: no limit); `why` says what the
    range comes from. A value out of range would fail late (after the model loads or the
    benchmark runs) or never (0 repeats time nothing)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bound = f"{low} <= value" + (f" <= {high}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"{value} is out of range: {bound}{f' ({why})' if why else ''}")
        return value
    parse.__name__ = "whole number"  # argparse names the type in its own messages
    return parse


def check_output_folder(path: str, what: str) -> None:
    """ValueError unless `path` is, or can be made, a writable folder: checked before a long run
    (a benchmark, a training), whose results would otherwise be lost at the end."""
    from ..model_source import shown  # cut: a name may be 10,000 characters

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
    read-only folder) is found now; a device (/dev/full) is refused as no regular file."""
    if path is None:
        return
    from ..model_source import shown  # cut: a name may be 10,000 characters

    target = Path(path)
    folder = target.parent if str(target.parent) else Path(".")
    try:
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


def main(argv: list[str] | None = None) -> int:
    # Named as installed (pyproject's [project.scripts]), however it was started.
    parser = Parser(prog="ppsd", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # a subcommand whose module is not part of this checkout
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub)
        modules[name] = module
    args = parser.parse_args(argv)
    return guarded(modules[args.command].run, args)


def guarded(run: Callable[..., int], *args) -> int:
    """`run(*args)`, with bad input (ValueError) as one `error: ...` line and status 2, and Ctrl-C
    as status 130: the one error path of every entry point (`ppsd.executors.distributed.pipeline` too)."""
    try:
        return run(*args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
