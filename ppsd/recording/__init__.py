"""A finished comparison as one file, and back: `RunRecord` holds everything a comparison
(`ppsd.compare.State`) produced, with where and when it ran, and `dumps` / `loads` turn it into
JSON bytes and back. `loads` checks a file before anything is built from it (`read`); anything
wrong is one `BadRecording` (a ValueError) in words.

The settings a front end ran with (the page's form) travel as a flat mapping of plain values
that this package checks for type only: what they mean is the front end's (`app.replay`). No
Gradio, no tokenizer: token text travels as recorded pieces and texts.
"""

from .format import (FORMAT, MAX_BYTES, MAX_DEPTH, VERSION, BadRecording, Machine, ModelFacts, Preamble,
                     RecordedRun, RunRecord)
from .read import loads
from .write import dumps, model_facts, now_utc, of_result, record, this_machine, weights_sha256

__all__ = ["FORMAT", "MAX_BYTES", "MAX_DEPTH", "VERSION", "BadRecording", "Machine", "ModelFacts", "Preamble", "RecordedRun",
           "RunRecord", "dumps", "loads", "model_facts", "now_utc", "of_result", "record", "this_machine",
           "weights_sha256"]
