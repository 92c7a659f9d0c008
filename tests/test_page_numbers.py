"""Issue 34, "Numbers that disagree": every number the page shows has one source and one way of
being written, so no two numbers on the page contradict each other, on a quiet or a busy machine.

First as pure functions over constructed `Comparison`s and real tiny-model snapshots (fast,
deterministic), then on the rendered page after a real Run in Debian chromium (`page_url`,
`open_page` from conftest: the default model when its wheel is installed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from pathlib import Path

import pytest
import torch

import ppsd
from app import analysis, reading, view, words
from app.panels import headline, metrics as metrics_panel, race as race_panel
from app.models import ModelCache
from app.request import RunRequest
from app.reading import RunView
from app.runner import run_comparison
from ppsd import quiet as ppsd_quiet
from ppsd.compare import PLAIN, MethodRun, PlainWay, State
from ppsd.compare_stats import Stats
from conftest import CHROMIUM, open_page, quiet
from ppsd.metrics import Stalls, ideal_ppsd_speedup_slowest_stage

RATIO = re.compile(r"(\d+\.\d\d)× (faster|slower)|no faster \(1\.00×\)")
BARE = re.compile(r"(?<!no faster \()\d+\.\d\d×(?! (?:faster|slower))")  # a decimal ratio without its direction
AGAINST_AR = re.compile(r"PPSD (\d+\.\d\d× (?:faster|slower)|no faster \(1\.00×\)) than AR\b")  # "than plain AR" is another baseline


def metrics(*, wall: float, accepted: int = 5, rejected: int = 5, clock: str = "measured", slot: float = 0.6,
            ideal: float | None = None) -> ppsd.Metrics:
    rate = accepted / (accepted + rejected) if accepted + rejected else None
    ideal = ideal_ppsd_speedup_slowest_stage(rate or 0.0, slot) if ideal is None else ideal
    return ppsd.Metrics(clock, 10, accepted, rejected, 1, rate, wall, 10 / wall, wall, [0.5, 0.75], 0.375, 3,
                        ideal, slot_fraction=slot)


def comparison(speedups=(), plain_walls=(), **fields) -> reading.Reading:
    """AR at 2.0 s every round, PPSD at 2.0 / speedup: the medians' ratio is the median speedup."""
    ar_walls, ppsd_walls = [2.0] * max(1, len(speedups)), [2.0 / s for s in speedups] or [2.0 / 1.6]
    walls = {"ar": tuple(ar_walls), "ppsd": tuple(ppsd_walls), **({"plain": tuple(plain_walls)} if plain_walls else {})}
    ar, ppsd_ = metrics(wall=2.0), metrics(wall=sorted(ppsd_walls)[len(ppsd_walls) // 2])
    return reading.Reading(ar, ppsd_, num_stages=2, device="cpu", workers=True,
                              stats=Stats(walls, walls, walls), **fields)


def text(html_: str) -> str:
    return re.sub(r"<[^>]+>", "", html_)


def sentences(page_text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.;!])\s+|\n+", page_text) if s.strip()]


def assert_one_story(page_text: str, headline: str, clock: str) -> None:
    """Every decimal ratio says which way it goes, and every sentence on the page's clock that
    puts PPSD against AR gives the headline's ratio (`headline`: "1.35× slower")."""
    assert not BARE.findall(page_text), BARE.findall(page_text)
    other = {"measured": ("projected",), "projected": ("measured", "one device")}[clock]
    for sentence in sentences(page_text):
        if any(word in sentence.lower() for word in other):
            continue  # the other clock's own ratio, named as such
        for found in AGAINST_AR.findall(sentence):
            assert found == headline, sentence


# --------------------------------------------------------------------------- 1. one ratio, one direction


def test_a_slower_ppsd_reads_slower_in_the_headline_and_every_round():
    """Issue 34: "PPSD 1.35× slower than AR (median of 3 runs, range 0.68–0.79×…)"."""
    out = text(headline.render_headline(comparison((0.68, 0.74, 0.79))))
    assert "PPSD 1.35× slower than AR on the same pipeline" in out and "median of 3 rounds" in out
    assert "PPSD 2.94 s, 2.70 s, 2.53 s" in out  # every round's wall, from which the medians come
    assert_one_story(out, "1.35× slower", "measured")


def test_ratios_have_one_writer_and_never_read_1_00x_slower():
    assert [words.ratio_text(x) for x in (1.35, 1 / 1.35, 1.0, 0.999, 1.004, 0.0)] == [
        "1.35× faster", "1.35× slower", "no faster (1.00×)", "no faster (1.00×)", "no faster (1.00×)", "not timed"]
    out = text(headline.render_headline(comparison((0.999, 0.998, 1.001))))
    assert "PPSD no faster (1.00×) than AR" in out and "1.00× slower" not in out


def test_every_ratio_in_the_headline_says_its_direction_on_either_clock():
    """The other clock's ratio, EESD's and the ideals: "0.99×" never stands beside "1.01× slower"."""
    ar, slow = metrics(wall=2.0, clock="projected"), metrics(wall=2.02, clock="projected")
    stats = Stats(walls={"ar": (2.0,), "ppsd": (2.02,), "eesd": (2.6,)},
                  measured={"ar": (2.0,), "ppsd": (2.5,), "eesd": (2.6,)})
    one = reading.Reading(ar, slow, num_stages=2, device="cpu",
                             workers=False, eesd=metrics(wall=2.6, ideal=0.8), stats=stats)
    out = text(headline.render_headline(one))
    assert "PPSD 1.01× slower than AR on the same pipeline" in out and "PPSD 1.25× slower than AR, medians)" in out
    assert "EESD (draft then verify, one device): 1.30× slower than AR" in out and "1.25× slower." in out
    assert_one_story(out, "1.01× slower", "projected")
    table = metrics_panel.render_metrics_table({m: reading.Clocks(metrics(wall=1.0, ideal=0.8), metrics(wall=1.0))
                                          for m in ("ar", "ppsd", "eesd")})
    assert BARE.findall(text(table)) == [] and "<td>the reference</td><td>1.25× slower</td>" in table


# --------------------------------------------------------------------------- real snapshots: star = headline


@pytest.fixture(scope="module")
def tiny_cache(saved_model):
    from transformers import AutoTokenizer

    def loader(name, device=None, progress=None):
        model, _ = ppsd.load_model(saved_model, device="cpu")
        return model, AutoTokenizer.from_pretrained(saved_model)

    torch.set_num_threads(1)
    return ModelCache(device="cpu", loader=loader)


@pytest.fixture(scope="module")
def tiny_run(tiny_cache):
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=16, repeats=3)
    return list(run_comparison(request, tiny_cache, throttle=0.0))[-1]


