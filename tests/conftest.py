"""Shared fixtures: tiny seeded models built in code (no network, no downloads), and the page
served for a real browser (`page_url`, `open_page`)."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

import ppsd
from ppsd import StagedModel
from ppsd.model_source import default_available

# Tests never need the hub; offline mode turns "not found" into an immediate error, not a retry loop.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: no GPU here")


def tiny_llama(*, vocab: int = 64, layers: int = 8, seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A random-weight Llama small enough to run hundreds of decodes per second."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **overrides,
    )
    return LlamaForCausalLM(config).eval()


def run_layers(model: StagedModel, ids: list[int], layers: range, cache, position: int = 0):
    """Hugging Face's own decoder `layers` on `ids` at [position, position + len(ids)) through the
    one forward (`StagedModel.run_static`) on a `StaticKVCache` (reserved and advanced here):
    (hidden, the step's `CacheView`), to call an exit head or `exit_logits` with."""
    view = cache.at(layers, position, len(ids))
    return model.run_static(model.embed(ids), layers, positions=view.write, cache=view), view


def tiny_tokenizer(vocab: int = 300) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained in memory on a few lines: real tokenization, no files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
            "The quick brown fox jumps over the lazy dog. 1 + 2 = 3.\n"] * 20
    tokenizer.train_from_iterator(text, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


@pytest.fixture(scope="session")
def llama() -> StagedModel:
    return StagedModel(tiny_llama(), name="tiny-llama")


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory) -> str:
    """A tiny Llama and its tokenizer saved like a hub checkpoint, for loaders and the CLI."""
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    model = tiny_llama(vocab=len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def app_state():
    """The demo's shared state for one module's server, built here rather than from the
    environment (any model name loads, whatever PPSD_MODELS or SPACE_ID say); its models are
    dropped afterwards. As behind a Space's proxy (`proxy_hops=1`): a test client is another
    visitor by the `X-Forwarded-For` it sends (`test_app_e2e.visiting`), all else 127.0.0.1."""
    from app.state import AppState

    state = AppState(proxy_hops=1)
    yield state
    state.cache.clear()


# --------------------------------------------------------------------------- the page in a browser

CHROMIUM = "/usr/bin/chromium"  # Debian's: Playwright's own browser download is blocked here
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_model(request) -> tuple[str, bool]:
    """The model the page tests run: the default one when its wheel is installed, else the tiny
    saved one; and whether it is the real one."""
    real = default_available()
    return (ppsd.DEFAULT_MODEL if real else request.getfixturevalue("saved_model")), real


@contextmanager
def served(state):
    """The page on `state`, launched on a free port: its address; the server closed afterwards."""
    from app import create_demo, launch_kwargs

    demo = create_demo(state)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_port=port, quiet=True, **launch_kwargs())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


@pytest.fixture(scope="module")
def page_url(request, app_state):
    torch.set_num_threads(1)  # the server and the browser share the cores: avoid oversubscription stalls
    model, real = page_model(request)
    with served(app_state) as url:  # and `app_state` drops the loaded models
        yield url, model, real


@contextmanager
def open_page(page_url):
    """The page in a fresh browser, on the test's model; closed afterwards, also on failure."""
    sync_api = pytest.importorskip("playwright.sync_api")
    url, model, real = page_url
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1920, "height": 1080})  # a projector
            page.goto(url, wait_until="domcontentloaded")
            page.locator("#run").wait_for(timeout=30_000)
            if not real:
                page.locator("#model textarea, #model input").first.fill(model)
            yield page
        finally:
            browser.close()


def set_slider(page, elem_id: str, value: int) -> None:
    """Type `value` into slider `elem_id`'s number box, as a user would (Enter, then away)."""
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()



@contextmanager
def quiet():
    """The page reads every run as on a quiet machine: no stalls (`ppsd.metrics.stalls`) and no
    other program's load counted (`ppsd.quiet.others_cpu`), so a test of how numbers agree is not
    turned into "not a clean result" by a busy test machine. A page test's server runs in this
    process, so this reaches it too."""
    from app import reading
    from ppsd import quiet as ppsd_quiet
    from ppsd.metrics import Stalls

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reading, "stalls", lambda trace: Stalls(0, 0.0))
        patch.setattr(ppsd_quiet, "CROWDED_CORES", float("inf"))
        yield


@pytest.fixture
def quiet_machine():
    with quiet():
        yield
