"""The stacked executor: a slot is one chain of L/K stacked layers for every set of live rows,
the same ops at every position and verdict, with no host read inside; a poisoned cache changes
nothing; a run across a length bucket stays exact; a correction discards the slot in flight and
the run stays exact; a layer exit head drafts from the packed cache; bf16 AR = EESD = PPSD.
(Call by call against the in-process executor: tests/test_conformance.py.) On a CPU the slots
run eagerly; their CUDA graphs are the device check's. Nothing here asserts speed."""

from __future__ import annotations

from itertools import combinations

import pytest
import torch

import ppsd
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.executors import Feed, InProcessExecutor
from ppsd.executors.stacked import StackedExecutor
from ppsd.trace import Stopwatch

from conftest import requires_cuda, tiny_llama
from test_conformance import Checked
from test_distributed import NEW_TOKENS, PROMPTS
from test_graphed import (HOST_READS, Ops, Poisoned, check_methods_agree, check_replays_equal_hugging_face,
                          with_layer_head)


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")


@pytest.mark.parametrize("num_stages,exit_layer", [(3, 3), (2, 3)])
def test_a_slot_is_one_chain_of_stacked_layers_for_every_set_of_live_rows(model, num_stages, exit_layer):
    partition = stage_layers(model.num_layers, exit_layer, num_stages)
    executor = StackedExecutor(model, partition)
    executor.cache.reserve(64)
    for size in range(1, num_stages + 1):
        for live in combinations(range(num_stages), size):
            steps = max(len(partition[k]) for k in range(live[0], live[-1] + 1))  # no pads past the longest
            for draft in ((False, True) if live[0] == 0 else (False,)):
                with Ops() as ops:
                    executor.step.run(0, 64, live, draft)
                names = [name for name, *_ in ops.ops]
                products = [args for name, args, _ in ops.ops if name == "aten::bmm"]
                # Four products a layer (QKV, output, gate/up, down), each over the rows lo..hi at once.
                assert len(products) == 4 * steps, (live, draft)
                assert {args[0][0][0] for args in products} == {live[-1] - live[0] + 1}
                assert names.count("aten::scaled_dot_product_attention") + \
                    names.count("aten::_scaled_dot_product_flash_attention_for_cpu") >= steps
                assert not HOST_READS & set(names)


def test_the_ops_are_the_same_at_every_position_and_verdict(model, monkeypatch):
    layer_model = with_layer_head(model, 4)
    executor = StackedExecutor(layer_model, stage_layers(model.num_layers, 4, 2))
    recorded: dict[tuple, list] = {}
    step = executor.step.run

    def recording(parity, bucket, live, draft):
        with Ops() as ops:
            out = step(parity, bucket, live, draft)
        recorded.setdefault((bucket, live, draft), []).append(ops.ops)
        return out

    monkeypatch.setattr(executor.step, "run", recording)
    result = ppsd.generate(layer_model, PROMPTS["long"], DecodeConfig(method="ppsd", exit_layer=4,
                                                                      max_new_tokens=NEW_TOKENS), executor=executor)
    assert {t.status for t in result.tokens} >= {"accepted", "corrected"}
    assert (64, (0, 1), True) in recorded and len(recorded[(64, (0, 1), True)]) > 5
    for key, sequences in recorded.items():
        # The first slot of a kind may do one-time work (a head slices its vocabulary once), as a
        # CUDA graph's warm-up runs do before its capture; every later slot runs the same ops.
        sequences = sequences[1:] or sequences
        assert all(ops == sequences[0] for ops in sequences), f"{key}: the ops vary between slots"
        assert not HOST_READS & {name for name, *_ in sequences[0]}


class StackedPoisoned(Poisoned):
    """Before every call, every cache entry at or past its layer's length, and the scratch layer,
    hold a large value (the slot in flight is off: it writes past the lengths ahead of time)."""

    def _poison(self):
        cache = self.candidate.cache
        for layer in range(cache.num_layers if cache.capacity else 0):
            cache.kv[:, layer, :, cache.length(layer):] = 1e4


@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
def test_a_poisoned_cache_changes_nothing(model, method):
    layer_model = with_layer_head(model, 4)
    partition = stage_layers(model.num_layers, 4, 2)
    config = DecodeConfig(method=method, exit_layer=4, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(layer_model, partition, lookahead=False) as stacked:
        twin = StackedPoisoned(InProcessExecutor(layer_model, partition, Stopwatch()), stacked)
        ppsd.generate(layer_model, PROMPTS["long"], config, executor=twin)
    assert twin.calls > NEW_TOKENS


def test_a_run_that_crosses_a_length_bucket_stays_exact(model):
    prompt = list(range(2, 62))  # 60 tokens: the first bucket (64) ends inside the answer
    partition = stage_layers(model.num_layers, 4, 2)
    expected = ppsd.generate(model, prompt, DecodeConfig(method="ar", exit_layer=4, max_new_tokens=NEW_TOKENS))
    with StackedExecutor(model, partition) as stacked:
        twin = Checked(InProcessExecutor(model, partition, Stopwatch()), stacked)
        result = ppsd.generate(model, prompt, DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS),
                               executor=twin)
        assert stacked.cache.capacity == 128
    assert result.token_ids == expected.token_ids


