"""Padding-free packed forward: the rows of a micro-batch concatenated into one sequence, no pad token.

A right-padded micro-batch of b rows is as wide as its longest row, so b * T tokens go through every
linear layer although only sum(n_r) are real. Here the real inputs of the rows are concatenated into one
sequence of shape (1, N), N = sum(n_r), with position ids restarting at 0 for each row, and attention
is variable-length: a token attends to the earlier tokens of its own row only (a document-causal mask).

    input_ids (1, N)     row 0's n_0 inputs | row 1's n_1 inputs | ...
    position_ids (1, N)  0 .. n_0-1         | 0 .. n_1-1         | ...
    mask(q, kv)          same row and kv <= q

With the shared prompt (algo.shared_prefix, `share=True`) the G rows of a group (the rows whose inputs
0..S agree, S = the first loss label's index) put their prompt in the sequence once, then each row's
inputs S+1 .. n-1 with positions continuing the prompt's; a response token sees its group's prompt and
its own earlier tokens:

    input_ids (1, N)     prompt A (S+1) | row 1's suffix | row 2's suffix | prompt B | ...
    mask(q, kv)          same group and kv <= q and (kv in the prompt or kv in q's own suffix)

so the prompt's work is done once per group and a micro-batch is still one forward, one attention kernel
per layer. Each row's first response label is predicted at its prompt's last position (one logit row per
row there), the others in its suffix. One mask_mod serves both layouts (`packed_causal`: per token a group
and an own-segment id, -1 on prompts; plain packing is every row a group of its own, all "prompt").

Attention is PyTorch's `flex_attention` with a `BlockMask`, through this module's attention function
(registered in transformers' AttentionInterface as "rlvr_packed", switched on only for the packed
forward, like rlvr.models.cascade). The BlockMask is built on the host from the rows' lengths (Python
ints, `PackPlan.build`, `segment_blocks`): which 128 x 128 blocks of the (N x N) score matrix a query
block reads, which of them are fully visible (no mask evaluated) and which need the mask; blocks of other
rows (groups) are never computed. On CUDA flex_attention is compiled (torch.compile with dynamic lengths, once per process; the
fused kernel reads the block indices); a failure to compile is caught by a probe before the first
packed forward and packing is then turned off with a warning (`flex_ready`). On CPU flex_attention runs eagerly
(the unfused implementation: the mask on the whole (N x N) score matrix) and has no backward, so a
forward with grad uses the same mask written out densely through SDPA there: correct (the tests check
it against the padded path), but N x N memory and slower than the cascade path, which is why
`algo.packing=auto` packs on CUDA only.

algo.packing=varlen attends instead with a variable-length kernel (FlashAttention's, torch's varlen_attn, on
CUDA; SDPA one sequence at a time elsewhere): `Varlen` describes the same layout as one query sequence per segment,
a response's keys its group's prompt's (copied) then its own, causal with the diagonal at the bottom right;
`varlen_ready` checks the kernel against the dense mask once per process and falls back to flex_attention with a
warning when it fails.

Only the response labels need logits: the LM head is applied to those positions alone (transformers'
`logits_to_keep` with an index tensor), and their logprobs / entropy are scattered back to the (b, T)
layout the loss reads (0 elsewhere, including the prompt's positions, which the loss never reads).

Everything that depends on the rows' lengths is computed on the host before the micro-batch loop
(`PackPlan.build` from CPU masks, then moved to the device once), so the forward itself has no host
synchronisation.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import torch

from rlvr.algo.logprobs import DEFAULT_CHUNK_SIZE, Truncation, token_scores
from rlvr.models.cascade import CASCADE_MODEL_TYPES, attention, forward_params
from rlvr.models.scoring import ScoreOutput
from rlvr.runtime import use_compile_cache

NAME = "rlvr_packed"
BLOCK = 128  # flex_attention's default block size (query and key blocks)
_REGISTERED = [False]
_FLEX_STATE: dict = {}  # device type -> the flex_attention callable, or None when compiling failed


@dataclass
class Varlen:
    """The packed sequence as a variable-length batch for a FlashAttention-style kernel (algo.packing=varlen): one
    query sequence per segment, in layout order, so the queries are the packed tokens as they are (cu_q); a prompt
    (or a whole row) attends to its own keys, a response suffix to its group's prompt's keys then its own, which
    `kv_gather` copies out of the packed keys/values into one key sequence per segment (cu_k; None: every segment
    is its own key sequence, as plain packing is). Causal with the diagonal at the bottom right (a query at
    suffix position i sees the whole prompt and suffix keys 0..i), which is FlashAttention's rule when a sequence
    has more keys than queries. Host-built int32 offsets, moved to the device once."""

    cu_q: torch.Tensor  # (S + 1,) int32
    cu_k: torch.Tensor  # (S + 1,) int32
    max_q: int
    max_k: int
    kv_gather: torch.Tensor | None  # (K,) int64 packed positions of each key sequence's keys, or None

    @classmethod
    def build(cls, segs: list[tuple[int, int, bool]], device) -> Varlen:
        segs = [x for x in segs if x[0] > 0]
        q_len, k_len, gather, prompt_at = [], [], [], {}
        at, shared = 0, False
        for length, group, is_prompt in segs:
            own = torch.arange(at, at + length)
            if is_prompt:
                prompt_at[group] = own
                keys = own
            else:
                keys, shared = torch.cat([prompt_at[group], own]), True
            q_len.append(length)
            k_len.append(int(keys.numel()))
            gather.append(keys)
            at += length

        def offsets(lens: list[int]) -> torch.Tensor:
            return torch.tensor([0, *lens], dtype=torch.long).cumsum(0).to(torch.int32).to(device)

        return cls(cu_q=offsets(q_len), cu_k=offsets(k_len), max_q=max(q_len, default=0), max_k=max(k_len, default=0),
                   kv_gather=torch.cat(gather).to(device) if shared else None)


@dataclass
class PackPlan:
    """How one right-padded micro-batch (b, T) is packed; every tensor on the model's device.

    gather (N,): flat index into the (b * T) inputs of each packed token; position_ids (1, N);
    keep (M,): packed positions whose logits the loss needs (the LM head runs there only); out_index (M,):
    where their values go in the flat (b * T) layout; block_mask: the flex BlockMask; grp, own (N padded to
    a multiple of the block): each packed token's group (its row, or with share its prompt's group; -1 on
    the block padding) and its own segment (a response's suffix; -1 on a prompt), read by the mask."""

    rows: int
    width: int
    tokens: int
    gather: torch.Tensor
    position_ids: torch.Tensor
    keep: torch.Tensor
    out_index: torch.Tensor
    grp: torch.Tensor
    own: torch.Tensor
    block_mask: object
    varlen: Varlen | None = None

    @classmethod
    def build(cls, attention_mask: torch.Tensor, response_mask: torch.Tensor, device, block: int = BLOCK,
              input_ids: torch.Tensor | None = None, share: bool = False, varlen: bool = False) -> PackPlan:
        """From a right-padded micro-batch's CPU tensors (b, T): attention_mask 1 on real inputs,
        response_mask True on loss labels. share (needs input_ids): each group's prompt once (the module
        docstring); else every row whole, one after the other. varlen: also the layout as a variable-length
        batch (Varlen: attention by the varlen kernel, algo.packing=varlen)."""
        am = attention_mask.detach().to("cpu")
        rm = response_mask.detach().to("cpu").bool()
        b, T = am.shape
        lens = am.sum(-1).tolist()
        if share and not bool(rm.any()):  # no loss label at all: nothing to share, the rows whole keep a forward
            share = False
        if share:
            if input_ids is None:
                raise ValueError("a shared-prompt PackPlan needs the micro-batch's input_ids")
            segs, gather, pos, keep, out = _shared_layout(input_ids.detach().to("cpu"), rm, lens, T)
        else:
            flat = am.reshape(-1).nonzero().squeeze(1)  # (N,) real inputs, row by row (right padding: t = 0..n-1)
            gather, pos = flat, flat % T
            keep = rm.reshape(-1).index_select(0, flat).nonzero().squeeze(1)  # (M,) packed positions of loss labels
            out = flat.index_select(0, keep)
            segs = [(n, r, True) for r, n in enumerate(lens) if n > 0]  # a row: its own group, all "prompt"
        n = int(gather.numel())
        pad = torch.full((-n % block,), -1, dtype=torch.int32)
        seg_len = torch.tensor([x[0] for x in segs], dtype=torch.long)
        grp = torch.repeat_interleave(torch.tensor([x[1] for x in segs], dtype=torch.int32), seg_len)
        own = torch.repeat_interleave(torch.tensor([-1 if x[2] else i for i, x in enumerate(segs)],
                                                   dtype=torch.int32), seg_len)
        kv_num, kv_idx, full_num, full_idx = segment_blocks(segs, block)
        mv = lambda t: t.to(device)  # noqa: E731
        grp_dev, own_dev = mv(torch.cat([grp, pad])), mv(torch.cat([own, pad]))
        from torch.nn.attention.flex_attention import BlockMask

        bm = BlockMask.from_kv_blocks(mv(kv_num), mv(kv_idx), mv(full_num), mv(full_idx), BLOCK_SIZE=block,
                                      mask_mod=packed_causal(grp_dev, own_dev), seq_lengths=(n, n))
        return cls(rows=b, width=T, tokens=n, gather=mv(gather), position_ids=mv(pos).unsqueeze(0), keep=mv(keep),
                   out_index=mv(out), grp=grp_dev, own=own_dev, block_mask=bm,
                   varlen=Varlen.build(segs, device) if varlen else None)

    def dense_mask(self) -> torch.Tensor:
        """(N, N) bool: the mask written out (the CPU backward's SDPA; N x N memory)."""
        g, o = self.grp[: self.tokens], self.own[: self.tokens]
        seen = (o.unsqueeze(0) < 0) | (o.unsqueeze(1) == o.unsqueeze(0))
        return ((g.unsqueeze(1) == g.unsqueeze(0)) & seen).tril_()


def _shared_layout(ids: torch.Tensor, rm: torch.Tensor, lens: list[int], T: int):
    """The shared-prompt layout of a micro-batch: per group (rows whose inputs 0..S agree, S = index of the
    first loss label) the prompt's S + 1 inputs once, then each of its rows' inputs S + 1 .. n - 1 (its
    response but the last token), positions continuing the prompt's. The logits of a row's label at S come
    from its prompt's last position (duplicated in keep), the others from its own suffix. Rows without a
    loss label need no logits and are left out. Returns (segments [(length, group, is_prompt)], gather,
    positions, keep, out_index) as CPU tensors."""
    first = rm.int().argmax(dim=-1).tolist()
    groups: dict[tuple, int] = {}
    members: list[list[int]] = []
    for r, (key, _) in enumerate(row_prompts(ids, rm)):
        if key is None:
            continue
        if key not in groups:
            groups[key] = len(members)
            members.append([])
        members[groups[key]].append(r)
    segs, gather, pos, keep, out = [], [], [], [], []
    at = 0
    for g, rows in enumerate(members):
        rep, S = rows[0], first[rows[0]]
        segs.append((S + 1, g, True))
        gather.append(rep * T + torch.arange(S + 1))
        pos.append(torch.arange(S + 1))
        last = at + S  # the prompt's last position: it predicts each row's first response token
        at += S + 1
        for r in rows:
            L = lens[r] - S - 1  # the suffix: inputs S + 1 .. n - 1
            if L > 0:
                segs.append((L, g, False))
                gather.append(r * T + S + 1 + torch.arange(L))
                pos.append(S + 1 + torch.arange(L))
            t = rm[r].nonzero().squeeze(1)  # the row's loss labels, t >= S
            keep.append(torch.where(t == S, torch.full_like(t, last), at + t - S - 1))
            out.append(r * T + t)
            at += max(L, 0)
    cat = lambda xs: torch.cat(xs) if xs else torch.zeros(0, dtype=torch.long)  # noqa: E731
    return segs, cat(gather), cat(pos), cat(keep), cat(out)


def row_prompts(input_ids: torch.Tensor, response_mask: torch.Tensor) -> list[tuple[tuple | None, int]]:
    """Each row's (prompt, prompt tokens) as the shared-prompt layout groups them: its inputs 0..S (S = the
    first loss label's index) and S + 1; (None, 0) for a row without a loss label (left out of the layout).
    CPU tensors (b, T)."""
    rm = response_mask.bool()
    has, first = rm.any(dim=-1).tolist(), rm.int().argmax(dim=-1).tolist()
    ids = input_ids.tolist()
    return [(tuple(ids[r][: first[r] + 1]), first[r] + 1) if has[r] else (None, 0) for r in range(len(ids))]


def packed_causal(grp: torch.Tensor, own: torch.Tensor):
    """flex mask_mod: query q sees key kv iff both are in the same group, kv <= q, and kv is a prompt token
    or in q's own segment (plain packing: every row its own group, all prompt, so: the same row, causal).
    One factory, so every plan's mask_mod has the same code (a compiled flex_attention does not retrace)."""

    def mask_mod(b, h, q, kv):
        return (grp[q] == grp[kv]) & (kv <= q) & ((own[kv] < 0) | (own[q] == own[kv]))

    return mask_mod


def segment_blocks(segs: list[tuple[int, int, bool]], block: int = BLOCK):
    """Block sparsity of the packed mask, computed on the host from the segments [(length, group, is_prompt)]
    in layout order (a group's prompt before its suffixes): (kv_num_blocks (1, 1, nb), kv_indices
    (1, 1, nb, nb), full_kv_num_blocks, full_kv_indices) int32, as BlockMask.from_kv_blocks takes them.

    Segment A (queries) sees segment B iff same group and (B is a prompt or B == A); causality between
    blocks j < i holds for every pair, and on the diagonal block a query sees its own position. So query
    block i reads key block j <= i iff some segment pair over the two blocks is visible, and j is full
    (no mask evaluated) iff j < i and every pair is (a query block cut short by the end of the sequence is
    never full): counted with a 2-D prefix sum of the segment visibility. Equal to what create_block_mask
    computes from the mask itself (tests/models/test_packing.py), without evaluating it on the (N x N) grid."""
    segs = [x for x in segs if x[0] > 0]
    seg_len = torch.tensor([x[0] for x in segs], dtype=torch.long)
    n = int(seg_len.sum())
    nb = max(1, -(-n // block))
    group = torch.tensor([x[1] for x in segs])
    prompt = torch.tensor([x[2] for x in segs], dtype=torch.bool)
    k = len(segs)
    vis = (group.unsqueeze(1) == group.unsqueeze(0)) & (prompt.unsqueeze(0) | torch.eye(k, dtype=torch.bool))
    c = torch.zeros(k + 1, k + 1, dtype=torch.long)
    c[1:, 1:] = vis.long().cumsum(0).cumsum(1)
    seg_of = torch.repeat_interleave(torch.arange(k), seg_len)
    starts = torch.arange(nb) * block
    lo, hi = seg_of[starts.clamp_max(n - 1)], seg_of[(starts + block).clamp_max(n) - 1] + 1  # [lo, hi) per block
    a0, a1, b0, b1 = lo.unsqueeze(1), hi.unsqueeze(1), lo.unsqueeze(0), hi.unsqueeze(0)  # query rows, key columns
    count = c[a1, b1] - c[a0, b1] - c[a1, b0] + c[a0, b0]  # visible segment pairs of (query block, key block)
    i, j = torch.arange(nb).unsqueeze(1), torch.arange(nb).unsqueeze(0)
    visible = (j <= i) & (count > 0)
    full = (j < i) & (count == (a1 - a0) * (b1 - b0)) & (starts + block <= n).unsqueeze(1)
    partial = visible & ~full

    def listed(m: torch.Tensor):
        order = torch.where(m, j, nb + j).argsort(dim=-1)  # the listed blocks first, ascending
        return m.sum(-1).to(torch.int32).view(1, 1, nb), order.to(torch.int32).view(1, 1, nb, nb)

    return (*listed(partial), *listed(full))


def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature. query (1, h, N, d); key, value (1, hkv, N, d) of the
    packed sequence; the mask comes from kwargs["rlvr_pack"] (PackPlan), attention_mask is ignored.
    Returns ((1, N, h, d), None)."""
    pack: PackPlan | None = kwargs.get("rlvr_pack")
    if pack is None:
        raise RuntimeError("rlvr_packed attention needs the rlvr_pack argument: run the forward through "
                           "rlvr.models.packed.score_packed")
    if dropout and module.training:
        raise RuntimeError("the packed forward has no attention dropout; set the model's attention_dropout to 0")
    if key.dtype != query.dtype or value.dtype != query.dtype:  # flex_attention wants one dtype
        key, value = key.to(query.dtype), value.to(query.dtype)
    if pack.varlen is not None:
        return varlen_attention(query, key, value, pack.varlen, scaling).unsqueeze(0), None
    gqa = query.shape[1] != key.shape[1]
    flex = _FLEX_STATE.get(query.device.type)
    if flex is None and torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
        # flex_attention has no backward on CPU: the same mask, dense, through SDPA (checks and CPU runs only)
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=pack.dense_mask(),
                                                               scale=scaling, enable_gqa=gqa)
    else:  # compiled on CUDA (flex_ready), eager elsewhere
        out = (flex or _eager_flex())(query, key, value, block_mask=pack.block_mask, scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


def varlen_attention(query, key, value, vl: Varlen, scaling=None, kernel=None) -> torch.Tensor:
    """Attention of the packed sequence by a variable-length kernel: query (1, h, N, d), key/value (1, hkv, N, d)
    -> (N, h, d). The keys/values are copied into their key sequences (vl.kv_gather: a suffix's group prompt, then
    its own; its backward adds the copies' gradients back), the kernel `kernel` (default: the one varlen_ready
    chose for the device) runs causal, the diagonal at the bottom right."""
    kernel = kernel or _VARLEN_STATE.get(query.device.type)
    if kernel is None:
        raise RuntimeError("algo.packing=varlen: no variable-length attention kernel is ready on "
                           f"{query.device.type} (rlvr.models.packed.varlen_ready chooses one)")
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # (tokens, heads, d): the projections' layout
    if vl.kv_gather is not None:
        k, v = k.index_select(0, vl.kv_gather), v.index_select(0, vl.kv_gather)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return kernel(q.contiguous(), k.contiguous(), v.contiguous(), vl.cu_q, vl.cu_k, vl.max_q, vl.max_k, scale)


def varlen_reference(q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float) -> torch.Tensor:
    """The variable-length kernel's contract written with SDPA, one sequence at a time: q (Nq, h, d), k/v (Nk, hkv,
    d), sequence i = queries cu_q[i]:cu_q[i+1] over keys cu_k[i]:cu_k[i+1], query j seeing keys 0..j + (keys -
    queries) (causal, bottom right). The CPU's kernel for algo.packing=varlen, and what the tests hold the packed
    layout to."""
    out, gqa = [], q.shape[1] != k.shape[1]
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(cq[:-1], cq[1:], ck[:-1], ck[1:], strict=True):
        nq, nk = q1 - q0, k1 - k0
        mask = torch.ones((nq, nk), dtype=torch.bool, device=q.device).tril_(nk - nq)
        o = torch.nn.functional.scaled_dot_product_attention(
            q[q0:q1].transpose(0, 1), k[k0:k1].transpose(0, 1), v[k0:k1].transpose(0, 1), attn_mask=mask,
            scale=scale, enable_gqa=gqa)
        out.append(o.transpose(0, 1))
    return torch.cat(out) if out else q.new_zeros(q.shape)


def _torch_varlen():
    """torch.nn.attention.varlen.varlen_attn (FlashAttention's variable-length kernel; CUDA) in this module's
    kernel signature, causal whatever the torch: `window_size=(-1, 0)` from torch 2.11, `is_causal` in 2.10."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, scale):
        kw = dict(causal)
        if "scale" in params:
            kw["scale"] = scale
        elif abs(scale - q.shape[-1] ** -0.5) > 1e-12:
            raise ValueError(f"this torch's varlen_attn takes no scale and the model's is {scale}")
        if "enable_gqa" in params and q.shape[1] != k.shape[1]:
            kw["enable_gqa"] = True
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)

    return kernel


VARLEN_TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}  # the probe's max |difference|
_VARLEN_STATE: dict = {}  # device type -> the variable-length kernel, or None when its probe failed


def varlen_ready(device, dtype, head_dim: int, heads: int, kv_heads: int, kernel=None) -> bool:
    """Whether algo.packing=varlen's kernel runs right on `device`, probed once per process before the first packed
    forward: a shared-prompt layout (two groups, suffixes of several lengths) and a plain one through
    varlen_attention and through SDPA with the layout's dense mask in float32, forward and backward, in `dtype`
    with the model's heads; outputs and q/k/v gradients within VARLEN_TOL[dtype]. So a kernel that is missing,
    refuses the dtype (FlashAttention has no float32) or the head layout, or reads the causal diagonal another
    way (top left) is never used: one warning, and the packed forward uses flex_attention (flex_ready). Out of
    memory is raised. CUDA: torch's varlen_attn; elsewhere: varlen_reference (kernel: another, for tests)."""
    device = torch.device(device)
    if device.type in _VARLEN_STATE:
        return _VARLEN_STATE[device.type] is not None
    try:
        kern = kernel or (_torch_varlen() if device.type == "cuda" else varlen_reference)
        tol = VARLEN_TOL.get(dtype, 5e-2)
        g = torch.Generator().manual_seed(0)
        for share in (True, False):
            plan = _probe_plan([40, 23, 31, 17, 26, 9], device, share=share, varlen=True, prompts=[12, 12, 12, 7, 7, 7])
            x = [torch.randn((1, n, plan.tokens, head_dim), generator=g).to(device=device, dtype=dtype).requires_grad_()
                 for n in (heads, kv_heads, kv_heads)]
            out = varlen_attention(*x, plan.varlen, head_dim ** -0.5, kernel=kern)
            w = torch.randn(out.shape, generator=g).to(device)
            got = [out.float(), *torch.autograd.grad((out.float() * w).sum(), x)]
            ref_in = [t.detach().float().requires_grad_() for t in x]
            ref = torch.nn.functional.scaled_dot_product_attention(
                *ref_in, attn_mask=plan.dense_mask(), scale=head_dim ** -0.5, enable_gqa=heads != kv_heads)[0]
            ref = ref.transpose(0, 1)
            want = [ref, *torch.autograd.grad((ref * w).sum(), ref_in)]
            worst = max(float((a.detach().float() - b.detach()).abs().max()) for a, b in zip(got, want, strict=True))
            if not worst <= tol:
                raise ValueError(f"its {'shared-prompt' if share else 'plain'} layout differs from the mask by "
                                 f"{worst:.3g} (tolerance {tol:g} in {dtype})")
        _VARLEN_STATE[device.type] = kern
    except Exception as exc:  # noqa: BLE001 - any failure means: flex_attention packs instead
        if is_out_of_memory(exc):
            raise
        first = str(exc).splitlines()[0] if str(exc) else ""
        warnings.warn(f"algo.packing=varlen: the variable-length attention kernel failed its check on {device} "
                      f"({type(exc).__name__}: {first}); the packed forward uses flex_attention", RuntimeWarning,
                      stacklevel=2)
        _VARLEN_STATE[device.type] = None
    return _VARLEN_STATE[device.type] is not None


def _eager_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic: every packed length is a new shape; compiled for symbolic lengths at once (a static first
    # compile would be thrown away at the second length)
    use_compile_cache()
    return torch.compile(flex_attention, dynamic=True)


def flex_ready(device, dtype, head_dim: int, heads: int, kv_heads: int) -> bool:
    """Whether the packed forward may run on `device`: on CUDA it needs a compiled flex_attention, which a
    probe compiles once per process before the first packed forward, as the model will call it (q, k, v in
    the projections' (1, N, heads, d) memory layout, in `dtype`: the dtype attention computes in, use_packing's
    compute_dtype (bfloat16 under FSDP2's mixed precision, whose parameters are float32), and the model's scale,
    with grad and without,
    each on two packed lengths and on a one-block length, which the dynamic graph specializes apart;
    checked with dynamo's recompile log on CPU: after these, other lengths reuse the compiled graphs); on a
    failure packing is turned off with a warning, never a crash, except out of memory (torch.OutOfMemoryError,
    re-raised: a full device is not a compiler failure). Other devices run flex_attention eagerly (always
    ready)."""
    device = torch.device(device)
    if device.type != "cuda":
        return True
    if device.type not in _FLEX_STATE:
        try:
            flex = _compiled_flex()
            for grad in (True, False):
                # two lengths (the second must reuse the first's graph); one block (<= 128 tokens) is its own case
                for lens in ([200, 37, 64], [300, 11, 129, 5], [60, 40]):
                    plan = _probe_plan(lens, device)

                    def qkv(h, plan=plan, grad=grad):
                        x = torch.randn(1, plan.tokens, h, head_dim, device=device, dtype=dtype, requires_grad=grad)
                        return x.transpose(1, 2)

                    with torch.set_grad_enabled(grad):
                        out = flex(qkv(heads), qkv(kv_heads), qkv(kv_heads), block_mask=plan.block_mask,
                                   scale=head_dim ** -0.5, enable_gqa=heads != kv_heads)
                        if grad:
                            out.sum().backward()
            torch.cuda.synchronize(device)
            _FLEX_STATE[device.type] = flex
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: do not pack
            if is_out_of_memory(exc):  # the device is full: the run's to know, not a reason to run padded rows
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            warnings.warn(f"algo.packing: compiling flex_attention failed on {device} ({type(exc).__name__}: "
                          f"{first}); the learner runs padded rows instead", RuntimeWarning, stacklevel=2)
            _FLEX_STATE[device.type] = None
    return _FLEX_STATE[device.type] is not None


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is torch.OutOfMemoryError, or wraps one (torch.compile re-raises what failed inside it as
    its own errors, the cause chained): the compile and fast-path fallbacks re-raise these."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, torch.OutOfMemoryError):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _probe_plan(lens: list[int], device, share: bool = False, varlen: bool = False,
                prompts: list[int] | None = None) -> PackPlan:
    """A plan over rows of `lens` tokens; with share, rows whose `prompts` lengths agree share their prompt (the
    same tokens), their responses after it."""
    T = max(lens)
    am = (torch.arange(T).unsqueeze(0) < torch.tensor(lens).unsqueeze(1)).long()
    rm = am.bool()
    ids = None
    if share:
        ids = torch.arange(T).repeat(len(lens), 1) + 1000 * torch.arange(len(lens)).unsqueeze(1)  # rows differ
        rm = rm.clone()
        for r, p in enumerate(prompts):
            ids[r, :p] = p  # one prompt per length: rows with equal prompt lengths share it
            rm[r, :p - 1] = False  # the first loss label is the prompt's next token
    return PackPlan.build(am, rm, device, input_ids=ids, share=share, varlen=varlen)


def register() -> None:
    """Add "rlvr_packed" to transformers' attention functions (once per process)."""
    if _REGISTERED[0]:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, lambda *a, **k: packed_attention(*a, **k))  # looked up per call
    _REGISTERED[0] = True