def star(values):
    point = next(t for t in values["theory"].data if t.name.startswith("PPSD measured"))
    return point.y[0], point.text[0]


def pipeline_ratio(headline_html: str) -> str:
    """The headline's ratio against AR on the same pipeline (its second line, or its first when
    that AR was the fastest)."""
    line = re.search(r'headline-(?:pipeline|main)">(PPSD [^<]* than AR on the same pipeline)<', headline_html)
    return RATIO.search(line.group(1)).group(0)


@dataclass(frozen=True)
class Slower(State):
    """A finished comparison whose PPSD took 1.6 times AR's wall in every round."""

    def stats(self) -> Stats:
        walls = {**super().stats().walls}
        walls["ppsd"] = tuple(w * 1.6 for w in walls["ar"])
        return Stats(walls, walls, walls)


@pytest.mark.parametrize("slower", [False, True])
def test_the_theory_star_the_headline_and_the_card_show_one_value(tiny_run, slower, quiet_machine):
    """Issue 34: "The theory star said 0.99× while the headline said PPSD 1.01× slower"; issue 44:
    the cards of the run shown give the headline's ratio."""
    snap = tiny_run
    if slower:
        snap = replace(snap, state=Slower(**{f.name: getattr(snap.state, f.name) for f in fields(State)}))
    values = view.snapshot(snap)
    y, label = star(values)
    assert y == snap.state.stats().ratio("ar", "ppsd")  # the ratio of the medians, the same value
    if analysis.unclean_reason(RunView.of(snap).reading):  # issue 48: above its own ideal, held back
        assert "Not a clean result" in values["headline"] and not slower
    else:
        assert label == pipeline_ratio(values["headline"])
    assert label == ("1.60× slower" if slower else words.ratio_text(y))
    assert f"PPSD {label} than AR (medians)" in values["stats_ppsd"]
    assert_one_story(text(values["headline"]), label, "projected")


