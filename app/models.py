"""The loaded models a server shares: each loaded once, kept by what its name resolves to, at
most a few at a time, warmed up (once in each process that decodes) so first-call costs never
land in a timed run.

No Gradio and no decoding loop here; `app.runner` runs comparisons on what this holds.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

import ppsd
from ppsd import DecodeConfig, StagedModel
from ppsd.chat import encode_prompt, has_chat_template
from ppsd.heads import AUTO_HEAD, SHARED_HEAD, HeadChoice, NotAHead, choose_exit_head
from ppsd.generate import warm_up
from ppsd.cache_files import NoSpace
from ppsd.model_source import UNREACHABLE, Progress, is_default, resolve, shown
from ppsd.setup import RunSetup, set_up


@dataclass(frozen=True)
class Loaded:
    """A loaded model with its tokenizer; `piece` renders one token id as display text."""

    name: str
    model: StagedModel
    tokenizer: object
    load_seconds: float
    key: str = ""  # what the name resolved to: the cache's identity of these weights

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of `text`: a chat user turn when `chat`, else raw text."""
        return encode_prompt(self.tokenizer, text, chat=chat)

    @property
    def chat(self) -> bool:
        """Has the model a chat template (an instruct model)?"""
        return has_chat_template(self.tokenizer)

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens (a chat model's end-of-turn) left out."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def piece(self) -> Callable[[int], str]:
        return _piece_function(self.tokenizer)


@lru_cache(maxsize=8)
def _piece_function(tokenizer) -> Callable[[int], str]:
    # SentencePiece tokenizers drop a token's leading space when it is decoded alone; decoding it
    # after a fixed anchor token and cutting the anchor off keeps the space.
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:] or []
    anchor_text = tokenizer.decode(anchor) if anchor else ""
    special = set(getattr(tokenizer, "all_special_ids", ()))  # an end-of-turn is a token, not text

    @lru_cache(maxsize=65536)
    def piece(token_id: int) -> str:
        if token_id in special:
            return ""
        both = tokenizer.decode(anchor + [token_id])
        if anchor and both.startswith(anchor_text):
            return both[len(anchor_text):]
        return tokenizer.decode([token_id])

    return piece


NOT_LOADABLE = ("is not a loadable model here: give the default ({default}), a model directory or "
                ".gguf file on this server, or a Hugging Face hub id")
NOT_A_HEAD = ("is not a usable exit head here: leave the box empty (the shipped head, if one fits), "
              "write 'shared', or give a directory written by `python -m ppsd train-head`")
ALWAYS_OFFERED_HEADS = ("", AUTO_HEAD, SHARED_HEAD)