def inner_model(model):
    """The transformers model that really runs `model`'s forward: a LoRA (peft) policy's base model (peft's
    forward takes **kwargs only and hands them on to it), else `model` itself."""
    get = getattr(model, "get_base_model", None)
    return get() if callable(get) and hasattr(model, "peft_config") else model


def supported(model) -> str | None:
    """None when the packed forward may run `model`, else why not: a decoder of CASCADE_MODEL_TYPES
    (plain softmax attention through transformers' AttentionInterface, rotary positions from position_ids),
    no active sliding window, no attention dropout, a forward that passes **kwargs down to the attention
    and takes logits_to_keep (a LoRA policy's: its base model's, which peft's forward passes them to)."""
    model = inner_model(model)
    hf_config = getattr(model, "config", None)
    kind = getattr(hf_config, "model_type", None)
    if hf_config is None or kind not in CASCADE_MODEL_TYPES:
        return f"model type {kind!r} is not one of {', '.join(CASCADE_MODEL_TYPES)}"
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", kind == "mistral"):
        return "the model uses sliding-window attention"
    if float(getattr(hf_config, "attention_dropout", 0.0) or 0.0) > 0:
        return "the model has attention dropout"
    params = forward_params(type(model))
    if "logits_to_keep" not in params or not any(p.kind.name == "VAR_KEYWORD" for p in params.values()):
        return "its forward takes no logits_to_keep or **kwargs"
    return None


