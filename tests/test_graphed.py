"""The graphed executor (captured steps on a static KV cache; call by call against the in-process
executor, greedy and sampled: tests/test_conformance.py): a poisoned cache
changes nothing; a step's ops are the same at every position and for accepted and corrected
drafts, with no host read inside; one host read per call; a run that crosses a length bucket;
bf16 AR = EESD = PPSD. On a CPU the steps run eagerly; the tests marked `gpu` replay them as CUDA
graphs (tools/device_check.sh runs them). Nothing here asserts speed."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import ppsd
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.executors import InProcessExecutor
from ppsd.executors.runtime import GraphedExecutor
from ppsd.heads import build_head
from ppsd.trace import Stopwatch

from conftest import requires_cuda, tiny_llama
from test_conformance import Checked
from test_distributed import NEW_TOKENS, PROMPTS

HOST_READS = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::is_nonzero", "aten::equal"}


def with_layer_head(model: ppsd.StagedModel, exit_layer: int) -> ppsd.StagedModel:
    """The model drafting with a `layer` head over a 32-token draft vocabulary, its zero-started
    projections randomised so that its attention over the cache counts."""
    head = build_head("layer", model, exit_layer, draft_vocab=32)
    torch.manual_seed(1)
    with torch.no_grad():
        for weight in (head.adapter.o_proj.weight, head.adapter.mlp.down_proj.weight):
            weight.normal_(std=0.2)
    return model.with_exit_head(head)


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")


@pytest.fixture(scope="module")
def layer_model(model):
    return with_layer_head(model, 4)


class Poisoned(Checked):
    """Before every call, every cache entry past its layer's committed length holds a large value
    (`_poison`, per cache layout: the graphed executor's keys and values here)."""

    def _poison(self):
        cache = self.candidate.cache
        for layer, buffers in enumerate(zip(cache.keys, cache.values)):
            for buffer in buffers:
                if buffer is not None:  # None: no buffers yet (a cache of some layers: never)
                    buffer[:, :, cache.length(layer):] = 1e4

    def slot(self, feed, *, slot):
        self._poison()
        return super().slot(feed, slot=slot)

    def push(self, feed):
        self._poison()
        return super().push(feed)

    def flow(self):
        self._poison()
        return super().flow()


@pytest.mark.parametrize("method", ["ppsd", "eesd"])
def test_a_layer_head_drafts_from_the_static_cache_as_in_process_and_stale_entries_change_nothing(layer_model,
                                                                                                   method):
    partition = stage_layers(layer_model.num_layers, 4, 2)
    config = DecodeConfig(method=method, exit_layer=4, max_new_tokens=NEW_TOKENS)
    with GraphedExecutor(layer_model, partition) as graphed:
        twin = Poisoned(InProcessExecutor(layer_model, partition, Stopwatch()), graphed)
        result = ppsd.generate(layer_model, PROMPTS["long"], config, executor=twin)
    assert "corrected" in {t.status for t in result.tokens}  # rollbacks left stale entries behind


def describe(arg):
    """An op's argument as the op sees it: a tensor's shape and dtype (never its values)."""
    if isinstance(arg, torch.Tensor):
        return tuple(arg.shape), arg.dtype
    if isinstance(arg, (list, tuple)):
        return tuple(map(describe, arg))
    return repr(arg)


class Ops(TorchDispatchMode):
    """Every op dispatched, as (name, tensor shapes and dtypes, other arguments)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append((func._schema.name, tuple(map(describe, args)),
                         tuple((k, describe(v)) for k, v in sorted(kwargs.items()))))
        return func(*args, **kwargs)


def test_a_step_is_the_same_ops_at_every_position_and_verdict_with_no_host_read(layer_model, monkeypatch):
    partition = stage_layers(layer_model.num_layers, 4, 2)
    graphed = GraphedExecutor(layer_model, partition)
    recorded: dict[tuple, list] = {}
    step = graphed.steps.static_step

    def recording(k, bucket, draft):
        with Ops() as ops:
            out = step(k, bucket, draft)
        recorded.setdefault((k, bucket, draft), []).append(ops.ops)
        return out

    monkeypatch.setattr(graphed.steps, "static_step", recording)
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    result = ppsd.generate(layer_model, PROMPTS["long"], config, executor=graphed)
    assert {t.status for t in result.tokens} >= {"accepted", "corrected"}  # steps after both verdicts
    assert {(0, 64, True), (1, 64, False)} <= set(recorded)
    for key, sequences in recorded.items():
        assert len(sequences) > 5
        assert all(ops == sequences[0] for ops in sequences), f"stage {key[0] + 1}'s ops vary between calls"
        assert not HOST_READS & {name for name, *_ in sequences[0]}


class Counted:
    """An executor that counts the decoder's calls and forwards everything."""

    def __init__(self, executor) -> None:
        self.executor, self.calls = executor, 0

    def __getattr__(self, name):
        return getattr(self.executor, name)

    def slot(self, feed, *, slot):
        self.calls += 1
        return self.executor.slot(feed, slot=slot)

    def push(self, feed):
        self.calls += 1
        return self.executor.push(feed)

    def flow(self):
        self.calls += 1
        return self.executor.flow()


def test_one_host_read_per_call_and_none_anywhere_else_when_greedy(model):
    reads = []

    class Reads(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name in HOST_READS:
                reads.append(func._schema.name)
            return func(*args, **(kwargs or {}))

    graphed = GraphedExecutor(model, stage_layers(model.num_layers, 4, 2))
    counted = Counted(graphed)
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    with Reads():
        result = ppsd.generate(model, PROMPTS["long"], config, executor=counted)
    assert graphed.host_reads == counted.calls > NEW_TOKENS
    assert reads == []  # the decoder and sampler took the executor's ids, read with that one read
    assert len(result.tokens) == NEW_TOKENS


def test_a_run_that_crosses_a_length_bucket_grows_the_cache_and_stays_exact(model):
    prompt = list(range(2, 62))  # 60 tokens: the first bucket (64) ends inside the answer
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    expected = ppsd.generate(model, prompt, DecodeConfig(method="ar", exit_layer=4, max_new_tokens=NEW_TOKENS))
    partition = stage_layers(model.num_layers, 4, 2)
    with GraphedExecutor(model, partition) as graphed:
        twin = Checked(InProcessExecutor(model, partition, Stopwatch()), graphed)
        result = ppsd.generate(model, prompt, config, executor=twin)
        assert graphed.cache.capacity == 128
    assert result.token_ids == expected.token_ids


def test_prepared_for_a_run_the_cache_never_grows_inside_it_and_stays_exact(model, monkeypatch):
    """`prepare` makes room for every position a run reaches (`ppsd.executors.kinds.reach`:
    prompt, new tokens, drafts in flight) before the run: the run crossing the 64 bucket then
    neither reallocates the cache nor, on CUDA, captures a step (`test_on_cuda_...prepared...`)."""
    from ppsd.executors.kinds import reach
    from ppsd.setup import set_up
    from ppsd.static_cache import StaticKVCache, buckets_to, run_reach

    assert buckets_to(1) == (64,) and buckets_to(65) == (64, 128) and buckets_to(300) == (64, 128, 256, 512)
    assert run_reach(60, 20, 2, 4) == 90
    prompt = list(range(2, 62))
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    setup = set_up(model, config, prompt_ids=prompt)
    expected = ppsd.generate(setup.model, prompt, DecodeConfig(method="ar", exit_layer=4, max_new_tokens=NEW_TOKENS))
    with GraphedExecutor(setup.model, setup.partition) as graphed:
        graphed.prepare(reach(setup))
        assert graphed.cache.capacity == 128
        reallocated: list[bool] = []
        reserve = StaticKVCache.reserve
        monkeypatch.setattr(StaticKVCache, "reserve", lambda self, n: reallocated.append(reserve(self, n)) or
                            reallocated[-1])
        result = ppsd.generate(setup.model, prompt, config, executor=graphed)
        assert reallocated and not any(reallocated) and graphed.cache.capacity == 128
    assert result.token_ids == expected.token_ids


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_a_prepared_run_captures_nothing_inside_it(cuda_model):
    """Every bucket the run reaches is captured by `prepare`, for every stage, drafting or not."""
    from ppsd.executors.kinds import reach
    from ppsd.setup import set_up

    prompt = list(range(2, 62))
    config = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS)
    setup = set_up(cuda_model, config, prompt_ids=prompt)
    with GraphedExecutor(setup.model, setup.partition) as graphed:
        graphed.prepare(reach(setup))
        captured = dict(graphed.how.graphs)
        assert {bucket for _, bucket, _ in captured} == {64, 128}
        ppsd.generate(setup.model, prompt, config, executor=graphed)
        assert graphed.how.graphs == captured


def test_in_bf16_ar_eesd_and_ppsd_are_token_identical_on_the_graphed_steps():
    check_methods_agree(ppsd.StagedModel(tiny_llama().to(torch.bfloat16), name="tiny-llama-bf16"), GraphedExecutor)


def test_it_refuses_a_single_stage_or_another_device_in_words(model, monkeypatch):
    from dataclasses import replace

    with pytest.raises(ValueError, match="K >= 2 stages"):
        GraphedExecutor(model, (range(0, model.num_layers),))
    monkeypatch.setattr(model, "info", replace(model.info, device="mps"))
    with pytest.raises(ValueError, match="runs on CPU or CUDA, not mps"):
        GraphedExecutor(model, stage_layers(model.num_layers, 4, 2))


# On a GPU: the same steps captured and replayed as CUDA graphs, one stream per stage.


@pytest.fixture(scope="module")
def cuda_model():
    return with_layer_head(ppsd.StagedModel(tiny_llama().to("cuda"), name="tiny-llama"), 4)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_stages,exit_layer", [(2, 4), (3, 3)])
@pytest.mark.parametrize("method", ["ppsd", "eesd", "ar"])
def test_on_cuda_every_replayed_call_returns_what_the_in_process_executor_returns(cuda_model, method, num_stages,
                                                                                   exit_layer):
    model = cuda_model if exit_layer == 4 else with_layer_head(cuda_model, exit_layer)
    partition = stage_layers(model.num_layers, exit_layer, num_stages)
    config = DecodeConfig(method=method, exit_layer=exit_layer, num_stages=num_stages, max_new_tokens=NEW_TOKENS)
    with GraphedExecutor(model, partition) as graphed:
        twin = Checked(InProcessExecutor(model, partition, Stopwatch(torch.cuda.synchronize)), graphed)
        result = ppsd.generate(model, PROMPTS["long"], config, executor=twin)
        assert graphed.how.graphs  # replayed, not eager
    assert twin.calls > NEW_TOKENS and result.trace.concurrent


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_greedy_replays_equal_hugging_face_across_a_bucket_and_sampling_draws_the_same(cuda_model):
    check_replays_equal_hugging_face(cuda_model, GraphedExecutor)


def check_replays_equal_hugging_face(model, make) -> None:
    """On CUDA, with `make(model, partition)` (K = 2, E = 4): greedy AR, EESD and PPSD equal HF
    `generate()` across a length bucket (graphs captured at 64 and 128), and sampled PPSD draws
    what in-process PPSD draws. Shared by every executor that captures CUDA graphs."""
    prompt = list(range(2, 62))
    hf = model.hf_model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW_TOKENS, do_sample=False,
                                 min_new_tokens=NEW_TOKENS)[0, len(prompt):].tolist()
    sampled = DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=NEW_TOKENS, temperature=0.9, top_p=0.95, seed=7)
    with make(model, stage_layers(model.num_layers, 4, 2)) as executor:
        for method in ("ar", "eesd", "ppsd"):
            config = DecodeConfig(method=method, exit_layer=4, max_new_tokens=NEW_TOKENS)
            assert ppsd.generate(model, prompt, config, executor=executor).token_ids == hf, method
        assert {key[1] for key in executor.how.graphs} == {64, 128}
        drawn = ppsd.generate(model, PROMPTS["short"], sampled, executor=executor).token_ids
    assert drawn == ppsd.generate(model, PROMPTS["short"], sampled).token_ids


