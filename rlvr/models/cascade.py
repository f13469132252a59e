"""Cascade attention over a shared prefix: the rows of a group attend to their prompt's keys and values
once per group, never copied per row.

The shared-prefix forward (rlvr.models.prefix) runs each group's prompt once and then each row's own
tokens (the suffix). Handing the prompt's KV cache to the suffix forward the transformers way means
copying it to every row (index_select g -> b rows) and, in the backward, scattering the rows' gradients
back (one scatter_add per layer, key and value): at the demo's shapes that copy and its backward cost
more than the attention itself. Here the suffix forward runs with this module's attention function
instead (registered in transformers' AttentionInterface as "rlvr_cascade" and switched on only for that
forward), which splits each query's attention in two parts with one softmax over both:

    scores = [ q . K_prefix(group of the row) ,  q . K_own(keys of the row so far, causal) ] * scale
    out    = softmax(scores)[prefix part] @ V_prefix(group)  +  softmax(scores)[own part] @ V_own

When the rows come in contiguous groups of equal size G (the trainer's layout: prompt-major), the prefix
part is one batched matmul per group and KV head over the G rows' queries stacked, (g, hkv, G*n_rep*L, d)
x (g, hkv, d, S): no per-row copy of the cache at all. Otherwise the group's keys are gathered per row
(the same work as the copy it replaces). Prefix positions that are padding are masked out; the own part
is causal; padding at the right of a row is never seen by a real position (causal), so no other mask is
needed. GQA is handled by grouping the n_rep query heads of each KV head, as `repeat_kv` does.

Two more branches choose by shape. Contiguous groups with few own keys (G x T <= _STACK_OWN) attend in
one masked SDPA per group over [prefix, all G rows' own keys] (the other rows' keys masked out): the
split softmax's dozen small ops cost more than G times the own part's few FLOPs there. Long suffixes
(_ROWS_SDPA_FROM new tokens or more) run one fused SDPA per row over [the group's prefix keys gathered
to the row, its own keys]: the split path keeps (L x S+T) score matrices for the backward, which at
1024-token responses made it 1.9x slower than forwarding every row whole and doubled its memory
(benchmarks/long_responses.py), while the gather costs little next to a long suffix's attention.

The sampler uses the same function for its decode steps: `SharedPrefixKV(append=True)` keeps each row's
generated keys and values (its own part) and appends the new token's at every call.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

NAME = "rlvr_cascade"
_SMALL_OWN = 8  # own keys up to which the own part is a broadcast product instead of a batched matmul
# a group's own keys (G rows x T) up to which the group's rows attend to [prefix, all G rows' own keys] in one
# masked attention (the other rows' keys masked out): G times the own part's few FLOPs, one fused kernel
# instead of the split softmax's dozen small ops (fwd+bwd 4 vs 7-9 ms a layer at the demo's shapes)
_STACK_OWN = 64
_ROWS_SDPA_FROM = 32  # new tokens per row from which each row is one fused SDPA over [prefix, own keys]
_REGISTERED = [False]


def _own_causal(n: int, L: int, T: int, device) -> torch.Tensor:
    """(n*L, T) bool: query (head rep r, new token l) of a row sits at own position T - L + l and sees its
    own keys 0 .. T - L + l (the n query heads of a KV head stacked, as the attention paths lay them out)."""
    qpos = torch.arange(T - L, T, device=device).repeat(n)
    return torch.arange(T, device=device)[None, :] <= qpos[:, None]


@dataclass
class SharedPrefixKV:
    """The prefix keys/values of g groups and how b rows map onto them.

    keys, values: per layer index, (g, hkv, S, d). key_ok: (g, S) bool, False at prefix padding.
    group_of_row: (b,) long. group_size: G when rows are contiguous groups of G (row r belongs to group
    r // G), else 0. append: keep the rows' own keys/values across calls (decoding)."""

    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    key_ok: torch.Tensor
    group_of_row: torch.Tensor
    group_size: int = 0
    append: bool = False
    own_keys: dict[int, torch.Tensor] = field(default_factory=dict)
    own_values: dict[int, torch.Tensor] = field(default_factory=dict)
    _bias: torch.Tensor | None = None
    _masks: dict = field(default_factory=dict)

    @classmethod
    def from_cache(cls, cache, key_ok: torch.Tensor, group_of_row: torch.Tensor, *, append: bool = False):
        """From a transformers cache whose layers expose `keys` and `values` (DynamicCache), or None
        when it does not (the caller keeps its copying path then)."""
        layers = getattr(cache, "layers", None)
        if not layers or not all(isinstance(getattr(la, "keys", None), torch.Tensor)
                                 and isinstance(getattr(la, "values", None), torch.Tensor) for la in layers):
            return None
        g = int(key_ok.shape[0])
        b = int(group_of_row.numel())
        G = b // g if g and b % g == 0 else 0
        if G and not torch.equal(group_of_row.cpu(), torch.arange(g).repeat_interleave(G)):
            G = 0
        return cls(keys={i: la.keys for i, la in enumerate(layers)},
                   values={i: la.values for i, la in enumerate(layers)},
                   key_ok=key_ok.bool(), group_of_row=group_of_row, group_size=G, append=append)

    def pad_bias(self) -> torch.Tensor:
        """(g, S) float32: 0 at real prefix keys, the most negative float at prefix pads (made once)."""
        if self._bias is None:
            self._bias = torch.zeros(self.key_ok.shape, dtype=torch.float32, device=self.key_ok.device).masked_fill(
                ~self.key_ok, torch.finfo(torch.float32).min)
        return self._bias

    def stacked_mask(self, n: int, L: int, T: int) -> torch.Tensor:
        """(g, 1, G*n*L, S + G*T) bool for the stacked attention: query (row i, head rep, new token l) sees
        its group's real prefix keys and row i's own keys 0 .. T - L + l (made once per shape and call)."""
        key = (n, L, T)
        if key not in self._masks:
            G = self.group_size
            g, S = self.key_ok.shape
            own = torch.block_diag(*[_own_causal(n, L, T, self.key_ok.device)] * G)  # a row sees only its own keys
            self._masks[key] = torch.cat([self.key_ok[:, None, :].expand(g, G * n * L, S),
                                          own.expand(g, -1, -1)], dim=2).unsqueeze(1)
        return self._masks[key]

    def rows_mask(self, L: int, T: int) -> torch.Tensor:
        """(b, 1, L, S + T) bool for _rows_sdpa: new token l of a row sees its group's real prefix keys and
        its own keys 0 .. T - L + l (made once per shape and call)."""
        key = ("rows", L, T)
        if key not in self._masks:
            b, S = int(self.group_of_row.numel()), self.key_ok.shape[1]
            causal = _own_causal(1, L, T, self.key_ok.device)
            self._masks[key] = torch.cat([self.key_ok.index_select(0, self.group_of_row)[:, None, :].expand(b, L, S),
                                          causal.expand(b, L, T)], dim=2).unsqueeze(1)
        return self._masks[key]

    def select_rows(self, keep: torch.Tensor) -> None:
        """Keep only rows `keep` (decoding drops finished rows); groups are no longer contiguous."""
        self.group_of_row = self.group_of_row.index_select(0, keep)
        self.group_size = 0
        self._masks.clear()  # they were made for the old rows
        for store in (self.own_keys, self.own_values):
            for i, t in store.items():
                store[i] = t.index_select(0, keep)


def cascade_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """transformers attention-function signature. query (b, h, L, d); key, value (b, hkv, L, d): the rows'
    own new tokens. The prefix comes from kwargs["rlvr_prefix"] (SharedPrefixKV); attention_mask is
    ignored (see the module docstring for why none is needed). Returns ((b, L, h, d), None)."""
    pk: SharedPrefixKV | None = kwargs.get("rlvr_prefix")
    if pk is None:
        raise RuntimeError("rlvr_cascade attention needs the rlvr_prefix argument: run the forward inside "
                           "rlvr.models.cascade.attention(model) with rlvr_prefix=SharedPrefixKV(...)")
    layer = module.layer_idx
    if pk.append:
        if layer in pk.own_keys:
            key = torch.cat([pk.own_keys[layer], key], dim=2)
            value = torch.cat([pk.own_values[layer], value], dim=2)
        pk.own_keys[layer], pk.own_values[layer] = key, value
    kp, vp = pk.keys[layer], pk.values[layer]  # (g, hkv, S, d)
    b, h, L, d = query.shape
    hkv, T = key.shape[1], key.shape[2]  # T = earlier own tokens + these L
    g, S = kp.shape[0], kp.shape[2]
    n = h // hkv
    G = pk.group_size
    if G and G * T <= _STACK_OWN:
        return _stacked(pk, query, key, kp, vp, value, scaling, dropout if module.training else 0.0), None
    if L >= _ROWS_SDPA_FROM:
        return _rows_sdpa(pk, query, key, kp, vp, value, scaling, dropout if module.training else 0.0), None
    q = query.reshape(b, hkv, n * L, d) * scaling  # query head kv*n + r -> KV head kv (as repeat_kv)
    if G:  # the G rows of a group stacked: one matmul per (group, KV head), the cache never copied
        qg = q.view(g, G, hkv, n * L, d).transpose(1, 2).reshape(g, hkv, G * n * L, d)
        s_pre = torch.matmul(qg, kp.transpose(-1, -2)).float() + pk.pad_bias()[:, None, None, :]  # prefix pads out
        s_pre = s_pre.view(g, hkv, G, n * L, S).transpose(1, 2).reshape(b, hkv, n * L, S)
    else:
        gor = pk.group_of_row
        kp, vp = kp.index_select(0, gor), vp.index_select(0, gor)
        s_pre = torch.matmul(q, kp.transpose(-1, -2)).float() + pk.pad_bias().index_select(0, gor)[:, None, None, :]
    # the rows' own part: (n*L x T) per row and head, tiny when responses are short; batched matmuls of
    # tiny matrices cost ~3 us each on CPU, so up to _SMALL_OWN own keys it is a broadcast product + sum
    small = T <= _SMALL_OWN
    if small:
        # in float32, as a matmul accumulates (a no-op for float32 models)
        s_own = (q.float().unsqueeze(-2) * key.float().unsqueeze(-3)).sum(-1)  # (b, hkv, n*L, T)
    else:
        s_own = torch.matmul(q, key.transpose(-1, -2)).float()  # (b, hkv, n*L, T)
    if L > 1:  # query i of the L new tokens sits at own position T - L + i and sees own keys 0 .. T - L + i
        s_own = s_own.masked_fill(~_own_causal(n, L, T, query.device), torch.finfo(torch.float32).min)
    scores = torch.cat([s_pre, s_own], dim=-1)
    p = torch.softmax(scores, dim=-1).to(query.dtype)
    if dropout and module.training:
        p = torch.nn.functional.dropout(p, p=dropout)
    p_pre, p_own = p[..., :S], p[..., S:]
    if small:
        out = (p_own.float().unsqueeze(-1) * value.float().unsqueeze(-3)).sum(-2).to(query.dtype)  # (b, hkv, n*L, d)
    else:
        out = torch.matmul(p_own, value)  # (b, hkv, n*L, d)
    if G:
        pg = p_pre.reshape(g, G, hkv, n * L, S).transpose(1, 2).reshape(g, hkv, G * n * L, S)
        out = out + torch.matmul(pg, vp).view(g, hkv, G, n * L, d).transpose(1, 2).reshape(b, hkv, n * L, d)
    else:
        out = out + torch.matmul(p_pre, vp)
    return out.view(b, h, L, d).transpose(1, 2), None


def _stacked(pk: SharedPrefixKV, query, key, kp, vp, value, scaling, dropout):
    """Contiguous groups with few own keys: per group and KV head, the G rows' queries (G*n*L) attend to
    [prefix (S), the G rows' own keys (G*T)] in one masked SDPA; returns (b, L, h, d)."""
    b, h, L, d = query.shape
    hkv, T = key.shape[1], key.shape[2]
    g, G, n = kp.shape[0], pk.group_size, h // hkv
    q = query.reshape(g, G, hkv, n * L, d).transpose(1, 2).reshape(g, hkv, G * n * L, d)
    ko = key.reshape(g, G, hkv, T, d).transpose(1, 2).reshape(g, hkv, G * T, d)
    vo = value.reshape(g, G, hkv, T, d).transpose(1, 2).reshape(g, hkv, G * T, d)
    out = torch.nn.functional.scaled_dot_product_attention(
        q, torch.cat([kp, ko], dim=2), torch.cat([vp, vo], dim=2), attn_mask=pk.stacked_mask(n, L, T),
        dropout_p=dropout, scale=scaling)  # (g, hkv, G*n*L, d)
    return out.view(g, hkv, G, n, L, d).permute(0, 2, 4, 1, 3, 5).reshape(b, L, h, d)


def _rows_sdpa(pk: SharedPrefixKV, query, key, kp, vp, value, scaling, dropout):
    """Long suffixes: each row attends to [its group's prefix keys, its own keys (causal)] in one fused
    SDPA (memory linear in the keys: no (L x S+T) score matrix kept for the backward); the prefix K/V is
    gathered per row, which costs little next to the attention of a long suffix. Returns (b, L, h, d)."""
    b, h, L, d = query.shape
    hkv, T = key.shape[1], key.shape[2]
    gor = pk.group_of_row
    k = torch.cat([kp.index_select(0, gor), key], dim=2)
    v = torch.cat([vp.index_select(0, gor), value], dim=2)
    if h != hkv:  # GQA: query head kv*n + r reads KV head kv (as repeat_kv)
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=pk.rows_mask(L, T),
                                                           dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2)