def test_the_round_shown_is_the_one_closest_to_the_medians_and_says_so(tiny_run):
    snap = tiny_run
    index = snap.state.stats().shown()
    assert RunView.of(snap).runs["ppsd"] is snap.state.rounds[index]["ppsd"]
    values = view.snapshot(snap)
    assert f"Round {index + 1} of 3, the one closest to the medians" in values["stats_ppsd"]
    assert f"the panels show round {index + 1}" in values["headline"]
    assert values["summary"]["timed_runs"]["shown_round"] == index + 1
    race = values["race"]
    note = race_panel.render_race(race["lanes"], str, at=0.0, clock=race["clock"], stretch=1, round_label=race["round_label"])
    assert f"Replay of round {index + 1} of 3, the one closest to the medians at its recorded pace" in note
    assert values["summary"]["speedup_projected"] == snap.state.stats().ratio("ar", "ppsd")  # the API's, the medians'


def test_a_snapshot_draws_each_runs_trace_once(tiny_run, monkeypatch):
    """Issue 59: the shown round's traces (a projected one replays every event) are read once into
    the view; the headline's stages, the timeline and the race each asked `MethodRun.shown()` anew."""
    calls, shown = [], MethodRun.shown
    monkeypatch.setattr(MethodRun, "shown", lambda run: calls.append(run) or shown(run))
    values = view.snapshot(tiny_run)
    assert values["race"]["lanes"] and "slowest stage" in values["headline"]
    assert len({id(run) for run in calls}) == len(calls) and {"ar", "ppsd"} <= {run.method for run in calls}


def test_the_slowest_stage_is_the_stage_the_timeline_shows_busiest(tiny_run):
    """Issue 34: "slowest stage 60% of the layers" (stage 1) where the timeline showed stage 2 busier."""
    values = view.snapshot(tiny_run)
    labels = {label for t in values["timeline"].data if t.type == "bar" and t.yaxis == "y"  # PPSD's panel, on top
              for label in t.y}
    util = {int(re.match(r"stage (\d+)", lab).group(1)): int(re.search(r"util (\d+)%", lab).group(1))
            for lab in labels}
    named = re.search(r"slowest stage: stage (\d+) \(util (\d+)% on the timeline", values["headline"])
    assert named, values["headline"]
    assert util[int(named.group(1))] == int(named.group(2)) == max(util.values())
    assert "slowest stage" not in re.sub(r"slowest stage: stage \d+", "", values["headline"])  # named every time


@pytest.fixture(scope="module")
def tiny_threads_run(tiny_cache):
    """The K stages at once on threads (the measured clock leads) and plain AR timed beside them."""
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=12, workers=True,
                         pipeline="threads", repeats=2)
    return list(run_comparison(request, tiny_cache, throttle=0.0))[-1]


def test_the_race_ends_at_the_wall_the_table_shows(tiny_run, tiny_threads_run):
    """Issue 34: 17.49 s in the race, 17.50 s in the table: one value per wall, on either clock."""
    for snap, row_name in ((tiny_run, "wall, projected (K workers)"),
                           (tiny_threads_run, "wall, measured (K threads in one process)")):
        values = view.snapshot(snap)
        race = values["race"]
        shown = RunView.of(snap)
        runs = {**shown.runs, **({PLAIN: shown.plain_run} if shown.plain_run is not None else {})}
        for lane in race["lanes"]:
            projected = lane.method == words.PROJECTED_LANE  # issue 48: PPSD as on K devices, its own lane
            # the run's wall on the page's clock (the projected lane: PPSD's on the projected clock)
            assert lane.total == (runs["ppsd"].wall("projected") if projected else runs[lane.method].wall())
            assert max(lane.times) <= lane.total  # every token still commits within its lane
        row = re.search(re.escape(row_name) + r"</th>(.*?)<td class", values["metrics"]).group(1)
        shown = [words.duration_text(lane.total) for lane in race["lanes"]
                 if lane.method not in (PLAIN, words.PROJECTED_LANE)]
        assert row == "".join(f"<td>{s}</td>" for s in shown)


# --------------------------------------------------------------------------- a* only where defined


