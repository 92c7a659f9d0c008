"""`python -m ppsd train-head`: the command line of the head trainer (`ppsd.heads.train`), and
the measurement its card carries besides the trainer's own: greedy PPSD decodes on prompts.

Boundary: arguments in (each checked before the weights load, by `values`), a trained head and
its card out. The loop and its checkpoints are `ppsd.heads.train`; the decodes are
`ppsd.generate`'s, so this module sits above both.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import fields
from pathlib import Path

import torch

from ..assets import ASSETS
from ..chat import encode_prompt, has_chat_template
from ..config import DecodeConfig
from ..generate import generate
from ..heads.data import TokenData, check_text_path, read_chat_answers, read_texts, tokenize
from ..heads.distill import LR_SCHEDULES, TrainConfig, acceptance, eval_windows
from ..heads.exits import TRAINED_HEAD_TYPES, shared_head
from ..heads.files import HeadConfig, fingerprint, save_exit_head
from ..heads.shipped import pipeline_stages
from ..heads.train import LOSS, TrainResult, train_head
from ..model import DEFAULT_MODEL, StagedModel, load_model, model_shape, resolve_device
from ..model_source import is_default
from .values import check_input_file, check_output_folder, whole

PROMPTS_DIR = ASSETS / "prompts"
CHAT_PROMPTS, RAW_PROMPTS = PROMPTS_DIR / "chat.json", PROMPTS_DIR / "prompts.json"
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# --- PPSD decodes on prompts (the card's second measurement) ---------------------------------------


def ppsd_acceptance(model: StagedModel, prompts: list[list[int]], config: DecodeConfig) -> float | None:
    """Greedy PPSD's acceptance rate on `prompts` (accepted / verified drafts, pooled over the
    prompts), each decoded in process with `config` on `model` and its exit head; None when no
    draft was verified."""
    accepted = verified = 0
    for ids in prompts:
        m = generate(model, ids, config).metrics()
        accepted += m.accepted
        verified += m.accepted + m.rejected
    return accepted / verified if verified else None


# --- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig(exit_layer=1)
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"{DEFAULT_MODEL} (default), a local directory, a .gguf file or a hub id")
    parser.add_argument("--exit-layer", type=int, default=None, help="E (default: L/2)")
    parser.add_argument("--data", default=None,
                        help="a JSONL file of chat answers (tools/build_chat_data.py), a text file or a folder "
                             "of text files (default: the embedded corpus, ppsd.heads.corpus)")
    parser.add_argument("--heldout", default=None, help="held-out text file or folder (default: split from --data)")
    parser.add_argument("--max-chars", type=whole(1, why="a text to learn from holds a character"), default=4_000_000,
                        help="read at most this much text")
    parser.add_argument("--head-type", default=defaults.head_type, choices=TRAINED_HEAD_TYPES)
    parser.add_argument("--rank", type=int, default=defaults.rank, help="adapter rank (lowrank only)")
    parser.add_argument("--draft-vocab", type=int, default=None,
                        help="draft only the D most frequent tokens of the training data (default: all)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--lr-schedule", default=defaults.lr_schedule, choices=LR_SCHEDULES)
    parser.add_argument("--cache-features", action="store_true",
                        help="run the teacher once over the data and train epochs on its states (fast, "
                             "needs about 3 x 2 x hidden bytes of memory per training token)")
    parser.add_argument("--ce-weight", type=float, default=defaults.ce_weight,
                        help="add this times the cross-entropy against the teacher's argmax (default 0: KL only)")
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every, help="held-out acceptance period")
    parser.add_argument("--eval-tokens", type=int, default=defaults.eval_tokens, help="held-out tokens measured")
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, prompt}] for greedy PPSD acceptance before/after "
                             "(default model: assets/prompts/chat.json, through its chat template)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="new tokens per prompt decode (default 64)")
    parser.add_argument("--stages", type=whole(2, why="K >= 2: a drafting stage and a verifying one"), default=None,
                        help="the K this head's E is for: its default E with K stages, and the K of the "
                             "prompt decodes (default: the K whose balanced E is nearest)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument("--save-dtype", default="float32", choices=tuple(SAVE_DTYPES),
                        help="dtype of the saved weights; the final evaluation uses them so rounded")
    parser.add_argument("--out", required=True, help="directory for the head, its card and checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def run(args: argparse.Namespace) -> int:
    # Every value before the load and the hours of training: a bad one is known now.
    check_output_folder(args.out, "--out")
    _check_data(args)
    check_input_file(args.prompts, "--prompts")
    resolve_device(args.device)
    layers = model_shape(args.model).num_layers  # the config alone: no weights read or hashed
    config = _config(args, layers)
    stages = args.stages or pipeline_stages(layers, config.exit_layer)
    # The card's prompt decodes: K must fit E on this model, and N be a length a run may ask for.
    DecodeConfig(method="ppsd", exit_layer=config.exit_layer, max_new_tokens=args.decode_tokens,
                 num_stages=stages).resolved(layers)
    model, tokenizer = load_model(args.model, device=args.device)
    data = _data(args, tokenizer)
    began = time.perf_counter()
    result = train_head(model, data, config, out=args.out, resume=args.resume, progress=not args.no_progress)
    seconds = time.perf_counter() - began
    save_dtype = SAVE_DTYPES[args.save_dtype]
    if save_dtype != torch.float32:  # evaluate exactly the weights that will be saved
        with torch.no_grad():
            for parameter in result.head.adapter.parameters():
                parameter.copy_(parameter.to(save_dtype).float())
        result.after = acceptance(model, result.head, eval_windows(data.heldout, config), config.exit_layer)
    evaluation = _evaluation(args, model, tokenizer, result, config, stages)
    head_config = HeadConfig(
        head_type=config.head_type, exit_layer=config.exit_layer, base_model=model.info.name,
        base_fingerprint=fingerprint(model), rank=config.rank if config.head_type == "lowrank" else None,
        draft_vocab=config.draft_vocab, stages=stages,
        training={"loss": LOSS + (f" + {config.ce_weight:g} x CE(argmax p, q)" if config.ce_weight else ""),
                  "data": data.description, "steps": result.steps, "lr": config.lr,
                  "lr_schedule": config.lr_schedule, "teacher": "cached once" if config.cache_features else "per step",
                  "batch_size": config.batch_size, "seq_len": config.seq_len, "seed": config.seed,
                  "train_tokens": data.train.numel(), "device": model.info.device,
                  "wall_seconds_this_run": round(seconds, 1), "weights_dtype": args.save_dtype,
                  "history": result.history},
        evaluation=evaluation,
    )
    save_exit_head(result.head, args.out, head_config, dtype=save_dtype)
    print(f"head saved to {args.out}: E={config.exit_layer}, {result.steps} steps, held-out greedy acceptance "
          f"(teacher-forced, {result.after.positions} positions) shared {result.after.shared:.3f} -> "
          f"trained {result.after.head:.3f}")
    if "ppsd_prompts" in evaluation:
        p = evaluation["ppsd_prompts"]
        print(f"greedy PPSD acceptance on {p['prompts']} prompts (K={p['stages']}): "
              f"shared {p['shared']:.3f} -> trained {p['head']:.3f}")
    return 0


def _check_data(args: argparse.Namespace) -> None:
    """--data and --heldout name readable text (or --data a JSONL of chat answers), and --heldout
    is only given where it is used."""
    chat = bool(args.data) and args.data.endswith((".jsonl", ".jsonl.gz"))
    if args.data:
        check_text_path(args.data, jsonl=chat, what="--data")
    if args.heldout is not None:
        if args.data is None or chat:
            raise ValueError("--heldout applies to a text --data only (the embedded corpus and chat answers "
                             "hold out their own)")
        check_text_path(args.heldout, what="--heldout")


def _config(args: argparse.Namespace, num_layers: int) -> TrainConfig:
    """Every `TrainConfig` field from its flag of the same name; E defaults to L/2."""
    settings = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    if args.exit_layer is None:
        settings["exit_layer"] = max(1, num_layers // 2)
    return TrainConfig(**settings).validated(num_layers)


def _data(args: argparse.Namespace, tokenizer) -> TokenData:
    if args.data and args.data.endswith((".jsonl", ".jsonl.gz")):
        return read_chat_answers(args.data)
    train_texts, heldout_texts, description = read_texts(args.data, args.heldout, max_chars=args.max_chars)
    return TokenData(tokenize(tokenizer, train_texts), tokenize(tokenizer, heldout_texts), description)


def _evaluation(args: argparse.Namespace, model: StagedModel, tokenizer, result: TrainResult, config: TrainConfig,
                stages: int) -> dict:
    """The card's evaluation: teacher-forced acceptance, and PPSD decodes on prompts when asked
    for (or on the default model)."""
    evaluation = {
        "description": (f"Teacher-forced on {result.after.positions} held-out tokens ({config.seq_len}-token "
                        "windows): share of positions where the head's argmax equals the full model's. "
                        f"Measured on {model.info.device} ({model.info.dtype})."),
        "acceptance_shared": result.after.shared,
        "acceptance_trained": result.after.head,
        "positions": result.after.positions,
        "notes": [],
    }
    chat = has_chat_template(tokenizer)
    prompts_path = Path(args.prompts) if args.prompts else CHAT_PROMPTS if chat else RAW_PROMPTS
    if args.prompts or is_default(args.model):
        evaluation.update(_prompt_evaluation(model, tokenizer, result.head, prompts_path, config.exit_layer,
                                             args.decode_tokens, chat=chat, stages=stages))
    return evaluation


def _prompt_evaluation(model, tokenizer, head, path: Path, exit_layer: int, max_new_tokens: int, *,
                       chat: bool, stages: int) -> dict:
    """`ppsd_acceptance` on the prompts in `path` with the shared head and with `head`, on K = `stages`."""
    try:
        entries = json.loads(path.read_text())
        prompts = [ids for e in entries if (ids := encode_prompt(tokenizer, e["prompt"], chat=chat))]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"prompts {str(path)!r} unreadable: {error}") from None
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, num_stages=stages, max_new_tokens=max_new_tokens)
    rates = {"stages": stages, "prompts": len(prompts), "max_new_tokens": max_new_tokens}
    for name, staged in (("shared", model.with_exit_head(shared_head(model))), ("head", model.with_exit_head(head))):
        rates[name] = ppsd_acceptance(staged, prompts, config)
    how = "through the chat template" if chat else "as raw text"
    note = (f"Greedy PPSD decodes (in process, K={rates['stages']}, {rates['max_new_tokens']} new tokens) of the "
            f"{rates['prompts']} prompts in {path.name} ({how}): acceptance rate (accepted / verified drafts) "
            f"shared {rates['shared']:.3f}, trained {rates['head']:.3f}.")
    return {"ppsd_prompts": rates, "notes": [note]}
