"""`python -m ppsd generate`: one prompt, one method, text or JSON out."""

from __future__ import annotations

import argparse
import json
import sys

import torch
import transformers

from . import check_output_file, options, thread_count
from .. import recording
from ..chat import check_text
from ..executors.kinds import ALIASES, KINDS, ExecutorKind
from ..executors.distributed.wire import PipelineError
from ..generate import Result, decode
from ..model import load_model, model_config
from ..setup import set_up_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True, help="the question (chat) or the text to continue (raw)")
    options.add_model(parser)
    options.add_decoding(parser)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="CPU threads for torch (default: torch's choice; 1 is faster on a busy shared CPU)")
    parser.add_argument("--executor", default="in-process", type=_kind_name, choices=tuple(KINDS),
                        help="; ".join(f"{kind.name}: {kind.choice}, "
                                       + ("measured" if kind.concurrent else "PPSD's overlap projected")
                                       for kind in KINDS.values()) + " (default in-process)")
    parser.add_argument("--chrome-trace", default=None, help="also write the trace here (Chrome JSON)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--record", default=None, metavar="FILE",
                        help="also write the run as a recording (ppsd.recording; the page opens comparisons only)")


def run(args: argparse.Namespace) -> int:
    check_text(args.prompt)
    check_output_file(args.chrome_trace, "--chrome-trace")
    check_output_file(args.record, "--record")
    # Settings are checked against the checkpoint's config before any weights load.
    layers = model_config(args.model, progress=_tell).num_hidden_layers
    config = options.decode_config(args, layers)
    transformers.utils.logging.disable_progress_bar()  # keeps stderr to one line on error
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device=args.device, progress=_tell)
    setup = set_up_text(model, tokenizer, args.prompt, config, exit_head=args.exit_head, chat=args.chat)
    executor = KINDS[args.executor].ready(setup, progress=_tell)
    try:
        result = decode(setup, executor=executor)
    except PipelineError as error:  # a worker died or hung: not bad input, so status 1
        print(f"error: the pipeline failed: {error}", file=sys.stderr)
        return 1
    finally:
        if executor is not None:
            executor.close()  # the command's one run: even a shared pipeline ends with it
    if args.chrome_trace:
        with open(args.chrome_trace, "w") as f:
            json.dump(result.trace.to_chrome(), f)
    if args.record:
        with open(args.record, "wb") as f:
            f.write(recording.dumps(recording.of_result(result, setup, tokenizer, kind=args.executor,
                                                        settings=_settings(args))))
    if args.json:
        print(json.dumps(to_json(result, tokenizer, model.info, chat=setup.chat, exit_head=setup.head), ensure_ascii=False))
    else:
        print(tokenizer.decode(result.token_ids, skip_special_tokens=True))
        print(summary_line(result, KINDS[args.executor]))
    return 0


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
