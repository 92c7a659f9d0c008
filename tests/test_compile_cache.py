"""The compiled CPU steps kept beside the converted models (`ppsd.compile_cache`): one folder per
torch version and CPU under PPSD_CACHE, torch pointed at it, and checked like the model cache: a
damaged, foreign or unfinished entry is compiled again, and says so. No compile runs here: the
entries are files as torch writes them (the real compile is tests/test_graphed.py's)."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from ppsd import compile_cache


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh PPSD_CACHE, torch's cache variable restored afterwards, and no folder in use yet."""
    monkeypatch.setenv("PPSD_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.environ.get("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch")))
    monkeypatch.setattr(compile_cache, "_in_use", None)
    return tmp_path


def compiled_files(place) -> None:
    """Files as a finished compile leaves them: code, a library, a graph-cache entry, a lock."""
    inductor = place / "inductor"
    for name, data in (("ab/cab.cpp", b"// code"), ("ab/cab.so", b"\x7fELF"), ("fxgraph/x/fx1", b"graph"),
                       ("locks/cab.lock", b"")):
        (inductor / name).parent.mkdir(parents=True, exist_ok=True)
        (inductor / name).write_bytes(data)


def test_the_folder_is_under_ppsd_cache_keyed_by_torch_and_cpu(cache, monkeypatch):
    place = compile_cache.folder()
    assert place.parent == cache / "compiled"
    assert torch.__version__.replace("+", "_") in place.name and compile_cache.cpu_identity() in place.name
    monkeypatch.setattr(compile_cache, "cpu_identity", lambda: "x86_64-another")
    assert compile_cache.folder() != place  # another CPU never reads what this one compiled
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert "torch-9.9.9-" in compile_cache.folder().name


def test_use_points_torch_there_and_a_finished_compile_is_recorded_and_kept(cache, capsys):
    place = compile_cache.use()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(place / "inductor")  # what Inductor's FX-graph and AOTAutograd caches read
    assert not compile_cache.kept() and compile_cache.last_seconds() is None
    compiled_files(place)
    compile_cache.record(81.8)
    assert compile_cache.kept() and compile_cache.last_seconds() == pytest.approx(81.8)
    record = json.loads((place / compile_cache.RECORD).read_text())
    assert record["torch"] == torch.__version__ and record["cpu"] == compile_cache.cpu_identity()
    assert sorted(record["files"]) == ["inductor/ab/cab.cpp", "inductor/ab/cab.so", "inductor/fxgraph/x/fx1"]
    compile_cache.record()  # more steps compiled later: the time of the compile is kept
    assert compile_cache.last_seconds() == pytest.approx(81.8)
    compile_cache._in_use = None
    assert compile_cache.use() == place and (place / "inductor/ab/cab.so").exists()  # an intact one is used
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("spoil, said", [
    (lambda place: (place / "inductor/ab/cab.so").write_bytes(b"\x7fELX"), "cab.so does not match the sha256"),
    (lambda place: (place / "inductor/fxgraph/x/fx1").unlink(), "fx1 is missing"),
    (lambda place: _rewrite(place, torch="2.0.0"), "compiled by another torch ('2.0.0'"),
    (lambda place: _rewrite(place, cpu="aarch64-0123"), "compiled by another cpu ('aarch64-0123'"),
    (lambda place: (place / compile_cache.RECORD).write_text("{"), "unreadable"),
])
def test_a_damaged_foreign_or_unfinished_entry_is_compiled_again_and_says_so(cache, spoil, said):
    place = compile_cache.use()
    compiled_files(place)
    compile_cache.record(50.0)
    spoil(place)
    assert not compile_cache.kept()
    compile_cache._in_use = None
    told: list[str] = []
    assert compile_cache.use(told.append) == place
    assert len(told) == 1 and said in told[0] and told[0].endswith("Compiling them again")
    assert list((place / "inductor").iterdir()) == []  # moved aside: torch compiles afresh
    assert not compile_cache.kept()


def test_an_unfinished_compile_is_used_as_it_is(cache, capsys):
    """Files with no record yet: a compile cut short, or another process compiling now. Torch
    writes each entry whole, so they are used (and never pulled from under that process)."""
    place = compile_cache.use()
    compiled_files(place)
    compile_cache._in_use = None
    assert compile_cache.use() == place and (place / "inductor/ab/cab.so").exists()
    assert not compile_cache.kept() and capsys.readouterr().err == ""


def _rewrite(place, **changes) -> None:
    record = json.loads((place / compile_cache.RECORD).read_text())
    (place / compile_cache.RECORD).write_text(json.dumps(record | changes))


def test_measured_speeds_are_kept_per_model_and_kind_in_the_folder(cache):
    assert compile_cache.speeds("m") == {}
    compile_cache.note_speed("m", "processes", 15.4, 0.5)
    compile_cache.note_speed("m", "graphed", 19.9, 0.25)
    compile_cache.note_speed("m", "processes", 15.1, 1.5)  # the latest run counts
    compile_cache.note_speed("tiny", "processes", 180.0, 0.0)  # another model's speeds are its own
    kept = compile_cache.speeds("m")
    assert {k: (s.tokens_per_second, s.load) for k, s in kept.items()} == {"processes": (15.1, 1.5), "graphed": (19.9, 0.25)}
    assert all(abs(s.at - time.time()) < 60 for s in kept.values())  # when each was measured
    assert compile_cache.speeds("tiny")["processes"].tokens_per_second == 180.0
    assert (compile_cache.folder() / compile_cache.SPEEDS).is_file()


def test_speeds_kept_by_an_earlier_version_read_with_no_load(cache):
    (compile_cache.folder()).mkdir(parents=True, exist_ok=True)
    (compile_cache.folder() / compile_cache.SPEEDS).write_text(json.dumps({"m": {"processes": 15.4, "x": "fast"}}))
    assert compile_cache.speeds("m") == {"processes": compile_cache.Speed(15.4)}  # no load: stale for auto


def test_the_compile_and_the_restart_are_announced_with_what_this_machine_measured_last(cache):
    """Issue 58: "a minute or more" took 751 s under load, and a restart's "about 18 s" 44 s: the
    announcement says what this machine measured, or that it has not timed one yet."""
    from ppsd.choice import took_here

    compile_cache.use()
    assert took_here(False) == took_here(True) == " (not yet timed on this machine)"
    compile_cache.record(751.4)
    assert took_here(False) == " (it took 751 s here last time)"
    assert took_here(True) == " (not yet timed on this machine)"
    compile_cache.record(None, load_seconds=44.2)  # a restart: the compile's time kept beside the load's
    assert took_here(True) == " (it took 44 s here last time)" and compile_cache.last_seconds() == pytest.approx(751.4)