def test_a_star_appears_only_where_plain_ar_is_faster_than_the_pipelines_ar():
    """Issue 34: "...so PPSD does not beat it here; ... a* = 0.00", and "PPSD 1.35× slower than AR"
    beside "PPSD beats it here"."""
    # PPSD 1.35x slower than the pipeline's AR, plain AR slower still: both said, plainly, no a*
    way = PlainWay(2, "in this one process on 2 threads with no pipeline")
    c = comparison((0.74,), plain_walls=(4.0,), plain=way)
    out = text(headline.render_headline(c))
    assert "a*" not in out
    assert "PPSD on the 2 worker processes: 1.48× faster than plain AR" in out
    assert "Plain AR ran 2.00× slower than AR on the pipeline here" in out
    assert_one_story(out, "1.35× slower", "measured")
    # plain AR faster than the pipeline's AR: a* is defined, and shown with this run's a
    faster = text(headline.render_headline(comparison((0.74,), plain_walls=(1.8,), plain=way)))
    a_star = float(re.search(r"a\* = (\d\.\d\d)", faster).group(1))
    assert 0 < a_star <= 1 and "(this run: a = 0.50)" in faster
    assert "PPSD 1.50× slower than plain AR" in faster  # line 1: 1.8 / 2.7, the fastest AR measured here


# --------------------------------------------------------------------------- above the ideal


def test_a_run_above_the_ideal_is_explained_or_flagged_beside_the_ideal():
    """Issue 34: "PPSD 1.33× faster" beside "ideal = 1.26×", and "range 0.91–3.64×" against 1.44×."""
    wide = headline.render_headline(comparison((1.3, 1.4, 3.64)))
    assert "⚠ The median (1.40× faster) is above the ideal 1.25× faster" in wide
    assert "slowest round took 2.80 times its fastest" in wide and "<summary>⚠" in wide

    # measured 1.33x, ideal 1.25x by layers (a = 0.5, s = 0.6), 1.33x at the measured costs (s = 0.5)
    stages = reading.Stages(layers=(18, 12), utilization=(0.6, 0.7), costs=(2.0, 2.0))
    costs = headline.render_headline(comparison((1.31, 1.33, 1.34), stages=stages))
    assert "The median (1.33× faster) is above the ideal 1.25× faster, which counts layers" in costs
    assert "⚠" not in costs and "at those costs the ideal is 1.33× faster" in costs

    busy = headline.render_headline(comparison((1.33,), stalls={"ar": Stalls(3, 0.6)}))
    assert "⚠ This run (1.33× faster) is above the ideal 1.25× faster: the machine was busy (stalled work added " \
           "up to 30%" in busy
    assert "above the ideal" not in headline.render_headline(comparison((1.1, 1.2, 1.24)))


# --------------------------------------------------------------------------- the best plain AR


@pytest.mark.parametrize("kind", ["processes", "threads", "graphed", "stacked"])
def test_plain_ar_has_the_same_trials_whatever_kind_ppsd_runs_on(tiny_cache, monkeypatch, kind):
    """Issue 56: beside the captured steps plain AR ran only on them, compiled for every core, with
    no 1-thread trial, and was timed 3-10x too slow. On a CPU it is timed the same careful way on
    every kind: 1 thread and every core, in this one process, each warmed up at its thread count."""
    from ppsd import plain_ar
    from ppsd.executors import host

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    setup = tiny_cache.set_up(tiny_cache.get("tiny"), "hi", ppsd.DecodeConfig(method="ar"), exit_head="",
                                 chat=False)
    warmed = []
    threads = torch.get_num_threads()
    ways = plain_ar.fastest_ar(setup, kind, None, warm_up=lambda *a, **k: warmed.append(torch.get_num_threads()))
    assert [(w.executor, w.threads) for w in ways] == [(None, 1), (None, 2)]
    assert ways[0].words == "in this one process on 1 thread with no pipeline"
    assert warmed == [1, 2] and torch.get_num_threads() == threads


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="a choice needs 2 cores")
def test_the_plain_ar_kept_is_the_faster_of_one_thread_and_every_core(tiny_threads_run):
    """Issue 34: plain AR on every core ran 3.5× slower than on 1 thread on a busy 2-core machine."""
    snap = tiny_threads_run
    trials = {threads: wall for threads, wall, _ in snap.plain.trials}
    assert set(trials) == {1, 2} and len(snap.state.stats().runs(PLAIN)) == 2
    assert snap.plain.threads == min(trials, key=trials.get)
    assert snap.state.stats().runs(PLAIN)[0] == min(trials.values()) == snap.state.rounds[0][PLAIN].wall()
    out = text(view.snapshot(snap)["headline"])
    kept = "1 thread" if snap.plain.threads == 1 else "2 threads"
    assert f"AR in this one process on {kept} with no pipeline, the faster of 1 thread (" in out
    for threads, wall, done in snap.plain.trials:  # a way that had lost by PLAIN_CUT was cut, and says so
        said = f"({words.duration_text(wall)})" if done else f"(cut after {words.duration_text(wall)}"
        assert f"{threads} thread{'s' * (threads != 1)} {said}" in out


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="a choice needs 2 cores")
def test_a_way_of_plain_ar_that_has_lost_is_cut_and_said_so(tiny_cache, monkeypatch):
    """The slow way on a busy machine (27.6 s against 2.9 s) does not hold the run: it is cut at
    `PLAIN_CUT` times the faster way's wall, and the page says it was cut, not how long it took."""
    from ppsd import compare

    monkeypatch.setattr(compare, "PLAIN_CUT", 1e-9)  # every way after the first has lost at once
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=12, workers=True,
                         pipeline="threads", repeats=1)
    snap = list(run_comparison(request, tiny_cache, throttle=0.0))[-1]
    (one, first, done), (every, cut_at, finished) = snap.plain.trials
    assert (one, every, done, finished) == (1, 2, True, False) and snap.plain.threads == 1
    assert snap.state.stats().runs(PLAIN) == (first,) and cut_at == pytest.approx(first * 1e-9)
    out = text(view.snapshot(snap)["headline"])
    assert f"the faster of 1 thread ({words.duration_text(first)}) and 2 threads (cut after " in out
    assert "still decoding)" in out


