"""The training corpus of the embedded model: what every fresh Python install already has.

Documents are the Python standard library's own sources (``*.py`` under
``sysconfig.get_paths()["stdlib"]``, test suites and IDLE left out) and the prose of
``pydoc_data.topics`` (the language reference behind ``help()``). Both are under the PSF licence.
Nothing is downloaded, so the corpus is the same wherever the same Python version runs.

This module knows nothing of tokenizers or models: it returns document texts, split into train
and held-out by whole document, deterministically (sorted paths, a seeded hash).
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Held out by name so the demo's prompts and the model card can cite them; the hash rule below
# adds about HELDOUT_PERCENT % of the remaining documents.
HELDOUT_FILES = ("fractions.py", "statistics.py", "textwrap.py", "colorsys.py", "heapq.py")
HELDOUT_TOPICS = ("assert", "for", "lambda", "numbers", "truth")
HELDOUT_PERCENT = 2
# Folders that are tests, GUI tooling or vendored packages rather than library code.
SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "idle_test", "site-packages", "lib2to3",
                          "__pycache__", "turtledemo", "ensurepip"})


@dataclass(frozen=True)
class Document:
    """One corpus document: ``name`` is a stdlib-relative path or ``topics:<key>``."""

    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """Document texts split by whole document; ``heldout_names`` parallels ``heldout``."""

    train: list[str]
    heldout: list[str]
    heldout_names: list[str]


def stdlib_documents() -> list[Document]:
    """The standard library's Python sources, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIPPED_DIRS.intersection(rel.parts[:-1]):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append(Document(rel.as_posix(), text))
    return docs


def topic_documents() -> list[Document]:
    """The ``help()`` topics of the language reference, sorted by key."""
    from pydoc_data.topics import topics

    return [Document(f"topics:{key}", topics[key]) for key in sorted(topics)]


def is_heldout(name: str, *, seed: int = 0) -> bool:
    """Whether a document is held out: named in the lists above, or picked by a seeded hash."""
    if name in HELDOUT_FILES or name.removeprefix("topics:") in HELDOUT_TOPICS:
        return True
    # sha256, not hash(): Python salts str hashes per process.
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 100 < HELDOUT_PERCENT


def build_corpus(*, max_chars: int | None = None, seed: int = 0) -> Corpus:
    """Split all documents into train and held-out; ``max_chars`` caps the training text.

    The held-out split does not depend on ``max_chars``, so a capped corpus (a quick run) evaluates
    on the same documents as the full one.
    """
    train: list[str] = []
    heldout: list[Document] = []
    budget = max_chars
    for doc in stdlib_documents() + topic_documents():
        if is_heldout(doc.name, seed=seed):
            heldout.append(doc)
        elif budget is None:
            train.append(doc.text)
        elif budget > 0:
            train.append(doc.text[:budget])
            budget -= len(train[-1])
    return Corpus(train=train, heldout=[d.text for d in heldout],
                  heldout_names=[d.name for d in heldout])
