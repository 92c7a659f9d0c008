"""The teaching views on real runs of the tiny model: slots account for every piece of work and
every decision, follow the spec's cost model, agree with the executor's own slot numbers, and
render escaped plain-word rows; the pipeline picture uses the library's partition."""

from __future__ import annotations

import html
from collections import Counter

import pytest

import ppsd
from app import teach, token_stream
from ppsd import DecodeConfig
from ppsd.config import stage_layers
from ppsd.model import TINY_MODEL

NEW_TOKENS = 24  # long enough that both K=2 and K=3 see accepted and corrected drafts
EVIL = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = ppsd.load_model(TINY_MODEL, device="cpu")
    return model, tokenizer, tokenizer("Once upon a time")["input_ids"]


def run(tiny, method: str, num_stages: int) -> ppsd.Result:
    model, _, prompt = tiny
    return ppsd.generate(model, prompt, DecodeConfig(method=method, num_stages=num_stages, max_new_tokens=NEW_TOKENS))


@pytest.fixture(scope="module", params=[2, 3], ids=lambda k: f"K={k}")
def ppsd_run(request, tiny):
    result = run(tiny, "ppsd", request.param)
    trace = result.trace.project()
    piece = lambda i: tiny[1].decode([i])  # noqa: E731
    return result, trace, teach.slots(trace), piece


def test_every_event_lies_in_exactly_one_slot_on_its_own_stage(ppsd_run):
    result, trace, slots, _ = ppsd_run
    placed = [e for s in slots for e in s.work if e is not None]
    assert Counter(map(id, placed)) == Counter(map(id, trace.events))  # kept and flushed, once each
    assert all(len(s.work) == trace.num_stages for s in slots)
    assert all(e.stage == k for s in slots for k, e in enumerate(s.work, start=1) if e is not None)
    assert [s.index for s in slots] == list(range(len(slots)))


def test_slot_order_is_each_stages_order_on_the_projected_clock(ppsd_run):
    _, trace, slots, _ = ppsd_run
    for k in range(trace.num_stages):
        on_stage = [s.work[k] for s in slots if s.work[k] is not None]
        assert all(a.end <= b.start + 1e-9 for a, b in zip(on_stage, on_stage[1:]))


def test_slots_agree_with_the_executors_slot_numbers_after_k_prefill_slots(ppsd_run):
    _, trace, slots, _ = ppsd_run
    offsets = {s.index - e.slot for s in slots for e in s.work if e is not None and e.slot is not None}
    assert offsets == {trace.num_stages}
    assert all(e.kind == "prefill" for s in slots[: trace.num_stages] for e in s.work if e is not None)


def test_measured_and_projected_traces_give_the_same_slots(ppsd_run):
    result, _, slots, _ = ppsd_run

    def shape(slot_list):
        return [(tuple(e and (e.stage, e.position, e.kind) for e in s.work), s.committed, s.decision)
                for s in slot_list]

    assert result.trace.clock == "measured" and shape(teach.slots(result.trace)) == shape(slots)


def test_decisions_in_slots_are_the_decisions_in_the_tokens(ppsd_run):
    result, _, slots, _ = ppsd_run
    by_position = {t.position: t for t in result.tokens}
    decided = [s for s in slots if s.decision is not None]
    statuses = Counter(t.status for t in result.tokens)
    assert statuses["accepted"] and statuses["corrected"]  # the run exercises both paths
    assert len(decided) == statuses["accepted"] + statuses["corrected"]
    assert all(by_position[s.committed[0]].status == s.decision for s in decided)
    assert sorted(p for s in slots for p in s.committed) == [t.position for t in result.tokens]


def test_accepted_costs_one_slot_and_corrected_costs_k(ppsd_run):
    """Spec, the ideal model: after prefill (K slots) the first verdict comes K slots later, then
    the next one 1 slot after an acceptance and K after a correction."""
    _, trace, slots, _ = ppsd_run
    k = trace.num_stages
    decided = [s for s in slots if s.decision is not None]
    expected = [k - 1 + k]
    for slot in decided[:-1]:
        expected.append(expected[-1] + (1 if slot.decision == "accepted" else k))
    assert [s.index for s in decided] == expected and len(slots) == expected[-1] + 1


def test_committed_text_grows_to_the_decoded_tokens(ppsd_run):
    result, trace, slots, piece = ppsd_run
    k = trace.num_stages
    assert "nothing committed yet" in teach.render_slot(slots, k - 2, result.tokens, piece)
    label = "the text committed by this slot"
    assert (token_stream.render_tokens(result.tokens[:1], piece, label=label)
            in teach.render_slot(slots, k - 1, result.tokens, piece))
    last = teach.render_slot(slots, len(slots) - 1, result.tokens, piece)
    assert token_stream.render_tokens(result.tokens, piece, label=label) in last


