"""What a path a user gave is, in words: the one source of "does not exist", "is not a regular
file (it is a FIFO)", "is not a folder" and "is not readable" in every message that names a file
(exit heads, training data, prompts).

Boundary: looks at a path (stat, access) and never opens it: reading a FIFO would wait for a
writer for ever, and a device may never end.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(path: str | Path) -> str | None:
    """"a folder", "a regular file", "a FIFO", ... or None when nothing is there (or a link leads
    nowhere). A name the file system refuses (too long, say) raises OSError."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # "file.txt/x": a part of the path is a file
        return None
    return next((name for test, name in KINDS if test(mode)), "something else")


def problem(path: str | Path, want: str) -> str | None:
    """None when `path` is what is wanted and readable, else what is wrong, in words to follow the
    path in a message. `want`: "file", "folder" or "file or folder"."""
    try:
        found = kind(path)
    except OSError as error:
        return f"is not a usable path: {error.strerror or error}"
    if found is None:
        return "does not exist"
    wanted = {"file": ("a regular file",), "folder": ("a folder",),
              "file or folder": ("a regular file", "a folder")}[want]
    if found not in wanted:
        return f"is not {' or '.join(wanted)} (it is {found})"
    if not os.access(path, os.R_OK | (os.X_OK if found == "a folder" else 0)):
        return "is not readable"
    return None