# --------------------------------------------------------------------------- the page in a browser

browser = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                             reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def ran(page_url):
    """One real Run of the default prompt settings (32 new tokens, 3 timed runs), and what the
    page then shows: the texts the tests below compare."""
    real = page_url[2]
    with quiet(), open_page(page_url) as page:
        page.locator("#prompt textarea").first.fill("Why is the sky blue?")
        box = page.locator("#max-new-tokens input[type=number]").first
        box.fill("32")
        box.press("Enter")
        box.blur()
        page.locator("#run").click()
        page.locator(".headline-agreement").wait_for(state="attached", timeout=300_000 if real else 60_000)
        page.locator(".headline-more > summary").click()  # the fold: every sentence, read below
        page.locator("#theory g.textpoint text").first.wait_for(timeout=10_000)
        page.locator("#timeline g.subplot.xy .yaxislayer-above text").first.wait_for(timeout=10_000)
        page.wait_for_function("() => document.querySelector('.race-verdict')", timeout=30_000)
        yield {
            "headline": page.locator(".headline-box").inner_text(),
            "main": page.locator(".headline-main").inner_text(),
            "pipeline": (page.locator(".headline-pipeline").inner_text() if page.locator(".headline-pipeline").count()
                         else page.locator(".headline-main").inner_text()),
            "verdict": page.locator(".race-verdict").inner_text(),
            "ppsd_card": page.locator("#stats-ppsd").inner_text(),
            "clock": page.locator(".headline-clock").inner_text(),
            "stars": page.locator("#theory g.textpoint text").all_text_contents(),
            "rows": page.locator("#timeline g.subplot.xy .yaxislayer-above text").all_text_contents(),
            "race": {page.locator(".race-name").nth(i).inner_text(): page.locator(".race-clock").nth(i).inner_text()
                     for i in range(page.locator(".race-lane").count())},
            "table": page.locator("#metrics table").inner_text(),
            "workers": page.locator("#workers input").is_checked(),
        }


@browser
def test_page_the_star_and_the_card_show_the_headlines_ratio(ran):
    ratio = RATIO.search(ran["pipeline"]).group(0)
    assert ran["stars"][0] == ratio, (ran["stars"], ran["pipeline"])
    assert f"PPSD {ratio} than AR (medians)" in ran["ppsd_card"], ran["ppsd_card"]


