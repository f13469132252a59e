"""Prompt + response tokenization with a response mask (CS336 assignment 5 semantics).

Layout of one row, with P prompt tokens, R response tokens and right padding to the batch's
longest P + R (called T):

    ids           = prompt_ids + response_ids + [pad] * (T - P - R)           # (T,)
    input_ids     = ids[:-1]                                                    # (T-1,)
    labels        = ids[1:]                                                     # (T-1,)
    response_mask = 1 where labels[t] is a response token, i.e. t in [P-1, P+R-1)

Right padding needs no attention mask for a causal model (real positions never attend to later
pads), but `attention_mask` is provided anyway for code that wants to trim or pass it.
Prompt and response are tokenized *separately*, exactly as the assignment does, so response
token ids are those the sampler produced, not a re-tokenization of
the concatenated text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class TrainingBatch:
    """Right-padded, shifted batch for scoring and training. All tensors (B, T-1)."""

    input_ids: torch.Tensor  # (B, T-1) int64
    labels: torch.Tensor  # (B, T-1) int64; labels[b, t] = ids[b, t+1]
    response_mask: torch.Tensor  # (B, T-1) bool; label is a response token that enters the loss
    attention_mask: torch.Tensor  # (B, T-1) int64; 1 on real input tokens
    sampler_logprobs: torch.Tensor | None = None  # (B, T-1) float32 aligned with labels; 0 elsewhere

    def to(self, device) -> TrainingBatch:
        """Move every tensor to `device`."""
        move = lambda t: None if t is None else t.to(device)
        return TrainingBatch(*(move(getattr(self, f)) for f in self.__dataclass_fields__))

    def rows(self, idx: Sequence[int] | torch.Tensor) -> TrainingBatch:
        """The rows `idx` (in that order) of every tensor: a minibatch or micro-batch."""
        idx = torch.as_tensor(list(idx) if not isinstance(idx, torch.Tensor) else idx, dtype=torch.long)
        pick = lambda t: None if t is None else t.index_select(0, idx)
        return TrainingBatch(*(pick(getattr(self, f)) for f in self.__dataclass_fields__))


def build_training_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    pad_token_id: int,
    *,
    loss_masks: Sequence[Sequence[bool]] | None = None,
    sampler_logprobs: Sequence[Sequence[float] | None] | None = None,
) -> TrainingBatch:
    """Concatenate token ids, right-pad, shift, and mark response positions.

    loss_masks[i] (optional, len = len(response_ids[i])): False for response tokens that must not
    enter the loss (e.g. text forced by a thinking budget); they stay in the sequence so the
    model still conditions on them. sampler_logprobs[i] (optional): per-response-token logprobs
    from the sampler, placed at the same positions as the labels.
    """
    if len(prompt_ids) != len(response_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(response_ids)} responses")
    if not prompt_ids:
        raise ValueError("empty batch")
    rows = [list(p) + list(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
    T = max(len(r) for r in rows)
    if T < 2:
        raise ValueError("every batch needs at least one sequence of >= 2 tokens")
    # built as padded Python lists and turned into tensors once (a tensor per row cost more than
    # the training forward of a small model)
    ids_l, attn_l, resp_l = [], [], []
    lps_l = [] if sampler_logprobs is not None else None
    for i, (p, r, row) in enumerate(zip(prompt_ids, response_ids, rows, strict=True)):
        P, R = len(p), len(r)
        if P == 0 and R > 0:
            raise ValueError(f"row {i}: empty prompt; the first response token would have no context")
        pad = T - len(row)
        ids_l.append(row + [pad_token_id] * pad)
        attn_l.append([1] * len(row) + [0] * pad)
        m = [True] * R
        if R and loss_masks is not None:
            if len(loss_masks[i]) != R:
                raise ValueError(f"row {i}: loss mask has {len(loss_masks[i])} entries for {R} tokens")
            m = [bool(x) for x in loss_masks[i]]
        tail = T - 1 - (P - 1 + R) if R else 0
        resp_l.append([False] * (P - 1) + m + [False] * tail if R else [False] * (T - 1))
        if lps_l is not None:
            lp = sampler_logprobs[i]
            if R and lp is not None:
                if len(lp) != R:
                    raise ValueError(f"row {i}: {len(lp)} sampler logprobs for {R} tokens")
                lps_l.append([0.0] * (P - 1) + [float(x) for x in lp] + [0.0] * tail)
            else:
                lps_l.append([0.0] * (T - 1))
    ids = torch.tensor(ids_l, dtype=torch.long)
    attn = torch.tensor(attn_l, dtype=torch.long)
    resp = torch.tensor(resp_l, dtype=torch.bool)
    lps = torch.tensor(lps_l, dtype=torch.float32) if lps_l is not None else None
    return TrainingBatch(
        input_ids=ids[:, :-1].contiguous(),
        labels=ids[:, 1:].contiguous(),
        response_mask=resp,
        attention_mask=attn[:, :-1].contiguous(),
        sampler_logprobs=lps,
    )


def tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer) -> dict:
    """CS336 `tokenize_prompt_and_output`: dict with input_ids, labels, response_mask, each
    (B, max(prompt_and_output_lens) - 1); padding uses tokenizer.pad_token_id, response_mask is
    bool. Prompt and output are tokenized separately (special tokens only on the prompt)."""
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"{len(prompt_strs)} prompts but {len(output_strs)} outputs")
    # The prompt gets the tokenizer's own special tokens (a BOS for tokenizers that add one, as
    # the generators and vLLM do); the output is a continuation and gets none.
    p_ids = [tokenizer.encode(s) for s in prompt_strs]
    o_ids = [tokenizer.encode(s, add_special_tokens=False) for s in output_strs]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    b = build_training_batch(p_ids, o_ids, pad)
    return {"input_ids": b.input_ids, "labels": b.labels, "response_mask": b.response_mask}
