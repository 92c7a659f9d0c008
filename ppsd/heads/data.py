"""Training text for exit heads: files, folders, the embedded corpus or chat transcripts,
split into training and held-out documents and tokenized.

Boundary: text and token ids only; no model, no training (that is `distill` and `train`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch

from ..paths import problem

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".json", ".csv", ".html", ".tex")


@dataclass(frozen=True)
class TokenData:
    """Token ids to train and evaluate on (1-D, documents concatenated), and where they came from."""

    train: torch.Tensor
    heldout: torch.Tensor
    description: str


def read_texts(data: str | None, heldout: str | None = None, *, max_chars: int = 4_000_000
               ) -> tuple[list[str], list[str], str]:
    """(train texts, held-out texts, description) from a file, a folder, or the embedded corpus."""
    if data is None:
        from .corpus import build_corpus

        corpus = build_corpus(max_chars=max_chars)
        description = (f"embedded corpus (ppsd.heads.corpus: Python stdlib sources and pydoc topics), first "
                       f"{max_chars:,} characters of training documents; held out: {len(corpus.heldout)} "
                       f"whole documents ({', '.join(corpus.heldout_names[:5])}, ...)")
        return corpus.train, corpus.heldout, description
    train, desc = _read_path(data, max_chars)
    if heldout is not None:
        held, held_desc = _read_path(heldout, max_chars)
        return train, held, f"{desc}; held out: {held_desc}"
    if len(train) >= 2:  # whole documents: every 10th, or the last one of fewer than 10
        held_out = set(range(9, len(train), 10)) or {len(train) - 1}
        kept = [t for i, t in enumerate(train) if i not in held_out]
        held = [t for i, t in enumerate(train) if i in held_out]
        return kept, held, f"{desc}; held out: {len(held)} whole documents (every 10th, or the last)"
    cut = int(len(train[0]) * 0.9)  # one document: its last 10 % is held out
    return [train[0][:cut]], [train[0][cut:]], f"{desc}; held out: its last 10%"


def _read_path(path: str, max_chars: int) -> tuple[list[str], str]:
    root = Path(path)
    check_text_path(path)
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    texts, digest, budget = [], hashlib.sha256(), max_chars
    for file in files:
        if budget <= 0:
            break
        text = _text_of(file)[:budget]
        if text.strip():
            texts.append(text)
            digest.update(text.encode())
            budget -= len(text)
    if not texts:
        raise ValueError(f"data {path!r} holds no text (files ending in {', '.join(TEXT_SUFFIXES)})")
    chars = sum(map(len, texts))
    return texts, f"{path} ({len(texts)} documents, {chars:,} characters, sha256 {digest.hexdigest()[:12]})"


def check_text_path(path: str, *, jsonl: bool = False, what: str = "data") -> None:
    """ValueError naming what is wrong with `path` as training text (a readable text file or
    folder, or a JSONL file of chat answers), before anything is loaded or read."""
    wrong = problem(path, "file" if jsonl else "file or folder")
    if wrong is not None:
        wanted = "a JSONL file of chat answers" if jsonl else "a text file or a folder of text files"
        raise ValueError(f"{what} {path!r} {wrong}: give {wanted}")


def _text_of(file: Path) -> str:
    """The file's text; ValueError naming it when it is not text (binary data would train a head
    on noise and save it as if it were fine)."""
    raw = file.read_bytes()
    where = raw.find(b"\x00")  # valid UTF-8, but no text file holds one
    if where < 0:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            where = error.start
    raise ValueError(f"data file {str(file)!r} is not UTF-8 text (byte {where}): give text files")


def open_jsonl(path: str | Path, mode: str = "r") -> IO[str]:
    """A JSON-lines file opened as text, gzip-compressed when its name ends in .gz (appending
    adds a gzip member, which readers see as one stream): the kept training data is compressed."""
    path = Path(path)
    return gzip.open(path, mode + "t", encoding="utf-8") if path.suffix == ".gz" else path.open(mode, encoding="utf-8")


def read_chat_answers(path: str) -> TokenData:
    """Chat transcripts from a JSONL file (or .jsonl.gz) of {"prompt", "prompt_ids", "answer_ids"}
    (what tools/build_chat_data.py writes), concatenated. About a tenth of the prompts are held out, by
    a hash of their text, with every answer to them (a greedy and a sampled answer never straddle
    the split)."""
    file = Path(path)
    check_text_path(path, jsonl=True)
    try:
        with open_jsonl(file) as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        sequences = [list(r["prompt_ids"]) + list(r["answer_ids"]) for r in rows]
        held = {i for i, r in enumerate(rows) if hashlib.sha256(r["prompt"].encode()).digest()[0] % 10 == 9}
    except UnicodeDecodeError as error:  # a ValueError too, but its words name no file
        raise ValueError(f"data {path!r} is not UTF-8 text (byte {error.start} of a block): "
                         "give a JSONL file of chat answers") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:  # not gzip, or cut short
        raise ValueError(f"data {path!r} is not a whole gzip file: {error}") from None
    except OSError as error:
        raise ValueError(f"data {path!r} cannot be read: {error.strerror or error}") from None
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"data {path!r} is not a JSONL file of chat answers: {error}") from None
    if len(sequences) < 2:
        raise ValueError(f"data {path!r} holds {len(sequences)} transcripts; at least 2 are needed")
    held = held or {len(sequences) - 1}
    flat = lambda picked: torch.tensor([t for i, q in enumerate(sequences) if (i in held) == picked for t in q])  # noqa: E731
    answers = sum(len(r["answer_ids"]) for r in rows)
    digest = hashlib.sha256(file.read_bytes()).hexdigest()[:12]
    sampled = sum(r.get("temperature", 0.0) > 0 for r in rows)
    description = (f"{file.name}: {len(rows)} chat transcripts, the base model's own answers ({len(rows) - sampled} "
                   f"greedy, {sampled} sampled; {answers:,} answer tokens), sha256 {digest}; held out: "
                   f"{len(held)} whole transcripts (a tenth of the prompts, by hash)")
    return TokenData(train=flat(False), heldout=flat(True), description=description)


def tokenize(tokenizer, texts: list[str]) -> torch.Tensor:
    """Documents concatenated, each followed by EOS when the tokenizer has one."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + eos
    return torch.tensor(ids, dtype=torch.long)
