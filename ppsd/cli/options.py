"""The flags every decoding command shares, the one mapping from them to a `DecodeConfig`, and
the one check of a decoding command's values before anything loads (`checked`).

Boundary: argparse in, a resolved `DecodeConfig` out; loads no weights and hashes none (the
model's config alone gives its shape, `ppsd.model.model_shape`), so bad settings fail in
seconds, before any download, conversion or load.
"""

from __future__ import annotations

import argparse

from ..chat import check_text, encode_prompt, use_chat
from ..config import DEFAULTS, METHODS, DecodeConfig
from ..heads import AUTO_HEAD, SHARED_HEAD
from ..heads.files import saved_head
from ..model import DEFAULT_MODEL, ModelShape, model_shape, resolve_device, shape_tokenizer
from ..model_source import Progress
from ..setup import check_prompt_length, resolve_config


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


def checked(args: argparse.Namespace, *, unavailable=None, num_stages: int | None = None,
            progress: Progress | None = None) -> tuple[DecodeConfig, ModelShape]:
    """Every value of a decoding command (`generate`, `pipeline`), checked before any weights
    load or any weight file is hashed, in the order a user fixes them: the prompt's text, the
    device, the settings against the model's shape, whether the stages can run where asked
    (`unavailable(device, K)`: a reason, or None), the exit head, the prompt's length. Returns
    the resolved config and the model's shape (ValueError, one line, names the first bad value)."""
    check_text(args.prompt)
    device = resolve_device(args.device)
    shape = model_shape(args.model, progress=progress)
    config = decode_config(args, shape.num_layers, num_stages=num_stages)
    reason = unavailable(device, config.num_stages) if unavailable is not None else None
    if reason is not None:
        raise ValueError(reason)
    if args.exit_head.strip() not in ("", AUTO_HEAD, SHARED_HEAD):
        saved_head(args.exit_head)  # a folder that holds no head, a FIFO, /etc: refused now
    _check_prompt_fits(args, shape, config)
    return config, shape


def _check_prompt_fits(args: argparse.Namespace, shape: ModelShape, config: DecodeConfig) -> None:
    """The prompt, as the run will encode it, fits the model's context with the tokens asked for;
    left to the run when the tokenizer needs a conversion first (a GGUF used the first time)."""
    tokenizer = shape_tokenizer(args.model)
    if tokenizer is not None:
        ids = encode_prompt(tokenizer, args.prompt, chat=use_chat(tokenizer, args.chat))
        check_prompt_length(len(ids), shape.max_context, config.max_new_tokens)
