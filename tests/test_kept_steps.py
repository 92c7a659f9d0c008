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