def test_rows_say_in_plain_words_what_each_stage_does(ppsd_run):
    result, trace, slots, piece = ppsd_run
    by_position = {t.position: t for t in result.tokens}
    quote = lambda i: html.escape(repr(piece(i)))  # noqa: E731
    pages = {s.index: teach.render_slot(slots, s.index, result.tokens, piece) for s in slots}
    for s in slots:
        if s.decision == "corrected":
            token = by_position[s.committed[0]]
            assert f"verifies token {token.position} {quote(token.draft)}: corrected to {quote(token.id)}" \
                in pages[s.index]
        elif s.decision == "accepted":
            assert f"verifies token {s.committed[0]} {quote(by_position[s.committed[0]].id)}: accepted" \
                in pages[s.index]
        if any(e is None for e in s.work):
            assert pages[s.index].count("idle (bubble)") == sum(e is None for e in s.work)
        if any(e is not None and e.kind == "flushed" for e in s.work):
            assert "flushed: ran layers" in pages[s.index]
    drafting = next(s for s in slots if s.work[0] is not None and s.work[0].kind == "draft")
    assert f"drafts token {drafting.work[0].position + 1}" in pages[drafting.index]
    assert f"layers 0–{trace.partition[0].stop - 1} + exit head" in pages[drafting.index]


def test_captions_count_slots_and_what_a_correction_flushes(ppsd_run):
    _, trace, slots, _ = ppsd_run
    k = trace.num_stages
    assert teach.step_caption(slots, 0) == f"Slot 1 of {len(slots)}: the prompt passes stage 1, filling the pipeline."
    first = next(s for s in slots if s.decision == "corrected")
    assert first.index < len(slots) - k  # not cut short by the end of the run
    # Spec: a correction flushes the K - 1 tokens in flight, K(K-1)/2 stage-slots of work.
    plural = k > 2
    assert (f"the {k - 1} token{'s' * plural} in flight behind it {'are' if plural else 'is'} flushed "
            f"({k * (k - 1) // 2} stage-slot{'s' * plural} of work wasted)") in teach.step_caption(slots, first.index)
    with pytest.raises(ValueError, match="out of range"):
        teach.step_caption(slots, len(slots))


def test_render_slot_escapes_token_text(ppsd_run):
    result, _, slots, _ = ppsd_run
    for index in range(len(slots)):
        page = teach.render_slot(slots, index, result.tokens, lambda i: EVIL)
        assert "<script>" not in page
    assert "&lt;script&gt;" in page


def test_ar_takes_k_slots_per_token_and_eesd_is_refused(tiny):
    """Spec: an AR step on the same K-stage pipeline takes K slots."""
    ar = run(tiny, "ar", 3)
    slots = teach.slots(ar.trace)
    assert len(slots) == 3 * len(ar.tokens)
    page = teach.render_slot(slots, len(slots) - 1, ar.tokens, str)
    assert "drafts" not in page and "(no draft to check)" in page
    with pytest.raises(ValueError, match="EESD"):
        teach.slots(run(tiny, "eesd", 2).trace)


def test_empty_inputs_render_placeholders():
    assert "appears here" in teach.render_slot([], 0, [], str)
    assert teach.step_caption([], 0).startswith("No slots yet")


# --------------------------------------------------------------------------- pipeline diagram


def test_diagram_names_the_stage_layers_the_exit_head_and_the_verifier():
    page = teach.pipeline_diagram(30, 18, 2)
    assert "layers 0–17" in page and "layers 18–29" in page
    assert page.count('class="teach-stage ') == 2 and "exit head" in page and "verifies" in page
    assert "<figcaption>" in page


@pytest.mark.parametrize("layers,exit_layer,num_stages", [(30, 18, 3), (30, 10, 4), (4, 2, 3)])
def test_diagram_follows_stage_layers(layers, exit_layer, num_stages):
    page = teach.pipeline_diagram(layers, exit_layer, num_stages)
    for k, r in enumerate(stage_layers(layers, exit_layer, num_stages), start=1):
        label = f"layer {r.start}" if len(r) == 1 else f"layers {r.start}–{r.stop - 1}"
        assert f"stage {k}</div><div class=\"teach-stage-layers\">{label}</div>" in page
    assert page.count("→") == num_stages - 1


@pytest.mark.parametrize("num_stages", [5, 10, 13])
def test_many_stages_between_the_first_and_the_last_are_one_box(num_stages):
    """K = 10 boxes side by side squeezed each role to a few letters: the stages between the
    drafter and the verifier are drawn as one box with all their layers."""
    page = teach.pipeline_diagram(30, 3, num_stages)
    ranges = stage_layers(30, 3, num_stages)
    assert page.count('class="teach-stage ') == 3 and page.count("→") == 2
    middle = f"layers {ranges[1].start}–{ranges[-2].stop - 1}"
    assert f"stages 2–{num_stages - 1}</div><div class=\"teach-stage-layers\">{middle}</div>" in page
    assert f"{num_stages - 2} stages, each passes the hidden state on" in page
    assert f"stage {num_stages}</div>" in page and "verifies" in page


@pytest.mark.parametrize("layers,exit_layer,num_stages,word", [
    (30, 0, 2, "exit layer"),    # stage 1 needs at least one layer
    (30, 30, 2, "exit layer"),   # and must leave some for the stages behind it
    (30, 18, 1, "stages"),       # one stage is no pipeline
    (30, 18, 14, "do not fit"),  # 12 layers after E hold at most 12 more stages
])
def test_diagram_refuses_exit_layers_and_stage_counts_out_of_range(layers, exit_layer, num_stages, word):
    with pytest.raises(ValueError, match=word):
        teach.pipeline_diagram(layers, exit_layer, num_stages)
