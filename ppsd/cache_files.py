"""The converted-model cache's files, on disk: a checksum of every file written at conversion and
checked before use, the record of those checksums sealed by a checksum of its own, a folder
swapped in whole, and the one message of a full disk.

Boundary: files and folders only; which model goes where, and when to convert, is
`ppsd.model_source`'s.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import shutil
import stat
import tempfile
from pathlib import Path

COMPLETE_MARKER = "ppsd_source.json"  # written last, with the checksums: a folder without it is an interrupted conversion
SEAL = "record_sha256"  # the record's own checksum: of every other key, as canonical JSON


def sealed(record: dict) -> str:
    """`record` as the text of a record file, with its own checksum (`SEAL`): a record edited by
    hand (a checksum changed to fit overwritten weights) no longer matches it. It detects an edit,
    not a forger: whoever can write the cache can also recompute the seal."""
    body = {key: value for key, value in record.items() if key != SEAL}
    return json.dumps({**body, SEAL: _digest(body)}, indent=2) + "\n"


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def sha256_of(path: Path) -> str:
    """The file's sha256, read once per version of the file (a 98 MB GGUF takes a third of a
    second, and a server resolves the same name for its cache key and again to load it)."""
    info = Path(path).stat()
    return _sha256(str(Path(path).resolve()), info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def damage(directory: Path, *, weights: bool = True) -> str | None:
    """What is wrong with the converted model in `directory`, or None when it is whole: every
    file its record lists is a regular file of the recorded size and sha256 (hashed once per
    version of a file in a process, `sha256_of`), and the record matches its own checksum
    (`sealed`). No record at all is an unfinished conversion.
    With `weights` False the weight files (*.safetensors, 540 MB for the default model) are
    checked for their size alone: enough to read the config and tokenizer beside them."""
    try:
        record = json.loads((directory / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "not converted yet"
    except (OSError, ValueError) as error:
        return f"its {COMPLETE_MARKER} is unreadable ({getattr(error, 'strerror', None) or error})"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files:
        return "it has no checksums (converted by an earlier version)"
    for name, expected in files.items():
        size, sha256 = (expected.get("size"), expected.get("sha256")) if isinstance(expected, dict) else (None, None)
        if type(size) is not int or not isinstance(sha256, str):  # a record edited by hand, or garbage
            return f"its {COMPLETE_MARKER} records no size and sha256 for {name}"
        path = directory / name
        try:
            info = path.stat()
            if not stat.S_ISREG(info.st_mode):
                return f"{name} is not a regular file"
            if info.st_size != size:
                return f"{name} is {info.st_size:,} bytes, not the {size:,} written"
            if (weights or path.suffix != ".safetensors") and sha256_of(path) != sha256:
                return f"{name} does not match the sha256 recorded when it was written"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as error:
            return f"{name} cannot be read ({(error.strerror or 'an error of the file system').lower()})"
        except ValueError:  # a name with a NUL byte
            return f"its {COMPLETE_MARKER} names a file that cannot exist"
    return _unsealed(record)


def _unsealed(record: dict) -> str | None:
    """Why `record` is not as it was written (`sealed`), or None."""
    if SEAL not in record:
        return f"its {COMPLETE_MARKER} has no checksum of its own (written by an earlier version)"
    body = {key: value for key, value in record.items() if key != SEAL}
    if record[SEAL] != _digest(body):
        return f"its {COMPLETE_MARKER} was changed after it was written (its own checksum does not match)"
    return None


def checksums(folder: Path) -> dict[str, dict]:
    """{relative path: {"size", "sha256"}} of every file under `folder`."""
    return {str(path.relative_to(folder)): {"size": path.stat().st_size, "sha256": sha256_of(path)}
            for path in sorted(folder.rglob("*")) if path.is_file()}


def replace_folder(staging: Path, target: Path) -> None:
    """Put `staging` where `target` is, moving an old (damaged or interrupted) one aside first, so
    the window in which another process finds no model there is two renames long."""
    old = None
    if target.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{target.name}-old-", dir=target.parent))
        target.replace(old / target.name)
    staging.replace(target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class NoSpace(ValueError):
    """The model cache's disk is full: said as it is everywhere (the page too), as it names no
    visitor's path, only the server's cache and what to do."""


def no_space(folder: Path, *, needed: int | None, doing: str) -> NoSpace:
    """The one-line message of a full disk: where, how much is needed and free, what to do."""
    try:
        free = f", {shutil.disk_usage(folder).free / 1e6:,.0f} MB free"
    except OSError:
        free = ""
    size = f"about {max(1, round(needed / 1e6)):,} MB" if needed else "more space"
    return NoSpace(f"no space left in the model cache {folder} for {doing}: it needs {size}{free}; "
                   "free some space there, or set PPSD_CACHE to a folder with room")


def space_needed(gguf: Path) -> int | None:
    """Bytes the conversion of `gguf` writes: its weights as float32 (read from the GGUF's tensor
    list, about 2 s), plus a tenth of the GGUF's size for the tokenizer files (3.5 MB of 98 MB for
    the default model). None when the file cannot be read as a GGUF."""
    try:
        from gguf import GGUFReader

        elements = sum(int(tensor.n_elements) for tensor in GGUFReader(str(gguf)).tensors)
    except Exception:  # noqa: BLE001 - a bad file is reported by the conversion itself
        return None
    return 4 * elements + gguf.stat().st_size // 10
