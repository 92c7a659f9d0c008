"""`python -m ppsd bench`: measure PPSD against EESD and AR, and against Hugging Face `generate()`.

The boundary: this module is the command line. It reads the flags, builds the sweep (`settings`),
loads the model and prompts (`prompts`), has `run.Run` time every group (warm-up runs excluded,
median of repeats, spread kept), and hands the record to the writers (`report`). It never changes
how the library's `Result`s are produced.

Every number says its clock. "measured" is wall time on this process's single device, stages run
in turn; "projected" replays the same measured stage work on K concurrent workers
(`Trace.project`): a projection, not a measurement. All methods generate exactly
`max_new_tokens` tokens (EOS is treated as an ordinary token) so that times compare like for like.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..chat import use_chat
from ..cli import options
from ..cli.values import check_output_folder, thread_count, whole, write_result
from ..config import DecodeConfig
from ..heads import default_exit_layer
from ..model import StagedModel
from . import report as bench_report
from .machine import machine_info
from .prompts import CHAT_PROMPTS_FILE, load_prompts, prompt_ids, spread
from .run import Run, fixed_length
from .settings import FULL, QUICK, Setting, preset_exit_layers, sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_model(parser)  # --model, --exit-head (a head per E) and --chat, as every decoding command's
    parser.add_argument("--quick", action="store_true",
                        help="a smoke check: 1 prompt, greedy, K = 2 at its default E, 16 tokens, one warm-up "
                             "and one timed round, our decoders' tokens checked against HF generate(), no HF "
                             "early exit: 10 decodes in all, with a progress bar (28 to 40 s in three runs on a "
                             "busy 2-core CPU at load averages 3.6 to 5.4: docs/benchmarks.md)")
    parser.add_argument("--hf-early-exit", action=argparse.BooleanOptionalAction, default=None,
                        help="also time HF generate(assistant_early_exit=E) beside each greedy EESD setting and "
                             "check its tokens against ours (default: on; off with --quick: each of its decodes took "
                             "3 to 6 times AR's)")
    parser.add_argument("--json", action="store_true", help="print the JSON report on stdout (table on stderr)")
    parser.add_argument("--out", default="benchmarks", help="folder for bench.json/.csv/.html/.md (default benchmarks)")
    parser.add_argument("--repeats", type=whole(1), default=None, help="timed runs per setting and prompt (median kept)")
    parser.add_argument("--warmup", type=whole(0), default=None, help="untimed runs before them")
    parser.add_argument("--max-new-tokens", type=whole(1), default=None, help="tokens generated per run (exactly)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--exit-layers", type=whole(1, why="E >= 1: stage 1 holds a layer"), nargs="+", default=None, help="E values (default: L/K per K)")
    parser.add_argument("--stages", type=whole(2, why="K >= 2: a drafting stage and a verifying one"), nargs="+", default=None, help="K values for PPSD")
    parser.add_argument("--draft-lens", type=whole(1, why="g >= 1: EESD drafts a token at least"), nargs="+", default=None, help="g values for EESD")
    parser.add_argument("--temperatures", type=float, nargs="+", default=None, help="0 is greedy")
    parser.add_argument("--distributed", choices=("auto", "on", "off"), default=None,
                        help="also run AR and PPSD on K worker processes (ppsd.distributed). auto: when "
                             "available, for each K whose workers get a core each; on: every K. Default: "
                             "off with --quick (each stage layout starts K processes), else auto")
    parser.add_argument("--threads", type=thread_count, default=1,
                        help="torch CPU threads (default 1: small models gain nothing from more, and on a "
                             "busy machine spinning threads cost far more than they give)")
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, category, prompt}] (default: assets/prompts/chat.json with "
                             "the chat template, else prompts.json)")
    parser.add_argument("--plotly-js", choices=("embed", "cdn"), default="embed",
                        help="embed plotly.js in bench.html (works offline) or link the CDN (small file)")
@dataclass
class Plan:
    """What a bench measures, settled (and checked) before any timing."""

    model: StagedModel  # fixed-length: EOS is an ordinary token
    prompts: list[dict]  # {"name", "category", "prompt", "ids"}
    prompts_source: str
    groups: list[list[Setting]]
    max_new_tokens: int
    warmup: int
    repeats: int
    hf_early_exit: bool  # greedy EESD also against generate(assistant_early_exit=E)


@dataclass
class Measured:
    """A finished (or interrupted) measurement: the run with its cells, and what goes beside them."""

    bench: Run
    baselines: dict
    machine: dict
    interrupted: bool


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    check_output_folder(args.out, "--out")  # before the minutes of measuring, whose record goes there
    torch.set_num_threads(args.threads)
    # HF warns on every assisted call about its own internal arguments; the table is the output.
    transformers.logging.set_verbosity_error()
    plan = _plan(args)
    measured = _measure(plan, args)
    report = measured.bench.report(measured.baselines, machine=measured.machine, interrupted=measured.interrupted,
                                   prompts_source=plan.prompts_source, quick=args.quick,
                                   command=command_line(args))
    table = bench_report.table(report)
    try:  # checked before measuring, but a disk may fill meanwhile: each file whole or not at all
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, text in bench_report.files(report, plotly_js=args.plotly_js).items():
            write_result(str(Path(args.out) / name), text, "--out's")
    except (OSError, ValueError) as error:
        print(table)
        print(f"error: {getattr(error, 'strerror', None) or error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(bench_report.finite(report), allow_nan=False))
        print(table, file=sys.stderr)
    else:
        print(table)
        print(f"wrote {args.out}/bench.json, bench.csv, bench.html, bench.md")
    if measured.interrupted:
        print("interrupted: kept the settings finished so far", file=sys.stderr)
        return 130
    return 0


def _plan(args: argparse.Namespace) -> Plan:
    """Model, prompts and sweep from the flags over the preset; bad values raise ValueError here,
    before the model loads (its config alone gives its shape: `ppsd.model.model_shape`)."""
    from ..model import load_model, model_shape, resolve_device

    preset = QUICK if args.quick else FULL
    pick = lambda name: _pick(args, preset, name)  # noqa: E731
    repeats, warmup, new_tokens = pick("repeats"), pick("warmup"), pick("max_new_tokens")  # flags typed by `whole`
    resolve_device(args.device)
    if args.prompts:
        load_prompts(args.prompts)  # a FIFO, /dev/full or a folder: refused before the load
    layers = model_shape(args.model).num_layers
    groups = _groups(args, preset, layers, new_tokens)
    # Said first: loading takes seconds (minutes for a hub download) before the progress bar.
    print(f"bench: loading the model {args.model} ...", file=sys.stderr, flush=True)
    loaded, tokenizer = load_model(args.model, device=args.device)
    chat = use_chat(tokenizer, args.chat)
    prompts, source = load_prompts(args.prompts or (CHAT_PROMPTS_FILE if chat else None))
    if args.quick:
        prompts = spread(prompts, preset["prompts"])  # the smoke check: each from another category
    model = fixed_length(loaded)
    for p in prompts:
        p["ids"] = prompt_ids(tokenizer, p["prompt"], model.info.max_context - new_tokens, chat=chat)
    source += ", through the chat template" if chat else ", raw text"
    return Plan(model, prompts, source, groups, new_tokens, warmup, repeats, pick("hf_early_exit"))


def _pick(args: argparse.Namespace, preset: dict, name: str):
    """The flag `name` as given, else the preset's value."""
    return preset[name] if getattr(args, name) is None else getattr(args, name)


