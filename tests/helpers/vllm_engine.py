"""The real vLLM engine's tests (marker vllm, `make test-vllm`): the tiny policy shape the CPU engine takes (head_dim
32: its attention refuses the default tiny model's 16), and the proof of a push: the rollouts sampled after it are
scored by the pushed policy to float tolerance (`gap`), and a perturbed copy of the policy (`perturbed`) does not
explain them. No vllm import here: a fresh process (tests/rollout/test_vllm_engine.py's separate engine) imports
this module with PYTHONPATH=tests."""

VLLM_SHAPE = dict(hidden_size=64, num_heads=2, num_layers=2, intermediate_size=128)
VLLM_TINY_MODEL = ["model.hidden_size=64", "model.num_heads=2", "model.num_layers=2", "model.intermediate_size=128"]

# A prompt longer than several KV blocks (16 tokens on the CPU engine), so the prefix cache holds it.
LONG = "Q: " + "the quick brown fox jumps over the lazy dog; " * 3 + "A:"


def perturbed(model, scale: float = 0.5, seed: int = 123):
    """A copy of `model` with every weight moved by scale * N(0, std of that weight)."""
    import copy

    import torch

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (float(p.std()) if p.numel() > 1 else 1.0))
    return other


def gap(model, rollouts, truncation=None, temperature: float = 1.0) -> float:
    """Largest |trainer - sampler| logprob over the sampled tokens of `rollouts`."""
    import torch

    from rlvr.models import score_tokens
    from rlvr.rollout import rollouts_to_batch

    b = rollouts_to_batch(rollouts, 0)
    with torch.no_grad():
        kw = {"truncation": truncation} if truncation is not None else {}
        lp = score_tokens(model, b.input_ids, b.labels, b.attention_mask, temperature=temperature, **kw).logprobs
    m = b.response_mask.bool()
    return float((lp - b.sampler_logprobs)[m].abs().max())
