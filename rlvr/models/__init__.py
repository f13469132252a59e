"""Policies: loading, the tiny CPU model factory, prompt/response tokenization and scoring."""

from rlvr.models.loading import load_policy, load_tokenizer, save_policy
from rlvr.models.tiny import DEFAULT_ALPHABET, build_char_tokenizer, build_tiny_model

__all__ = [
    "DEFAULT_ALPHABET",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_policy",
    "load_tokenizer",
    "save_policy",
]
