"""Command line: `ppsd SUBCOMMAND ...` (or `python -m ppsd ...`), the stable contract other tools use.

Each subcommand lives in its own module exposing `add_arguments(parser)` and `run(args) -> int`,
imported only when used. Its values are checked before any weights load (`values`: argparse
types and file checks; `options`: the decoding flags against the model's shape). Bad input
raises ValueError there; here it becomes a one-line `error: ...` on stderr and exit status 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable

from .values import thread_count  # noqa: F401 - the page's own command line (app.py) takes it from here

SUBCOMMANDS = {
    "generate": ("ppsd.cli.generate", "generate text with AR, EESD or PPSD"),
    "pipeline": ("ppsd.cli.pipeline", "generate on a K-process pipeline (also one rank of a torchrun launch)"),
    "bench": ("ppsd.bench.sweep", "benchmark PPSD against EESD and AR over a sweep of settings"),
    "bench-pipeline": ("ppsd.bench.pipeline", "benchmark AR, HF, EESD and PPSD on a K-worker pipeline"),
    "train-head": ("ppsd.cli.train_head", "train an early-exit head by self-distillation"),
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, status 2
        self.exit(2, f"error: {message}\n")


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
