"""The page's words: the title, the intro, the captions, the example prompts and the labels
other words name (a warning names the control to change). Text only; no events.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Short questions whose greedy answers on the default model end within the default 64 tokens
# (tests/test_default_model.py checks it), so a class sees whole answers; never trained on.
PROMPTS = ROOT / "assets" / "prompts" / "examples.json"

BUILTIN_EXAMPLES = (
    {"name": "palindrome", "category": "code",
     "prompt": "Write a Python function that checks whether a word is a palindrome. Code only."},
    {"name": "sea poem", "category": "prose", "prompt": "Write a four-line poem about the sea."},
    {"name": "average speed", "category": "math",
     "prompt": "A car drives 150 km in 2 hours. What is its average speed? Answer briefly."},
)

TITLE = "Pipeline-Parallel Self-Speculative Decoding"
# Control labels the page's own words name (the warning for K past the cores names them to change).
STAGES_LABEL = "Stages K"
WORKERS_LABEL = "Run the K stages at once (measured clock)"

INTRO = """
**The picture.** A language model writes one word-piece (a *token*) at a time, and every token
passes through all of its layers, one after another: 30 layers here. Cut those layers into
**K** groups, the *stages* in the diagram, and give each stage its own worker, like stations on
an assembly line. Plain decoding (*autoregressive*, **AR**) keeps only one station busy: the next
token cannot start before the last one has left the line.

**The trick.** The first station can *guess* the next token early: after its first **E** layers, a
small *exit head* (a layer trained to predict the final answer from halfway through) proposes a
*draft*. The guess goes down the line at once, while the last station *verifies* the token before it.
If the full model agrees, the guess is **accepted** and a token came out after one station's time
instead of K. If not, the full model's own token is kept (**corrected**) and the guesses queued
behind the wrong one are thrown away (**flushed**).

**Why it is safe.** Every token that is kept is the full model's own choice, so the text is
*identical* to plain decoding; only the speed changes. The **acceptance rate** (the share of
guesses that were right) decides how much faster it is.

Press **Run**: the page decodes the same prompt with AR, then with PPSD (and, if ticked, with
**EESD**, which drafts several tokens and then verifies them in one go), and shows where each stage
works, waits and wastes. The default model is **SmolLM2-135M-Instruct** (30 layers), asked through
its chat template; its drafts come from an exit head trained for this demo on the model's own
answers (K = 2, E = 18). Method: Li et al., [arXiv 2509.19368](https://arxiv.org/abs/2509.19368).
"""

TIMELINE_CAPTION = """
Each bar is one stage working on one token (hover for position, token, slot and decision); gaps are
idle stage time, the pipeline's bubbles. In PPSD, stage 1 keeps drafting while the later stages
verify; a red × is a correction: the final stage rejected a draft and the work in flight behind it
turns orange (flushed). AR on the same pipeline keeps only one stage busy at a time. With **K worker
processes** the times are measured: each stage ran in its own process, at the same time as the others,
and stamped its own work on one clock. In **one process** the stages ran in turn, and the times are
their measured costs replayed as if each stage had its own worker (projected clock).
"""


def load_examples(path: Path = PROMPTS) -> list[dict]:
    """The page's example prompts (assets/prompts/examples.json) if present and well formed, else a
    few built-in ones (code, prose, math)."""
    try:
        items = json.loads(path.read_text())
        examples = [dict(name=str(i["name"]), category=str(i["category"]), prompt=str(i["prompt"]))
                    for i in items if str(i.get("prompt", "")).strip()]
    except (OSError, ValueError, KeyError, TypeError):
        examples = []
    # A few per category keeps the list short enough to present.
    chosen, per_category = [], Counter()
    for item in examples:
        per_category[item["category"]] += 1
        if per_category[item["category"]] <= 3:
            chosen.append(item)
    return chosen or list(BUILTIN_EXAMPLES)
