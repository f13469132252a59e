"""Per-token log-probabilities (and entropy) of given labels under a causal LM.

One function for the policy (called with grad) and for old/reference policies (called under
torch.no_grad()). Memory is bounded two ways: the batch is run in micro-batches of
`micro_batch_size` rows, and the (rows, T, V) logits are turned into logprobs by the chunked
functions of `rlvr.algo.logprobs`, which never materialise a full log_softmax. Under grad each
micro-batch's graph stays alive until the caller's backward, so a trainer that wants bounded
activation memory calls `score_tokens` once per micro-batch and backpropagates in between.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algo import LOSS_AGGREGATIONS, loss_normalizers
from rlvr.algo.logprobs import DEFAULT_CHUNK_SIZE, Truncation, token_scores


@dataclass
class ScoreOutput:
    """Scores aligned with the labels passed in."""

    logprobs: torch.Tensor  # (B, T) float32, log p(labels[b, t] | input_ids[b, :t+1]) in nats
    entropy: torch.Tensor | None = None  # (B, T) float32 entropy of the next-token distribution (nats)
    hidden: torch.Tensor | None = None  # (B, T, H) last hidden state (with_hidden=True): a value head reads it
    # (B, T) float32 log p(labels) under the UNtruncated softmax(logits / temperature), set only when a
    # truncation (top-k / top-p) was scored: the KL penalty reads it (rlvr.algo.logprobs.token_scores)
    full_logprobs: torch.Tensor | None = None

    @property
    def model_logprobs(self) -> torch.Tensor:
        """The labels' logprobs under the model's untruncated distribution (at the temperature): full_logprobs
        under a truncation, else logprobs (the same thing)."""
        return self.logprobs if self.full_logprobs is None else self.full_logprobs


def position_ids_of(attention_mask: torch.Tensor) -> torch.Tensor:
    # Positions count real tokens only, so left-padded rows get the same positions as unpadded
    # ones (transformers would otherwise number the pads). For right padding this is arange.
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def score_tokens(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    micro_batch_size: int | None = None,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    with_hidden: bool = False,
    truncation: Truncation | None = None,
) -> ScoreOutput:
    """Score `labels` (B, T) given `input_ids` (B, T) (already shifted: labels[:, t] is the token
    after input_ids[:, t]). attention_mask (B, T) optional (1 = real token); with it, padded
    rows may be left- or right-padded, and trailing all-pad columns of each micro-batch are
    skipped (exact: a causal model never looks right). Positions where attention_mask is 0 get
    logprob 0 and entropy 0. temperature divides the logits (use the sampling temperature to
    score under the sampled distribution). truncation: the sampler's top-k / top-p
    (rlvr.algo.logprobs.Truncation): score the truncated, renormalized distribution it sampled from
    (and full_logprobs: the untruncated one, for the KL penalty); None = the full softmax. Gradients flow if called with grad enabled.
    with_hidden: also return the last hidden state at each position (the state that predicts
    labels[:, t]), from the same forward, for a value head on the policy's trunk.
    Returns ScoreOutput(logprobs (B, T) float32, entropy (B, T) float32 | None, hidden (B, T, H) | None).
    """
    if input_ids.shape != labels.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and labels {tuple(labels.shape)} must be equal (B, T)"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    B, T = input_ids.shape
    mb = micro_batch_size or B
    if mb <= 0:
        raise ValueError(f"micro_batch_size must be > 0, got {micro_batch_size}")
    device = next(model.parameters()).device
    lp_parts, ent_parts, hid_parts, full_parts = [], [], [], []
    for s in range(0, B, mb):
        ids = input_ids[s : s + mb].to(device)
        lab = labels[s : s + mb].to(device)
        kwargs = {}
        L = T
        if attention_mask is not None:
            am = attention_mask[s : s + mb].to(device)
            cols = am.any(dim=0).nonzero()
            L = int(cols[-1]) + 1 if len(cols) else 1
            am = am[:, :L]
            kwargs = {"attention_mask": am, "position_ids": position_ids_of(am)}
        if with_hidden:
            kwargs["output_hidden_states"] = True
        out = model(input_ids=ids[:, :L], use_cache=False, **kwargs)
        logits = out.logits  # (mb, L, V)
        if with_hidden:
            hid = out.hidden_states[-1]  # (mb, L, H)
            hid_parts.append(torch.nn.functional.pad(hid, (0, 0, 0, T - L)) if L < T else hid)
        scored = token_scores(logits, lab[:, :L], chunk_size=chunk_size, with_entropy=with_entropy,
                              temperature=temperature, truncation=truncation)
        lp, ent, full = scored.logp, scored.entropy, scored.full_logp
        if attention_mask is not None:
            keep = am.bool()
            lp = torch.where(keep, lp, torch.zeros_like(lp))
            ent = torch.where(keep, ent, torch.zeros_like(ent)) if ent is not None else None
            full = torch.where(keep, full, torch.zeros_like(full)) if full is not None else None
        if L < T:  # pad the skipped all-pad columns back with zeros
            lp = torch.nn.functional.pad(lp, (0, T - L))
            ent = torch.nn.functional.pad(ent, (0, T - L)) if ent is not None else None
            full = torch.nn.functional.pad(full, (0, T - L)) if full is not None else None
        lp_parts.append(lp)
        ent_parts.append(ent)
        full_parts.append(full)
    logprobs = torch.cat(lp_parts, dim=0)
    entropy = torch.cat(ent_parts, dim=0) if with_entropy else None
    hidden = torch.cat(hid_parts, dim=0) if with_hidden else None
    full_logprobs = torch.cat(full_parts, dim=0) if full_parts and full_parts[0] is not None else None
    return ScoreOutput(logprobs=logprobs, entropy=entropy, hidden=hidden, full_logprobs=full_logprobs)


def sft_loss(model, batch, aggregation: str, micro_batch_size: int, norm_length: int = 0) -> float:
    """Backward of the aggregated response-token NLL over `batch` in micro-batches; returns the loss.

    norm_length: the constant of `seq_mean_token_sum_norm` (the trainer passes algo.max_length, the
    longest possible response), so that mode works for SFT instead of failing at the first step."""
    norm = loss_normalizers(batch.response_mask, constant=float(norm_length) if norm_length else None)
    agg = LOSS_AGGREGATIONS[aggregation]
    total = 0.0
    n = batch.input_ids.shape[0]
    for lo in range(0, n, micro_batch_size):
        mb = batch.rows(torch.arange(lo, min(lo + micro_batch_size, n)))
        logp = score_tokens(model, mb.input_ids, mb.labels, mb.attention_mask).logprobs  # (b, T)
        loss = agg(-logp, mb.response_mask, norm)
        loss.backward()
        total += float(loss.detach())
    return total
