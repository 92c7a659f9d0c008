"""Early-exit heads: their types, and saving and loading them with the metadata that binds them to
one base model and one exit layer E.

A head maps the hidden state after layers [0, E) to next-token logits (the `ExitHead` protocol
of `ppsd.model`). `shared` is the model's own final norm + LM head (no weights of its own);
`lowrank` is an RMSNorm and a low-rank residual adapter feeding that same frozen norm + LM head;
`layer` is one decoder layer (attention + MLP) whose attention reads the keys and values stage 1's
last layer already cached, feeding the same norm + LM head. Both are trained by `ppsd.heads.train`,
and either may draft from a slice of the vocabulary only (`draft_vocab`). A saved head is a
directory:

    head_config.json     what the head is and what it was made for (HeadConfig)
    adapter.safetensors  the head's own weights (float32, or float16 where size matters)
    README.md            the head card: base model, E, training data, acceptance before/after

`load_exit_head` refuses a head made for another model (weights fingerprint) or another E.
`assets/heads/` holds the heads this repository ships: `default_exit_layer` and
`choose_exit_head` are how every entry point picks E and a head when none is given.
This module knows nothing of training loops, decoders or tokenizers.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..assets import ASSETS
from ..model import KVCache, SharedExitHead, StagedModel

HEAD_TYPES = ("shared", "lowrank", "layer")
TRAINED_HEAD_TYPES = ("lowrank", "layer")
CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "adapter.safetensors"
CARD_FILE = "README.md"
FORMAT_VERSION = 1
# Probe values are compared with this tolerance: loose enough that a float32 checkpoint loaded in
# bf16 or fp16 still matches (bf16 keeps ~3 significant digits), tight enough that two different
# trainings or random seeds never do.
PROBE_RTOL, PROBE_ATOL = 2e-2, 1e-3
PROBE_VALUES = 16  # per probed tensor


class LowRankAdapter(nn.Module):
    """h + up(silu(down(rmsnorm(h)))): a residual correction of the layer-E hidden state."""

    def __init__(self, hidden_size: int, rank: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(hidden_size, eps=eps)
        self.down = nn.Linear(hidden_size, rank, bias=False)
        self.up = nn.Linear(rank, hidden_size, bias=False)
        # Zero `up`: an untrained head is exactly the shared head, so training starts from it.
        nn.init.zeros_(self.up.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.up(F.silu(self.down(self.norm(hidden))))


class TrainedExitHead(nn.Module):
    """What both trained heads share: an `adapter` (the only registered submodule: saved, trained,
    moved) in front of the base model's frozen final norm and LM head, which are borrowed.

    With a draft vocabulary (`adapter.draft_vocab`, token ids sorted), the head scores only those
    tokens: its LM head is that slice of the base one, so a draft costs |D| x hidden instead of
    V x hidden (FR-Spec style). Every other token gets -inf: it is never drafted, and the
    verifier still commits it whenever the full model chooses it, so decoding stays lossless.
    """

    def __init__(self, model: StagedModel, exit_layer: int, adapter: nn.Module, draft_vocab: int | None) -> None:
        super().__init__()
        self.exit_layer = exit_layer
        self.adapter = adapter
        self.vocab_size = model.hf_model.lm_head.out_features
        if draft_vocab is not None:
            if not 1 <= draft_vocab <= self.vocab_size:
                raise ValueError(f"draft vocabulary of {draft_vocab} is out of range: 1 <= D <= {self.vocab_size}")
            adapter.register_buffer("draft_vocab", torch.arange(draft_vocab))
        # A tuple, not attributes: nn.Module would register them and save the base weights too.
        self._base = (model.hf_model.model.norm, model.hf_model.lm_head)
        self._slice: tuple[tuple, torch.Tensor] | None = None

    @property
    def norm(self) -> nn.Module:
        """The base model's final norm (borrowed, frozen), as on `SharedExitHead`."""
        return self._base[0]

    @property
    def lm_head(self) -> nn.Module:
        """The base model's LM head (borrowed, frozen), as on `SharedExitHead`."""
        return self._base[1]

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        """The token ids this head can draft, or None for the whole vocabulary."""
        return getattr(self.adapter, "draft_vocab", None)

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """(..., D) logits over the draft vocabulary (or all V tokens) of normed hidden states."""
        vocab = self.draft_vocab
        if vocab is None:
            return self.lm_head(normed)
        weight = self.lm_head.weight
        key = (vocab.data_ptr(), weight.data_ptr(), weight.dtype, weight.device)
        if self._slice is None or self._slice[0] != key:  # sliced once per load, not per draft
            self._slice = (key, weight.detach()[vocab])
        return F.linear(normed, self._slice[1])

    def draft_ids(self, logits: torch.Tensor) -> torch.Tensor:
        """Token ids of the argmax of `project`'s logits."""
        best = logits.argmax(-1)
        return best if self.draft_vocab is None else self.draft_vocab[best]

    def full_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """(V,) logits of one position: -inf outside the draft vocabulary."""
        vocab = self.draft_vocab
        if vocab is None:
            return logits
        return logits.new_full((self.vocab_size,), float("-inf")).index_copy_(0, vocab, logits)


