"""`python -m ppsd train-head`: train an early-exit head by self-distillation.

The base model is frozen. One full forward pass per batch gives both the hidden state after layer
E (the head's input) and the full model's next-token distribution p at every position (the
teacher); the head's distribution q at the same position is pulled towards it by KL(p || q) at
temperature 1. That is the quantity greedy and sampled PPSD care about: a draft is accepted when
the head agrees with the full model.

Training is seeded (batch b is drawn from a generator seeded by (seed, b), so a resumed run sees
the same batches as an uninterrupted one) and resumable (`checkpoint.pt` in the output
directory). Every `eval_every` steps it measures the held-out greedy acceptance rate,
teacher-forced: the share of held-out positions where argmax q == argmax p.

This module knows nothing of decoders' internals or UIs; head types and their files are
`ppsd.heads`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from .heads import TRAINED_HEAD_TYPES, HeadConfig, build_head, fingerprint, save_exit_head, shared_head
from .model import DEFAULT_MODEL, StagedModel, load_model

CHECKPOINT_FILE = "checkpoint.pt"
LOSS = "KL(p_full || q_head) per token, temperature 1, teacher = full model at the same position"
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex")
DEFAULT_PROMPTS = Path(DEFAULT_MODEL).parent.parent / "prompts" / "prompts.json"


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one training run (the CLI's flags, validated)."""

    exit_layer: int
    head_type: str = "lowrank"
    rank: int = 64
    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 8
    seq_len: int = 256
    seed: int = 0
    eval_every: int = 100
    eval_tokens: int = 8192
    checkpoint_every: int = 50

    def validated(self, num_layers: int) -> "TrainConfig":
        if not 1 <= self.exit_layer < num_layers:
            raise ValueError(f"exit layer E={self.exit_layer} is out of range: 1 <= E < {num_layers} (layers)")
        if self.head_type not in TRAINED_HEAD_TYPES:
            raise ValueError(f"head type {self.head_type!r} cannot be trained; choose one of: "
                             f"{', '.join(TRAINED_HEAD_TYPES)}")
        for name in ("rank", "steps", "batch_size", "eval_every", "eval_tokens", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} is out of range: >= 1")
        if self.seq_len < 2:
            raise ValueError(f"seq_len={self.seq_len} is out of range: >= 2")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr} is out of range: > 0")
        return self


@dataclass(frozen=True)
class TokenData:
    """Token ids to train and evaluate on (1-D, documents concatenated), and where they came from."""

    train: torch.Tensor
    heldout: torch.Tensor
    description: str


@dataclass(frozen=True)
class Acceptance:
    """Teacher-forced greedy agreement with the full model on the same positions."""

    shared: float
    head: float
    positions: int


@dataclass
class TrainResult:
    head: torch.nn.Module
    steps: int
    before: Acceptance  # at the start of this run (a resumed run starts from its checkpoint)
    after: Acceptance
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "acceptance"?}


# --- data -----------------------------------------------------------------------------------------


def read_texts(data: str | None, heldout: str | None = None, *, max_chars: int = 4_000_000
               ) -> tuple[list[str], list[str], str]:
    """(train texts, held-out texts, description) from a file, a folder, or the embedded corpus."""
    if data is None:
        from .corpus import build_corpus

        corpus = build_corpus(max_chars=max_chars)
        description = (f"embedded corpus (ppsd.corpus: Python stdlib sources and pydoc topics), first "
                       f"{max_chars:,} characters of training documents; held out: {len(corpus.heldout)} "
                       f"whole documents ({', '.join(corpus.heldout_names[:5])}, ...)")
        return corpus.train, corpus.heldout, description
    train, desc = _read_path(data, max_chars)
    if heldout is not None:
        held, held_desc = _read_path(heldout, max_chars)
        return train, held, f"{desc}; held out: {held_desc}"
    if len(train) >= 2:  # whole documents: every 10th, or the last one of fewer than 10
        held_out = set(range(9, len(train), 10)) or {len(train) - 1}
        kept = [t for i, t in enumerate(train) if i not in held_out]
        held = [t for i, t in enumerate(train) if i in held_out]
        return kept, held, f"{desc}; held out: {len(held)} whole documents (every 10th, or the last)"
    cut = int(len(train[0]) * 0.9)  # one document: its last 10 % is held out
    return [train[0][:cut]], [train[0][cut:]], f"{desc}; held out: its last 10%"