def use_packing(model, packing) -> bool:
    """Resolve algo.packing for `model`: "auto" packs on CUDA when the model is supported and flex_attention
    compiles there; True packs (a clear error when the model cannot be packed); "varlen" packs as True does, its
    attention by the variable-length kernel where that passes its check (use_varlen), else by flex_attention;
    False never packs."""
    if packing is False or packing in ("false", "off"):
        return False
    param = next(model.parameters())
    why = supported(model)
    if packing is True or packing in ("true", "varlen"):
        if why is not None:
            raise ValueError(f"algo.packing={str(packing).lower()} cannot pack this model: {why}; set "
                             "algo.packing=auto or false")
        return use_varlen(model, packing) or flex_ready(param.device, compute_dtype(model),
                                                        *_head_shape(inner_model(model)))
    if param.device.type != "cuda" or why is not None:
        return False
    return flex_ready(param.device, compute_dtype(model), *_head_shape(inner_model(model)))


def use_varlen(model, packing) -> bool:
    """Whether the packed forwards of `model` attend by the variable-length kernel: algo.packing=varlen and the
    kernel passed varlen_ready's check for the model's device, compute dtype and heads."""
    if packing != "varlen":
        return False
    return varlen_ready(next(model.parameters()).device, compute_dtype(model), *_head_shape(inner_model(model)))


