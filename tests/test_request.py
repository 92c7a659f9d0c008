"""A run is parsed and checked once (`app.request.CheckedRequest`): each check on a run's settings
has one home and one message, and everything downstream takes the checked request as true."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from app import handlers, lease, view
from app.request import FORM, CheckedRequest, RunRequest

ROOT = Path(__file__).resolve().parent.parent


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for folder in ("app", "ppsd") for p in (ROOT / folder).rglob("*.py")}


@pytest.mark.parametrize("check, home", [
    ("is a lone surrogate", "ppsd/chat.py"),  # every text field, page and library alike
    ("The prompt is empty", "app/request.py"),  # the page's words for a blank prompt
    ('whole_number("max_new_tokens"', "app/request.py"),
])
def test_each_check_on_a_run_is_written_once(check, home):
    assert [path for path, text in _sources().items() if check in text] == [home]


def test_a_checked_request_carries_what_was_checked_and_is_not_checked_again():
    run = RunRequest(prompt="hi", repeats=3, max_new_tokens=16.0, forced_acceptance=0.25).checked()
    assert isinstance(run, CheckedRequest) and run.checked() is run
    assert (run.rounds, run.forced, run.config.max_new_tokens) == (3, 0.25, 16)
    assert {name: getattr(run, name) for name in FORM} == {name: getattr(RunRequest(
        prompt="hi", repeats=3, max_new_tokens=16.0, forced_acceptance=0.25), name) for name in FORM}  # as sent
    with pytest.raises(ValueError, match=r"^repeats=0 is out of range: 1 <= repeats <= 9$"):
        dataclasses.replace(run, repeats=0)  # a changed copy is checked again
    with pytest.raises(ValueError, match="^The prompt is empty: type some text for the model to continue, or"):
        RunRequest(prompt=" \n", chat=False).checked()


def test_the_page_refuses_a_request_that_does_not_check_out_before_any_work():
    """On the Run button and the API: refused in words where the form is parsed, with no state,
    no model and no line touched (`state` is None here)."""
    form = {name: getattr(RunRequest(prompt="hi"), name) for name in FORM}
    ran = []
    for bad, said in ((dict(repeats=0), "repeats=0 is out of range"), (dict(prompt="  "), "The prompt is empty"),
                      (dict(max_new_tokens=2.5), "max_new_tokens")):
        (values,) = list(handlers.on_run_form(None, lambda *a: ran.append(a), None, *{**form, **bad}.values()))
        assert said in dict(zip(view.OUTPUTS, values))["summary"]["error"]
    assert not ran


def test_the_lease_of_a_stacked_run_is_its_kinds_not_the_eager_rate():
    """A kind's own cost a token sizes the lease: the stacked chain captures on a GPU as the
    captured steps do, so it is not leased at the eager rate."""
    request = lambda pipeline: RunRequest(prompt="hi", workers=True, pipeline=pipeline)  # noqa: E731
    assert lease.gpu_seconds(request("stacked")) == lease.gpu_seconds(request("graphed")) \
        == lease.gpu_seconds(request("auto")) < lease.gpu_seconds(request("threads"))