def _read_path(path: str, max_chars: int) -> tuple[list[str], str]:
    root = Path(path)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    else:
        raise ValueError(f"data {path!r} not found: give a text file or a folder of text files")
    texts, digest, budget = [], hashlib.sha256(), max_chars
    for file in files:
        if budget <= 0:
            break
        text = file.read_text(encoding="utf-8", errors="replace")[:budget]
        if text.strip():
            texts.append(text)
            digest.update(text.encode())
            budget -= len(text)
    if not texts:
        raise ValueError(f"data {path!r} holds no text (files ending in {', '.join(TEXT_SUFFIXES)})")
    chars = sum(map(len, texts))
    return texts, f"{path} ({len(texts)} documents, {chars:,} characters, sha256 {digest.hexdigest()[:12]})"


def tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    """Documents concatenated, each followed by EOS when the tokenizer has one."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + eos
    return torch.tensor(ids, dtype=torch.long)


def batch_at(ids: torch.Tensor, step: int, config: TrainConfig) -> torch.Tensor:
    """(B, T) random windows for step `step`: a function of (seed, step) alone, so resumable."""
    if ids.numel() < config.seq_len + 1:
        raise ValueError(f"training data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    starts = torch.randint(0, ids.numel() - config.seq_len + 1, (config.batch_size,), generator=generator)
    return torch.stack([ids[s: s + config.seq_len] for s in starts.tolist()])


def eval_windows(ids: torch.Tensor, config: TrainConfig) -> torch.Tensor:
    """(N, T) consecutive held-out windows covering at most `eval_tokens` tokens."""
    ids = ids[: config.eval_tokens]
    count = ids.numel() // config.seq_len
    if count == 0:
        raise ValueError(f"held-out data has {ids.numel()} tokens, fewer than seq_len={config.seq_len}")
    return ids[: count * config.seq_len].view(count, config.seq_len)


# --- distillation ---------------------------------------------------------------------------------


@torch.no_grad()
def teacher(model: StagedModel, ids: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(hidden states: embeddings then after each layer, each (B, T, H); full-model logits
    (B, T, V)) of one frozen forward pass. The heads take what they need: `hidden_states[E]`."""
    out = model.hf_model(ids.to(model.hf_model.device), output_hidden_states=True, use_cache=False)
    return out.hidden_states, out.logits