class LowRankExitHead(TrainedExitHead):
    """Adapter at layer E, then the base model's frozen final norm and LM head.

    Stateless: it never touches the KV cache, so the decoders' rollback needs nothing from it.
    """

    head_type = "lowrank"

    def __init__(self, model: StagedModel, exit_layer: int, *, rank: int, draft_vocab: int | None = None) -> None:
        config = model.hf_model.config
        adapter = LowRankAdapter(config.hidden_size, rank, eps=getattr(config, "rms_norm_eps", 1e-6))
        super().__init__(model, exit_layer, adapter, draft_vocab)
        self.rank = rank

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, D) logits for every position of `hidden` (B, T, hidden): the training path."""
        weight = self.adapter.down.weight
        adapted = self.adapter(hidden.to(weight.dtype)).to(hidden.dtype)
        return self.project(self.norm(adapted))

    def batch_logits(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(B, T, D) logits from a full pass's `hidden_states` (embeddings first): training."""
        return self.logits(hidden_states[self.exit_layer])

    def forward(self, hidden: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        return self.full_logits(self.logits(hidden[:, -1:])[0, -1])


class LayerAdapter(nn.Module):
    """A pre-norm decoder layer without key/value projections: queries from layer E's output,
    keys and values shared with layer E-1 (cross-layer KV sharing), then an MLP."""

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        attention = source.self_attn
        # Copies of layer E-1 (its queries already live in the space of its keys), with the two
        # output projections zeroed: an untrained head is exactly the shared head.
        self.input_layernorm = copy.deepcopy(source.input_layernorm)
        self.q_proj = copy.deepcopy(attention.q_proj)
        self.q_norm = copy.deepcopy(getattr(attention, "q_norm", None)) or nn.Identity()  # Qwen3
        self.o_proj = copy.deepcopy(attention.o_proj)
        self.post_attention_layernorm = copy.deepcopy(source.post_attention_layernorm)
        self.mlp = copy.deepcopy(source.mlp)
        nn.init.zeros_(self.o_proj.weight)
        nn.init.zeros_(self.mlp.down_proj.weight)
        self.head_dim = attention.head_dim

    def forward(self, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                rotary: tuple[torch.Tensor, torch.Tensor], position: int) -> torch.Tensor:
        """`hidden` (B, T, H) at [position, position+T); keys/values (B, kv, position+T, d)."""
        batch, width, _ = hidden.shape
        query = self.q_proj(self.input_layernorm(hidden)).view(batch, width, -1, self.head_dim)
        query = _rotate(self.q_norm(query).transpose(1, 2), *rotary)  # (B, heads, T, d)
        allowed = torch.arange(keys.shape[2], device=hidden.device)[None, :] <= (
            torch.arange(position, position + width, device=hidden.device)[:, None])  # (T, P+T)
        attended = F.scaled_dot_product_attention(query, keys, values, attn_mask=allowed, enable_gqa=True)
        hidden = hidden + self.o_proj(attended.transpose(1, 2).reshape(batch, width, -1))
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LayerExitHead(TrainedExitHead):
    """A one-layer exit head at E that writes nothing to the KV cache: its attention reads layer
    E-1's cached keys and values, which stage 1 has just computed for every position it ran
    (prompt and verify feeds included, which never reach the exit head). So rollback needs
    nothing from it, and it costs one attention query and one MLP per draft."""

    head_type = "layer"

    def __init__(self, model: StagedModel, exit_layer: int, *, draft_vocab: int | None = None) -> None:
        below = model.hf_model.model.layers[exit_layer - 1]
        super().__init__(model, exit_layer, LayerAdapter(below), draft_vocab)
        self._layer = (model.hf_model.model.rotary_emb, below)  # borrowed, as `_base`

    def _attend(self, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, position: int) -> torch.Tensor:
        weight = self.adapter.q_proj.weight
        positions = torch.arange(position, position + hidden.shape[1], device=hidden.device)[None]
        cos, sin = self._layer[0](hidden, positions)
        out = self.adapter(hidden.to(weight.dtype), keys.to(weight.dtype), values.to(weight.dtype),
                           (cos.to(weight.dtype), sin.to(weight.dtype)), position)
        return self.project(self.norm(out.to(hidden.dtype)))

    def shared_kv(self, below: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer E-1's post-rotary keys and values, recomputed from its input `below` (B, T, H):
        what its attention stores in the KV cache during decoding."""
        layer = self._layer[1]
        attention = layer.self_attn
        batch, width, _ = below.shape
        normed = layer.input_layernorm(below)
        keys = attention.k_proj(normed).view(batch, width, -1, self.adapter.head_dim)
        keys = getattr(attention, "k_norm", nn.Identity())(keys).transpose(1, 2)
        values = attention.v_proj(normed).view(batch, width, -1, self.adapter.head_dim).transpose(1, 2)
        cos, sin = self._layer[0](below, torch.arange(width, device=below.device)[None])
        return _rotate(keys, cos, sin), values

    def batch_logits(self, hidden_states: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """(B, T, D) logits from a full pass's `hidden_states` (embeddings first): training."""
        keys, values = self.shared_kv(hidden_states[self.exit_layer - 1])
        return self._attend(hidden_states[self.exit_layer], keys, values, 0)

    def forward(self, hidden: torch.Tensor, position: int, cache: KVCache) -> torch.Tensor:
        keys, values = cache.keys_values(self.exit_layer - 1)
        if keys.shape[2] != position + hidden.shape[1]:
            raise RuntimeError(f"layer {self.exit_layer - 1} caches {keys.shape[2]} tokens, "
                               f"expected {position + hidden.shape[1]}")
        return self.full_logits(self._attend(hidden[:, -1:], keys, values, position + hidden.shape[1] - 1)[0, -1])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, heads, T, d) `x`; cos/sin (B, T, d) as the models' rotary_emb gives."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def shared_head(model: StagedModel) -> SharedExitHead:
    """The model's own final norm + LM head, whatever head `model` currently uses."""
    return SharedExitHead(model.hf_model.model.norm, model.hf_model.lm_head)


def build_head(head_type: str, model: StagedModel, exit_layer: int, *, rank: int = 64,
               draft_vocab: int | None = None) -> nn.Module:
    """A fresh head of `head_type` for `model` at `exit_layer` (a trained type starts equal to the
    shared head; with `draft_vocab`, over that many tokens, set in `adapter.draft_vocab`)."""
    if not 1 <= exit_layer < model.num_layers:
        raise ValueError(f"exit layer E={exit_layer} is out of range: 1 <= E < {model.num_layers} (layers)")
    if head_type == "shared":
        return shared_head(model)
    if head_type == "lowrank":
        if rank < 1:
            raise ValueError(f"rank={rank} is out of range: rank >= 1")
        return LowRankExitHead(model, exit_layer, rank=rank, draft_vocab=draft_vocab).to(model.hf_model.device)
    if head_type == "layer":
        return LayerExitHead(model, exit_layer, draft_vocab=draft_vocab)
    raise ValueError(f"head type {head_type!r} is unknown; choose one of: {', '.join(HEAD_TYPES)}")


# --- binding a head to its base model ------------------------------------------------------------


def _probed_tensors(model: StagedModel) -> dict[str, torch.Tensor]:
    hf = model.hf_model
    layers = hf.model.layers
    return {
        "embed_tokens": hf.model.embed_tokens.weight,
        "lm_head": hf.lm_head.weight,
        "norm": hf.model.norm.weight,
        "layers.0.q_proj": layers[0].self_attn.q_proj.weight,
        f"layers.{len(layers) // 2}.up_proj": layers[len(layers) // 2].mlp.up_proj.weight,
        f"layers.{len(layers) - 1}.down_proj": layers[-1].mlp.down_proj.weight,
    }


def fingerprint(model: StagedModel) -> dict:
    """Architecture plus a probe of weight values, and a sha256 naming them.

    The probe is PROBE_VALUES evenly spaced entries of a few tensors (first, middle and last
    layer, embeddings, norm, LM head): any retraining moves them. Hashing every weight would read
    gigabytes per load and would change with the dtype the model happens to be loaded in; the probe
    is compared with a tolerance instead, so one head serves a model in float32, bf16 or fp16.
    """
    config = model.hf_model.config
    architecture = {
        "model_type": config.model_type,
        "num_layers": model.num_layers,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
        "vocab_size": model.info.vocab_size,
    }
    probe = {name: probe_values(tensor) for name, tensor in _probed_tensors(model).items()}
    # The hash rounds to bf16 so the same checkpoint in another dtype usually keeps its name;
    # matching is decided by `fingerprint_matches`, not by the hash.
    rounded = {k: torch.tensor(v).to(torch.bfloat16).float().tolist() for k, v in probe.items()}
    digest = hashlib.sha256(json.dumps([architecture, rounded], sort_keys=True).encode()).hexdigest()
    return {"sha256": digest, "architecture": architecture, "probe": probe}


def probe_values(tensor: torch.Tensor) -> list[float]:
    """PROBE_VALUES evenly spaced entries of `tensor`, first and last included. The indices are
    computed in float64: float32 rounds past the end of tensors of more than 2^24 elements."""
    flat = tensor.detach().reshape(-1)
    index = torch.linspace(0, flat.numel() - 1, PROBE_VALUES, dtype=torch.float64).round().long()
    return [float(v) for v in flat[index.to(flat.device)].float().cpu()]


def fingerprint_matches(saved: dict, current: dict) -> bool:
    """Same architecture and probe values equal up to a dtype's rounding."""
    if saved.get("architecture") != current["architecture"]:
        return False
    if set(saved.get("probe", {})) != set(current["probe"]):
        return False
    return all(
        torch.allclose(torch.tensor(saved["probe"][k]), torch.tensor(v), rtol=PROBE_RTOL, atol=PROBE_ATOL)
        for k, v in current["probe"].items()
    )


# --- saving and loading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HeadConfig:
    """Everything `head_config.json` holds: what the head is, for which model and E, how made."""

    head_type: str
    exit_layer: int
    base_model: str
    base_fingerprint: dict
    rank: int | None = None
    draft_vocab: int | None = None  # drafts only from this many tokens (None: all of them)
    stages: int | None = None  # the pipeline depth K its E was chosen for (None: the K whose balanced E it is)
    training: dict = field(default_factory=dict)  # data, steps, lr, batch_size, seq_len, seed, loss
    evaluation: dict = field(default_factory=dict)  # held-out acceptance before/after, and how measured
    format_version: int = FORMAT_VERSION

    @classmethod
    def read(cls, directory: Path) -> "HeadConfig":
        path = directory / CONFIG_FILE
        if not path.is_file():
            raise ValueError(f"{directory} is not a saved exit head: {CONFIG_FILE} is missing")
        try:
            data = json.loads(path.read_text())
            return cls(**data)
        except (json.JSONDecodeError, TypeError) as error:
            raise ValueError(f"{path} is not a valid head config: {error}") from None


def save_exit_head(head: nn.Module, directory: str | Path, config: HeadConfig, *,
                   dtype: torch.dtype = torch.float32) -> Path:
    """Write weights (in `dtype`; loading casts them to the model's), head_config.json and the card
    into `directory` (created if needed)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if config.head_type not in TRAINED_HEAD_TYPES:
        raise ValueError(f"only trained heads are saved ({', '.join(TRAINED_HEAD_TYPES)}), not {config.head_type!r}")
    weights = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).cpu().contiguous()
               for k, v in head.adapter.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / CONFIG_FILE).write_text(json.dumps(asdict(config), indent=2) + "\n")
    (directory / CARD_FILE).write_text(render_card(config))
    return directory


def load_exit_head(path: str | Path, model: StagedModel, exit_layer: int) -> nn.Module:
    """Load a saved head for `model` at `exit_layer`, in the model's device and dtype.

    Raises ValueError, with the reason and what the head was made for, if the directory is not a
    head, or the head was made for another model (architecture or weights fingerprint differ: a
    head only helps the weights it was distilled from) or for another exit layer E.
    """
    from safetensors.torch import load_file

    directory = Path(path)
    if directory.is_file() and directory.name == CONFIG_FILE:
        directory = directory.parent
    if not directory.is_dir():
        raise ValueError(f"exit head {str(path)!r} not found: give the directory train-head wrote")
    config = HeadConfig.read(directory)
    if config.format_version != FORMAT_VERSION:
        raise ValueError(f"exit head {directory} has format {config.format_version}; this version reads {FORMAT_VERSION}")
    if config.head_type not in TRAINED_HEAD_TYPES:
        raise ValueError(f"exit head {directory} has unknown type {config.head_type!r}")
    current = fingerprint(model)
    if not fingerprint_matches(config.base_fingerprint, current):
        raise ValueError(
            f"exit head {directory} was trained for model {config.base_model!r} "
            f"(fingerprint {config.base_fingerprint.get('sha256', '?')[:12]}), not for {model.info.name!r} "
            f"(fingerprint {current['sha256'][:12]}): train one for this model with `python -m ppsd train-head`"
        )
    if config.exit_layer != exit_layer:
        raise ValueError(
            f"exit head {directory} was trained for exit layer E={config.exit_layer}, not E={exit_layer}: "
            f"use --exit-layer {config.exit_layer} or train a head for E={exit_layer}"
        )
    head = build_head(config.head_type, model, exit_layer, rank=config.rank or 1, draft_vocab=config.draft_vocab)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ValueError(f"exit head {directory} has no weights ({WEIGHTS_FILE} is missing)")
    try:
        head.adapter.load_state_dict(load_file(str(weights_path)))
    except RuntimeError as error:
        raise ValueError(f"exit head {directory} has weights that do not fit its config: {str(error)[:200]}") from None
    return head.to(device=model.hf_model.device, dtype=model.hf_model.dtype).eval()


def render_card(config: HeadConfig) -> str:
    """The README.md written next to a saved head."""
    t, e = config.training, config.evaluation
    lines = [
        f"# Early-exit head: {config.head_type}, E = {config.exit_layer}",
        "",
        f"A `{config.head_type}` exit head{f' (rank {config.rank})' if config.rank else ''} for **{config.base_model}** "
        f"({config.base_fingerprint['architecture']['model_type']}, "
        f"{config.base_fingerprint['architecture']['num_layers']} layers), drafting from the hidden state "
        f"after layer E = {config.exit_layer}. Base weights fingerprint `{config.base_fingerprint['sha256'][:16]}`; "
        "`ppsd.heads.load_exit_head` refuses any other model or exit layer.",
        "",
        "Use: `python -m ppsd generate --model BASE --exit-layer "
        f"{config.exit_layer} --exit-head THIS_DIR --prompt ...`",
        "",
        "## Training",
        "",
        f"- Self-distillation, base model frozen: {t.get('loss', '?')}",
        f"- Data: {t.get('data', '?')}",
        f"- Steps: {t.get('steps', '?')}, batch {t.get('batch_size', '?')} x {t.get('seq_len', '?')} tokens, "
        f"lr {t.get('lr', '?')} ({t.get('lr_schedule', 'constant')}), seed {t.get('seed', '?')}, "
        f"device {t.get('device', '?')}, weights saved as {t.get('weights_dtype', 'float32')}",
        f"- Draft vocabulary: {'all tokens' if config.draft_vocab is None else f'the {config.draft_vocab} most frequent tokens of the training data'}",
        "",
        "## Greedy acceptance rate (measured)",
        "",
        e.get("description", "Not measured."),
        "",
    ]
    rows = []
    if "acceptance_shared" in e and "acceptance_trained" in e:
        rows.append((f"teacher-forced, {e.get('positions', '?')} held-out positions",
                     e["acceptance_shared"], e["acceptance_trained"]))
    prompts = e.get("ppsd_prompts")
    if prompts and prompts.get("shared") is not None:
        rows.append((f"greedy PPSD, K={prompts['stages']}, {prompts['prompts']} prompts x "
                     f"{prompts['max_new_tokens']} tokens", prompts["shared"], prompts["head"]))
    if rows:
        lines += ["| measurement | shared head (before) | trained head (after) |", "|---|---|---|"]
        lines += [f"| {name} | {before:.3f} | {after:.3f} |" for name, before, after in rows]
        lines.append("")
    for extra in e.get("notes", []):
        lines += [extra, ""]
    return "\n".join(lines)


# --- the heads this repository ships ---------------------------------------------------------------

SHIPPED_HEADS = ASSETS / "heads"
AUTO_HEAD, SHARED_HEAD = "auto", "shared"


def pipeline_stages(num_layers: int, exit_layer: int) -> int:
    """The K a head at E serves when its config does not say: the one whose balanced E is nearest."""
    return max(2, min(round(num_layers / exit_layer), num_layers - exit_layer + 1))


def _shipped(root: Path) -> list[tuple[Path, HeadConfig]]:
    """Every head directory under `root`, with its config, in name order."""
    if not root.is_dir():
        return []
    return [(d, HeadConfig.read(d)) for d in sorted(p for p in root.iterdir() if (p / CONFIG_FILE).is_file())]


def shipped_exit_layers(model_name: str, root: Path = SHIPPED_HEADS) -> dict[int, int]:
    """{K: E} of the shipped heads made for the model called `model_name` (by name alone, no
    weights read: the E a run with K stages uses by default; the fingerprint is checked at load)."""
    chosen: dict[int, int] = {}
    for _, config in _shipped(root):
        if config.base_model == str(model_name).strip():
            layers = config.base_fingerprint["architecture"]["num_layers"]
            chosen.setdefault(config.stages or pipeline_stages(layers, config.exit_layer), config.exit_layer)
    return chosen


def default_exit_layer(model_name: str, num_layers: int, stages: int) -> int:
    """The E a run of `model_name` with K stages uses when none is given: the shipped head's for
    that K (its E was chosen by measured speed), else the balanced L/K."""
    from ..config import balanced_exit_layer

    return shipped_exit_layers(model_name).get(stages) or balanced_exit_layer(num_layers, stages)


def exit_layer_for(model_name: str, num_layers: int, stages: int, exit_layer: int | None) -> int | None:
    """The E an entry point asks for: the one given, else the default for K; None (DecodeConfig
    then names the bad K) when K itself is out of range."""
    if exit_layer is not None or not 2 <= stages <= num_layers:
        return exit_layer
    return default_exit_layer(model_name, num_layers, stages)


def shipped_head(model: StagedModel, exit_layer: int, root: Path = SHIPPED_HEADS) -> Path | None:
    """The shipped head directory made for `model`'s weights at `exit_layer`, if there is one."""
    current = None
    for directory, config in _shipped(root):
        if config.exit_layer != exit_layer or config.head_type not in TRAINED_HEAD_TYPES:
            continue
        current = current or fingerprint(model)
        if fingerprint_matches(config.base_fingerprint, current):
            return directory
    return None


@dataclass(frozen=True)
class HeadChoice:
    """Which exit head a run uses, and how to say it: `path` is None for the shared head."""

    head: nn.Module
    path: Path | None

    @property
    def label(self) -> str:
        return "shared (the model's own norm + LM head)" if self.path is None else f"trained ({self.path.name})"


def choose_exit_head(model: StagedModel, exit_layer: int, spec: str | None = AUTO_HEAD) -> HeadChoice:
    """The exit head `spec` names: "auto" (or empty) is the shipped head for these weights and E
    when there is one, else the shared head; "shared" is the shared head; anything else is a
    directory written by `train-head` (ValueError when it does not fit, as `load_exit_head`)."""
    spec = (spec or AUTO_HEAD).strip()
    if spec == SHARED_HEAD:
        return HeadChoice(shared_head(model), None)
    path = shipped_head(model, exit_layer) if spec == AUTO_HEAD else Path(spec)
    if path is None:
        return HeadChoice(shared_head(model), None)
    return HeadChoice(load_exit_head(path, model, exit_layer), path)