@browser
def test_page_the_race_finishes_in_the_headlines_order(ran):
    """Issue 44: the headline said PPSD 1.33x faster while the race, replaying run 1, ended with PPSD last."""
    ratio = RATIO.search(ran["pipeline"]).group(0)
    order = re.findall(r"\b(AR|PPSD)\b", ran["verdict"].replace("Plain AR, one process", ""))
    if ratio.startswith("no "):  # "no faster (1.00×)": a tie in the medians, so the replayed round may go either way
        return
    if "faster" in ratio:
        assert order.index("PPSD") < order.index("AR"), (ratio, ran["verdict"])
    elif "slower" in ratio:
        assert order.index("AR") < order.index("PPSD"), (ratio, ran["verdict"])


@browser
def test_page_no_sentence_contradicts_the_headline(ran):
    ratio = RATIO.search(ran["pipeline"]).group(0)
    assert_one_story(ran["headline"], ratio, "measured" if ran["workers"] else "projected")
    for a_star in re.findall(r"a\* = (\S+)", ran["headline"]):
        assert 0 < float(a_star.rstrip(",.;")) <= 1, ran["headline"]


@browser
def test_page_the_slowest_stage_is_the_timelines_busiest(ran):
    named = re.search(r"slowest stage: stage (\d+) \(util (\d+)%", ran["headline"])
    assert named, ran["headline"]
    util = {int(re.match(r"stage (\d+)", r).group(1)): int(re.search(r"util (\d+)%", r).group(1))
            for r in ran["rows"] if r.startswith("stage")}
    assert util[int(named.group(1))] == int(named.group(2)) == max(util.values()), (ran["rows"], named.group(0))


@browser
def test_page_the_race_and_the_table_show_one_value_per_wall(ran):
    clock = "measured" if ran["workers"] else "projected"
    row = next(line for line in ran["table"].splitlines() if line.startswith(f"wall, {clock}"))
    cells = row.split("\t")[1:3]  # AR, PPSD
    assert [ran["race"]["AR"].split(" ✓")[0], ran["race"]["PPSD"].split(" ✓")[0]] == cells, (ran["race"], row)


@browser
@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="a choice needs 2 cores")
def test_page_plain_ar_is_the_faster_of_one_thread_and_every_core(ran):
    if not ran["workers"]:
        pytest.skip("plain AR is timed beside K stages at once only")
    found = re.search(r"the faster of 1 thread \(([\d.]+) (m?s)\) and (\d+) threads \((cut after )?([\d.]+) (m?s)",
                      ran["headline"])
    assert found, ran["headline"]
    one, every = (float(found.group(i)) * (1e-3 if found.group(i + 1) == "ms" else 1) for i in (1, 5))
    every_core = f"{found.group(3)} threads"
    kept = ({"1 thread"} if found.group(4) or one < every else {every_core} if every < one else  # a cut way had lost
            {"1 thread", every_core})  # equal as shown: either may have been the faster by less than shown
    assert any(f"on {way} with no pipeline, the faster of" in ran["headline"] for way in kept), ran["headline"]


def test_an_answer_too_short_to_time_shows_no_speedup(tiny_cache):
    """Issue 44: a one-token answer was headlined "PPSD 1.07× slower than AR ... to the same 1 tokens"."""
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=4, repeats=1)
    values = view.snapshot(list(run_comparison(request, tiny_cache, throttle=0.0))[-1])
    assert "The answer is 4 tokens: too short to time" in values["headline"]
    assert not RATIO.search(text(values["headline"])) and "than AR (medians)" not in values["stats_ppsd"]
    assert not [t for t in values["theory"].data if t.name.startswith("PPSD measured")]
    assert 'class="tok tok-' in values["stream_ppsd"]  # the answer itself still shows


def test_a_card_of_one_timed_round_says_so_not_medians(tiny_cache, quiet_machine):
    """Present mode times one round: its card gives the headline's ratio of that round."""
    request = RunRequest(prompt="def fibonacci(n):", model="tiny", max_new_tokens=16, repeats=1)
    snap = list(run_comparison(request, tiny_cache, throttle=0.0))[-1]
    values = view.snapshot(snap)
    label = words.ratio_text(snap.state.stats().ratio("ar", "ppsd"))
    assert f"PPSD {label} than AR (one round)" in values["stats_ppsd"] and "medians" not in values["stats_ppsd"]
    # the headline's ratio, or (issue 48) no number at all where the run's own ideal does not allow it
    assert ("Not a clean result" in values["headline"] if analysis.unclean_reason(RunView.of(snap).reading)
            else pipeline_ratio(values["headline"]) == label)