def register() -> None:
    """Add "rlvr_cascade" to transformers' attention functions (once per process)."""
    if _REGISTERED[0]:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, lambda *a, **k: cascade_attention(*a, **k))  # looked up per call
    _REGISTERED[0] = True


# Decoders whose attention is plain softmax(q k^T * scale) v through transformers' AttentionInterface (no
# logit soft-capping, no attention sinks), checked against the plain forward in tests/models/test_prefix.py.
CASCADE_MODEL_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def supported(model) -> bool:
    """Whether the cascade may run `model`'s attention: a model type of CASCADE_MODEL_TYPES (others keep
    the KV-cache copy path, which is exact for any model), no active sliding window (old prefix keys
    would have to be masked), and a forward that passes **kwargs down to the attention call."""
    hf_config = getattr(model, "config", None)
    if hf_config is None or getattr(hf_config, "model_type", None) not in CASCADE_MODEL_TYPES:
        return False
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", hf_config.model_type == "mistral"):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in forward_params(type(model)).values())


@functools.cache
def forward_params(model_cls) -> Mapping[str, inspect.Parameter]:
    """The parameters of a model class's forward (inspected once per class: scoring asks every micro-batch)."""
    return inspect.signature(model_cls.forward).parameters


@contextlib.contextmanager
def attention(model, name: str = NAME):
    """Run the model's attention with `name` inside the block (restored after, also on error)."""
    register()
    cfg = model.config
    old = cfg._attn_implementation
    cfg._attn_implementation = name
    try:
        yield
    finally:
        cfg._attn_implementation = old
