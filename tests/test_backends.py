"""The executors' shape where devices differ: each kind of the one runtime, and the stacked
executor, choose their backends when built (`ppsd.executors.backends`: where the stages run and
how a step runs), so no other function of theirs, their steps' or their backends' branches on the
device, the compiler or the stage threads; every executor in this process takes a stage's input
off its queue in one place (`ppsd.executors.waiting`); each kind builds the pair its device and
options ask for."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import ppsd
from ppsd.config import stage_layers
from ppsd.executors.backends.cpu import Clocked, CompiledStep, EagerSlots, EagerStep
from ppsd.executors.backends.stage_threads import Here, StageThreads
from ppsd.executors.runtime import GraphedExecutor, InProcessExecutor, ThreadedExecutor
from ppsd.executors.stacked import StackedExecutor

from ppsd.trace import Stopwatch

from conftest import tiny_llama

EXECUTORS = Path(__file__).resolve().parent.parent / "ppsd" / "executors"
CHOSEN_ONCE = [EXECUTORS / name for name in ("runtime.py", "stage_steps.py", "stacked.py", "stacked_step.py")] + \
    sorted((EXECUTORS / "backends").glob("*.py"))
CHOICES = {"cuda", "compiled", "threads", "stage_threads"}
BUILDERS = {"__init__", "_backend"}  # where the choice is made, once


def _names(node: ast.AST) -> set[str]:
    """The names a condition reads: variables, attributes, and "cuda" in a `startswith` call."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("cuda"):
            found.add("cuda")
    return found


def _device_branches(path: Path) -> list[str]:
    branches = []
    for function in ast.walk(ast.parse(path.read_text())):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) or function.name in BUILDERS:
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.If, ast.IfExp, ast.While)) and _names(node.test) & CHOICES:
                branches.append(f"{path.name}:{node.lineno} in {function.name}")
    return branches


def test_no_function_past_the_constructor_branches_on_the_device():
    branches = [b for path in CHOSEN_ONCE for b in _device_branches(path)]
    assert not branches


def test_a_stage_input_is_taken_off_its_queue_in_one_place():
    takers = {p.name for p in EXECUTORS.glob("*.py") if "popleft" in p.read_text()}
    assert takers == {"waiting.py"}


def test_one_forward_and_one_rollback_serve_every_executor():
    """Issue 59: every executor's stages (the runtime's steps, the K-process coordinator's stage 1
    and its workers' stages) run one forward, `base.stage_forward`; in this process only the
    runtime plans calls and truncates the cache (the stacked executor and the K-process
    coordinator are runtimes), and each worker process its own cache."""
    def using(pattern: str) -> set[str]:
        return {str(p.relative_to(EXECUTORS)) for p in EXECUTORS.rglob("*.py") if re.search(pattern, p.read_text())}

    assert using(r"run_static\(") == {"base.py"}
    assert using(r"\.truncate\(") == {"runtime.py", "distributed/worker.py"}
    assert using(r"schedule\.(slot|enter|flow|advance)\(") == {"runtime.py", "stacked.py"}


@pytest.fixture(scope="module")
def model():
    return ppsd.StagedModel(tiny_llama(), name="tiny-llama")


def test_each_executor_builds_the_backend_its_options_ask_for(model, monkeypatch):
    partition = stage_layers(model.num_layers, 4, 2)
    monkeypatch.setattr("ppsd.executors.backends.cpu._configure_compiler", lambda: None)  # nothing compiles here

    def built(kind=GraphedExecutor, *args, **options):
        with kind(model, partition, *args, **options) as executor:
            where = executor.where
            return type(where), type(where.pool), type(executor.how), executor.concurrent

    assert built() == (Clocked, Here, EagerStep, False)
    assert built(compiled=True) == (Clocked, StageThreads, CompiledStep, True)
    assert built(compiled=True, stage_threads=False) == (Clocked, Here, CompiledStep, False)
    assert built(InProcessExecutor, Stopwatch()) == (Clocked, Here, EagerStep, False)
    assert built(ThreadedExecutor) == (Clocked, StageThreads, EagerStep, True)
    with StackedExecutor(model, partition) as stacked:
        assert type(stacked.backend) is EagerSlots


def test_the_library_has_one_kv_cache_and_one_forward():
    """Issue 59: one KV cache (the static one, whose views are what Hugging Face's attention
    writes through: the only `update(key, value, layer_idx)` in the library) and one forward over
    the model's layers (`StagedModel.run_static`), on every executor's hot path and off it."""
    library = EXECUTORS.parent
    writers = {str(p.relative_to(library)) for p in library.rglob("*.py") if "def update(self, key" in p.read_text()}
    assert writers == {"static_cache.py"}
    assert not hasattr(ppsd.StagedModel, "run_layers")


@pytest.mark.parametrize("kind", ["in-process", "threads", "graphed"])
def test_every_in_process_kind_decodes_on_the_static_cache_alone(model, kind):
    from ppsd import DecodeConfig
    from ppsd.static_cache import StaticKVCache

    partition = stage_layers(model.num_layers, 4, 2)
    build = {"in-process": lambda: InProcessExecutor(model, partition, Stopwatch()),
             "threads": lambda: ThreadedExecutor(model, partition), "graphed": lambda: GraphedExecutor(model, partition)}
    with build[kind]() as executor:
        assert type(executor.cache) is StaticKVCache
        result = ppsd.generate(model, [3, 1, 4, 1, 5], DecodeConfig(method="ppsd", exit_layer=4, max_new_tokens=6),
                               executor=executor)
    assert len(result.token_ids) == 6