def test_plain_ar_slower_than_ar_on_the_same_eager_steps_is_a_fault_never_a_ppsd_win():
    """Issue 56: plain AR timed 3-10x too slow made "PPSD 5.72x faster than plain AR, so PPSD beats it"."""
    from ppsd.executors.kinds import KINDS

    way = PlainWay(2, "in this one process on 2 threads with no pipeline")
    slow = comparison((1.25, 1.25, 1.25), plain_walls=(9.0, 9.5, 9.2), plain=way, kind=KINDS["processes"])
    assert "timing fault" in analysis.unclean_reason(slow)
    assert "Not a clean result" in text(headline.speedup_headline(slow))
    assert "beats it" not in analysis.plain_sentence(slow)
    spread = comparison((1.25, 1.25, 1.25), plain_walls=(1.5, 4.2, 1.6), plain=way, kind=KINDS["processes"])
    assert "plain AR's slowest round took 2.80 times its fastest" in analysis.unclean_reason(spread)
    fine = comparison((1.25, 1.25, 1.25), plain_walls=(1.9, 2.0, 2.1), plain=way, kind=KINDS["processes"])
    assert analysis.unclean_reason(fine) == ""


def test_a_round_that_compiled_keeps_the_number_out_of_the_headline():
    c = comparison((1.25, 1.25, 1.25), compiled=(0,))
    assert "something compiled in this process during round 1" in analysis.unclean_reason(c)
    assert "Not a clean result" in text(headline.speedup_headline(c))


def test_a_round_other_programs_crowded_keeps_the_number_out_of_the_headline(monkeypatch):
    """Issue 56: a default Run that another program slowed evenly (28.4 s against 11-14 s) showed
    no stall in its trace, and its 0.72x read as a clean result."""
    monkeypatch.setattr(ppsd_quiet, "CROWDED_CORES", 0.3)  # as shipped: this module's tests read runs as quiet
    c = comparison((1.25, 1.25, 1.25), others=(0.02, 0.9, 0.05))
    assert "other programs used 0.9 of this machine's cores while round 2 ran" in analysis.unclean_reason(c)
    assert "Not a clean result" in text(headline.speedup_headline(c))
    assert analysis.unclean_reason(comparison((1.25, 1.25, 1.25), others=(0.02, 0.1, 0.05))) == ""


def test_when_ppsd_loses_the_headline_box_says_why_in_one_sentence():
    """Issue 56: "PPSD 1.26x slower than AR on the same pipeline" at a = 0.76 (ideal 1.44x), with no
    sentence on why; and the mission's two cases: a second thread that speeds AR up, or not."""
    from ppsd.executors.kinds import KINDS

    two = PlainWay(2, "in this one process on 2 threads with no pipeline", trials=((1, 1.86, True), (2, 1.1, True)))
    threaded = comparison((1.30, 1.30, 1.30), plain_walls=(1.1, 1.1, 1.1), plain=two, kind=KINDS["processes"])
    why = analysis.loss_sentence(threaded)
    assert why.startswith("Why PPSD lost: a second thread speeds AR up here (plain AR on 2 threads ran 1.69 times as fast")
    assert "no acceptance closes that gap here" in why  # AR on the pipeline 2.0 / 1.1 = 1.82x slower > 1 / 0.6
    assert why in text(headline.speedup_headline(threaded)) and why.count(". ") == 0
    one = PlainWay(1, "in this one process on 1 thread with no pipeline", trials=((1, 1.8, True), (2, 3.0, True)))
    single = comparison((1.05, 1.05, 1.05), plain_walls=(1.8, 1.8, 1.8), plain=one, kind=KINDS["processes"])
    assert "second thread" not in analysis.loss_sentence(single)
    assert "PPSD would need acceptance a* = 0.25 (a = 0.50 here)" in analysis.loss_sentence(single)
    own = comparison((0.8, 0.8, 0.8), kind=KINDS["processes"])  # lost to AR on its own pipeline
    assert analysis.loss_sentence(own).startswith("Why PPSD lost: at a = 0.50 the ideal is 1.25× faster than AR")
    assert "the cost of moving hidden states and logits between processes" in analysis.loss_sentence(own)
    won = comparison((1.3, 1.3, 1.3), plain_walls=(2.4, 2.4, 2.4), plain=one, kind=KINDS["processes"])
    assert analysis.loss_sentence(won) == ""  # PPSD beat every AR measured: nothing to explain
