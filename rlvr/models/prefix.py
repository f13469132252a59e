"""Shared-prefix scoring: each distinct prompt is run through the model once, its keys and values
reused by every response that continues it.

The G responses of a GRPO group share their prompt. `score_tokens` runs every row whole, so the
prompt's P tokens are processed G times in each forward and backward. Here a micro-batch's rows are
grouped by their prompt (the tokens before the first response label; rows need not be adjacent),
and the step runs in two forwards:

    prefix:  the group's whole prompt once, inputs 0..S (S = P - 1: inputs 0..S-1 have prompt labels,
             input S predicts the first response token), with use_cache -> K/V (g rows)
    suffix:  each row's inputs S+1..n-1 (its response tokens but the last), attending to its group's
             K/V and to itself; with cascade attention (rlvr.models.cascade) the group's K/V are read in
             place, else they are index-selected g -> b rows (differentiable) into a KV cache

Logprobs and entropy of the prompt positions come from the prefix forward (once per group), those of
the first response token from the group's logits at input S (gathered per row: the label differs),
the rest from the suffix forward; all land in the (B, T) layout `score_tokens` returns. Autograd runs
through the shared K/V and logits: the prompt's gradient is the sum of its G rows', as in the unshared
forward, so the numbers equal `score_tokens` up to float rounding (tests/models/test_prefix.py). The work on
prompt tokens falls by G; with short prompts (the demo: 8 of 11 tokens) the step's FLOPs fall about
3x, with the long shared templates of real tasks by nearly G.

Prefixes and suffixes are right-padded; an explicit 2-D attention mask (the prefix mask of the
row's group, then the row's own) hides the pads, and position ids continue the prefix's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.algo.logprobs import DEFAULT_CHUNK_SIZE, TokenScores, Truncation, token_scores
from rlvr.models.cascade import SharedPrefixKV, attention, forward_params
from rlvr.models.cascade import supported as cascade_supported
from rlvr.models.scoring import ScoreOutput, score_tokens


@dataclass
class PrefixGroups:
    """Rows grouped by shared prefix. prefix_len (g,) S of each group (>= 1); group_of_row (b,);
    rep (g,) a row of each group (whose first S inputs are the prefix)."""

    prefix_len: torch.Tensor
    group_of_row: torch.Tensor
    rep: torch.Tensor

    @property
    def n_groups(self) -> int:
        return int(self.rep.numel())


def prefix_groups(input_ids: torch.Tensor, response_mask: torch.Tensor, attention_mask: torch.Tensor,
                  min_share: int = 2) -> PrefixGroups | None:
    """Group the rows of a right-padded batch by their prompt: inputs 0..S, S = index of the first True of
    response_mask (input S is the prompt's last token; it predicts the first response token). Returns None when sharing saves nothing
    (no group has min_share rows, or some row has no response label: then score it whole)."""
    if input_ids.shape[0] < min_share or not bool(response_mask.any(dim=-1).all()):
        return None
    first = response_mask.int().argmax(dim=-1)  # (b,) S of each row
    lens = attention_mask.sum(-1)
    if bool((first < 1).any()) or bool((first >= lens).any()):
        return None
    keys: dict[tuple, int] = {}
    group_of_row, rep, plen = [], [], []
    ids = input_ids.tolist()
    for i, s in enumerate(first.tolist()):
        key = tuple(ids[i][:s + 1])  # the whole prompt: input S (its last token) predicts the first response token
        g = keys.get(key)
        if g is None:
            g = keys[key] = len(rep)
            rep.append(i)
            plen.append(s)
        group_of_row.append(g)
    if len(rep) > input_ids.shape[0] - (min_share - 1):  # fewer than min_share rows share anything
        return None
    return PrefixGroups(prefix_len=torch.tensor(plen), group_of_row=torch.tensor(group_of_row), rep=torch.tensor(rep))


def score_shared_prefix(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    attention_mask: torch.Tensor,
    groups: PrefixGroups,
    *,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    use_cascade: bool = True,
    truncation: Truncation | None = None,
):
    """`score_tokens` of a right-padded batch (input_ids, labels, attention_mask (b, T)), computed
    with each group's prefix run once (see the module docstring). Returns rlvr.models.ScoreOutput
    with logprobs and entropy (b, T) float32 (0 where attention_mask is 0); gradients flow when
    called with grad enabled. temperature, truncation: the distribution scored, as in score_tokens."""
    dev = next(model.parameters()).device
    b, T = input_ids.shape
    S = groups.prefix_len.to(dev)  # (g,) inputs whose labels are prompt tokens
    gor = groups.group_of_row.to(dev)  # (b,)
    rep = groups.rep.to(dev)
    ids, lab, am = input_ids.to(dev), labels.to(dev), attention_mask.to(dev)
    n = am.sum(-1)  # (b,) real inputs of each row (right-padded)
    g, P = groups.n_groups, int(S.max()) + 1
    rows = torch.arange(b, device=dev)

    # prefix: the whole prompt, inputs 0..S of a group (its last input S predicts the first response
    # token, whose label differs per row), right-padded to (g, P); columns > S of a group are pads
    col = torch.arange(P, device=dev).unsqueeze(0)  # (1, P)
    real_pre = col <= S.unsqueeze(1)  # (g, P)
    pre_ids = ids[rep, :P]
    pre_lab = torch.where(col < S.unsqueeze(1), lab[rep, :P], torch.full((), -100, dtype=lab.dtype, device=dev))
    pre_am = real_pre.long()
    pre_pos = col.expand(g, P)
    cache_kw = "cache" if "cache" in forward_params(type(model)) else "past_key_values"  # renamed in transformers 5.2x
    cascade = use_cascade and cascade_supported(model)
    # right padding: a causal model's real positions never see the pads after them, so the cascade
    # path needs no mask here (its suffix attention masks the pads of each prefix itself)
    out = model(input_ids=pre_ids, attention_mask=None if cascade else pre_am, position_ids=pre_pos, use_cache=True)
    cache = getattr(out, cache_kw)
    if cache is None:
        raise RuntimeError("shared-prefix scoring needs the model's KV cache, but its forward returned none "
                           "(use_cache off?); set algo.shared_prefix=false")
    dist = {"temperature": temperature, "truncation": truncation}  # the distribution scored, for all three parts
    pre = token_scores(out.logits, pre_lab, chunk_size=chunk_size, with_entropy=with_entropy, **dist)  # (g, P)
    Sr = S[gor]  # (b,)
    # the first response token of each row, from its group's logits at input S (one (b, V) gather)
    first_logits = out.logits[torch.arange(g, device=dev), S].index_select(0, gor).unsqueeze(1)  # (b, 1, V)
    first = token_scores(first_logits, lab[rows, Sr].unsqueeze(1), chunk_size=chunk_size, with_entropy=with_entropy,
                         **dist)  # (b, 1)
    del out, first_logits

    # suffix: row r's inputs S_r + 1 .. n_r - 1 (its response tokens but the last), right-padded to Lsuf
    suf_len = n - Sr - 1  # >= 0
    Lsuf = int(suf_len.max())
    empty = torch.zeros((b, 0), device=dev)
    suf = TokenScores(empty, empty, empty if pre.full_logp is not None else None)
    if Lsuf > 0:
        cs = torch.arange(Lsuf, device=dev)
        real_suf = cs.unsqueeze(0) < suf_len.unsqueeze(1)  # (b, Lsuf)
        at = (Sr.unsqueeze(1) + 1 + cs.unsqueeze(0)).clamp_max(T - 1)
        suf_ids = torch.where(real_suf, ids.gather(1, at), torch.zeros((), dtype=ids.dtype, device=dev))
        suf_lab = torch.where(real_suf, lab.gather(1, at), torch.full((), -100, dtype=lab.dtype, device=dev))
        suf_pos = Sr.unsqueeze(1) + 1 + cs.unsqueeze(0)
        pk = SharedPrefixKV.from_cache(cache, real_pre, gor) if cascade else None
        if pk is not None:  # cascade attention: the rows attend to their group's K/V, never copied per row
            with attention(model):
                out = model(input_ids=suf_ids, position_ids=suf_pos, use_cache=False, rlvr_prefix=pk)
            del pk
        else:
            select_rows(cache, gor)  # (g, ...) -> (b, ...) rows of each row's group, differentiable
            full_am = torch.cat([pre_am[gor], real_suf.long()], dim=1)
            out = model(input_ids=suf_ids, attention_mask=full_am, position_ids=suf_pos, use_cache=True,
                        **{cache_kw: cache})
        suf = token_scores(out.logits, suf_lab, chunk_size=chunk_size, with_entropy=with_entropy, **dist)  # (b, Lsuf)
        del out
    del cache

    # back to the (b, T) layout: one gather from [prefix values, first-token values, suffix values, 0]
    t = torch.arange(T, device=dev).unsqueeze(0)  # (1, T)
    Sr1 = Sr.unsqueeze(1)
    pre_idx = gor.unsqueeze(1) * P + t
    first_idx = (g * P + rows).unsqueeze(1).expand(b, T)
    suf_idx = g * P + b + rows.unsqueeze(1) * Lsuf + (t - Sr1 - 1)
    zero = torch.full((), g * P + b + b * Lsuf, device=dev)
    idx = torch.where(t < Sr1, pre_idx, torch.where(t == Sr1, first_idx,
                                                    torch.where(t < n.unsqueeze(1), suf_idx, zero)))

    def place(pre, first, suf):
        flat = torch.cat([pre.reshape(-1), first.reshape(-1), suf.reshape(-1), pre.new_zeros(1)])
        return flat.index_select(0, idx.reshape(-1)).view(b, T)  # backward: index_add, no sort

    logprobs = place(pre.logp, first.logp, suf.logp)
    entropy = place(pre.entropy, first.entropy, suf.entropy) if with_entropy else None
    full = place(pre.full_logp, first.full_logp, suf.full_logp) if pre.full_logp is not None else None
    return ScoreOutput(logprobs=logprobs, entropy=entropy, full_logprobs=full)


def select_rows(cache, rows: torch.Tensor) -> None:
    """cache rows -> cache rows[rows], in place. index_select (backward: one index_add) where the
    cache exposes its layers' keys/values, else the cache's own batch_select_indices."""
    layers = getattr(cache, "layers", None)
    if layers and all(isinstance(getattr(la, "keys", None), torch.Tensor) and
                      isinstance(getattr(la, "values", None), torch.Tensor) for la in layers):
        for la in layers:
            la.keys = la.keys.index_select(0, rows)
            la.values = la.values.index_select(0, rows)
    else:
        cache.batch_select_indices(rows)



def score_rows(model, input_ids, labels, attention_mask, response_mask=None, *, shared_prefix: bool = False,
               with_entropy: bool = False, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK_SIZE,
               truncation: Truncation | None = None):
    """`score_tokens` of a micro-batch, with its rows' shared prompts run once when shared_prefix
    is on and some rows share one (prefix_groups); else the plain forward. response_mask (b, T)
    tells where each row's prompt ends. temperature, truncation: the distribution scored (score_tokens)."""
    # activation checkpointing turns the training forward's KV cache off (transformers), so there is
    # no prefix cache to share: such a model runs every row whole
    checkpointing = model.training and (getattr(model, "is_activation_checkpointing", None)  # transformers 5.x
                                        if hasattr(type(model), "is_activation_checkpointing")
                                        else getattr(model, "is_gradient_checkpointing", False))
    groups = (prefix_groups(input_ids, response_mask, attention_mask)
              if shared_prefix and response_mask is not None and not checkpointing else None)
    if groups is None:
        return score_tokens(model, input_ids, labels, attention_mask, with_entropy=with_entropy,
                            temperature=temperature, chunk_size=chunk_size, truncation=truncation)
    return score_shared_prefix(model, input_ids, labels, attention_mask, groups, with_entropy=with_entropy,
                               temperature=temperature, chunk_size=chunk_size, truncation=truncation)
