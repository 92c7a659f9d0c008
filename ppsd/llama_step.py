"""Our own Llama forward for static steps, with the K stages' layers stacked.

Boundary: tensors and kernels only; no schedule, no drafts, no host reads. At load it packs the
Hugging Face model's decoder weights (Q, K and V as one matrix, gate and up as one) and stacks
them by *chain step*: entry [j, k] of every weight is layer j of stage k (layer
`partition[k].start + j`). A stage shorter than the longest is padded with identity layers (zero
output projections: the residual stream passes unchanged), so every stage's chain is as long as
the longest stage's: stages of 20 and 10 layers cost a chain of 20 steps at batch 2, where
balanced stages of 15 would cost 15.

`chain` runs steps [0, n) for a range of rows at once, row r being stage r's token: one batched
product per matrix for every stage, so a PPSD slot is one chain of L/K layers rather than K
chains. One stage alone (the prefill, AR, EESD's verification) is the same chain on one row.
The rotary embedding is a table indexed by device positions; attention is grouped-query without
repeated keys; the KV cache is one tensor (`PackedKVCache`) written and read per row by (layer,
position), so the same kernels run at every position and a CUDA graph can replay them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .model import SharedExitHead, StagedModel
from .static_cache import CacheView, StaticKVCache

__all__ = ["PackedKVCache", "StackedLlama"]


class PackedKVCache(StaticKVCache):
    """Every layer's keys and values in one zero-filled (2, L + 1, kv_heads, capacity, head_dim)
    tensor; layer L is scratch, where identity pads and rows with no token write. `keys[i]` and
    `values[i]` stay the (1, kv_heads, capacity, head_dim) views `StaticKVCache` has, so a layer
    exit head reads it through a `CacheView`; host lengths and rollback are `StaticKVCache`'s."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, *, dtype, device) -> None:
        super().__init__(num_layers + 1, kv_heads, head_dim, dtype=dtype, device=device)
        self.scratch = num_layers
        self.kv = torch.zeros(0, device=self.device, dtype=dtype)

    def _allocate(self, capacity: int) -> None:
        # Zeros, not garbage: a masked score multiplies its value by 0, and 0 x NaN is NaN.
        grown = torch.zeros((2, self.num_layers, self.kv_heads, capacity, self.head_dim), dtype=self.dtype,
                            device=self.device)
        if self.capacity:
            grown[:, :, :, :self.capacity] = self.kv
        self.kv = grown
        self.keys = [grown[0, i:i + 1] for i in range(self.num_layers)]
        self.values = [grown[1, i:i + 1] for i in range(self.num_layers)]


def _pack(layer, attention) -> dict[str, torch.Tensor]:
    """One HF decoder layer's weights, packed: (Q; K; V), (gate; up), and the rest as they are."""
    if not isinstance(getattr(attention, "q_norm", None), (type(None), torch.nn.Identity)):
        raise ValueError("the stacked engine runs Llama, Mistral and Qwen2 layers (no query/key norms)")
    proj = (attention.q_proj, attention.k_proj, attention.v_proj)
    bias = None
    if any(p.bias is not None for p in proj):
        bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features) for p in proj])
    return {"qkv": torch.cat([p.weight for p in proj]), "qkv_bias": bias, "o": attention.o_proj.weight,
            "gate_up": torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight]),
            "down": layer.mlp.down_proj.weight, "attn_norm": layer.input_layernorm.weight,
            "mlp_norm": layer.post_attention_layernorm.weight}


