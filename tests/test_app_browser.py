"""The whole page in a real browser (Debian chromium through Playwright): open it, click an
example, Run, and see coloured tokens, the Plotly timeline and the speedup headline.

Uses the default model (SmolLM2-135M-Instruct) when its wheel is installed, else the tiny random
test model.
Saves a screenshot to docs/screenshot.png when PPSD_SAVE_SCREENSHOT=1, else to tmp_path.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

import ppsd
from ppsd.model_source import default_available

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def page_url(request):
    from app import create_demo, launch_kwargs
    from app import ui

    torch.set_num_threads(1)  # two shared cores: avoid oversubscription stalls
    real = default_available()
    model = ppsd.DEFAULT_MODEL if real else request.getfixturevalue("saved_model")
    demo = create_demo()
    demo.queue(max_size=8)
    port = free_port()
    demo.launch(prevent_thread_lock=True, server_port=port, quiet=True, **launch_kwargs())
    try:
        yield f"http://127.0.0.1:{port}/", model, real
    finally:
        demo.close()
        ui.CACHE.clear()


def test_page_runs_an_example_and_shows_tokens_timeline_and_headline(page_url, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    from app.runner import workers_available
    from app.ui import load_examples
    from ppsd.model import resolve_device

    url, model, real = page_url
    shot = ROOT / "docs" / "screenshot.png" if os.environ.get("PPSD_SAVE_SCREENSHOT") == "1" \
        else tmp_path / "screenshot.png"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, wait_until="domcontentloaded")
            page.locator("#run").wait_for(timeout=30_000)
            if not real:
                box = page.locator("#model textarea, #model input").first
                box.fill(model)
            example = load_examples()[0]
            page.get_by_text(f"{example['category']} · {example['name']}", exact=True).first.click()
            prompt = page.locator("#prompt textarea").first
            page.wait_for_function("(el) => el.value.length > 0", arg=prompt.element_handle(), timeout=10_000)
            assert prompt.input_value() == example["prompt"]
            page.locator("#run").click()
            # The default model's first use converts its GGUF (about 20 s) before the run.
            page.locator(".headline-main").wait_for(timeout=180_000 if real else 45_000)
            headline = page.locator(".headline-main").inner_text()
            assert "than AR" in headline and "PPSD" in headline
            # With the cores for K = 2 workers the page runs the real pipeline and says so.
            workers = workers_available(2, resolve_device("auto")) is None
            assert page.locator("#workers input").is_checked() == workers
            clock = "measured clock" if workers else "projected clock"
            assert clock in page.locator(".headline-clock").inner_text()
            coloured = page.locator("#stream-ppsd .tok-accepted, #stream-ppsd .tok-corrected")
            assert coloured.count() > 0
            assert page.locator("#stream-ar .tok-verified").count() > 0
            page.locator("#timeline .js-plotly-plot").wait_for(timeout=10_000)
            assert "stage 1" in page.locator("#timeline").inner_text()
            assert page.locator(".ppsd-legend").is_visible()
            page.locator(".race-lane").first.wait_for(timeout=10_000)
            page.wait_for_timeout(4500)  # let the race replay finish before the picture
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
