"""What leaves the learner: the tensors pushed to a generator, under the model's own (HF) names.

Every weight push of the trainers (rlvr train / sft / ei) goes through push_tensors(model), so a wrapped
learner (a sharded FSDP2 module, a LoRA adapter) is turned into plain named tensors in one place.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def push_tensors(model) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter as the generator knows it (model.named_parameters() of a plain
    module: the learner's own storage, so an in-process HF generator sharing the module copies nothing)."""
    yield from model.named_parameters()