def test_a_correction_discards_the_slot_in_flight(model):
    partition = stage_layers(model.num_layers, 4, 2)
    prompt = PROMPTS["long"]
    with StackedExecutor(model, partition) as stacked:
        stacked.begin(Stopwatch())
        stacked.push(Feed(0, tuple(prompt), "prefill"))
        first = stacked.flow().final_best[-1]
        out = stacked.slot(Feed(len(prompt), (first,), "draft", from_final=True), slot=0)
        guessed = stacked._inflight
        assert guessed is not None and guessed.guessed_feed() == Feed(len(prompt) + 1, (out.exit_best,), "draft")
        stacked.rollback(len(prompt))  # as a correction does: the guess is never adopted
        assert stacked._inflight is None and stacked.stats.discarded == 1
        assert [stacked.cache.length(i) for i in range(model.num_layers)] == [len(prompt)] * model.num_layers
        again = stacked.slot(Feed(len(prompt), (first,), "draft", from_final=True), slot=1)
        stacked.end()
    torch.testing.assert_close(again.exit_logits, out.exit_logits)
    # A whole run: every correction discards one slot, and the run commits in-process AR's tokens.
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(model, partition) as stacked:
        result = ppsd.generate(model, prompt, config, executor=stacked)
        corrections = sum(t.status == "corrected" for t in result.tokens)
        assert corrections > 0 and stacked.stats.discarded >= corrections
    assert result.token_ids == ppsd.generate(model, prompt, DecodeConfig(method="ar", exit_layer=4,
                                                                         max_new_tokens=NEW_TOKENS)).token_ids


@pytest.mark.parametrize("method", ["ppsd", "eesd"])
def test_a_layer_head_drafts_from_the_packed_cache_as_in_process(model, method):
    layer_model = with_layer_head(model, 4)
    partition = stage_layers(model.num_layers, 4, 2)
    config = DecodeConfig(method=method, exit_layer=4, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(layer_model, partition) as stacked:
        twin = Checked(InProcessExecutor(layer_model, partition, Stopwatch()), stacked)
        result = ppsd.generate(layer_model, PROMPTS["long"], config, executor=twin)
    assert "corrected" in {t.status for t in result.tokens}


def test_in_bf16_ar_eesd_and_ppsd_are_token_identical_on_the_stacked_engine():
    check_methods_agree(ppsd.StagedModel(tiny_llama().to(torch.bfloat16), name="tiny-llama-bf16"), StackedExecutor)


def test_it_refuses_a_single_stage_or_another_device_in_words(model, monkeypatch):
    from dataclasses import replace

    with pytest.raises(ValueError, match="K >= 2 stages"):
        StackedExecutor(model, (range(0, model.num_layers),))
    monkeypatch.setattr(model, "info", replace(model.info, device="mps"))
    with pytest.raises(ValueError, match="runs on CPU or CUDA, not mps"):
        StackedExecutor(model, stage_layers(model.num_layers, 4, 2))


# On a GPU: the same slots captured and replayed as CUDA graphs (tools/device_check.sh runs these).


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_stages,exit_layer", [(2, 4), (3, 3), (2, 3)])
@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
def test_on_cuda_every_replayed_call_returns_what_the_in_process_executor_returns(method, num_stages, exit_layer):
    model = with_layer_head(ppsd.StagedModel(tiny_llama().to("cuda"), name="tiny-llama"), exit_layer)
    partition = stage_layers(model.num_layers, exit_layer, num_stages)
    config = DecodeConfig(method=method, exit_layer=exit_layer, num_stages=num_stages, max_new_tokens=NEW_TOKENS)
    with StackedExecutor(model, partition) as stacked:
        twin = Checked(InProcessExecutor(model, partition, Stopwatch(torch.cuda.synchronize)), stacked)
        result = ppsd.generate(model, PROMPTS["long"], config, executor=twin)
        assert stacked.backend.graphs or method == "eesd"  # slots replayed, not eager
    assert twin.calls > NEW_TOKENS and result.trace.concurrent


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_greedy_replays_equal_hugging_face_across_a_bucket_and_sampling_draws_the_same():
    model = with_layer_head(ppsd.StagedModel(tiny_llama().to("cuda"), name="tiny-llama"), 4)
    check_replays_equal_hugging_face(model, StackedExecutor)


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_in_bf16_ar_eesd_and_ppsd_are_token_identical():
    check_methods_agree(ppsd.StagedModel(tiny_llama().to("cuda", torch.bfloat16), name="tiny-bf16"), StackedExecutor)


@pytest.mark.parametrize("acceptance", [0.0, 0.5, 1.0])
def test_forced_acceptance_replaces_each_verdict_with_a_seeded_coin(model, acceptance):
    """For timing only: the work of a run at acceptance a, on any weights (the tokens are not the model's)."""
    from ppsd.bench.forced import ForcedAcceptance

    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=2 * NEW_TOKENS)
    runs = []
    for _ in range(2):
        with StackedExecutor(model, stage_layers(model.num_layers, 4, 2)) as stacked:
            forced = ForcedAcceptance(stacked, acceptance, vocab_size=model.info.vocab_size, seed=3)
            runs.append(ppsd.generate(model, PROMPTS["long"], config, executor=forced))
    statuses = [t.status for t in runs[0].tokens if t.status != "verified"]
    assert forced.forced == len(statuses) > NEW_TOKENS // 2
    if acceptance in (0.0, 1.0):
        assert set(statuses) == {"accepted" if acceptance else "corrected"}
    else:
        assert set(statuses) == {"accepted", "corrected"}
    assert runs[0].token_ids == runs[1].token_ids  # seeded


def test_a_sampled_run_stops_guessing_tokens_after_its_first_draw_differs(model):
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7)
    expected = ppsd.generate(model, PROMPTS["short"], config)
    with StackedExecutor(model, stage_layers(model.num_layers, 4, 2)) as stacked:
        result = ppsd.generate(model, PROMPTS["short"], config, executor=stacked)
        corrections = sum(t.status == "corrected" for t in result.tokens)
        assert stacked.stats.discarded <= corrections + 2  # not a slot thrown away at every draw
    assert result.token_ids == expected.token_ids
