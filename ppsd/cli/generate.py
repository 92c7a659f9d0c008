"""`python -m ppsd generate`: one prompt, one method, text or JSON out."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import transformers

from . import options
from .values import check_output_file, thread_count, write_result
from .. import compile_cache, recording
from ..choice import choose_measured
from ..executors.background import ticking
from ..executors.kinds import ALIASES, AUTO, KINDS, ExecutorKind, concurrent_kinds
from ..executors import PipelineError
from ..generate import Result, decode, warm_up
from ..model import load_model
from ..setup import set_up_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the question (chat) or the text to continue (raw)")
    options.add_model(parser)
    options.add_decoding(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 is faster on a busy shared CPU)")
    parser.add_argument("--executor", default="in-process", type=_kind_name, choices=(AUTO, *KINDS),
                        help="auto: the fastest PPSD measured on this machine (on a CPU: the captured steps, "
                             "compiled once and kept under PPSD_CACHE, until the page measures otherwise); "
                             + "; ".join(f"{kind.name}: {kind.noun}, "
                                       + ("measured" if kind.concurrent else "PPSD's overlap projected")
                                       for kind in KINDS.values()) + " (default in-process)")
    parser.add_argument("--chrome-trace", default=None, help="also write the trace here (Chrome JSON)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="also write the run as a recording (ppsd.recording; the page opens comparisons only)")


def run(args: argparse.Namespace) -> int:
    # auto picks among the kinds that can run here, so only a named kind is refused up front
    unavailable = None if args.executor == AUTO else KINDS[args.executor].unavailable
    config, _ = options.checked(args, unavailable=unavailable, progress=_tell)
    check_output_file(args.chrome_trace, "--chrome-trace")
    check_output_file(args.record, "--record")
    transformers.utils.logging.disable_progress_bar()  # keeps stderr to one line on error
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device=args.device, progress=_tell)
    setup = set_up_text(model, tokenizer, args.prompt, config, exit_head=args.exit_head, chat=args.chat)
    kind = _auto(setup) if args.executor == AUTO else KINDS[args.executor]
    compiling = kind.compiles_on(model.info.device) and not compile_cache.kept()
    if compiling:
        last = compile_cache.last_seconds()
        _tell(f"A one-time compile of {kind.compiles} is coming (" + (f"it took {last:.0f} s last time" if last else
              "a minute or two on a quiet small CPU, more under load") + f"); it is kept in {compile_cache.folder()}")
    began = time.monotonic()
    words = lambda: f"compiling {kind.compiles}: {time.monotonic() - began:.0f} s so far"  # noqa: E731
    executor = None
    try:
        with ticking(_tell if compiling else None, words, 10.0):
            executor = kind.ready(setup, warm_up=warm_up, progress=_tell)
            result = decode(setup, executor=executor)  # a step first reached here compiles now
    except PipelineError as error:  # a worker died or hung: not bad input, so status 1
        print(f"error: the pipeline failed: {error}", file=sys.stderr)
        return 1
    finally:
        if executor is not None:
            executor.close()  # the command's one run: even a shared pipeline ends with it
    if compiling:
        compile_cache.record(time.monotonic() - began)
    if args.json:
        print(json.dumps(to_json(result, tokenizer, model.info, chat=setup.chat, exit_head=setup.head), ensure_ascii=False))
    else:
        print(tokenizer.decode(result.token_ids, skip_special_tokens=True))
        print(summary_line(result, kind))
    files = {"--chrome-trace": (args.chrome_trace, lambda: json.dumps(result.trace.to_chrome())),
             "--record": (args.record, lambda: recording.dumps(recording.of_result(
                 result, setup, tokenizer, kind=kind.name, settings=_settings(args))).decode("utf-8"))}
    for flag, (path, text) in files.items():
        if not path:
            continue
        try:  # checked before the run, but a disk may fill meanwhile: the answer above still stands
            write_result(path, text(), flag)
        except ValueError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    return 0


def _auto(setup) -> ExecutorKind:
    """`--executor auto`: the fastest PPSD measured on this machine among the kinds that can run
    here (`choose_measured`), said in one line."""
    device, stages = setup.model.info.device, setup.config.num_stages
    compiled = tuple(k.name for k in concurrent_kinds() if k.compiles_on(device) and k.unavailable(device, stages) is None)
    choice = choose_measured(stages, device, compiled, compile_cache.speeds(setup.model.info.name),
                             measures=False, load=os.getloadavg()[0])
    _tell(f"--executor auto: the {choice.kind.noun}, chosen: {choice.why}")
    return choice.kind


def _settings(args: argparse.Namespace) -> dict:
    """The command's options, as a recording's settings (plain values only)."""
    return {k: v for k, v in vars(args).items()
            if k not in ("func", "record") and (v is None or isinstance(v, (str, int, float, bool)))}


def _kind_name(name: str) -> str:
    return ALIASES.get(name, name)  # "distributed", the earlier name of "processes", still works


def _tell(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summary_line(result: Result, on: ExecutorKind) -> str:
    """One line: both clocks, so that two methods' lines compare like with like (in one process
    the measured clock runs the stages in turn; the projected one replays their costs on K devices)."""
    measured, projected = result.metrics("measured"), result.metrics("projected")
    rate = "n/a" if measured.acceptance_rate is None else f"{measured.acceptance_rate:.2f}"
    where = f"{on.label} at once" if result.trace.concurrent else "stages in turn, one process"
    return (f"[{result.config.method}] {measured.tokens} tokens, {measured.tokens_per_second:.1f} tok/s measured "
            f"({where}), {projected.tokens_per_second:.1f} tok/s projected (each stage on its own device), "
            f"acceptance {rate}, ideal speedup {measured.ideal_speedup:.2f}x, "
            f"measured wall {measured.measured_wall_seconds:.3f}s")


def to_json(result: Result, tokenizer, info, *, chat: bool, exit_head: str) -> dict:
    """The documented JSON contract of `generate --json`."""
    piece = lambda token_id: tokenizer.decode([token_id])  # noqa: E731
    c = result.config
    return {
        "text": tokenizer.decode(result.token_ids, skip_special_tokens=True),
        "token_ids": result.token_ids,
        "tokens": [{"id": t.id, "text": piece(t.id), "status": t.status, "draft": t.draft, "position": t.position}
                   for t in result.tokens],
        "drafts": [{"position": d.position, "id": d.id, "text": piece(d.id), "fate": d.fate} for d in result.drafts],
        "metrics": result.metrics().to_dict(),
        "trace": {"clock": result.trace.clock, "device": result.trace.device,
                  "stages": [[r.start, r.stop] for r in result.trace.partition],
                  "events": [vars(e) for e in result.trace.events]},
        "config": {"model": info.name, "method": c.method, "exit_layer": c.exit_layer, "stages": c.num_stages,
                   "draft_len": c.draft_len, "max_new_tokens": c.max_new_tokens, "temperature": c.temperature,
                   "top_p": c.top_p, "device": info.device, "dtype": info.dtype, "seed": c.seed,
                   "num_layers": info.num_layers, "chat": chat, "exit_head": exit_head},
    }
