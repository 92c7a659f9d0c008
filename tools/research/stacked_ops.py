"""Count the ops a stacked slot dispatches against the graphed executor's steps, on a CPU.

    python tools/research/stacked_ops.py [--layers 30 --exit-layer 15]

A random Llama of the given depth (tiny width: the op count does not depend on it), its ops
recorded with a torch dispatch mode, view ops (no kernel) left out. It is a proxy for a GPU's
kernel launches, not a measurement of them: an op may launch more than one kernel, or none.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ppsd import StagedModel  # noqa: E402
from ppsd.config import stage_layers  # noqa: E402
from ppsd.executors.runtime import GraphedExecutor  # noqa: E402
from ppsd.executors.stacked import StackedExecutor  # noqa: E402

VIEWS = {"view", "slice", "select", "unsqueeze", "t", "transpose", "expand", "permute", "_unsafe_view", "detach",
         "split", "alias", "as_strided", "reshape", "chunk", "squeeze"}


class Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += func._schema.name.removeprefix("aten::") not in VIEWS
        return func(*args, **(kwargs or {}))


def counted(step) -> int:
    step()  # one-time work (caches, tables) left out, as a graph's warm-up does
    with Count() as count:
        step()
    return count.ops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--exit-layer", type=int, default=15)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=36, intermediate_size=96, num_hidden_layers=args.layers,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256)
    model = StagedModel(LlamaForCausalLM(config).eval(), name="random")
    partition = stage_layers(args.layers, args.exit_layer, 2)
    with torch.inference_mode():
        stacked, graphed = StackedExecutor(model, partition), GraphedExecutor(model, partition)
        stacked.cache.reserve(64), graphed.cache.reserve(64)
        for live in ((0, 1), (0,), (1,)):
            stacked.engine.table(live)
        slot = counted(lambda: stacked.step.run(0, 64, (0, 1), True))
        ar = counted(lambda: stacked.step.run(0, 64, (0,), False)) + counted(lambda: stacked.step.run(0, 64, (1,), False))
        stages = [counted(lambda k=k: graphed.steps.static_step(k, 64, k == 0)) for k in range(2)]
    print(f"RESULT stages {[len(r) for r in partition]}: stacked PPSD slot {slot} ops; stacked AR token {ar} ops; "
          f"graphed stage 1 {stages[0]} + stage 2 {stages[1]} = {sum(stages)} ops (one PPSD slot, or one AR token)")


if __name__ == "__main__":
    main()
