"""Trained early-exit heads: distillation helps, files round-trip exactly, a head is refused for
another model or E, and greedy decoding with a trained head still equals AR token for token."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ppsd import DecodeConfig, StagedModel, generate
from ppsd.cli import main
from ppsd.heads import HeadConfig, build_head, fingerprint, load_exit_head, save_exit_head
from ppsd.heads.data import TokenData
from ppsd.heads.distill import TrainConfig
from ppsd.heads.train import train_head

from ppsd.static_cache import StaticKVCache

from conftest import run_layers, tiny_llama

EXIT = 2
# Small enough to train in seconds on a CPU; 20 Adam steps at lr 1e-2 move either head well clear of
# the shared head on this model (measured 0.08 -> 0.20 lowrank, 0.28 layer, when written).
TRAIN = TrainConfig(exit_layer=EXIT, rank=16, steps=20, lr=1e-2, batch_size=8, seq_len=32,
                    eval_every=1000, eval_tokens=512)


def sharp_llama(seed: int = 0) -> StagedModel:
    # initializer_range 0.1 instead of 0.02: the default tiny model's next-token distributions are
    # nearly uniform, so the KL signal is tiny and its argmax almost arbitrary; sharper weights
    # give a teacher with clear preferences, which makes "training helps" a robust assertion.
    return StagedModel(tiny_llama(seed=seed, initializer_range=0.1), name=f"sharp-{seed}")


def random_tokens(count: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (count,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model() -> StagedModel:
    return sharp_llama()


@pytest.fixture(scope="module", params=["lowrank", "layer", "layer+vocab"])
def trained(model, request):
    # Measured on the training distribution (held-out = a slice of the training tokens): the test
    # is about the optimiser and loss being right, not about generalisation of a random model.
    # "+vocab": drafts from the 48 most frequent of the 64 tokens only.
    tokens = random_tokens(2048)
    head_type, _, vocab = request.param.partition("+")
    config = TrainConfig(**{**TRAIN.__dict__, "head_type": head_type, "draft_vocab": 48 if vocab else None})
    return train_head(model, TokenData(tokens, tokens[:512], "random tokens"), config, progress=False)


def head_config(model: StagedModel, exit_layer: int = EXIT, rank: int = 16, head_type: str = "lowrank",
                draft_vocab: int | None = None) -> HeadConfig:
    return HeadConfig(head_type=head_type, exit_layer=exit_layer, base_model=model.info.name,
                      base_fingerprint=fingerprint(model), rank=rank if head_type == "lowrank" else None,
                      draft_vocab=draft_vocab,
                      training={"loss": "test", "data": "test", "steps": 0},
                      evaluation={"acceptance_shared": 0.5, "acceptance_trained": 0.6})


def config_for(model: StagedModel, head) -> HeadConfig:
    vocab = None if head.draft_vocab is None else len(head.draft_vocab)
    return head_config(model, head_type=head.head_type, draft_vocab=vocab)


@pytest.mark.parametrize("head_type", ["lowrank", "layer"])
def test_untrained_head_is_the_shared_head(model, head_type):
    hidden, view = run_layers(model, [1, 5, 9, 3, 7], range(0, EXIT), StaticKVCache.for_model(model.hf_model))
    shared = model.exit_logits(hidden, position=view.write, cache=view)
    head = build_head(head_type, model, EXIT, rank=8)
    assert torch.equal(model.with_exit_head(head).exit_logits(hidden, position=view.write, cache=view), shared)


def test_layer_head_recomputes_exactly_the_keys_and_values_stage_1_cached(model):
    # Training recomputes layer E-1's keys/values from hidden_states[E-1]; decoding reads them
    # from the cache. Both must be the same tensors or the head would be trained on other inputs.
    ids = [1, 5, 9, 3, 7, 11]
    cache = StaticKVCache.for_model(model.hf_model)
    run_layers(model, ids, range(0, EXIT), cache)
    cached = (cache.keys[EXIT - 1][:, :, :len(ids)], cache.values[EXIT - 1][:, :, :len(ids)])
    with torch.no_grad():
        states = model.hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        recomputed = build_head("layer", model, EXIT).shared_kv(states[EXIT - 1])
    for a, b in zip(recomputed, cached):
        torch.testing.assert_close(a, b)


def test_batch_and_decoding_paths_agree(model, trained):
    # The head sees whole windows in training and one token behind a cache in decoding.
    ids = [4, 8, 15, 16, 23, 42]
    with torch.no_grad():
        states = model.hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        batch = trained.head.batch_logits(states)[0]
        cache = StaticKVCache.for_model(model.hf_model)
        for position, token in enumerate(ids):
            hidden, view = run_layers(model, [token], range(0, EXIT), cache, position)
            full = trained.head.full_logits(batch[position])
            torch.testing.assert_close(trained.head(hidden, view.write, view), full, rtol=1e-4, atol=1e-5)


def test_training_raises_acceptance_above_the_shared_head(trained):
    if trained.head.draft_vocab is None:  # zero-initialised adapter (a draft vocabulary differs by design)
        assert trained.before.head == trained.before.shared
    assert trained.after.head > trained.after.shared + 0.05
    assert trained.history[-1]["loss"] < trained.history[0]["loss"]


def test_save_load_round_trip_is_exact(model, trained, tmp_path):
    save_exit_head(trained.head, tmp_path, config_for(model, trained.head))
    loaded = load_exit_head(tmp_path, model, EXIT)
    hidden, view = run_layers(model, [3, 1, 4, 1, 5, 9, 2], range(0, EXIT), StaticKVCache.for_model(model.hf_model))
    with torch.no_grad():
        assert torch.equal(loaded(hidden, view.write, view), trained.head(hidden, view.write, view))
    saved = json.loads((tmp_path / "head_config.json").read_text())
    assert saved["exit_layer"] == EXIT and saved["base_fingerprint"]["sha256"] == fingerprint(model)["sha256"]
    assert f"E = {EXIT}" in (tmp_path / "README.md").read_text()


def test_head_for_another_model_or_exit_layer_is_refused(model, trained, tmp_path):
    save_exit_head(trained.head, tmp_path, config_for(model, trained.head))
    with pytest.raises(ValueError, match="trained for model 'sharp-0'.*not for 'sharp-1'"):
        load_exit_head(tmp_path, sharp_llama(seed=1), EXIT)
    with pytest.raises(ValueError, match="exit layer E=2, not E=4"):
        load_exit_head(tmp_path, model, 4)
    with pytest.raises(ValueError, match="does not exist"):
        load_exit_head(tmp_path / "missing", model, EXIT)


@pytest.mark.parametrize("change", [
    {"base_fingerprint": "abc"}, {"exit_layer": "2"}, {"exit_layer": True}, {"rank": 1.5}, {"training": []},
    {"head_type": 7}, {"base_fingerprint": {"sha256": "x", "architecture": {}, "probe": {"norm": "abc"}}},
    {"base_fingerprint": {"sha256": 1, "architecture": {}, "probe": {}}},
], ids=["fingerprint-str", "exit-str", "exit-bool", "rank-float", "training-list", "type-int", "probe-str",
        "sha-int"])
def test_a_head_config_with_wrong_field_types_is_not_a_head(model, tmp_path, change):
    from dataclasses import asdict

    from ppsd.heads.files import NotAHead

    (tmp_path / "head_config.json").write_text(json.dumps({**asdict(head_config(model)), **change}))
    with pytest.raises(NotAHead, match="is not a valid head config: "):
        load_exit_head(tmp_path, model, EXIT)


def test_same_weights_in_another_dtype_and_name_are_accepted(model, trained, tmp_path):
    # The fingerprint binds a head to weights, not to a path or a dtype: the same checkpoint
    # loaded in bf16 (as on a GPU) under another name is still the same model.
    save_exit_head(trained.head, tmp_path, config_for(model, trained.head))
    bf16 = StagedModel(tiny_llama(initializer_range=0.1).to(torch.bfloat16), name="elsewhere")
    head = load_exit_head(tmp_path, bf16, EXIT)
    assert all(p.dtype == torch.bfloat16 for p in head.adapter.parameters())


def test_another_architecture_round_trips(tmp_path):
    # Qwen2 (biased q/k/v projections) as a pipeline check of fingerprint, save and load.
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    qwen = StagedModel(Qwen2ForCausalLM(config).eval(), name="tiny-qwen2")
    tokens = random_tokens(512)
    config = TrainConfig(exit_layer=2, rank=4, steps=2, batch_size=2, seq_len=16, eval_tokens=64)
    result = train_head(qwen, TokenData(tokens, tokens[:64], "random"), config, progress=False)
    save_exit_head(result.head, tmp_path, head_config(qwen, 2, rank=4))
    hidden, view = run_layers(qwen, [5, 6, 7], range(0, 2), StaticKVCache.for_model(qwen.hf_model))
    with torch.no_grad():
        assert torch.equal(load_exit_head(tmp_path, qwen, 2)(hidden, view.write, view),
                           result.head(hidden, view.write, view))


@pytest.mark.parametrize("method, num_stages", [("ppsd", 2), ("ppsd", 3), ("eesd", 2)])
def test_greedy_decoding_with_a_trained_head_equals_ar(model, trained, method, num_stages):
    staged = model.with_exit_head(trained.head)
    prompt = [1, 5, 9, 3, 7]
    ar = generate(model, prompt, DecodeConfig(method="ar", exit_layer=EXIT, num_stages=num_stages, max_new_tokens=24))
    spec = generate(staged, prompt, DecodeConfig(method=method, exit_layer=EXIT, num_stages=num_stages, max_new_tokens=24))
    assert spec.token_ids == ar.token_ids
    assert spec.metrics().accepted > 0  # the trained head's drafts are really used and sometimes right
    if trained.head.draft_vocab is not None:  # drafts come from the draft vocabulary alone
        assert {d.id for d in spec.drafts} <= set(trained.head.draft_vocab.tolist())


def test_resumed_training_equals_uninterrupted(model, tmp_path):
    tokens = random_tokens(1024)
    data = TokenData(tokens, tokens[:64], "random")
    short = TrainConfig(exit_layer=EXIT, rank=4, steps=3, batch_size=2, seq_len=16, eval_tokens=64)
    full = TrainConfig(**{**short.__dict__, "steps": 6})
    straight = train_head(model, data, full, progress=False)
    train_head(model, data, short, out=tmp_path, progress=False)
    with pytest.raises(ValueError, match="--resume"):
        train_head(model, data, full, out=tmp_path, progress=False)
    resumed = train_head(model, data, full, out=tmp_path, resume=True, progress=False)
    for a, b in zip(straight.head.adapter.parameters(), resumed.head.adapter.parameters()):
        assert torch.equal(a, b)


def test_cli_trains_a_head_that_generate_loads(saved_model, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n" * 40)
    out = tmp_path / "head"
    args = ["train-head", "--model", saved_model, "--exit-layer", "4", "--data", str(data), "--steps", "3",
            "--batch-size", "2", "--seq-len", "16", "--eval-tokens", "64", "--rank", "4", "--out", str(out),
            "--no-progress"]
    assert main(args) == 0
    assert "held-out greedy acceptance" in capsys.readouterr().out
    config = json.loads((out / "head_config.json").read_text())
    assert config["training"]["steps"] == 3 and str(data) in config["training"]["data"]
    generate_args = ["generate", "--model", saved_model, "--prompt", "def fib", "--max-new-tokens", "4",
                     "--exit-head", str(out)]
    assert main(generate_args + ["--exit-layer", "4"]) == 0
    assert main(generate_args + ["--exit-layer", "3"]) == 2
    assert "trained for exit layer E=4" in capsys.readouterr().err


def test_probe_reaches_the_last_entry_of_a_tensor_past_float32_precision():
    # 28,311,552 entries: SmolLM2-135M's embedding. float32 index arithmetic rounded past the end.
    from ppsd.heads.files import PROBE_VALUES, probe_values

    tensor = torch.zeros(49152 * 576)
    tensor[-1] = 7.0
    values = probe_values(tensor)
    assert len(values) == PROBE_VALUES
    assert values[-1] == 7.0 and values[:-1] == [0.0] * (PROBE_VALUES - 1)


def test_cached_teacher_trains_like_the_per_step_teacher(model):
    # One teacher pass kept in memory (float16), with the argmax cross-entropy added, must train
    # as well as a teacher pass per step (its batches are whole windows, so not bit-identical).
    tokens = random_tokens(2048)
    data = TokenData(tokens, tokens[:512], "random tokens")
    config = TrainConfig(**{**TRAIN.__dict__, "head_type": "layer", "cache_features": True, "ce_weight": 1.0})
    cached = train_head(model, data, config, progress=False)
    assert cached.after.head > cached.after.shared + 0.05
    assert cached.history[-1]["loss"] < cached.history[0]["loss"]


@pytest.mark.parametrize("field, value", [("lr", float("inf")), ("lr", float("nan")), ("ce_weight", float("inf")),
                                          ("draft_vocab", 0)])
def test_train_settings_out_of_range_are_refused_with_their_name(field, value):
    with pytest.raises(ValueError, match=f"{field}="):
        TrainConfig(**{**TRAIN.__dict__, field: value}).validated(8)


def test_chat_answers_read_alike_from_jsonl_and_from_gzip_appended_in_parts(tmp_path):
    from ppsd.heads.data import open_jsonl, read_chat_answers

    rows = [{"category": "c", "prompt": f"question {i}", "temperature": 0.0, "prompt_ids": [1, i],
             "answer_ids": [i, i + 1, 2]} for i in range(30)]
    plain, packed = tmp_path / "answers.jsonl", tmp_path / "answers.jsonl.gz"
    for part in (rows[:12], rows[12:]):  # appended in two runs, as build_chat_data extends a file
        for path in (plain, packed):
            with open_jsonl(path, "a") as sink:
                sink.writelines(json.dumps(r) + "\n" for r in part)
    a, b = read_chat_answers(str(plain)), read_chat_answers(str(packed))
    assert torch.equal(a.train, b.train) and torch.equal(a.heldout, b.heldout)
    assert len(a.train) + len(a.heldout) == sum(len(r["prompt_ids"]) + len(r["answer_ids"]) for r in rows)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"  # gzip
