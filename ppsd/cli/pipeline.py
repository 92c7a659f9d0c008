"""`python -m ppsd pipeline --prompt TEXT`: one generation on a K-stage pipeline of processes.

Plain: K - 1 local workers are started. Under torchrun (RANK set) the world is the K stages:
rank 0 loads the model and tokenizer, decodes and prints; ranks >= 1 serve their stage.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import options
from .values import seconds, thread_count
from ..executors.distributed.pipeline import DistributedExecutor
from ..executors.distributed.pool import shared_pipeline
from ..executors.kinds import KINDS
from ..executors.distributed.wire import PipelineError, PipelineSpec
from ..executors.distributed.worker import run_worker
from ..generate import Result, decode
from ..model import load_model
from ..setup import set_up_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", required=True)
    options.add_model(parser)
    options.add_decoding(parser, sampling=False)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads-per-worker", type=thread_count, default=1)
    parser.add_argument("--timeout", type=seconds, default=30.0,
                        help="seconds a worker may take to answer before the run fails (default 30)")


def run(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    torchrun = "RANK" in os.environ
    # Every rank checks every value before any group forms or weights load: all exit 2 alike.
    # Started here, the workers need what `generate --executor processes` needs (one check, one
    # message); under torchrun the launcher placed the ranks.
    config, shape = options.checked(args, unavailable=None if torchrun else KINDS["processes"].unavailable,
                                    num_stages=int(os.environ["WORLD_SIZE"]) if torchrun else None)
    # Every torchrun rank builds the same spec (dtype: the device's default, as load_model's).
    spec = PipelineSpec(model=args.model, partition=config.partition(shape.num_layers), device=args.device,
                        threads_per_worker=args.threads_per_worker, timeout=args.timeout)
    if rank > 0:
        run_worker(spec, rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        return 0
    model, tokenizer = load_model(args.model, device=args.device)
    setup = set_up_text(model, tokenizer, args.prompt, config, exit_head=args.exit_head, chat=args.chat)
    try:
        if torchrun:
            executor = DistributedExecutor(spec, setup.model).join()
        else:
            executor = shared_pipeline(setup.model, setup.config, threads_per_worker=args.threads_per_worker,
                                       timeout=args.timeout)
        with executor:
            result = decode(setup, executor=executor)
    except PipelineError as error:  # a worker died or hung: not bad input, so status 1, as generate's
        print(f"error: the pipeline failed: {error}", file=sys.stderr)
        return 1
    print(tokenizer.decode(result.token_ids, skip_special_tokens=True))
    print(summary(result, args.device))
    return 0


def summary(result: Result, device: str) -> str:
    m = result.metrics()
    rate = "n/a" if m.acceptance_rate is None else f"{m.acceptance_rate:.2f}"
    return (f"[{result.config.method}, {result.config.num_stages}-stage pipeline, {device}] {m.tokens} tokens, "
            f"{m.tokens_per_second:.1f} tok/s ({m.clock} clock), acceptance {rate}, "
            f"stage utilization {', '.join(f'{u:.2f}' for u in m.stage_utilization)}")
