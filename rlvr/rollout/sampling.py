"""One sampling step and stop-string detection, shared by the decode loops (rlvr.rollout.hf_generator's
plain loop, rlvr.rollout.static_decode's CUDA-graph loop) and the vLLM generator's stop handling."""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from rlvr.algo.logprobs import kept_mask, truncates
from rlvr.rollout.types import SamplingSpec


def process_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """logits (B, V) -> log-probabilities (B, V) float32 of the distribution sampled from:
    softmax(logits / temperature) restricted to the top_k tokens and then to the smallest set
    whose mass reaches top_p (the most likely token is always kept), renormalized. Removed
    tokens get -inf. temperature must be > 0. The kept set is rlvr.algo.logprobs.kept_mask, the
    rule the trainer scores with (algo Truncation), so sampler and trainer truncate alike."""
    if temperature == 1.0 and not truncates(logits.shape[-1], top_k, top_p):
        # nothing to divide or remove: the float32 log-softmax straight from the logits' own dtype (the same bits
        # as log_softmax(logits.float()), without writing the float32 copy)
        return torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    x = logits.float()
    if temperature != 1.0:  # x / 1.0 is x exactly: one pass over (B, V) saved at temperature 1
        x = x / temperature
    keep = kept_mask(x, top_k, top_p)
    if keep is not None:
        x = x.masked_fill(~keep, float("-inf"))
    return torch.log_softmax(x, dim=-1)


SAMPLE_BLOCK = 1024  # sample_rows finds a row's block of this many tokens first, then the token inside it