def compute_dtype(model) -> torch.dtype:
    """The dtype the model's attention computes in (what flex_attention is compiled for): FSDP2's mixed-precision
    param_dtype when the model is sharded with one (its parameters are the float32 masters then), else the
    input embedding's dtype (a LoRA policy's base: its float32 adapters add into the base layers' dtype)."""
    state = getattr(model, "_get_fsdp_state", None)
    if callable(state):
        policy = getattr(state(), "_mp_policy", None)
        if getattr(policy, "param_dtype", None) is not None:
            return policy.param_dtype
    emb = getattr(model, "get_input_embeddings", None)
    weight = getattr(emb(), "weight", None) if callable(emb) else None
    return weight.dtype if isinstance(weight, torch.Tensor) else next(model.parameters()).dtype


def _head_shape(model) -> tuple[int, int, int]:
    hf_config = model.config
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return head_dim, heads, getattr(hf_config, "num_key_value_heads", None) or heads


def score_packed(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    pack: PackPlan,
    *,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
    truncation: Truncation | None = None,
):
    """`score_tokens` of a right-padded micro-batch (input_ids, labels (b, T) on the model's device) through
    one packed forward (see the module docstring). Returns rlvr.models.ScoreOutput with logprobs and
    entropy (b, T) float32, set on the loss labels (pack.keep) and 0 elsewhere; gradients flow when
    called with grad enabled. temperature, truncation: the distribution scored, as in score_tokens."""
    b, T = input_ids.shape
    if (b, T) != (pack.rows, pack.width):
        raise ValueError(f"the micro-batch is {(b, T)} but its PackPlan was built for {(pack.rows, pack.width)}")
    ids = input_ids.reshape(-1).index_select(0, pack.gather).unsqueeze(0)  # (1, N)
    register()
    with attention(model, NAME):
        out = model(input_ids=ids, position_ids=pack.position_ids, use_cache=False, logits_to_keep=pack.keep,
                    rlvr_pack=pack)
    logits = out.logits[0]  # (M, V): the loss labels' positions only
    del out
    lab = labels.reshape(-1).index_select(0, pack.out_index)
    scored = token_scores(logits, lab, chunk_size=chunk_size, with_entropy=with_entropy, temperature=temperature,
                          truncation=truncation)

    def place(x):  # (M,) -> (b, T), 0 off the loss labels; backward: one index_select
        return None if x is None else x.new_zeros(b * T).index_copy(0, pack.out_index, x).view(b, T)

    return ScoreOutput(logprobs=place(scored.logp), entropy=place(scored.entropy),
                       full_logprobs=place(scored.full_logp))
