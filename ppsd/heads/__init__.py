"""Exit heads: the draft model's last piece (stage 1's head over layer E's hidden state).

`exits` holds the head types, `files` a saved head and what binds it to its base model,
`shipped` the heads this repository ships and how an entry point picks one; training is
`data` (the text), `distill` (the objective) and `train` (the loop; its command line,
`python -m ppsd train-head`, is `ppsd.cli.train_head`); `corpus` is the built-in training text.
"""

from .exits import HEAD_TYPES, TRAINED_HEAD_TYPES, build_head
from .files import HeadConfig, NotAHead, fingerprint, load_exit_head, save_exit_head
from .shipped import AUTO_HEAD, SHARED_HEAD, HeadChoice, choose_exit_head, default_exit_layer, pipeline_stages, shipped_head

__all__ = ["AUTO_HEAD", "HEAD_TYPES", "TRAINED_HEAD_TYPES", "HeadChoice", "HeadConfig", "NotAHead", "SHARED_HEAD", "build_head",
           "choose_exit_head", "default_exit_layer", "fingerprint", "load_exit_head",
           "pipeline_stages", "save_exit_head", "shipped_head"]
