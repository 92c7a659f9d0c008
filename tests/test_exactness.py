"""The headline property: greedy EESD and PPSD are token-identical to greedy AR and to Hugging Face
`generate()`, whatever the exit layer, stage count, draft length, prompt and head quality."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from ppsd import DecodeConfig, StagedModel, generate
from ppsd.generate import stream
from ppsd.steps import Committed
from ppsd.config import balanced_exit_layer

from conftest import tiny_llama

PROMPTS = {"one-token": [7], "short": [1, 5, 9, 3, 7], "long": list(range(2, 60, 3))}
NEW_TOKENS = 24


class RandomHead(torch.nn.Module):
    """An exit head unrelated to the model: its drafts are almost never right."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, vocab, bias=False)
        torch.nn.init.normal_(self.proj.weight, generator=torch.Generator().manual_seed(123))

    def forward(self, hidden, position, cache):
        return self.proj(hidden[0, -1])


def exit_equals_full(exit_layer: int) -> StagedModel:
    """Layers from E on add nothing to the residual stream, so the exit head at E is the full
    model: every draft must be accepted."""
    hf = tiny_llama()
    with torch.no_grad():
        for layer in hf.model.layers[exit_layer:]:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    return StagedModel(hf, name=f"identity-after-{exit_layer}")


@functools.cache
def model_for(head: str, exit_layer: int) -> StagedModel:
    if head == "perfect":
        return exit_equals_full(exit_layer)
    model = StagedModel(tiny_llama(), name="tiny")
    return model.with_exit_head(RandomHead(32, 64)) if head == "random" else model


@functools.cache
def hf_greedy(model: StagedModel, prompt: str) -> list[int]:
    ids = torch.tensor([PROMPTS[prompt]])
    out = model.hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    return out[0, ids.shape[1]:].tolist()


# (K, E): balanced, earliest and latest exits, uneven stages, the deepest pipeline.
LAYOUTS = [(2, None), (2, 1), (2, 7), (3, None), (3, 5), (4, 2), (8, 1)]


@pytest.mark.parametrize("head", ["shared", "perfect", "random"])
@pytest.mark.parametrize("num_stages,exit_layer", LAYOUTS)
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_ppsd_matches_ar_and_hf(head, num_stages, exit_layer, prompt):
    exit_layer = exit_layer or balanced_exit_layer(8, num_stages)
    model = model_for(head, exit_layer)
    ar = generate(model, PROMPTS[prompt], DecodeConfig(method="ar", num_stages=num_stages, exit_layer=exit_layer,
                                                       max_new_tokens=NEW_TOKENS))
    result = generate(model, PROMPTS[prompt], DecodeConfig(method="ppsd", num_stages=num_stages, exit_layer=exit_layer,
                                                           max_new_tokens=NEW_TOKENS))
    assert result.token_ids == ar.token_ids == hf_greedy(model, prompt)
    _assert_head_behaviour(result, head)


@pytest.mark.parametrize("head", ["shared", "perfect", "random"])
@pytest.mark.parametrize("draft_len", [1, 3, 5])
@pytest.mark.parametrize("num_stages,exit_layer", [(2, None), (2, 1), (3, 5), (4, 2)])
@pytest.mark.parametrize("prompt", ["one-token", "short"])
def test_eesd_matches_ar_and_hf(head, draft_len, num_stages, exit_layer, prompt):
    exit_layer = exit_layer or balanced_exit_layer(8, num_stages)
    model = model_for(head, exit_layer)
    result = generate(model, PROMPTS[prompt], DecodeConfig(method="eesd", num_stages=num_stages, exit_layer=exit_layer,
                                                           draft_len=draft_len, max_new_tokens=NEW_TOKENS))
    assert result.token_ids == hf_greedy(model, prompt)
    _assert_head_behaviour(result, head)
    verify_passes = [e for e in result.trace.events if e.stage == num_stages and e.kind != "prefill"]
    assert len(verify_passes) >= 3


def _assert_head_behaviour(result, head: str) -> None:
    """Each setup exercises what it claims to: all accepted, mostly rejected, or a mix."""
    statuses = [t.status for t in result.tokens[1:]]
    if head == "perfect":  # EESD's bonus tokens have no draft: "verified"
        assert "accepted" in statuses and "corrected" not in statuses
    elif head == "random":
        assert statuses.count("corrected") >= 3 * statuses.count("accepted") + 3
    else:
        assert "accepted" in statuses and "corrected" in statuses


def test_stop_at_eos_and_max_new_tokens(llama):
    ar = generate(llama, PROMPTS["short"], DecodeConfig(method="ar", max_new_tokens=12))
    eos = ar.token_ids[5]
    model = StagedModel(llama.hf_model, name="with-eos")
    object.__setattr__(model.info, "eos_token_ids", (eos,))
    expected = ar.token_ids[: ar.token_ids.index(eos) + 1]
    for method in ("ar", "eesd", "ppsd"):
        result = generate(model, PROMPTS["short"], DecodeConfig(method=method, max_new_tokens=12, draft_len=3))
        assert result.token_ids == expected, method
        assert len(generate(llama, PROMPTS["short"], DecodeConfig(method=method, max_new_tokens=7)).token_ids) == 7


ARCHITECTURES = {
    "qwen2": (Qwen2ForCausalLM, Qwen2Config),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config),
    "mistral": (MistralForCausalLM, MistralConfig),
}


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_other_llama_family_architectures(arch):
    model_cls, config_cls = ARCHITECTURES[arch]
    torch.manual_seed(0)
    config = config_cls(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        head_dim=8, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = StagedModel(model_cls(config).eval(), name=arch)
    ids = torch.tensor([PROMPTS["short"]])
    hf = model.hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=16, min_new_tokens=16)[0, ids.shape[1]:].tolist()
    for method in ("ar", "eesd", "ppsd"):
        assert generate(model, PROMPTS["short"], DecodeConfig(method=method, max_new_tokens=16)).token_ids == hf


def test_unsupported_architecture_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        StagedModel(gpt2)


def test_stream_resumed_on_other_threads_matches_generate(llama):
    """Gradio resumes a handler's generator on whichever worker thread is free: every step of
    `stream` driven from a fresh thread still commits `generate`'s tokens (inference mode is per
    thread, so it must hold for each resumption, not only the first)."""
    from concurrent.futures import ThreadPoolExecutor

    config = DecodeConfig(method="ppsd", num_stages=2, exit_layer=4, max_new_tokens=12)
    expected = generate(llama, [1, 2, 3], config).token_ids
    steps = stream(llama, [1, 2, 3], config)
    committed = []
    for _ in range(200):
        with ThreadPoolExecutor(max_workers=1) as pool:  # a new thread for every resumption
            step = pool.submit(next, steps, None).result()
        if step is None:
            break
        if isinstance(step, Committed):
            committed.append(step.token.id)
    assert committed == expected
