"""Train an early-exit head by self-distillation (the loop behind `python -m ppsd train-head`).

The base model is frozen. One full forward pass per batch gives both the hidden state after layer
E (the head's input) and the full model's next-token distribution p at every position (the
teacher); the head's distribution q at the same position is pulled towards it by KL(p || q) at
temperature 1. That is the quantity greedy and sampled PPSD care about: a draft is accepted when
the head agrees with the full model.

Training is seeded (batch b is drawn from a generator seeded by (seed, b), so a resumed run sees
the same batches as an uninterrupted one) and resumable (`checkpoint.pt` in the output
directory). Every `eval_every` steps it measures the held-out greedy acceptance rate,
teacher-forced: the share of held-out positions where argmax q == argmax p.

Here: the loop and its checkpoints. The objective is `distill`, the text `data`, the head types
`exits` and their files `files`; the command line (`python -m ppsd train-head`) and the card's
PPSD measurement, which decodes, are `ppsd.cli.train_head`, above the decoders.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..model import StagedModel
from .data import TokenData
from .distill import (Acceptance, CachedTeacher, TrainConfig, acceptance, batch_at, distill_loss, eval_windows,
                      frequent_tokens, learning_rate, teacher)
from .exits import build_head
from .files import fingerprint

CHECKPOINT_FILE = "checkpoint.pt"
LOSS = "KL(p_full || q_head) per token, temperature 1, teacher = full model at the same position"


@dataclass
class TrainResult:
    head: torch.nn.Module
    steps: int
    before: Acceptance  # at the start of this run (a resumed run starts from its checkpoint)
    after: Acceptance
    history: list[dict] = field(default_factory=list)  # {"step", "loss", "acceptance"?}


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
        head = build_head(config.head_type, model, config.exit_layer, rank=config.rank,
                          draft_vocab=config.draft_vocab)
    if config.draft_vocab is not None:
        head.adapter.draft_vocab.copy_(frequent_tokens(data.train, config.draft_vocab, model.info.vocab_size))
        head.slice_draft_vocab()
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
    cached = CachedTeacher(model, data.train, config, progress=progress) if config.cache_features else None
    bar = tqdm(range(start, config.steps), initial=start, total=config.steps, disable=not progress,
               desc=f"train-head E={config.exit_layer}", unit="step")
    head.train()
    with _Frozen(model):
        for step in bar:
            for group in optimizer.param_groups:  # a function of the step alone: resumable
                group["lr"] = learning_rate(config, step)
            # With a draft vocabulary the teacher is renormalised over what the head can draft.
            if cached is not None:
                states, target = cached.batch(step, config, head.draft_vocab)
            else:
                states, target = teacher(model, batch_at(data.train, step, config), head.draft_vocab)
            loss = distill_loss(head.batch_logits(states), target, config.ce_weight)
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


# Settings a resumed run may change: how long it trains, its step size and how it reports.
RESUMABLE = ("steps", "lr", "eval_every", "eval_tokens", "checkpoint_every")


def _identity(model: StagedModel, config: TrainConfig) -> dict:
    return {"fingerprint": fingerprint(model)["sha256"],
            **{k: v for k, v in asdict(config).items() if k not in RESUMABLE}}


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
