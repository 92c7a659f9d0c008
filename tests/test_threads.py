"""The threads executor (call by call against the in-process executor: tests/test_conformance.py):
greedy AR, EESD and PPSD token-identical to in-process AR and to Hugging Face; a measured, concurrent trace that
validates; it runs inside a daemonic process, where worker processes cannot start. Nothing here
asserts speed."""

from __future__ import annotations

import multiprocessing

import pytest
import torch

import ppsd
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.executors import InProcessExecutor
from ppsd.executors.runtime import ThreadedExecutor
from ppsd.trace import Stopwatch

from conftest import requires_cuda, tiny_llama
from test_distributed import NEW_TOKENS, PROMPTS, Twin


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")




@pytest.mark.parametrize("method", ["ar", "eesd", "ppsd"])
def test_greedy_output_equals_in_process_ar_and_hugging_face(model, method):
    config = DecodeConfig(method=method, exit_layer=4, num_stages=2, max_new_tokens=NEW_TOKENS)
    expected = ppsd.generate(model, PROMPTS["long"], DecodeConfig(method="ar", exit_layer=4, max_new_tokens=NEW_TOKENS))
    hf = model.hf_model.generate(torch.tensor([PROMPTS["long"]]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS)[0, len(PROMPTS["long"]):].tolist()
    threads_before = torch.get_num_threads()
    with ThreadedExecutor(model, stage_layers(model.num_layers, 4, 2)) as threads:
        result = ppsd.generate(model, PROMPTS["long"], config, executor=threads)
    assert result.token_ids == expected.token_ids == hf
    assert result.trace.clock == "measured" and result.trace.concurrent  # validated by generate
    assert torch.get_num_threads() == threads_before  # the caller's threads are given back




def test_it_refuses_a_device_it_cannot_overlap_on_in_words(model, monkeypatch):
    from dataclasses import replace

    monkeypatch.setattr(model, "info", replace(model.info, device="mps"))
    with pytest.raises(ValueError, match="runs on CPU or CUDA, not mps"):
        ThreadedExecutor(model, stage_layers(model.num_layers, 4, 2))



@pytest.fixture(scope="module")
def cuda_model():
    return ppsd.StagedModel(tiny_llama().to("cuda"), name="tiny-llama")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_stages,exit_layer", [(2, 4), (3, 3)])
@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
def test_on_cuda_every_call_on_streams_returns_what_the_in_process_executor_returns(cuda_model, method, num_stages,
                                                                                     exit_layer):
    partition = stage_layers(cuda_model.num_layers, exit_layer, num_stages)
    config = DecodeConfig(method=method, exit_layer=exit_layer, num_stages=num_stages, max_new_tokens=NEW_TOKENS)
    with ThreadedExecutor(cuda_model, partition) as threads:
        assert len(threads.where.streams) == num_stages  # a stream per stage
        twin = Twin(InProcessExecutor(cuda_model, partition, Stopwatch(torch.cuda.synchronize)), threads)
        result = ppsd.generate(cuda_model, PROMPTS["long"], config, executor=twin)
    assert twin.calls > NEW_TOKENS and result.trace.concurrent


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_greedy_on_streams_equals_hugging_face_and_sampling_draws_the_same(cuda_model):
    partition = stage_layers(cuda_model.num_layers, 4, 2)
    greedy = DecodeConfig(method="ppsd", exit_layer=4, num_stages=2, max_new_tokens=NEW_TOKENS)
    ids = torch.tensor([PROMPTS["long"]], device="cuda")
    hf = cuda_model.hf_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                      min_new_tokens=NEW_TOKENS)[0, len(PROMPTS["long"]):].tolist()
    sampled = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7)
    with ThreadedExecutor(cuda_model, partition, Stopwatch(torch.cuda.synchronize)) as threads:
        result = ppsd.generate(cuda_model, PROMPTS["long"], greedy, executor=threads)
        drawn = ppsd.generate(cuda_model, PROMPTS["short"], sampled, executor=threads).token_ids
    assert result.token_ids == hf
    assert result.trace.clock == "measured" and result.trace.concurrent  # CUDA-event times, validated
    assert drawn == ppsd.generate(cuda_model, PROMPTS["short"], sampled).token_ids



def _decode_in_a_daemon(answer) -> None:
    model = ppsd.StagedModel(tiny_llama(), name="tiny-llama")
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=8)
    with ThreadedExecutor(model, stage_layers(model.num_layers, 4, 2)) as threads:
        result = ppsd.generate(model, PROMPTS["short"], config, executor=threads)
    answer.put((result.token_ids, ppsd.generate(model, PROMPTS["short"], config).token_ids))


def test_it_decodes_inside_a_daemonic_process_as_a_zerogpu_call_runs():
    context = multiprocessing.get_context("spawn")
    answer = context.Queue()
    child = context.Process(target=_decode_in_a_daemon, args=(answer,), daemon=True)
    child.start()
    try:
        threaded, in_process = answer.get(timeout=120)
    finally:
        child.join(timeout=10)
    assert threaded == in_process and len(threaded) == 8
