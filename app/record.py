"""`python -m app.record`: run the page's comparison (AR, PPSD and plain AR, the page's defaults
and its default prompt unless told otherwise, through `app.runner` as a Run does) and write it
as a recording (`ppsd.recording`) that the page opens with no model loaded. This is how the
recordings in assets/runs/ are made. It lives in the demo, not in `ppsd.cli`: the comparison a
recording replays is the page's, and the library never imports the page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ppsd.cli import Parser, guarded
from ppsd.cli.values import check_output_file, thread_count, whole, write_result
from ppsd.config import DEFAULTS, MAX_NEW_TOKENS_CAP
from ppsd.executors.kinds import AUTO, IN_TURN, concurrent_kinds, kind_named

from .request import DEFAULT_REPEATS, MAX_REPEATS, RunRequest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="the model (default the page's)")
    parser.add_argument("--prompt", default=None, help="the question (default: the page's default prompt)")
    parser.add_argument("--pipeline", default=AUTO,
                        help=f"where the K stages run at once: {AUTO} (the page's default), "
                             f"{', '.join(kind.name for kind in concurrent_kinds())}; {IN_TURN.name} runs them in "
                             "turn (projected clock)")
    parser.add_argument("--stages", type=whole(2, 64), default=DEFAULTS.num_stages, help="K (default the page's)")
    parser.add_argument("--max-new-tokens", type=whole(1, MAX_NEW_TOKENS_CAP), default=DEFAULTS.max_new_tokens)
    parser.add_argument("--repeats", type=whole(1, MAX_REPEATS), default=DEFAULT_REPEATS,
                        help=f"timed rounds (default the page's, {DEFAULT_REPEATS})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu", help="where the model loads")
    parser.add_argument("--threads", type=thread_count, default=None, help="CPU threads for torch")
    parser.add_argument("--out", default=None,
                        help="the file to write (default: assets/runs/ppsd-<device>-<pipeline>-<date>.json)")


def run(args: argparse.Namespace) -> int:
    from ppsd.model import DEVICE_VARIABLE

    os.environ[DEVICE_VARIABLE] = args.device  # what the page's model cache loads on
    check_output_file(args.out, "--out")
    check_pipeline(args.pipeline, args.stages, args.device)
    import torch

    # torch and the page's modules after the device is set: the model cache reads it as it loads
    from ppsd.recording import dumps

    from .models import ModelCache
    from .page_text import load_examples
    from .replay import RUNS, file_name, record
    from .runner import run_comparison

    if args.threads:
        torch.set_num_threads(args.threads)
    in_turn = args.pipeline == IN_TURN.name
    model = {"model": args.model} if args.model else {}
    request = RunRequest(prompt=args.prompt or load_examples()[0]["prompt"], num_stages=args.stages, **model,
                         max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                         workers=not in_turn, pipeline=AUTO if in_turn else args.pipeline).checked()
    cache = ModelCache()
    # One untimed comparison first, as the page's start-up runs one: what a first use compiles or
    # starts (the captured steps' kept compile, the worker processes) stays out of the recorded rounds.
    print("A first comparison, untimed (what a first use compiles or starts)", file=sys.stderr, flush=True)
    for _ in run_comparison(replace(request, repeats=1), cache, time_limit=None):
        pass
    last, said = None, 0.0
    for snap in run_comparison(request, cache, time_limit=None):
        last = snap
        if time.monotonic() - said > 5 and snap.status:
            print(snap.status, file=sys.stderr, flush=True)
            said = time.monotonic()
    if last is None or not last.done:
        print("error: the comparison did not finish", file=sys.stderr)
        return 1
    rec = record(last)
    target = Path(args.out) if args.out else RUNS / file_name(rec)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_result(str(target), dumps(rec).decode("utf-8"), "--out")
    stats = last.state.stats()
    ratio = stats.ratio("ar", "ppsd")
    print(f"wrote {target} ({target.stat().st_size / 1e3:.0f} kB): {rec.machine.name}, load "
          f"{' '.join(f'{x:.2f}' for x in rec.machine.load_average)}; {last.pipeline}, "
          f"AR {stats.median('ar'):.3f} s, PPSD {stats.median('ppsd'):.3f} s median "
          f"({ratio:.2f}x AR/PPSD on the {last.state.clock} clock)")
    return 0


def check_pipeline(name: str, stages: int, device: str) -> None:
    """ValueError, before any weights load, when `name` is no kind, or cannot run K = `stages`
    stages on `device` here (K worker processes on fewer cores): found after the load, it cost a
    refusal most of a minute."""
    if name in (AUTO, IN_TURN.name):
        return
    from ppsd.model import resolve_device

    kind = kind_named(name)
    if not kind.concurrent:
        raise ValueError(f"--pipeline {name!r} runs the stages in turn: give {IN_TURN.name}, or one of "
                         f"{', '.join(k.name for k in concurrent_kinds())}")
    reason = kind.unavailable(resolve_device(device), stages)
    if reason is not None:
        raise ValueError(f"--pipeline {name} cannot run here: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m app.record", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return guarded(run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