class ModelCache:
    """Loaded models, shared by every visitor: keyed by what a name resolves to (a directory
    however it is spelled, a hub id), at most `capacity` of them, the least recently used
    evicted first and the default model last. `allowed` (None: any name) limits which names may
    load at all, for a public Space, and `allowed_heads` which exit-head directories may (the
    shipped and shared heads always may). A failed load leaves the cache unchanged and says only
    that the name is not loadable: the reason (which paths exist) goes to the server's log.
    Exit heads get the same treatment (`set_up`)."""

    def __init__(self, *, device: str | None = "auto",
                 loader: Callable[..., tuple[StagedModel, object]] = ppsd.load_model,
                 key: Callable[[str], str] = resolve, capacity: int = 2,
                 allowed: tuple[str, ...] | None = None, allowed_heads: tuple[str, ...] | None = None,
                 warm: bool = True) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: the cache must hold at least one model")
        self._device, self._loader, self._key = device, loader, key
        self.capacity, self.allowed, self.allowed_heads = capacity, allowed, allowed_heads
        self._models: OrderedDict[str, Loaded] = OrderedDict()  # key -> model, least recent first
        self._aliases: dict[str, str] = {}  # name as typed -> key
        self._heads: dict[tuple[str, str, int], HeadChoice] = {}
        self._fresh_locks()
        renew = weakref.WeakMethod(self._fresh_locks)
        # A ZeroGPU call is forked while another visitor's Load may hold a lock: the child's copy
        # would stay held for ever, so a forked process starts with its own, open.
        os.register_at_fork(after_in_child=lambda: (fresh := renew()) is not None and fresh())
        self.warm = warm  # warm a model up as it loads (not on ZeroGPU, whose main process decodes nothing)
        self._warmed: set[tuple[int, str]] = set()  # (process, key): a forked process warms its own copy

    def _fresh_locks(self) -> None:
        self._lock = threading.Lock()  # held briefly: the tables above
        self._loading = threading.Lock()  # held through a load: two at once would hold both in memory
        self._warming = threading.Lock()  # held through a warm-up, apart from loads: a loaded model never waits for one

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def __len__(self) -> int:
        return len(self._models)

    def names(self) -> list[str]:
        return [loaded.name for loaded in self._models.values()]

    def find(self, name: str) -> "Loaded | None":
        """The loaded model `name` if it is in the cache (never loads, never resolves)."""
        key = self._aliases.get(str(name).strip())
        return self._models.get(key) if key is not None else None

    def ready(self, name: str) -> bool:
        """Is `name` loaded and warmed up in this process (a forked one warms its own copy)?"""
        found = self.find(name)
        return found is not None and (os.getpid(), found.key) in self._warmed

    def clear(self) -> None:
        with self._lock:
            self._models.clear()
            self._aliases.clear()
            self._heads.clear()
            self._warmed.clear()
        _free_memory()

    def exit_head(self, spec: str, loaded: "Loaded", exit_layer: int) -> HeadChoice:
        """The exit head `spec` names for `loaded` at `exit_layer` ("" or "auto": the shipped one
        when it fits, else shared), loaded once; ValueError when it is not offered here, is not a
        head (neutrally) or was made for another model or another E (saying which)."""
        key = (self.head_spec(spec), loaded.key, exit_layer)
        with self._lock:
            if key not in self._heads:
                with _neutral_head_errors(key[0]):
                    self._heads[key] = choose_exit_head(loaded.model, exit_layer, key[0])
            return self._heads[key]

    def head_spec(self, spec: str) -> str:
        """`spec` stripped, when this server offers it; ValueError naming what it offers when not."""
        spec = (spec or "").strip()
        if self.allowed_heads is not None and spec not in ALWAYS_OFFERED_HEADS + self.allowed_heads:
            offered = ", ".join(repr(h) for h in (SHARED_HEAD, *self.allowed_heads))
            raise ValueError(f"exit head {shown(spec)} is not offered here: leave the box empty for the shipped "
                             f"head, or give one of {offered}")
        return spec

    def set_up(self, loaded: "Loaded", text: str, config: DecodeConfig, *, exit_head: str,
               chat: bool) -> RunSetup:
        """`ppsd.setup.set_up` on `loaded` for `text` (a `CheckedRequest`'s prompt, whose checks are
        not repeated here), with the exit head checked as `exit_head` does."""
        spec = self.head_spec(exit_head)
        with _neutral_head_errors(spec):
            return set_up(loaded.model, config, exit_head=spec, prompt_ids=loaded.encode(text, chat=chat), chat=chat)

    def offers(self, name: str) -> bool:
        """May `name` be loaded (or its config read) here? Every handler asks before it touches a
        path: a private one is as reachable as Load (by its fn_index)."""
        return self.allowed is None or str(name).strip() in self.allowed

    def get(self, name: str, *, progress: Progress | None = None, warm: bool | None = None) -> Loaded:
        """The loaded model `name`, loading it on first use (ValueError if it may not or cannot
        be loaded) and warming it up once in this process when `warm` (None: `self.warm`), so
        first-call costs never land in a timed run; `progress` hears of a first-use download or
        conversion."""
        loaded = self._get(name, progress)
        if self.warm if warm is None else warm:
            self._warm_up(loaded)
        return loaded

    def _warm_up(self, loaded: Loaded) -> None:
        done = (os.getpid(), loaded.key)
        if done in self._warmed:  # the common case, without waiting behind another visitor's load
            return
        with self._warming:  # one warm-up at a time
            if done not in self._warmed:
                warm_up(loaded.model, loaded.encode("Hello") or [0])
                self._warmed.add(done)

    def _get(self, name: str, progress: Progress | None) -> Loaded:
        name = str(name).strip()
        if not name:
            raise ValueError("model name is empty: give a local directory or a Hugging Face hub id")
        if not self.offers(name):
            raise ValueError(f"{shown(name)} is not offered here: choose one of {', '.join(self.allowed or ())}")
        found = self._touch(name)
        if found is not None:
            return found
        with self._loading:
            found = self._touch(name)  # loaded by whoever held the lock before us
            if found is not None:
                return found
            try:
                key = self._key(name)
                loaded = self._models.get(key) or self._load(name, key, progress)
            except ValueError as error:
                print(f"model {shown(name)} not loaded: {error}", file=sys.stderr, flush=True)  # cut: a name may be 1 MB
                if UNREACHABLE in str(error) or isinstance(error, NoSpace):  # says nothing of a visitor's paths
                    raise
                if is_default(name):  # always offered: "give the default" would contradict itself
                    raise ValueError(f"the default model {name} cannot be loaded here now: {error}") from None
                raise ValueError(f"{shown(name)} " + NOT_LOADABLE.format(default=ppsd.DEFAULT_MODEL)) from None
            with self._lock:
                self._models[key] = loaded
                self._aliases[name] = key
                self._models.move_to_end(key)
                self._evict()
            return loaded

    def _touch(self, name: str) -> "Loaded | None":
        """`find(name)`, marked as the most recently used."""
        with self._lock:
            found = self.find(name)
            if found is not None:
                self._models.move_to_end(found.key)
            return found

    def _load(self, name: str, key: str, progress: Progress | None) -> "Loaded":
        started = time.perf_counter()
        model, tokenizer = self._loader(name, device=self._device, progress=progress)
        return Loaded(name, model, tokenizer, time.perf_counter() - started, key=key)

    def _evict(self) -> None:
        """Drop least recently used models (the default model last) until `capacity` fit."""
        while len(self._models) > self.capacity:
            keys = list(self._models)
            victim = next((k for k in keys if not is_default(self._models[k].name)), keys[0])
            del self._models[victim]
            self._aliases = {n: k for n, k in self._aliases.items() if k != victim}
            self._heads = {h: v for h, v in self._heads.items() if h[1] != victim}
            self._warmed = {w for w in self._warmed if w[1] != victim}
            print(f"model cache: evicted {victim} (holds at most {self.capacity})", file=sys.stderr, flush=True)
            _free_memory()


@contextmanager
def _neutral_head_errors(spec: str) -> Iterator[None]:
    """A path that names no readable head becomes one message, whatever the reason (missing, not
    a head, unreadable): the reason, which tells what exists on this server, goes to its log."""
    try:
        yield
    except NotAHead as error:
        print(f"exit head {shown(spec)} refused: {error}", file=sys.stderr, flush=True)
        raise ValueError(f"{shown(spec)} {NOT_A_HEAD}") from None


def _free_memory() -> None:
    """Give an evicted model's memory back now (its tensors may sit in reference cycles)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