def sample_rows(logp: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling: row b takes the first token whose cumulative probability exceeds
    u[b] * (the row's total) (u in [0, 1), one uniform per row from that row's own RNG stream, so a row's sample
    does not depend on which other rows share the batch). logp (B, V), u (B,) -> ids (B,) int64.

    Rows of up to 2 * SAMPLE_BLOCK tokens take the float64 cumulative sum over the whole row. Longer rows go in
    two levels, so no (B, V) cumulative sum and no float64 copy of the row is written (on a GPU the sampler's
    step was ~5 GB of memory traffic at 512 x 151,936; this is ~1 GB, all of it in log_softmax, exp and one
    summing read): the probabilities' sums per block of SAMPLE_BLOCK tokens (accumulated in float64) and their
    running total find the block holding the target, then the running sum inside that one block finds the token.
    Zero-probability tokens are never chosen (the first index whose running sum is *above* the target: sums are
    flat across them), and where rounding puts the target at or past the end (u just below 1, or the block's own
    running sum ending a rounding error below its block sum), the last token with probability is taken. The
    choice equals the full float64 cumulative sum's except where the target falls within rounding (~1e-7 of
    the row's mass) of a boundary between two tokens (tests/rollout/test_rollout_sampling_exact.py)."""
    B, V = logp.shape
    if V <= 2 * SAMPLE_BLOCK:  # a short row: one cumulative sum over it costs less than the blocks' bookkeeping
        cdf = logp.double().exp().cumsum(-1)
        target = (u.double().to(cdf.device) * cdf[:, -1]).unsqueeze(-1)
        ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)
        return torch.minimum(ids, _last_positive(logp > float("-inf")).squeeze(-1))
    K = SAMPLE_BLOCK
    p = logp.exp()  # (B, V) in logp's dtype; 0 where removed (-inf)
    full = V // K * K
    sums = []
    if full:  # the whole blocks: a view of the rows (splitting the last dimension), whatever their layout
        sums.append(p[:, :full].reshape(B, V // K, K).sum(-1, dtype=torch.float64))
    if full < V:
        sums.append(p[:, full:].sum(-1, keepdim=True, dtype=torch.float64))
    block_sum = torch.cat(sums, -1) if len(sums) > 1 else sums[0]  # (B, blocks)
    running = block_sum.cumsum(-1)
    target = (u.double().to(p.device) * running[:, -1]).unsqueeze(-1)  # (B, 1)
    # the first block whose running total is above the target, at most the last block with mass
    j = torch.minimum(torch.searchsorted(running, target, right=True), _last_positive(block_sum))
    before = torch.where(j > 0, running.gather(-1, (j - 1).clamp_min(0)), 0.0)  # mass of the blocks before j
    cols = j * K + torch.arange(K, device=p.device)  # (B, K) the block's token ids, past V in a short last block
    inside = p.gather(-1, cols.clamp_max(V - 1)).masked_fill(cols >= V, 0.0)
    i = torch.searchsorted(before + inside.double().cumsum(-1), target, right=True)
    # at most V - 1: a row without any probability (NaN logits of a diverged model) takes the last token, as the
    # full cumulative sum did, and the run's own checks report the NaN
    return (j * K + torch.minimum(i, _last_positive(inside))).squeeze(-1).clamp_max(V - 1)


def _last_positive(x: torch.Tensor) -> torch.Tensor:
    """(B, n) -> (B, 1): the index of each row's last entry > 0, or last True of a bool x (the first True of the
    flipped row: argmax over the mask's bytes, read in place)."""
    mask = x if x.dtype == torch.bool else x > 0
    return x.shape[-1] - 1 - mask.flip(-1).view(torch.uint8).argmax(-1, keepdim=True)


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


# -- stop strings from token ids -------------------------------------------------------------------------------

_TOKEN_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> {"texts": ..., stops: table}
_REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 byte sequence decodes to


def _decode_each(tokenizer, seqs: list[list[int]]) -> list[str]:
    """decode(x, skip_special_tokens=True) for each x: one call of the Rust tokenizer where there is one (without
    the clean-up of spaces, which only ever removes characters: the superset the stop table needs)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if hasattr(backend, "decode_batch"):
        return backend.decode_batch(seqs, skip_special_tokens=True)
    return [tokenizer.decode(x, skip_special_tokens=True) for x in seqs]


def _cache(tokenizer) -> dict:
    """This module's per-tokenizer cache (emptied when the tokenizer's vocabulary grows; a fresh dict, kept
    nowhere, for a tokenizer that cannot be weakly referenced)."""
    n = len(tokenizer)
    try:
        cached = _TOKEN_TEXTS.get(tokenizer)
        if cached is None or cached["n"] != n:
            cached = _TOKEN_TEXTS[tokenizer] = {"n": n}
    except TypeError:
        cached = {"n": n}
    return cached


def token_texts(tokenizer) -> tuple[list[str], list[str | None]]:
    """Each token id's text twice, computed once per tokenizer: alone (decode([t])) and as it renders after an
    ordinary token a (decode([a, t]) less decode([a]); None where that is not a prefix). The second catches what
    decoders add or strip at a token's start in context (a SentencePiece token's leading space, a WordPiece
    separator)."""
    cached = _cache(tokenizer)
    if "texts" not in cached:
        n = cached["n"]
        alone = _decode_each(tokenizer, [[t] for t in range(n)])
        anchor = next((t for t, x in enumerate(alone) if len(x) == 1 and x.isalnum() and x.isascii()), None)
        if anchor is None:
            ctx: list[str | None] = [None] * n
        else:
            head = alone[anchor]
            ctx = [x[len(head):] if x.startswith(head) else None
                   for x in _decode_each(tokenizer, [[anchor, t] for t in range(n)])]
        cached["texts"] = (alone, ctx)
    return cached["texts"]


def stop_candidates(tokenizer, stops: Sequence[str]) -> torch.Tensor:
    """(len(tokenizer),) bool, True at the token ids after which a stop string may have just completed: those whose
    text (alone or in context, token_texts) holds the last character of some stop string, holds U+FFFD (a piece of
    a multi-byte character: it may complete any character with the bytes before it), or is empty. Made once per
    (tokenizer, stop strings).

    Why that is enough: find_completed_stop reports a stop string s only when the new token's text makes the
    response's text end after the previous text's length, with s ending there: s's last character sits at or past
    the previous length, and the characters there are the new token's text in context (or, where bytes of earlier
    tokens complete a character, the new token holds a continuation byte and decodes alone to U+FFFD)."""
    cached = _cache(tokenizer)
    key = ("stops", tuple(stops))
    if key not in cached:
        alone, ctx = token_texts(tokenizer)
        last = {s[-1] for s in stops if s} | {_REPLACEMENT}
        cached[key] = torch.tensor([
            not a or c is None or not c or any(ch in a or ch in c for ch in last)
            for a, c in zip(alone, ctx, strict=True)
        ], dtype=torch.bool) | (not all(stops))  # an empty stop string (SamplingSpec forbids it): every token
    return cached[key]


class StopStrings:
    """A generate call's stop strings, detected from the sampled token ids: only a row whose newest token may have
    completed one (stop_candidates) is decoded, by find_completed_stop (the same answer, the same cut text), so a
    row costs a decode per candidate token instead of one per token."""

    def __init__(self, tokenizer, stops: Sequence[str], include: bool):
        self.tokenizer, self.stops, self.include = tokenizer, tuple(stops), include
        self.window = max((len(x) for x in self.stops), default=0) + 16  # tokens decoded for the cheap check
        self.table = stop_candidates(tokenizer, self.stops) if self.stops else None

    def candidates(self, tok: torch.Tensor) -> torch.Tensor:
        """tok (any shape) int64 ids on the CPU -> bool of the same shape: may have completed a stop string (ids
        past the tokenizer's vocabulary, which the model's padded one may hold, always may)."""
        n = len(self.table)
        return torch.where(tok < n, self.table[tok.clamp(0, n - 1)], True)

    def check(self, ids: list[int]) -> tuple[str, str] | None:
        """find_completed_stop for a row whose tokens so far are `ids` (the newest last)."""
        return find_completed_stop(self.tokenizer, ids, self.stops, self.include, self.window)
