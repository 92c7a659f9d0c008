"""Measure what each pipeline stage costs per token for candidate exit layers and head shapes, to
choose E and the head by speed before training one (acceptance is a separate question).

    python tools/research/stage_costs.py --exit-layers 15 18 20 22 --draft-vocab 0 8192 --threads 1

For each (E, draft vocabulary) an untrained `layer` head of that shape (its cost does not depend
on its weights) drafts in greedy PPSD, K = 2, in process; AR runs on the same stages. Printed:
the median per-token time of stage 1 (layers [0, E) + head) and stage 2 (layers [E, L) + LM head),
AR's per-token time, and slot / AR = max(stage) / AR, the share of an AR step one accepted token
costs on a 2-worker pipeline, so that speedup ~ 1 / (slot/AR * (2 - a)) at acceptance a.
Measured on the CPU it runs on; noisy when that is busy (the ratios less so).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsd import DEFAULT_MODEL, DecodeConfig, generate, load_model  # noqa: E402
from ppsd.chat import encode_prompt  # noqa: E402
from ppsd.heads import build_head  # noqa: E402


def per_token_ms(result, kinds: tuple[str, ...]) -> dict[int, float]:
    """Median milliseconds of one-token events per stage."""
    times: dict[int, list[float]] = {}
    for event in result.trace.events:
        if event.kind in kinds and event.width == 1:
            times.setdefault(event.stage, []).append(event.end - event.start)
    return {stage: statistics.median(t) * 1e3 for stage, t in sorted(times.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--exit-layers", type=int, nargs="+", default=[15, 18, 20, 22])
    parser.add_argument("--draft-vocab", type=int, nargs="+", default=[0, 8192], help="0: the whole vocabulary")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    ids = encode_prompt(tokenizer, "Explain how rainbows form.", chat=True)
    print("E  draft-vocab  stage1-ms  stage2-ms  AR-ms  slot/AR")
    for exit_layer in args.exit_layers:
        for vocab in args.draft_vocab:
            head = build_head("layer", model, exit_layer, draft_vocab=vocab or None)
            drafting = model.with_exit_head(head)
            config = DecodeConfig(method="ppsd", exit_layer=exit_layer, num_stages=2, max_new_tokens=args.tokens)
            generate(drafting, ids, config)  # warm-up
            ppsd = per_token_ms(generate(drafting, ids, config), ("draft", "verify"))
            ar = per_token_ms(generate(drafting, ids, DecodeConfig(method="ar", exit_layer=exit_layer, num_stages=2,
                                                                  max_new_tokens=args.tokens)), ("verify", "draft"))
            step = sum(ar.values())
            print(f"{exit_layer:<2} {vocab or 'all':>11}  {ppsd[1]:9.2f}  {ppsd[2]:9.2f}  {step:5.2f}  "
                  f"{max(ppsd.values()) / step:7.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
