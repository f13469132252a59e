"""What leaves the learner: the tensors pushed to a generator, under the model's own (HF) names.

Every weight push of the trainers (rlvr train / sft / ei) goes through push_tensors(model), so a wrapped
learner (a sharded FSDP2 module, a LoRA adapter) is turned into plain named tensors in one place.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from rlvr.models import lora


def push_tensors(model) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter as the generator knows it.

    A plain module: model.named_parameters(), the learner's own storage, so an in-process HF generator
    sharing the module copies nothing. A LoRA (peft) learner: rlvr.models.lora.LoraPush, the merged
    weights W + scaling * B @ A under the base model's HF names (the learner's module unchanged); a
    generator sharing the module sees push.module is its own model and copies nothing. A sharded learner
    (distributed.learner=fsdp2): each parameter gathered whole, one at a time, as the stream is read (a
    collective: every rank reads it to the end, rlvr.train.pg.sharded.ShardedSource)."""
    if lora.is_lora(model):
        return lora.LoraPush(model)
    if any(hasattr(p, "full_tensor") for p in model.parameters()):  # a sharded (FSDP2) learner: gathered
        return ((name, lora.full(p).detach()) for name, p in model.named_parameters())
    return model.named_parameters()
