"""One sampling step and stop-string detection, shared by the decode loops (rlvr.rollout.hf_generator's
plain loop, rlvr.rollout.static_decode's CUDA-graph loop) and the vLLM generator's stop handling."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlvr.algo.logprobs import kept_mask
from rlvr.rollout.types import SamplingSpec


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits (B, V) -> log-probabilities (B, V) float32 of the distribution sampled from:
    softmax(logits / temperature) restricted to the top_k tokens and then to the smallest set
    whose mass reaches top_p (the most likely token is always kept), renormalized. Removed
    tokens get -inf. temperature must be > 0. The kept set is rlvr.algo.logprobs.kept_mask, the
    rule the trainer scores with (algo Truncation), so sampler and trainer truncate alike."""
    x = logits.float() / temperature
    keep = kept_mask(x, top_k, top_p)
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(x, dim=-1)


def sample_rows(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: row b takes the first token whose cumulative probability exceeds
    u[b] (u in [0, 1), one uniform per row from that row's own RNG stream, so a row's sample does
    not depend on which other rows share the batch). logp (B, V), u (B,) -> ids (B,) int64."""
    cdf = logp.double().exp().cumsum(-1)  # (B, V)
    target = (u.double().to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
    # right=True: first index whose cdf is > target, so zero-probability tokens are never chosen.
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # u * total can round up to total (u just below 1): fall back to the last token that has
    # probability, never to a removed one at the end of the vocabulary.
    positive = logp > float("-inf")  # (B, V)
    last = logp.shape[-1] - 1 - positive.flip(-1).int().argmax(-1)  # (B,)
    return torch.minimum(ids, last)


def sample_step(logits: torch.Tensor, step: int, spec: SamplingSpec, eos: torch.Tensor,
                u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's choice for every row: (log-probabilities (B, V) of the distribution sampled from,
    token ids (B,)). EOS is banned before spec.min_tokens; greedy at temperature 0, else inverse-CDF sampling
    with u (B,) (the rows' uniforms of this step). Shared by the plain loop and the static-cache decode."""
    if step < spec.min_tokens and len(eos):
        logits = logits.clone()
        logits[:, eos] = float("-inf")
    if spec.temperature == 0:
        logp = torch.log_softmax(logits.float(), dim=-1)
        return logp, logp.argmax(-1)
    logp = process_logits(logits, spec.temperature, spec.top_k, spec.top_p)
    return logp, sample_rows(logp, u)


def decode_batch(tokenizer, seqs: list[list[int]]) -> list[str]:
    """[tokenizer.decode(x, skip_special_tokens=True) for x in seqs], in one call of the Rust tokenizer
    where that is the same thing (a fast tokenizer without clean-up of spaces); else one decode each."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if seqs and hasattr(backend, "decode_batch") and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return backend.decode_batch(seqs, skip_special_tokens=True)
    return [tokenizer.decode(x, skip_special_tokens=True) for x in seqs]


def find_completed_stop(
    tokenizer, ids: list[int], stops: Sequence[str], include: bool, window: int | None = None
) -> tuple[str, str] | None:
    """If the last of `ids` completed one of `stops`, return (stop, response text cut at it, the
    stop kept iff `include`); else None. Only the last `window` tokens are decoded for the cheap
    check (None = all), so the per-step cost does not grow with the response length."""
    tail_ids = ids if window is None else ids[-window:]
    tail = tokenizer.decode(tail_ids, skip_special_tokens=True)
    if not any(s in tail for s in stops):
        return None
    text = tokenizer.decode(ids, skip_special_tokens=True)
    prev_len = len(tokenizer.decode(ids[:-1], skip_special_tokens=True))
    best = None  # (start, stop): the earliest occurrence that ends inside the newest token's text
    for s in stops:
        k = text.find(s, max(0, prev_len - len(s) + 1))
        if k >= 0 and (best is None or k < best[0]):
            best = (k, s)
    if best is None:
        return None  # the stop string in the window is an old one (completed before min_tokens)
    k, s = best
    return s, text[: k + len(s)] if include else text[:k]
