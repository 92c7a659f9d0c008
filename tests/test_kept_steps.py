"""Compiled steps kept whole (`ppsd.kept_steps`): compiled ahead of time once, saved in the
compile cache's folder under a key that holds what dynamo's guards would check, and loaded by a
new process without tracing; what the loaded step computes equals the function's own result.
A toy step on a holder of static buffers stands for the captured steps (tests/test_graphed.py
runs the real ones through the same path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not any(os.access(os.path.join(p, c), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep)
            for c in ("g++", "c++")), reason="the compiled steps need a C++ compiler (apt-get install -y g++)")

SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    from ppsd import compile_cache
    from ppsd.kept_steps import KeptSteps
    import torch._dynamo.utils as dynamo_utils

    torch._inductor.config.cpp_wrapper = True
    torch.set_num_threads(1)

    class Holder:
        def __init__(self):
            torch.manual_seed(0)
            self.weight = torch.randn(8, 8)
            self.buffer = torch.zeros(4, 8)
            self.position = torch.zeros(1, dtype=torch.long)

        def step(self, k, draft):
            hidden = (self.buffer[self.position] + k) @ self.weight
            self.buffer.index_copy_(0, self.position, hidden)
            return hidden.relu() if draft else hidden

    steps, holder, twin = KeptSteps(Holder.step), Holder(), Holder()
    out = []
    with torch.inference_mode():
        for position, k, draft in ((1, 0, True), (2, 1, False), (3, 0, True)):
            for h in (holder, twin):
                h.position.fill_(position)
            got = steps(holder, k, draft, shape_key="toy-4x8")
            want = Holder.step(twin, k, draft)
            out.append(torch.equal(got, want) and torch.equal(holder.buffer, twin.buffer))
    compile_cache.record(1.0)
    print(json.dumps({"equal": out, "frames": dynamo_utils.counters["stats"]["unique_graphs"],
                      "files": sorted(p.name for p in (compile_cache.folder() / compile_cache.STEPS).iterdir())}))
""")


def run(cache: Path) -> dict:
    env = {**os.environ, "PPSD_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_step_compiled_once_is_loaded_by_the_next_process_without_tracing_and_computes_the_same(tmp_path):
    first = run(tmp_path)
    assert first["equal"] == [True, True, True]
    assert len(first["files"]) == 2  # one file a key: (stage 0, drafting) and (stage 1, not)
    assert first["frames"] == 2  # traced by dynamo once each
    again = run(tmp_path)
    assert again["equal"] == [True, True, True] and again["files"] == first["files"]
    assert again["frames"] == 0  # loaded whole: nothing traced
    from ppsd import compile_cache  # the folder's record covers the kept steps like torch's own files

    record = json.loads(next((tmp_path / "compiled").glob("torch-*/" + compile_cache.RECORD)).read_text())
    assert sum(name.startswith(compile_cache.STEPS + "/") for name in record["files"]) == 2


def test_a_kept_step_that_does_not_load_is_compiled_again_and_the_rest_still_load(tmp_path):
    first = run(tmp_path)
    steps = next((tmp_path / "compiled").glob("torch-*/steps"))
    spoiled = steps / first["files"][0]
    spoiled.write_bytes(b"not a compiled function")
    (steps.parent / "ppsd_source.json").unlink()  # as after a Run that compiled a step the record does not list yet
    again = run(tmp_path)
    assert again["equal"] == [True, True, True]
    assert again["frames"] == 1  # the spoiled one traced and compiled again, the other loaded
    assert spoiled.read_bytes() != b"not a compiled function"


def test_steps_of_another_version_of_the_code_are_not_called_kept_and_are_pruned(tmp_path, monkeypatch):
    from ppsd import compile_cache, kept_steps

    monkeypatch.setenv("PPSD_CACHE", str(tmp_path))
    monkeypatch.setattr(compile_cache, "_in_use", None)
    steps = compile_cache.folder() / compile_cache.STEPS
    steps.mkdir(parents=True)
    assert not kept_steps.kept()
    (steps / "0123456789abcdef-old.pt2").write_bytes(b"compiled by other code")
    assert not kept_steps.kept()  # a build of this code compiles (and says so), it does not load
    ours = steps / f"{kept_steps.source_key()[:16]}-new.pt2"
    ours.write_bytes(b"ours")
    assert kept_steps.kept()
    kept_steps.prune()
    assert sorted(p.name for p in steps.iterdir()) == [ours.name]


HEAD_SCRIPT = textwrap.dedent("""
    import sys, torch
    from ppsd.model import load_model
    from ppsd.heads.exits import build_head
    from ppsd.heads.files import HeadConfig, fingerprint, save_exit_head

    model, _ = load_model(sys.argv[1], device="cpu")
    torch.manual_seed(1)
    head = build_head("lowrank", model, 2, rank=4, draft_vocab=60)
    head.adapter.draft_vocab.copy_(torch.randperm(model.info.vocab_size)[:60].sort().values)
    torch.nn.init.normal_(head.adapter.up.weight, std=0.02)
    save_exit_head(head, sys.argv[2], HeadConfig("lowrank", 2, "ppsd-tiny", fingerprint(model), rank=4,
                                                  draft_vocab=60, stages=2))
""")
TINY = str(ROOT / "assets" / "models" / "ppsd-tiny")


def generate(cache: Path, method: str, executor: str, head: str) -> list[int]:
    """`python -m ppsd generate` in a process of its own on `cache`: its token ids (exit 0 asserted)."""
    env = {**os.environ, "PPSD_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "ppsd", "generate", "--model", TINY, "--prompt", "Once upon a time",
                           "--no-chat", "--json", "--max-new-tokens", "24", "--method", method, "--executor", executor,
                           "--exit-head", head, "--exit-layer", "2", "--threads", "1"],
                          env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, f"{method} on {executor} with head {head}: {done.stderr[-3000:]}"
    return [t["id"] for t in json.loads(done.stdout)["tokens"]]


@pytest.mark.parametrize("order", [("ppsd", "ar", "eesd"), ("ar", "ppsd", "eesd")])
def test_kept_steps_with_a_trained_head_run_in_any_order_in_new_processes_and_give_ar_s_tokens(tmp_path, order):
    """Issue 56: a step compiled in one process and order, then loaded in another, read the head's
    lazily made vocabulary slice and crashed (or could compute from a stale one). Here every method
    runs in a process of its own on one cache (the first compiles, the rest load), with a trained
    head that drafts from 60 tokens, then with the shared head, and gives in-process AR's tokens."""
    head = tmp_path / "head"
    made = subprocess.run([sys.executable, "-c", HEAD_SCRIPT, TINY, str(head)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert made.returncode == 0, made.stderr[-2000:]
    want = generate(tmp_path, "ar", "in-process", str(head))
    for method in order:
        assert generate(tmp_path, method, "graphed", str(head)) == want, method
    assert generate(tmp_path, order[0], "graphed", "shared") == want  # another head, another key: never its steps
