"""The page's words for each executor kind: its radio button, where its measured clock ran, how a
run of it ran (the headline), the stages as one thing, and what its measured clock pays that the
projected one does not; and the page's sentences on which kind a run took, and why.

Boundary: words only. What a kind is, and which one a run takes, are the library's
(`ppsd.executors.kinds`, `ppsd.choice`); the words the library's own output needs (a kind's
`label`, `noun` and bench `row`) stay there. A new kind gets one entry in `WORDS`
(`tests/test_kinds.py` checks every kind has one).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppsd.choice import ForRun
from ppsd.executors.kinds import ExecutorKind

__all__ = ["AUTO_CHOICE", "KindWords", "WORDS", "note", "of"]

AUTO_CHOICE = "auto: the fastest PPSD measured here"  # the radio button for "auto" (`ppsd.choice.choose_measured`)


@dataclass(frozen=True)
class KindWords:
    """What the page says of one kind."""

    choice: str  # the radio button: "worker processes, one per stage"
    where: str  # where its measured clock ran: "each stage in its own worker process, at once"
    # A run of K stages on it ({k}: K; {each}: "a core" or "a CUDA stream"; {where}):
    ran: str = ""  # how the stages and AR ran, after "Measured: "
    stages: str = ""  # the stages as one thing, after "PPSD on "
    # What the measured clock pays that the projected one (the same stage costs replayed) does not:
    # "" when there is nothing to name; None when a projection says nothing of this kind.
    overhead: str | None = ""

    def ran_on(self, num_stages: int, device: str) -> str:
        return self._said(self.ran, num_stages, device)

    def stages_on(self, num_stages: int, device: str) -> str:
        return self._said(self.stages, num_stages, device)

    def _said(self, text: str, num_stages: int, device: str) -> str:
        each = "a CUDA stream" if device.startswith("cuda") else "a core"
        return text.format(k=num_stages, each=each, where=self.where)


WORDS: dict[str, KindWords] = {
    "in-process": KindWords("one process, the stages in turn", "stages in turn on one device"),
    "processes": KindWords(
        "worker processes, one per stage", "each stage in its own worker process, at once",
        ran="each of the K={k} stages ran in its own worker process (pinned to its own cores or GPU), at the same "
            "time; AR ran on the same pipeline",
        stages="the {k} worker processes",
        overhead="the cost of moving hidden states and logits between processes"),
    "threads": KindWords(
        "threads in this process", "each stage on its own thread in one process, at once",
        ran="each of the K={k} stages ran on its own thread in this one process ({each} each), at the same time, "
            "sharing the weights and the KV cache; AR ran on the same threads",
        stages="the {k} stage threads",
        overhead="what the threads lose to each other (on a CPU, Python's lock between short kernels)"),
    "graphed": KindWords(
        "captured steps, one per stage",
        "each stage a captured step (a CUDA graph on its stream, or a compiled step on its thread), at once",
        ran="each of the K={k} stages ran as one captured step in this one process ({where}), sharing the weights "
            "and a static KV cache; AR ran on the same steps",
        stages="the {k}-stage pipeline ({where})"),
    "stacked": KindWords(
        "stacked stages, one chain a slot (experimental: slower on every CPU measured, not yet run on a GPU)",
        "every stage at once in one chain of stacked layers (a CUDA graph a slot, or eager on a CPU)",
        ran="the K={k} stages ran as one stacked chain in this one process ({where}): each slot runs layer j of "
            "every stage as one batched step over the K stages' tokens, on one KV cache; AR ran on the same engine",
        stages="the {k}-stage pipeline ({where})", overhead=None),
}


def of(kind: ExecutorKind | str) -> KindWords:
    """The page's words for `kind` (or the kind of that name)."""
    return WORDS[kind if isinstance(kind, str) else kind.name]


def note(run: ForRun) -> str:
    """The page's sentence on the kind `run` took, shown with the run's end ("" for a kind asked
    for by name that ran as asked)."""
    if run.instead_of is not None:
        return (f"The {of(run.instead_of).choice} cannot run here ({run.reason}), so the stages ran on "
                f"{of(run.kind).choice}.")
    if run.chosen is not None:
        return f"The stages ran on the {run.chosen.kind.noun}, chosen by auto: {run.chosen.why}."
    return ""