def _groups(args: argparse.Namespace, preset: dict, layers: int, new_tokens: int) -> list[list[Setting]]:
    """The sweep's groups on a model of `layers` layers, every setting checked (`DecodeConfig`):
    an E or K given that no model of this depth allows is refused, not skipped."""
    pick = lambda name: _pick(args, preset, name)  # noqa: E731
    for e in args.exit_layers or ():
        DecodeConfig(exit_layer=e, num_stages=2).resolved(layers)
    for k in args.stages or ():
        DecodeConfig(num_stages=k).resolved(layers)
    default_exit = lambda k: default_exit_layer(args.model, layers, k)  # noqa: E731
    exit_layers = args.exit_layers or preset_exit_layers(preset["exit_fractions"], layers, pick("stages"),
                                                         default_exit)
    groups = sweep(layers, num_stages=pick("stages"), draft_lens=pick("draft_lens"),
                   temperatures=pick("temperatures"), exit_layers=exit_layers, default_exit=default_exit)
    if not groups:
        raise ValueError(f"no valid (exit layer, stages) pair for a {layers}-layer model")
    for s in itertools.chain(*groups):
        s.config(new_tokens).resolved(layers)  # bad values fail before any timing
    return groups


def _measure(plan: Plan, args: argparse.Namespace) -> Measured:
    """The baselines, then every group in turn; Ctrl-C keeps the groups finished so far."""
    from tqdm import tqdm

    bar = tqdm(total=0, desc="bench", unit="round", file=sys.stderr, dynamic_ncols=True)
    bench = Run(plan.model, plan.prompts, plan.groups, plan.max_new_tokens, plan.warmup, plan.repeats,
                tick=lambda: bar.update(), pipeline=_pipeline(args), exit_head=args.exit_head,
                hf_early_exit=plan.hf_early_exit)
    bar.total = bench.total_runs()
    baselines, interrupted = {}, False
    machine = machine_info(plan.model)  # before timing: the load average and date of the start
    try:
        bar.set_postfix_str("AR vs HF generate()")
        baselines = bench.baselines()
        for group in plan.groups:
            bar.set_postfix_str(group[0].label.replace("ar ", ""))
            bench.measure(group)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bench.pipeline is not None:
            from ..executors.distributed.processes import close_all

            close_all()
    bar.close()
    return Measured(bench, baselines, machine, interrupted)


def _pipeline(args: argparse.Namespace) -> Callable | None:
    """`ppsd.executors.distributed.pool.shared_pipeline` when K-worker runs are asked for (or auto)."""
    mode = args.distributed or ("off" if args.quick else "auto")
    if mode == "off":
        return None
    from ..executors.distributed.pool import shared_pipeline
    from ..executors.host import usable_cores  # cgroup quotas counted, as the workers' own check does

    cores = usable_cores()

    def make(model: StagedModel, config: DecodeConfig):
        # K processes sharing fewer cores run in turn again: not a K-worker measurement.
        if mode == "auto" and model.info.device == "cpu" and config.num_stages * args.threads > cores:
            return None
        return shared_pipeline(model, config, threads_per_worker=args.threads)
    return make


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this run, rebuilt from the parsed arguments (defaults left out)."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    parts = ["python -m ppsd bench"]
    for name, value in vars(args).items():
        if name in ("command", "json") or value == defaults.get_default(name):
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            parts.append(flag)
        elif value is False:  # only a BooleanOptionalAction (default None) gets here False
            parts.append("--no-" + flag[2:])
        else:
            values = value if isinstance(value, (list, tuple)) else [value]
            parts.append(" ".join([flag] + [f"{v:g}" if isinstance(v, float) else str(v) for v in values]))
    return " ".join(parts)
