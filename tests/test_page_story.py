"""Issue 44, on the page in a real browser (Debian chromium): one comparison told once. A run
that cannot teach is said before Run; the headline's lines, the cards and the race agree; the
page fits a projector in Present mode and a phone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import CHROMIUM, open_page, set_slider

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "assets" / "models" / "ppsd-tiny"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
RATIO = re.compile(r"\d+\.\d\d× (?:faster|slower)|no faster \(1\.00×\)")


def test_an_e_without_a_trained_head_is_said_beside_the_slider_with_the_shipped_e(page_url):
    if not page_url[2]:
        pytest.skip("the shipped head is the default model's")
    with open_page(page_url) as page:
        # The page's load event sets E from the model's config: a value typed before it answers is
        # overwritten with 18 (this test failed so, twice, late in the whole suite).
        page.locator(".model-status", has_text="layers ·").first.wait_for(timeout=60_000)
        note = page.locator("#exit-head-note")
        assert note.inner_text().strip() == ""  # the default E = 18 drafts with the shipped head
        set_slider(page, "exit-layer", 10)
        page.wait_for_function("() => document.querySelector('#exit-head-note').innerText.includes('E = 10')",
                               timeout=30_000)
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


def run_short(page, tokens: int | None, real: bool) -> None:
    if tokens is not None:
        set_slider(page, "max-new-tokens", tokens)
    page.locator("#run").click()
    page.locator(".headline-more, .headline-why").first.wait_for(state="attached", timeout=300_000 if real else 60_000)
    page.wait_for_function("() => !document.querySelector('.headline-status')", timeout=300_000 if real else 60_000)


def box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def visible(page, selector: str) -> bool:
    return page.locator(selector).first.is_visible()


def test_present_mode_fits_a_projector_after_a_run(page_url):
    real = page_url[2]
    with open_page(page_url) as page:
        set_slider(page, "max-new-tokens", 24)
        page.set_viewport_size({"width": 1366, "height": 768})
        page.locator("#present input").click()
        page.wait_for_function("() => document.body.classList.contains('present')")
        run_short(page, None, real)
        for width, height in ((1366, 768), (1920, 1080)):
            page.set_viewport_size({"width": width, "height": height})
            page.evaluate("window.scrollTo(0, 0)")
            page.wait_for_timeout(500)
            # the headline: at most 2 lines, each of its lines on one line, nothing else of it shown
            lines = [s for s in (".headline-main", ".headline-pipeline") if page.locator(s).count()]
            for selector in lines:
                height_px = box(page, selector)["height"]
                line = float(page.locator(selector).first.evaluate("e => parseFloat(getComputedStyle(e).lineHeight)"))
                assert height_px < 1.6 * line, (width, selector, height_px, line)
            # (issue 58: the sentence that reconciles the headline's two numbers and the marks' key stay)
            for hidden in (".headline-more", ".headline-clock", "#race-fold", "#intro-fold", "#settings"):
                assert not visible(page, hidden), (width, hidden)
            # the two streams side by side, in view, and the top of the timeline below them
            ar, ppsd_ = box(page, "#stream-ar"), box(page, "#stream-ppsd")
            overlap = min(ar["y"] + ar["height"], ppsd_["y"] + ppsd_["height"]) - max(ar["y"], ppsd_["y"])
            assert overlap > 0.5 * ar["height"] and ppsd_["x"] >= ar["x"] + ar["width"] - 1, (width, ar, ppsd_)
            assert ar["y"] + 40 < height and box(page, "#timeline")["y"] < height - 40, (width, box(page, "#timeline"))
            assert box(page, "#side")["height"] <= 200  # the controls give way: a bar across the top (and a notice)


def test_on_a_phone_the_results_follow_run_and_nothing_is_wider_than_the_screen(page_url):
    real = page_url[2]
    with open_page(page_url) as page:
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(500)
        run, results = box(page, "#run"), box(page, "#results")
        assert 0 <= results["y"] - (run["y"] + run["height"]) < 400, (run, results)
        title, present = box(page, ".page-title"), box(page, "#present")
        assert title["y"] + title["height"] <= present["y"] + 1, (title, present)  # the Present box under the title
        assert present["width"] >= 300 and box(page, "#title-row")["height"] < 250, present  # readable, no tall gap
        run_short(page, 8, real)
        page.locator("#metrics table").wait_for(state="attached", timeout=10_000)
        wide = page.evaluate("""() => [...document.querySelectorAll('body *')].filter(e => {
            const r = e.getBoundingClientRect();
            if (r.width === 0 || r.right <= window.innerWidth + 1) return false;
            for (let p = e.parentElement; p; p = p.parentElement) {  // inside a box that scrolls: fine
                const s = getComputedStyle(p);
                if (['auto', 'scroll', 'hidden'].includes(s.overflowX) && p.getBoundingClientRect().right <= window.innerWidth + 1) return false;
            }
            return true; }).map(e => e.tagName + '#' + e.id + '.' + e.className).slice(0, 8)""")
        assert wide == [] and page.evaluate("document.documentElement.scrollWidth") <= 390, wide
