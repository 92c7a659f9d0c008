"""PPSD: pipeline-parallel self-speculative decoding (Li et al., arXiv 2509.19368).

The core: a staged early-exit model (`model`), three decoders (`decoders`) over an executor
(`executors`: the schedule, in process or on K processes), the trace and its metrics (`trace`,
`metrics`). `generate` is the entry point. Exit heads are `heads`, benchmarks `bench`, the
command line `cli`.
"""

__version__ = "0.1.0"  # pyproject.toml's version (tests/test_recording.py checks they agree); a recording names it

from .config import DecodeConfig, MAX_NEW_TOKENS_CAP, balanced_exit_layer, stage_layers
from .generate import Result, generate, stream
from .metrics import Metrics, ideal_eesd_speedup, ideal_ppsd_speedup_slowest_stage
from .model import DEFAULT_MODEL, KVCache, StagedModel, load_model
from .steps import Committed, Draft, Drafted, Event, Flushed, Recorder, Step, Token, Work
from .trace import Trace

__all__ = [
    "DEFAULT_MODEL", "MAX_NEW_TOKENS_CAP", "Committed", "DecodeConfig", "Draft", "Drafted", "Event",
    "Flushed", "KVCache", "Metrics", "Recorder", "Result", "StagedModel", "Step", "Token", "Trace",
    "Work", "balanced_exit_layer", "generate", "ideal_eesd_speedup",
    "ideal_ppsd_speedup_slowest_stage", "load_model", "stage_layers", "stream",
]
