"""Sampling: specs, rollouts, the Generator protocol, the transformers and vLLM generators,
and thinking budgets. VLLMGenerator lives in rlvr.rollout.vllm_generator (import it from there;
it is the only module that imports vllm, and only when constructed)."""

from rlvr.rollout.batch import rollouts_to_batch
from rlvr.rollout.builder import GENERATOR_BACKENDS, build_generator, register_generator_backend
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.thinking import ThinkingBudgetGenerator, generate_with_thinking_budget, with_thinking_budget
from rlvr.rollout.types import Generator, Rollout, SamplingSpec

__all__ = [
    "GENERATOR_BACKENDS",
    "Generator",
    "HFGenerator",
    "Rollout",
    "SamplingSpec",
    "ThinkingBudgetGenerator",
    "build_generator",
    "generate_with_thinking_budget",
    "register_generator_backend",
    "rollouts_to_batch",
    "with_thinking_budget",
]
