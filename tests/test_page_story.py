"""Issue 44, on the page in a real browser (Debian chromium): one comparison told once. A run
that cannot teach is said before Run; the headline's lines, the cards and the race agree; the
page fits a projector in Present mode and a phone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import CHROMIUM, open_page

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets" / "models" / "ppsd-tiny"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
RATIO = re.compile(r"\d+\.\d\d× (?:faster|slower)|no faster \(1\.00×\)")


def set_slider(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]").first
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def test_an_e_without_a_trained_head_is_said_beside_the_slider_with_the_shipped_e(page_url):
    if not page_url[2]:
        pytest.skip("the shipped head is the default model's")
    with open_page(page_url) as page:
        note = page.locator("#exit-head-note")
        assert note.inner_text().strip() == ""  # the default E = 18 drafts with the shipped head
        set_slider(page, "exit-layer", 10)
        page.wait_for_function("() => document.querySelector('#exit-head-note').innerText.includes('E = 10')",
                               timeout=10_000)
        text = note.inner_text()
        assert "No trained exit head at E = 10" in text and "shared head" in text and "E = 18" in text
        use = page.locator("#use-shipped-e")
        assert use.is_visible() and "E = 18" in use.inner_text()
        use.click()
        page.wait_for_function("() => document.querySelector('#exit-layer input[type=number]').value === '18'",
                               timeout=10_000)
        page.wait_for_function("() => document.querySelector('#exit-head-note').innerText.trim() === ''",
                               timeout=10_000)


@pytest.mark.skipif(not (TINY / "model.safetensors").exists(), reason="the shipped tiny model is absent")
def test_loading_an_8_layer_model_fits_the_sliders_without_an_error(page_url):
    with open_page(page_url) as page:
        page.locator("#model textarea, #model input").first.fill(str(TINY))
        page.locator("#load").click()
        page.wait_for_function("() => document.querySelector('#exit-layer input[type=number]').max === '7'",
                               timeout=60_000)
        page.wait_for_timeout(1500)  # any event the new ranges set off has answered
        body = page.locator("body").inner_text()
        assert "greater than maximum" not in body and "Error" not in page.locator(".toast-wrap").all_inner_texts()
        assert int(page.locator("#exit-layer input[type=number]").first.input_value()) <= 7
