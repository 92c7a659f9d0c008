"""The flags every decoding command shares, and the one mapping from them to a `DecodeConfig`.

Boundary: argparse in, a resolved `DecodeConfig` out; loads no weights (the checkpoint's
config alone gives L, so bad settings fail before any download or load).
"""

from __future__ import annotations

import argparse

from ..config import DEFAULTS, METHODS, DecodeConfig
from ..heads import AUTO_HEAD
from ..model import DEFAULT_MODEL
from ..setup import resolve_config


def add_model(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"{DEFAULT_MODEL} (default), a local directory, a .gguf file or a hub id")
    parser.add_argument("--exit-head", default=AUTO_HEAD,
                        help="auto: the shipped head for this model and E, if any, else shared (default); "
                             "shared: the model's own norm + LM head; or a train-head output directory")
    parser.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="wrap the prompt in the model's chat template (default: on when the model has one)")


def add_decoding(parser: argparse.ArgumentParser, *, sampling: bool = True) -> None:
    """--method, --stages, --exit-layer, --draft-len, --max-new-tokens (and, with `sampling`,
    --temperature, --top-p, --seed): the fields of `DecodeConfig`, its defaults."""
    parser.add_argument("--method", default=DEFAULTS.method,
                        help=f"one of {', '.join(METHODS)} (default {DEFAULTS.method})")
    add_stages(parser)
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens)
    if sampling:
        parser.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="0 is greedy (default)")
        parser.add_argument("--top-p", type=float, default=DEFAULTS.top_p)
        parser.add_argument("--seed", type=int, default=DEFAULTS.seed)


def add_stages(parser: argparse.ArgumentParser) -> None:
    """--stages, --exit-layer, --draft-len: how the layers split and how far EESD drafts."""
    parser.add_argument("--stages", type=int, default=DEFAULTS.num_stages,
                        help=f"K pipeline stages (default {DEFAULTS.num_stages})")
    parser.add_argument("--exit-layer", type=int, default=None,
                        help="E (default: the shipped head's E for this model and K, else balanced, L/K)")
    parser.add_argument("--draft-len", type=int, default=DEFAULTS.draft_len,
                        help=f"EESD draft length g (default {DEFAULTS.draft_len})")


def decode_config(args: argparse.Namespace, num_layers: int, *, num_stages: int | None = None) -> DecodeConfig:
    """The run `args` ask for on a model of `num_layers` layers, resolved (ValueError if invalid).
    `num_stages` overrides --stages (under torchrun the world size decides)."""
    num_stages = args.stages if num_stages is None else num_stages
    sampled = {name: getattr(args, name) for name in ("temperature", "top_p", "seed") if hasattr(args, name)}
    return resolve_config(args.model, num_layers, DecodeConfig(
        method=args.method, num_stages=num_stages, draft_len=args.draft_len, max_new_tokens=args.max_new_tokens,
        exit_layer=args.exit_layer, **sampled,
    ))
