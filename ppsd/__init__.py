"""PPSD: pipeline-parallel self-speculative decoding (Li et al., arXiv 2509.19368).

- `model`: the staged early-exit model (HF modules, the reference); `heads`: exit heads;
- `decoders`: AR, EESD and PPSD as loops over an executor; `generate`: the entry point;
- `executors`: the schedule and the ways to run K stages (in turn; threads; captured steps;
  stacked; K processes in `executors.distributed`) and the registry of kinds, as facts
  (`executors.kinds`); `choice`: which kind a run takes ("auto"), what this process has ready
  for it and what a run of a kind costs on a leased GPU; `plain_ar`: plain AR's ways here;
- `compare`: a timed comparison (rounds, plain AR, the statistic); `quiet`: no compile in a round;
- `trace`, `metrics`: the timeline and its numbers; `recording`: runs saved and read back;
- `bench`, `cli`: benchmarks and the command line.

The engine's design, kinds and measurements are in `docs/engine.md`, `docs/distributed.md` and
`docs/benchmarks.md`.
"""

__version__ = "0.1.0"  # pyproject.toml's version (tests/test_recording.py checks they agree); a recording names it

from .config import DecodeConfig, MAX_NEW_TOKENS_CAP, balanced_exit_layer, stage_layers
from .generate import Result, generate, stream
from .metrics import Metrics, ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage
from .model import DEFAULT_MODEL, StagedModel, load_model
from .steps import Committed, Draft, Drafted, Event, Flushed, Recorder, Step, Token, Work
from .trace import Trace

__all__ = [
    "DEFAULT_MODEL", "MAX_NEW_TOKENS_CAP", "Committed", "DecodeConfig", "Draft", "Drafted", "Event",
    "Flushed", "Metrics", "Recorder", "Result", "StagedModel", "Step", "Token", "Trace",
    "Work", "balanced_exit_layer", "generate", "ideal_eesd_speedup",
    "ideal_ppsd_speedup_slowest_stage", "load_model", "stage_layers", "stream",
]