@pytest.mark.gpu
@requires_cuda
def test_on_cuda_in_bf16_ar_eesd_and_ppsd_are_token_identical():
    model = with_layer_head(ppsd.StagedModel(tiny_llama().to("cuda", torch.bfloat16), name="tiny-bf16"), 4)
    check_methods_agree(model, GraphedExecutor)


def check_methods_agree(model, make) -> None:
    """AR, EESD and PPSD on `make(model, partition)` (K = 2, E = 4) give the same tokens."""
    with make(model, stage_layers(model.num_layers, 4, 2)) as executor:
        outputs = {method: ppsd.generate(model, PROMPTS["long"], DecodeConfig(
            method=method, exit_layer=4, max_new_tokens=2 * NEW_TOKENS), executor=executor).token_ids
            for method in ("ar", "eesd", "ppsd")}
    assert outputs["ar"] == outputs["eesd"] == outputs["ppsd"]


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="compiled CPU steps need a C++ compiler (apt-get install -y g++)")
def test_compiled_steps_on_stage_threads_return_what_the_in_process_executor_returns(layer_model):
    """The CPU's fast path: each step compiled (Inductor, C++ wrapper), stages 2..K on threads."""
    partition = stage_layers(layer_model.num_layers, 4, 2)
    with GraphedExecutor(layer_model, partition, compiled=True) as graphed:
        assert graphed.concurrent
        for method in ("ppsd", "ar"):
            config = DecodeConfig(method=method, exit_layer=4, max_new_tokens=NEW_TOKENS)
            twin = Checked(InProcessExecutor(layer_model, partition, Stopwatch()), graphed)
            result = ppsd.generate(layer_model, PROMPTS["long"], config, executor=twin)
        assert graphed.how.compiled_keys >= {(0, 64, True), (0, 64, False), (1, 64, False)}
    assert result.trace.concurrent and twin.calls > NEW_TOKENS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the thread count the steps were compiled for above: no new compile
    try:
        with GraphedExecutor(layer_model, partition, compiled=True, stage_threads=False) as in_turn:
            assert not in_turn.concurrent  # AR alone, say, with every core the caller gives it
            alone = ppsd.generate(layer_model, PROMPTS["long"], config, executor=in_turn)
    finally:
        torch.set_num_threads(threads)
    assert alone.token_ids == result.token_ids and not alone.trace.concurrent
