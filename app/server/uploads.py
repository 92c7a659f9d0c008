"""Each upload its own file: Gradio stores an upload by its content (`<folder>/<sha256>/<name>`),
so two visitors sending the same file got the same path, and the first to open it (which deletes
it, `app.replay.read_upload`) took it from the second. `own_paths` gives each upload's files a
home of their own (`<sha256>/<random>/<name>`, a hard link, so no byte is copied) before their
paths go back to the client, and puts those paths, not the shared one, in the set Gradio's
sweep deletes from.

Boundary: files in the upload folder and the JSON list of paths Gradio's upload route answers
with; `app.server.guard` calls it on that answer. No limits, no ASGI.
"""

from __future__ import annotations

import glob
import json
import os
import secrets
import shutil
from pathlib import Path


class Lost(OSError):
    """An uploaded file went before it got its own path (a twin's owner opened it at once)."""


def own_paths(answer: bytes, kept: set, folder: str) -> bytes:
    """Gradio's answer to an upload (a JSON list of stored paths) with each path moved to a home
    of its own under `folder`; `kept` (Gradio's `upload_file_set`) holds the new paths instead.
    An answer that is not such a list is left as it is. Raises `Lost` (nothing kept) when a file
    is gone before it was moved."""
    try:
        paths = json.loads(answer)
    except ValueError:
        return answer
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        return answer
    root = Path(folder).resolve()
    owned = []
    try:
        for path in paths:
            owned.append(str(_own(Path(path), root)) if Path(path).resolve().is_relative_to(root) else path)
    except Lost:
        for path in owned:
            discard(path, folder)
        raise
    finally:
        kept.difference_update(paths)
    kept.update(owned)
    return json.dumps(owned).encode()


def _own(shared: Path, root: Path) -> Path:
    """`shared` (`<sha>/<name>`) as `<sha>/<random>/<name>`. Two uploads of one content at once
    may both have been stored at `shared`, and the first to be moved takes it: the second then
    links to the first's home, which holds the same bytes (the same content, the same name)."""
    home = shared.parent / secrets.token_hex(8)
    home.mkdir()
    own = home / shared.name
    try:
        _link(shared, own)
    except FileNotFoundError:
        twin = next((p for p in shared.parent.glob(f"*/{glob.escape(shared.name)}") if p != own and p.is_file()), None)
        try:
            if twin is None:
                raise FileNotFoundError(shared)
            _link(twin, own)
        except FileNotFoundError:
            home.rmdir()
            raise Lost(f"{shared.name} was gone before it was kept") from None
    shared.unlink(missing_ok=True)
    return own


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except FileNotFoundError:
        raise
    except OSError:  # a file system without hard links: a copy of its own
        shutil.copyfile(source, target)


def discard(path: str | Path, folder: str | Path) -> None:
    """Delete the upload at `path`, and its own home, if it lies in `folder` (never a file outside
    it); a file already gone is no error. The content's folder above stays: an upload of the same
    content may be landing in it now."""
    path, root = Path(path), Path(folder).resolve()
    try:
        if not path.resolve().is_relative_to(root):
            return
        path.unlink(missing_ok=True)
        home = path.parent.resolve()
        if home.parent != root and home.parent.is_relative_to(root):  # <sha>/<random>/, this upload's alone
            home.rmdir()
    except OSError:
        pass  # gone already: Gradio's sweep takes what is left


__all__ = ["Lost", "discard", "own_paths"]
