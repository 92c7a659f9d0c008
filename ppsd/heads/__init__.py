"""Exit heads: the draft model's last piece (stage 1's head over layer E's hidden state).

`exits` holds the head types, their files and the shipped heads; `train` trains one by
self-distillation (`python -m ppsd train-head`); `corpus` is the built-in training text.
"""

from .exits import (AUTO_HEAD, HEAD_TYPES, TRAINED_HEAD_TYPES, HeadChoice, HeadConfig, build_head,
                    choose_exit_head, default_exit_layer, exit_layer_for, fingerprint, load_exit_head,
                    pipeline_stages, save_exit_head, shipped_head)

__all__ = ["AUTO_HEAD", "HEAD_TYPES", "TRAINED_HEAD_TYPES", "HeadChoice", "HeadConfig", "build_head",
           "choose_exit_head", "default_exit_layer", "exit_layer_for", "fingerprint", "load_exit_head",
           "pipeline_stages", "save_exit_head", "shipped_head"]
