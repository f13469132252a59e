"""Sampling: specs, rollouts, the Generator protocol, the transformers and vLLM generators,
and thinking budgets. VLLMGenerator lives in rlvr.rollout.vllm_generator (import it from there;
it is the only module that imports vllm, and only when constructed)."""

from rlvr.rollout.batch import rollouts_to_batch
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.thinking import generate_with_thinking_budget
from rlvr.rollout.types import Generator, Rollout, SamplingSpec

__all__ = [
    "Generator",
    "HFGenerator",
    "Rollout",
    "SamplingSpec",
    "generate_with_thinking_budget",
    "rollouts_to_batch",
]