class StackedLlama:
    """The model's layers stacked by chain step for `partition`, plus what the ends need: the
    embedding, the final norm and LM head, the rotary table and the packed cache."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...]) -> None:
        hf = model.hf_model
        config = hf.config
        self.model, self.partition = model, partition
        self.num_heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = getattr(config, "rms_norm_eps", 1e-6)
        self.steps = max(len(r) for r in partition)
        weight = next(hf.parameters())
        self.device, self.dtype = weight.device, weight.dtype
        layers = hf.model.layers
        with torch.no_grad(), torch.inference_mode(False):
            packed = [_pack(layer, layer.self_attn) for layer in layers]
            pad = {name: torch.zeros_like(t) if name not in ("attn_norm", "mlp_norm") else torch.ones_like(t)
                   for name, t in packed[0].items() if t is not None}
            table = [[(r.start + j if j < len(r) else None) for r in partition] for j in range(self.steps)]
            self.weights = {name: torch.stack([torch.stack([packed[i][name] if i is not None else pad[name]
                                                            for i in row]) for row in table]).contiguous()
                            for name in pad}  # name -> (steps, K, ...)
            self.cache = PackedKVCache(len(layers), self.kv_heads, self.head_dim, dtype=self.dtype, device=self.device)
            # (steps, K): the cache layer each entry writes; pads write the scratch layer.
            self.layer_ids = torch.tensor([[self.cache.scratch if i is None else i for i in row] for row in table],
                                          device=self.device)
            positions = torch.arange(model.info.max_context, device=self.device)[None]
            cos, sin = hf.model.rotary_emb(weight[:1, None].to(self.dtype), positions)  # HF's own table
            half = self.head_dim // 2
            # (max_context, head_dim); rotate_half(x) * sin = roll(x, half) * (-sin1, sin2), exactly
            self.cos = cos[0].contiguous()
            self.sin = torch.cat((-sin[0, :, :half], sin[0, :, half:]), dim=-1).contiguous()
            self.embed_weight = hf.model.embed_tokens.weight
            self.norm_weight, self.lm_weight = hf.model.norm.weight, hf.lm_head.weight
            self.head_eps = getattr(hf.model.norm, "variance_epsilon", self.eps)
        head = model.exit_head
        # The shared exit head is the final norm and LM head: one product serves both rows.
        self.shared_head = isinstance(head, SharedExitHead) and head.norm is hf.model.norm and head.lm_head is hf.lm_head
        self._tables: dict[tuple[int, ...], torch.Tensor] = {}

    # Pieces ------------------------------------------------------------------------------------

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """(R, T, hidden) embeddings of (R, T) token ids."""
        return F.embedding(ids, self.embed_weight)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # As Hugging Face's RMSNorm: normalised in float32 (torch's rms_norm upcasts a half
        # input itself, in one kernel where it has a fused one), rounded back, then the weight.
        return weight * F.rms_norm(x, (x.shape[-1],), eps=eps)

    def final_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., V) float32 logits of the full model for hidden states after the last layer."""
        return F.linear(self._norm(hidden, self.norm_weight, self.head_eps), self.lm_weight).float()

    def exit_logits(self, hidden: torch.Tensor, positions: torch.Tensor, bucket: int) -> torch.Tensor:
        """(V,) float32 exit-head logits of the last position of `hidden` (1, T, hidden) after
        layer E; a layer head reads the cache through a `CacheView` (it never writes it)."""
        if self.shared_head:
            return self.final_logits(hidden[0, -1])
        return self.model.exit_logits(hidden, position=positions, cache=CacheView(self.cache, positions, bucket))

    def table(self, live: tuple[int, ...]) -> torch.Tensor:
        """(steps, hi - lo + 1) cache layers for the rows lo..hi of `live`: rows in between that
        hold no token write the scratch layer."""
        if live not in self._tables:
            lo, hi = live[0], live[-1]
            ids = self.layer_ids[:, lo:hi + 1].clone()
            for row in range(lo, hi + 1):
                if row not in live:
                    ids[:, row - lo] = self.cache.scratch
            self._tables[live] = ids
        return self._tables[live]

    # The chain ---------------------------------------------------------------------------------

    def chain(self, x: torch.Tensor, rows: slice, positions: torch.Tensor, bucket: int, layer_ids: torch.Tensor,
              steps: int | None = None) -> torch.Tensor:
        """Steps [0, steps) (default: all) on `x` (R, T, hidden): row r is stage `rows.start + r`
        at `positions` (R, T) (device), writing and reading the cache layers `layer_ids` (steps, R)
        give it. Keys past a query's position are masked (stale after a rollback, or unwritten)."""
        rows_n, width = x.shape[:2]
        groups = self.num_heads // self.kv_heads
        cos = self.cos[positions].unsqueeze(2)  # (R, T, 1, d): broadcast over heads
        sin = self.sin[positions].unsqueeze(2)
        allowed = self.cache.key_index[:bucket] <= positions[..., None]  # (R, T, S)
        # Queries grouped by their key head: (R, kv, groups * T, d) against (R, kv, S, d) keys.
        mask = allowed[:, None, None].expand(rows_n, 1, groups, width, bucket).reshape(rows_n, 1, groups * width, bucket)
        heads = torch.arange(self.kv_heads, device=x.device)[None, None, :]
        where = positions[:, :, None]  # (R, T, 1)
        w = self.weights
        for j in range(self.steps if steps is None else steps):
            layer = layer_ids[j][:, None, None]  # (R, 1, 1)
            x = self._layer(x, {name: t[j, rows] for name, t in w.items()}, cos, sin, mask, bucket,
                            (layer, heads, where), layer_ids[j], groups)
        return x

    def _layer(self, x, w, cos, sin, mask, bucket, write, read_layers, groups) -> torch.Tensor:
        rows_n, width, _ = x.shape
        nq, nkv, d = self.num_heads * self.head_dim, self.kv_heads * self.head_dim, self.head_dim
        h = self._norm(x, w["attn_norm"][:, None], self.eps)
        if "qkv_bias" in w:
            qkv = torch.baddbmm(w["qkv_bias"][:, None], h, w["qkv"].transpose(1, 2))
        else:
            qkv = torch.bmm(h, w["qkv"].transpose(1, 2))  # (R, T, nq + 2 nkv)
        qk = qkv[..., :nq + nkv].view(rows_n, width, self.num_heads + self.kv_heads, d)
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin  # rotary, as HF's (the sign is in the table)
        q, k = qk[:, :, :self.num_heads], qk[:, :, self.num_heads:]
        v = qkv[..., nq + nkv:].view(rows_n, width, self.kv_heads, d)
        cache = self.cache.kv
        cache[0].index_put_(write, k)
        cache[1].index_put_(write, v)
        kv = cache[:, :, :, :bucket].index_select(1, read_layers)  # (2, R, kv, S, d)
        q = q.reshape(rows_n, width, self.kv_heads, groups, d).permute(0, 2, 3, 1, 4)
        q = q.reshape(rows_n, self.kv_heads, groups * width, d)
        out = F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask, scale=d ** -0.5)
        out = out.view(rows_n, self.kv_heads, groups, width, d).permute(0, 3, 1, 2, 4).reshape(rows_n, width, nq)
        x = x + torch.bmm(out, w["o"].transpose(1, 2))
        h = self._norm(x, w["mlp_norm"][:, None], self.eps)
        gate, up = torch.bmm(h, w["gate_up"].transpose(1, 2)).chunk(2, dim=-1)
        return x + torch.bmm(F.silu(gate) * up, w["down"].transpose(1, 2))

    def stage(self, x: torch.Tensor, k: int, positions: torch.Tensor, bucket: int) -> torch.Tensor:
        """Stage k's own layers alone on `x` (1, T, hidden) at `positions` (T,)."""
        return self.chain(x, slice(k, k + 1), positions[None], bucket, self.layer_ids[:, k:k + 1],
                          steps=len(self.partition[k]))