def distill_loss(head_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p || q), p the teacher, q the head (both temperature 1)."""
    log_q = F.log_softmax(head_logits.float(), dim=-1).flatten(0, -2)
    log_p = F.log_softmax(teacher_logits.float(), dim=-1).flatten(0, -2)
    return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


@torch.no_grad()
def acceptance(model: StagedModel, head: torch.nn.Module, windows: torch.Tensor, exit_layer: int) -> Acceptance:
    """Teacher-forced greedy acceptance of the shared head and of `head` on the same windows."""
    shared = shared_head(model)
    agree_shared = agree_head = total = 0
    for window in windows.split(4):
        states, logits = teacher(model, window)
        target = logits.argmax(-1)
        agree_shared += (shared.lm_head(shared.norm(states[exit_layer])).argmax(-1) == target).sum().item()
        agree_head += (head.batch_logits(states).argmax(-1) == target).sum().item()
        total += target.numel()
    return Acceptance(shared=agree_shared / total, head=agree_head / total, positions=total)


class _Frozen:
    """Base weights need no gradients: without this, backward through the shared LM head would
    also compute a (V, H) gradient for it at every step. Restored on exit."""

    def __init__(self, model: StagedModel) -> None:
        self.params = [p for p in model.hf_model.parameters() if p.requires_grad]

    def __enter__(self) -> None:
        for p in self.params:
            p.requires_grad_(False)

    def __exit__(self, *exc) -> None:
        for p in self.params:
            p.requires_grad_(True)


def train_head(
    model: StagedModel, data: TokenData, config: TrainConfig, *,
    out: str | Path | None = None, resume: bool = False, progress: bool = True,
) -> TrainResult:
    """Distil a head of `config.head_type` at `config.exit_layer`; checkpoint into `out` if given."""
    config = config.validated(model.num_layers)
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
        torch.manual_seed(config.seed)
        head = build_head(config.head_type, model, config.exit_layer, rank=config.rank)
    head.adapter.float()  # trained in float32 whatever the base dtype; cast at load time
    optimizer = torch.optim.AdamW(head.adapter.parameters(), lr=config.lr, weight_decay=0.0)
    windows = eval_windows(data.heldout, config)
    start, history = 0, []
    checkpoint = Path(out) / CHECKPOINT_FILE if out is not None else None
    if checkpoint is not None and checkpoint.is_file():
        if not resume:
            raise ValueError(f"{checkpoint} exists: pass --resume to continue it, or choose another --out")
        start, history = _restore(checkpoint, head, optimizer, model, config)
    before = acceptance(model, head, windows, config.exit_layer)
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, disable=not progress,
               desc=f"train-head E={config.exit_layer}", unit="step")
    head.train()
    with _Frozen(model):
        for step in bar:
            states, target = teacher(model, batch_at(data.train, step, config))
            loss = distill_loss(head.batch_logits(states), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            record = {"step": step + 1, "loss": round(loss.item(), 5)}
            done = step + 1 == config.steps
            if (step + 1) % config.eval_every == 0 or done:
                head.eval()
                record["acceptance"] = round(acceptance(model, head, windows, config.exit_layer).head, 5)
                head.train()
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{record['acceptance']:.3f}")
            history.append(record)
            if checkpoint is not None and ((step + 1) % config.checkpoint_every == 0 or done):
                _save_checkpoint(checkpoint, head, optimizer, model, config, step + 1, history)
    head.eval()
    after = acceptance(model, head, windows, config.exit_layer)
    return TrainResult(head=head, steps=max(start, config.steps), before=before, after=after, history=history)


def _identity(model: StagedModel, config: TrainConfig) -> dict:
    return {"fingerprint": fingerprint(model)["sha256"], "exit_layer": config.exit_layer,
            "head_type": config.head_type, "rank": config.rank, "seed": config.seed,
            "batch_size": config.batch_size, "seq_len": config.seq_len}


def _save_checkpoint(path: Path, head, optimizer, model, config, step: int, history: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"step": step, "adapter": head.adapter.state_dict(), "optimizer": optimizer.state_dict(),
             "identity": _identity(model, config), "history": history}
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # atomic: a kill mid-write leaves the old checkpoint


def _restore(path: Path, head, optimizer, model, config) -> tuple[int, list[dict]]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    saved, current = state["identity"], _identity(model, config)
    different = [k for k in current if saved.get(k) != current[k]]
    if different:
        raise ValueError(f"{path} was made with other settings ({', '.join(different)}): "
                         f"cannot resume it; choose another --out")
    head.adapter.load_state_dict(state["adapter"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"], list(state["history"])


# --- PPSD decodes on prompts (the card's second measurement) ---------------------------------------


def decode_acceptance(model: StagedModel, head, prompts: list[list[int]], exit_layer: int, *,
                      max_new_tokens: int = 64) -> dict:
    """Greedy PPSD acceptance rate (accepted / verified drafts, pooled over prompts) with the
    shared head and with `head`, on the pipeline whose balanced exit is E (K = L / E)."""
    from .config import DecodeConfig
    from .generate import generate

    stages = max(2, min(round(model.num_layers / exit_layer), model.num_layers - exit_layer + 1))
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, stages=stages, max_new_tokens=max_new_tokens)
    rates = {"stages": stages, "prompts": len(prompts), "max_new_tokens": max_new_tokens}
    for name, staged in (("shared", model.with_exit_head(shared_head(model))), ("head", model.with_exit_head(head))):
        accepted = verified = 0
        for ids in prompts:
            m = generate(staged, ids, config).metrics()
            accepted += m.accepted
            verified += m.accepted + m.rejected
        rates[name] = accepted / verified if verified else None
    return rates


# --- command line ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = TrainConfig(exit_layer=1)
    parser.add_argument("--model", default=DEFAULT_MODEL, help="local directory or hub id (default: embedded)")
    parser.add_argument("--exit-layer", type=int, default=None, help="E (default: L/2)")
    parser.add_argument("--data", default=None,
                        help="text file or folder of text files (default: the embedded corpus, ppsd.corpus)")
    parser.add_argument("--heldout", default=None, help="held-out text file or folder (default: split from --data)")
    parser.add_argument("--max-chars", type=int, default=4_000_000, help="read at most this much text")
    parser.add_argument("--head-type", default=defaults.head_type, choices=TRAINED_HEAD_TYPES)
    parser.add_argument("--rank", type=int, default=defaults.rank, help="adapter rank (lowrank only)")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--seq-len", type=int, default=defaults.seq_len)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--eval-every", type=int, default=defaults.eval_every, help="held-out acceptance period")
    parser.add_argument("--eval-tokens", type=int, default=defaults.eval_tokens, help="held-out tokens measured")
    parser.add_argument("--checkpoint-every", type=int, default=defaults.checkpoint_every)
    parser.add_argument("--prompts", default=None,
                        help="prompts JSON [{name, prompt}] for greedy PPSD acceptance before/after "
                             "(default: assets/prompts/prompts.json when present)")
    parser.add_argument("--decode-tokens", type=int, default=64, help="new tokens per prompt decode (default 64)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto (default cpu)")
    parser.add_argument("--out", required=True, help="directory for the head, its card and checkpoint")
    parser.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")


def run(args: argparse.Namespace) -> int:
    model, tokenizer = load_model(args.model, device=args.device)
    exit_layer = args.exit_layer if args.exit_layer is not None else max(1, model.num_layers // 2)
    config = TrainConfig(
        exit_layer=exit_layer, head_type=args.head_type, rank=args.rank, steps=args.steps, lr=args.lr,
        batch_size=args.batch_size, seq_len=args.seq_len, seed=args.seed, eval_every=args.eval_every,
        eval_tokens=args.eval_tokens, checkpoint_every=args.checkpoint_every,
    ).validated(model.num_layers)
    train_texts, heldout_texts, description = read_texts(args.data, args.heldout, max_chars=args.max_chars)
    data = TokenData(tokenize(tokenizer, train_texts), tokenize(tokenizer, heldout_texts), description)
    began = time.perf_counter()
    result = train_head(model, data, config, out=args.out, resume=args.resume, progress=not args.no_progress)
    seconds = time.perf_counter() - began
    evaluation = {
        "description": (f"Teacher-forced on {result.after.positions} held-out tokens ({config.seq_len}-token "
                        "windows): share of positions where the head's argmax equals the full model's. "
                        f"Measured on {model.info.device} ({model.info.dtype})."),
        "acceptance_shared": result.after.shared,
        "acceptance_trained": result.after.head,
        "positions": result.after.positions,
        "notes": [],
    }
    prompts_path = Path(args.prompts) if args.prompts else DEFAULT_PROMPTS
    if args.prompts or (prompts_path.is_file() and args.model == DEFAULT_MODEL):
        evaluation.update(_prompt_evaluation(model, tokenizer, result.head, prompts_path, exit_layer,
                                             args.decode_tokens))
    head_config = HeadConfig(
        head_type=config.head_type, exit_layer=exit_layer, base_model=model.info.name,
        base_fingerprint=fingerprint(model), rank=config.rank if config.head_type == "lowrank" else None,
        training={"loss": LOSS, "data": description, "steps": result.steps, "lr": config.lr,
                  "batch_size": config.batch_size, "seq_len": config.seq_len, "seed": config.seed,
                  "train_tokens": data.train.numel(), "device": model.info.device,
                  "wall_seconds_this_run": round(seconds, 1), "history": result.history},
        evaluation=evaluation,
    )
    save_exit_head(result.head, args.out, head_config)
    print(f"head saved to {args.out}: E={exit_layer}, {result.steps} steps, held-out greedy acceptance "
          f"(teacher-forced, {result.after.positions} positions) shared {result.after.shared:.3f} -> "
          f"trained {result.after.head:.3f}")
    if "ppsd_prompts" in evaluation:
        p = evaluation["ppsd_prompts"]
        print(f"greedy PPSD acceptance on {p['prompts']} prompts (K={p['stages']}): "
              f"shared {p['shared']:.3f} -> trained {p['head']:.3f}")
    return 0


def _prompt_evaluation(model, tokenizer, head, path: Path, exit_layer: int, max_new_tokens: int) -> dict:
    try:
        entries = json.loads(path.read_text())
        prompts = [tokenizer(e["prompt"], add_special_tokens=False)["input_ids"] for e in entries]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"prompts {str(path)!r} unreadable: {error}") from None
    rates = decode_acceptance(model, head, [p for p in prompts if p], exit_layer, max_new_tokens=max_new_tokens)
    note = (f"Greedy PPSD decodes (in process, K={rates['stages']}, {rates['max_new_tokens']} new tokens) of the "
            f"{rates['prompts']} prompts in {path.name}: acceptance rate (accepted / verified drafts) "
            f"shared {rates['shared']:.3f}, trained {rates['head']:.3f}.")
    return {"ppsd_prompts": rates, "notes": [note]}
