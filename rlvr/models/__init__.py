"""Policies: loading, the tiny CPU model factory, prompt/response tokenization and scoring."""

from rlvr.models.loading import load_policy, load_tokenizer, save_policy
from rlvr.models.scoring import ScoreOutput, score_tokens
from rlvr.models.tiny import DEFAULT_ALPHABET, build_char_tokenizer, build_tiny_model
from rlvr.models.tokenize import TrainingBatch, build_training_batch, tokenize_prompt_and_output

__all__ = [
    "ScoreOutput",
    "TrainingBatch",
    "build_training_batch",
    "score_tokens",
    "tokenize_prompt_and_output",
    "DEFAULT_ALPHABET",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_policy",
    "load_tokenizer",
    "save_policy",
]
