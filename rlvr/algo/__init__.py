"""Pure tensor math for RLVR: tensors and floats in, tensors out (no models, no I/O)."""

from rlvr.algo.logprobs import (
    IGNORE_INDEX,
    entropy_from_logits,
    logprobs_and_entropy,
    token_logprobs_from_logits,
)

__all__ = [
    "IGNORE_INDEX",
    "entropy_from_logits",
    "logprobs_and_entropy",
    "token_logprobs_from_logits",
]
