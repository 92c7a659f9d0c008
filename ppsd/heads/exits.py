"""Early-exit head types: what maps the hidden state after layers [0, E) to next-token logits
(the `ExitHead` protocol of `ppsd.model`).

`shared` is the model's own final norm + LM head (no weights of its own); `lowrank` is an
RMSNorm and a low-rank residual adapter feeding that same frozen norm + LM head; `layer` is one
decoder layer (attention + MLP) whose attention reads the keys and values stage 1's last layer
already cached, feeding the same norm + LM head. Both are trained by `ppsd.heads.train`, and
either may draft from a slice of the vocabulary only (`draft_vocab`). Saving and loading are
`files`, the shipped heads `shipped`. This module knows nothing of training loops, decoders,
tokenizers or files.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import rotate_half

from ..model import SharedExitHead, StagedModel

HEAD_TYPES = ("shared", "lowrank", "layer")
TRAINED_HEAD_TYPES = ("lowrank", "layer")


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
        # The LM head's rows for the draft vocabulary, made here and again whenever the vocabulary
        # or the head's place changes, never while drafting: a compiled step then reads a buffer,
        # not lazy Python state (a kept step runs without guards, issue 56).
        self.register_buffer("draft_weight", None, persistent=False)
        adapter.register_load_state_dict_post_hook(lambda module, keys: self.slice_draft_vocab())
        self.slice_draft_vocab()

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

    def slice_draft_vocab(self) -> None:
        """Make `draft_weight` anew from the LM head and `draft_vocab` (after the vocabulary is
        loaded or written, or the head moved): the one place the slice is made."""
        vocab = self.draft_vocab
        if vocab is None:
            self.draft_weight = None
            return
        weight = self.lm_head.weight.detach()
        with torch.inference_mode(False):  # a buffer that outlives any one run's inference mode
            self.draft_weight = weight[vocab.to(weight.device)]  # indexing copies: a tensor of its own

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - nn.Module's own signature
        super()._apply(fn, recurse)
        self.slice_draft_vocab()  # `.to()` moved the vocabulary: the slice follows the LM head's place
        return self

    def project(self, normed: torch.Tensor) -> torch.Tensor:
        """(..., D) logits over the draft vocabulary (or all V tokens) of normed hidden states."""
        if self.draft_weight is None:
            return self.lm_head(normed)
        return F.linear(normed, self.draft_weight)

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

    def forward(self, hidden: torch.Tensor, position: torch.Tensor, cache) -> torch.Tensor:
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
                rotary: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor) -> torch.Tensor:
        """`hidden` (B, T, H) at `positions` (T,); keys/values (B, kv, S, d) for positions [0, S),
        of which each query sees those up to its own (a static cache's later ones are stale)."""
        batch, width, _ = hidden.shape
        query = self.q_proj(self.input_layernorm(hidden)).view(batch, width, -1, self.head_dim)
        query = _rotate(self.q_norm(query).transpose(1, 2), *rotary)  # (B, heads, T, d)
        allowed = torch.arange(keys.shape[2], device=hidden.device)[None, :] <= positions[:, None]  # (T, S)
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

    def _attend(self, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                positions: torch.Tensor) -> torch.Tensor:
        weight = self.adapter.q_proj.weight
        cos, sin = self._layer[0](hidden, positions[None])
        out = self.adapter(hidden.to(weight.dtype), keys.to(weight.dtype), values.to(weight.dtype),
                           (cos.to(weight.dtype), sin.to(weight.dtype)), positions)
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
        above = hidden_states[self.exit_layer]
        return self._attend(above, keys, values, torch.arange(above.shape[1], device=above.device))

    def forward(self, hidden: torch.Tensor, position: torch.Tensor, cache) -> torch.Tensor:
        """`position`: the (T,) device tensor of `hidden`'s positions; `cache` the step's `CacheView`."""
        keys, values = cache.keys_values(self.exit_layer - 1)
        return self.full_logits(self._attend(hidden[:, -1:], keys, values, position[-1:])[0, -1])


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, heads, T, d) `x`, as Hugging Face's attention applies it; cos/sin
    (B, T, d) as the models' rotary_emb gives."""
    return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1)


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
        return LayerExitHead(model, exit_layer, draft_vocab=draft_vocab).to(model.hf_model.device)
    raise ValueError(f"head type {head_type!r} is unknown; choose one of: {', '.join(HEAD_TYPES)}")
