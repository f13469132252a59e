"""The hf sampler's decode loop on a static KV cache, its decode step replayed as a CUDA graph on a GPU.

At batch 512 a decode step of a 0.5B model is a few ms of GPU work but ~50 ms of host work (the Python of
the transformers forward, ~1000 kernel launches, per-step copies of the sampled tokens to the host). This
path removes the host from the step:

- the distinct prompts of the chunk (the n samples of a prompt share it) are prefilled once, left-padded to a
  multiple of 16, with an explicit 4-D additive mask (causal, pads hidden), and their keys/values are written
  to every row of the prompt in this module's `SlotCache`: per layer (rows, kv heads, prompt_len + max_tokens,
  head size) tensors allocated once per shape and written in place;
- every decode step runs the model on static buffers: token ids (B, 1), position ids (B, 1), the slot index
  (written into the cache with index_copy_, the same slot for every row) and a (B, 1, 1, slots) additive mask
  whose slot for the newest token is opened in place, so the step has no host-side input that changes;
- attention reads the slots written so far only, rounded up to a quarter of the response slots (the step
  attends to prompt + ceil(step / block) * block slots; one graph per such width), and, for sdpa models, the
  query heads of a KV head attend to it together (the (B, heads, 1, d) query reshaped to (B, kv heads,
  heads / kv heads, d): grouped-query attention without copying the keys/values per head, `gqa_attention`);
- on CUDA the step is captured once per (rows, attended slots) with `torch.cuda.CUDAGraph` (warm-up on a side
  stream, capture, replay) and replayed; on CPU it runs eagerly (the same numbers: what the tests check);
- rollout.compile_decode (sdpa models): the step's forward compiled by torch.compile with dynamic shapes before
  the capture (compiled_step: one compile per process). Its inputs are views that never span a whole buffer (the
  input buffers and the cache have a spare row and PAD_MULTIPLE spare slots) and the attended width comes from the
  mask's shape (gqa_attention slices the cache), so every (rows, slots) meets the same layout: one compile;
- sampling runs inside the step (`sample_in_graph`: sample_step's numbers, the sampled token and its logprob the
  step's outputs), so a replay is forward and sampling at once, and with rollout.compile_decode both are one
  compiled function (the log-softmax, the block sums of sample_rows and the gathers fused: one (B, V) float32
  buffer written where the eager sampler writes two). The step's inputs for it are static buffers set before
  each replay: the rows' uniforms of this step (StaticDecoder.u, gathered from the rows' own streams, moved to
  the device once) and an additive EOS ban ((V,) float32: -inf at the EOS ids while step < min_tokens, then 0). Top-p keeps
  sampling outside the graph (its threshold search sorts only the rows that need it: a host sync), as does any
  step whose graph with sampling fails to capture (one warning: the step is then captured without it);
- the tokens and logprobs go into (max_tokens, B) device tensors and come to the host
  every `sync_every` steps, one block behind the GPU, where EOS, stop strings (rlvr.rollout.sampling.StopStrings:
  only candidate tokens decoded) and min_tokens are checked exactly as the plain path does (a row is cut where
  it finished; the steps it decoded after that are ignored);
- finished rows are compacted out at those checks (rollout drop_finished): once the unfinished rows fit in half
  the batch, they move to the first rows of the same cache and buffers (their written slots only) and decode
  on in the smallest of the row counts B, B/2, B/4, ... (down to max(4, B/16)) that holds them, each with its
  own graph; spare rows of that count repeat a live row and their outputs are not read.

A row's tokens before it finishes depend only on its own prompt, tokens and uniforms (its own RNG stream, fixed
by its seed, whatever rows share the batch), so the results equal the plain path's up to float rounding
(tests/rollout/test_rollout_static.py). Models: causal LMs whose every layer is full attention in the supported list
(Qwen2, Qwen3, Llama) with sdpa or eager attention; anything else, and any failure here, falls back to the
plain path with one warning (rlvr.rollout.hf_generator).
"""

from __future__ import annotations

import functools
import warnings

import torch

from rlvr.models.cascade import attention as attention_named
from rlvr.models.packed import is_out_of_memory
from rlvr.rollout.sampling import StopStrings, process_logits, sample_rows, sample_step

# model_type -> decoder-only models whose forward takes a 4-D mask, position ids and a cache object as-is
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
SUPPORTED_ATTENTION = ("sdpa", "eager")
PAD_MULTIPLE = 16  # prompts left-padded to a multiple of this (chunks of similar prompts share one graph), cache too
SLOT_BLOCKS = 4  # the response slots a step attends to grow in this many blocks (one graph each)
MIN_ROWS = 4  # finished rows are compacted down to max(MIN_ROWS, B // 16) rows at the least
GQA_NAME = "rlvr_static_gqa"
_REGISTERED = [False]


def unsupported_reason(model) -> str | None:
    """Why the static-cache decode cannot run this model, or None when it can."""
    hf_config = getattr(model, "config", None)
    mtype = getattr(hf_config, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        return f"model type {mtype!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    attn = getattr(hf_config, "_attn_implementation", None)
    if attn not in SUPPORTED_ATTENTION:
        return f"attention implementation {attn!r} is not one of {', '.join(SUPPORTED_ATTENTION)}"
    types = getattr(hf_config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        return "the model has sliding-window or other non-full attention layers"
    try:
        from transformers import AttentionInterface  # noqa: F401
    except ImportError:
        return "this transformers has no AttentionInterface"
    return None


class _Graph:
    """One decode step captured as a CUDA graph: warm-up on a side stream, capture, replay."""

    def __init__(self, fn):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # kernels chosen and their workspaces allocated before capture
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA calls (a reward worker, a logger) do not invalidate the capture
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.out = fn()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


def gqa_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention-function signature, for the decode step (one new token per row): query (b, h, 1, d),
    key/value (b, hkv, S, d) the cache's written slots, attention_mask (b, 1, 1, S) additive. The h / hkv query heads
    of each KV head are one (b, hkv, h / hkv, d) query block over that head's keys (as transformers' repeat_kv
    reads them), so no key or value is copied per head. Returns ((b, 1, h, d), None)."""
    b, h, L, d = query.shape
    hkv, S = key.shape[1], attention_mask.shape[-1]
    key, value = key[:, :, :S], value[:, :, :S]  # the attended slots (SlotCache hands the whole cache to this path)
    if L == 1:
        q = query.reshape(b, hkv, h // hkv, d)  # query head kv * n + r -> KV head kv
    else:  # not used by the decode step; correct anyway
        q = query
        key, value = key.repeat_interleave(h // hkv, dim=1), value.repeat_interleave(h // hkv, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, h, L, d).transpose(1, 2), None


def _register() -> None:
    if not _REGISTERED[0]:
        from transformers import AttentionInterface

        AttentionInterface.register(GQA_NAME, lambda *a, **k: gqa_attention(*a, **k))
        _REGISTERED[0] = True


class SlotCache:
    """The decode's KV cache (the part of transformers' Cache API these models' forwards call: `update`).

    keys/values: per layer (B + 1, kv heads, max_len + PAD_MULTIPLE, head size: a spare row and spare slots, never
    used, module docstring), allocated at the first prefill from the model's own key states (so heads, head size and
    dtype are the model's). A prefill (prefill=True) writes slots 0..L0-1 of rows 0..B-1, from the prompt row
    `expand[r]` (each distinct prompt forwarded once), and attends to the prompt's own keys; a decode step writes
    its token's key/value at slot `slot` (a (1,) device tensor: the same for every row) of the first b rows (b: the
    step's batch) and attends to their first `kv_len` slots (None: hands over every slot, and gqa_attention reads
    the attended ones from the mask's width)."""

    def __init__(self, B: int, max_len: int, device):
        self.B, self.max_len = B, max_len
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slot = torch.zeros((1,), dtype=torch.long, device=device)
        self.kv_len: int | None = max_len
        self.prefill, self.expand = False, None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if self.prefill:
            if layer_idx == len(self.keys):  # first use: allocated from the model's own shapes
                B, hkv, _, d = key_states.shape
                # a spare row and PAD_MULTIPLE spare slots, never written or read (as the step's input buffers'):
                # a step's rows and attended slots never span the whole cache, so the compiled step compiles once
                shape = (self.B + 1, hkv, self.max_len + PAD_MULTIPLE, d)
                self.keys.append(torch.zeros(shape, dtype=key_states.dtype, device=key_states.device))
                self.values.append(torch.zeros(shape[:3] + value_states.shape[3:], dtype=value_states.dtype,
                                               device=value_states.device))
            L = key_states.shape[2]
            k, v = key_states, value_states
            if self.expand is not None:  # prompt rows -> the rows that share them
                k, v = k.index_select(0, self.expand), v.index_select(0, self.expand)
            self.keys[layer_idx][: self.B, :, :L] = k
            self.values[layer_idx][: self.B, :, :L] = v
            return key_states, value_states
        rows = key_states.shape[0]  # (a shape, not an attribute: one compiled step serves every row count)
        k, v = self.keys[layer_idx][:rows], self.values[layer_idx][:rows]
        k.index_copy_(2, self.slot, key_states)
        v.index_copy_(2, self.slot, value_states)
        if self.kv_len is None:  # gqa_attention reads the attended slots from the mask's width
            return k, v
        return k[:, :, : self.kv_len], v[:, :, : self.kv_len]

    def get_seq_length(self, layer_idx: int = 0) -> int:  # only asked when no position ids are given
        return self.max_len


def _decode_forward(model, ids, mask, pos, kwargs: dict) -> torch.Tensor:
    """The decode step's forward (what compiled_step compiles): logits (b, V) of the rows' new tokens."""
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs).logits[:, -1, :]


def samples_in_graph(spec) -> bool:
    """Whether a call's decode steps can sample inside the captured step (sample_in_graph): everything but top-p
    (greedy ignores it), whose threshold search sorts only the rows that need a full sort (a host sync)."""
    return spec.temperature == 0 or spec.top_p >= 1.0


def sample_in_graph(logits: torch.Tensor, u: torch.Tensor, ban: torch.Tensor | None, temperature: float,
                    top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_step's choice for a decode step inside a captured graph (no host sync, no input that changes between
    replays but the buffers): logits (b, V), u (b,) the rows' uniforms of this step, ban (V,) float32 added to the
    logits (-inf at the EOS ids before min_tokens, else 0; None: no ban). Returns (token ids (b,), their
    log-probabilities (b,) float32): sample_step's, bit for bit where run eagerly (adding a ban of 0 in float32
    changes no value the sampler reads: it reads the logits in float32)."""
    if ban is not None:
        logits = logits.float() + ban
    if temperature == 0:
        logp = torch.log_softmax(logits.float(), dim=-1)
        tok = logp.argmax(-1)
    else:
        logp = process_logits(logits, temperature, top_k, 1.0)
        tok = sample_rows(logp, u)
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float()


def _decode_sample(model, ids, mask, pos, kwargs: dict, u, ban, temperature: float, top_k: int):
    """The decode step's forward and sampling (what compiled_sample_step compiles): (token ids (b,), logprobs)."""
    return sample_in_graph(_decode_forward(model, ids, mask, pos, kwargs), u, ban, temperature, top_k)


@functools.cache
def compiled_step():
    """_decode_forward compiled once per process (torch.compile, dynamic shapes): every decoder, row count and
    attended width shares it (the shapes are symbolic; the cache's tensors are inputs, not constants)."""
    return torch.compile(_decode_forward, dynamic=True)


@functools.cache
def compiled_sample_step():
    """_decode_sample compiled likewise (once per process and sampling setting: temperature and top-k are
    constants of the graph)."""
    return torch.compile(_decode_sample, dynamic=True)


class StaticDecoder:
    """The slot cache, the step's input buffers and (on CUDA) its graphs, for one (rows, max_len) shape. Kept by
    HFGenerator between calls, so equal shapes (same batch, prompts of similar length) capture once: one graph per
    (live rows, attended slots) met."""

    def __init__(self, gen, B: int, max_len: int, dtype: torch.dtype):
        self.gen, self.B, self.max_len, self.dtype = gen, B, max_len, dtype
        dev = gen.device
        self.cache = SlotCache(B, max_len, dev)
        # a spare row and PAD_MULTIPLE spare columns, never read: a step's views (b rows, S slots) never span a
        # whole buffer, so the compiled step (rollout.compile_decode) meets one layout and compiles once
        self.tok = torch.zeros((B + 1, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((B + 1, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((B + 1, 1, 1, max_len + PAD_MULTIPLE), dtype=dtype, device=dev)
        self.graphs: dict[tuple[int, int], _Graph] = {}
        self.use_graph = dev.type == "cuda"
        # sdpa models: the query heads of a KV head attend together (gqa_attention); eager keeps its own
        self.attention = GQA_NAME if getattr(gen.model.config, "_attn_implementation", None) == "sdpa" else None
        self.shapes: list[tuple[int, int]] = []  # (rows, attended slots) of each decode step of the last chunk
        self.compiled = None  # rollout.compile_decode: the step compiled (compiled_step), sdpa models
        self.compiled_sample = None  # ... and with its sampling (compiled_sample_step)
        if gen.compile_decode:
            if self.attention is None:
                gen.compile_decode = False  # (said once)
                warnings.warn("rollout.compile_decode: the model's attention is eager, not sdpa; its decode step "
                              "runs uncompiled", stacklevel=4)
            else:
                self.compiled, self.compiled_sample = compiled_step(), compiled_sample_step()
        # sampling inside the step (sample_in_graph): the call's setting (temperature, top-k, whether EOS is banned
        # before min_tokens) or None (top-p: outside), and the buffers the step reads it from
        self.sampling: tuple[float, int, bool] | None = None
        self.u = torch.zeros((B + 1,), dtype=torch.float64, device=dev)  # the rows' uniforms of the step
        self.ban: torch.Tensor | None = None  # (V,) float32, allocated by set_sampling where a call bans EOS
        self.graph_sampling = True  # False after a graph with sampling failed to capture (said once)

    @property
    def graph(self) -> _Graph | None:
        """A captured graph (the first), or None before any capture (benchmarks/gpu.py reports it)."""
        return next(iter(self.graphs.values()), None)

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        g = self.gen
        out = g.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                      **{g._cache_kw: self.cache}, **g._keep_kw)
        return out.logits[:, -1, :]

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor, expand: torch.Tensor | None = None) -> torch.Tensor:
        """Left-padded prompts (P, L0) into cache slots 0..L0-1 of every row (row r from prompt expand[r]; None =
        row r from prompt r); logits (B, V) of the rows' last prompt tokens. Sets the decode mask to the rows'
        real prompt tokens."""
        P, L0 = ids.shape
        neg = torch.finfo(self.dtype).min
        ok = attn.bool()
        causal = torch.ones((L0, L0), dtype=torch.bool, device=ids.device).tril()
        m = torch.full((P, 1, L0, L0), neg, dtype=self.dtype, device=ids.device)
        m[:, 0].masked_fill_(causal.unsqueeze(0) & ok.unsqueeze(1), 0.0)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        self.shapes = []
        self.cache.prefill, self.cache.expand = True, expand
        try:
            logits = self._forward(ids, m, pos)
        finally:
            self.cache.prefill, self.cache.expand = False, None
        if expand is not None:
            logits, ok = logits.index_select(0, expand), ok.index_select(0, expand)
        self.mask.fill_(neg)
        self.mask[: self.B, 0, 0, :L0].masked_fill_(ok, 0.0)
        return logits

    def _decode(self, b: int, S: int, sampling: tuple | None = None):
        """The decode step of the first b rows over slots 0..S-1 (what a graph captures): logits (b, V), or with
        `sampling` (set_sampling's setting) the sampled tokens and their logprobs (sample_in_graph)."""
        mask = self.mask[:b, :, :, :S]
        extra = () if sampling is None else self._sample_args(b, sampling)
        if self.attention is None:
            self.cache.kv_len = S
            return self._eager(b, mask, extra)
        self.cache.kv_len = None  # gqa_attention: the slots the mask is wide
        with attention_named(self.gen.model, self.attention):
            fn = self.compiled if sampling is None else self.compiled_sample
            if fn is None:
                return self._eager(b, mask, extra)
            g = self.gen
            try:
                with torch.compiler.set_stance("default"):  # (generate() forces eager for the learner's layers)
                    return fn(g.model, self.tok[:b], mask, self.pos[:b], {g._cache_kw: self.cache, **g._keep_kw},
                              *extra)
            except Exception as e:  # noqa: BLE001 - the uncompiled step gives the same tokens
                if is_out_of_memory(e):
                    raise
                self.compiled = self.compiled_sample = None
                g.compile_decode = False
                warnings.warn(f"rollout.compile_decode: compiling the decode step failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); it runs uncompiled", stacklevel=4)
            return self._eager(b, mask, extra)

    def _sample_args(self, b: int, sampling: tuple) -> tuple:
        """sample_in_graph's arguments after the logits for the first b rows: (u, ban or None, temperature, top_k)."""
        return self.u[:b], self.ban if sampling[2] else None, *sampling[:2]

    def _eager(self, b: int, mask: torch.Tensor, extra: tuple):
        logits = self._forward(self.tok[:b], mask, self.pos[:b])
        return logits if not extra else sample_in_graph(logits, *extra)

    def set_sampling(self, spec, eos: torch.Tensor, V: int) -> None:
        """A call's sampling setting for the steps that sample inside the graph (None where they cannot: top-p), and
        the EOS ban buffer where min_tokens bans EOS past the first step (sampled outside, by sample_step)."""
        if not samples_in_graph(spec):
            self.sampling = None
            return
        banned = spec.min_tokens > 1 and len(eos) > 0
        if banned:
            if self.ban is None or self.ban.shape[0] != V:
                self.ban = torch.zeros((V,), dtype=torch.float32, device=self.u.device)
            self.ban.zero_()
            self.ban[eos] = float("-inf")
        self.sampling = (float(spec.temperature), int(spec.top_k), banned)

    def lift_ban(self) -> None:
        """From step min_tokens on, EOS may be sampled (the ban buffer read by the captured steps becomes 0)."""
        if self.ban is not None:
            self.ban.zero_()

    def _run(self, b: int, S: int, sampling: tuple | None):
        if not self.use_graph:
            return self._decode(b, S, sampling)
        key = (b, S, sampling)
        g = self.graphs.get(key)
        if g is None:  # warm-ups and capture write the same key/value at the same slot: nothing to undo
            g = self.graphs[key] = _Graph(lambda: self._decode(b, S, sampling))
        return g()

    def _feed(self, tok: torch.Tensor, slot: int, pos: torch.Tensor, S: int | None) -> tuple[int, int]:
        b, S = tok.shape[0], self.max_len if S is None else S
        if not slot < S <= self.max_len:
            raise ValueError(f"slot {slot} outside the {S} attended slots (of {self.max_len})")
        _register()
        self.tok[:b].copy_(tok.unsqueeze(-1))
        self.pos[:b].copy_(pos.unsqueeze(-1))
        self.mask[:b, 0, 0, slot] = 0.0  # the new token sees itself (its key is written before attention)
        self.cache.slot.fill_(slot)
        self.shapes.append((b, S))
        return b, S

    def step(self, tok: torch.Tensor, slot: int, pos: torch.Tensor, S: int | None = None) -> torch.Tensor:
        """Feed tok (b,) (the first b rows) at cache slot `slot` and positions pos (b,), attending to slots
        0..S-1 (None = all); logits (b, V)."""
        return self._run(*self._feed(tok, slot, pos, S), None)

    def step_sample(self, tok: torch.Tensor, slot: int, pos: torch.Tensor, S: int | None,
                    u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """step(), then sampling with set_sampling's setting and the rows' uniforms u (b,) (None at temperature 0):
        (token ids (b,), logprobs (b,) float32), sampled inside the step's graph (its outputs: read them before the
        next step) or, where that graph failed to capture, after it."""
        b, S = self._feed(tok, slot, pos, S)
        if u is not None:
            self.u[:b].copy_(u)
        extra = self._sample_args(b, self.sampling)
        if not self.graph_sampling:
            return sample_in_graph(self._run(b, S, None), *extra)
        try:
            return self._run(b, S, self.sampling)
        except Exception as e:  # noqa: BLE001 - the step captured without sampling gives the same tokens
            if is_out_of_memory(e) or not self.use_graph:
                raise
            self.graphs.pop((b, S, self.sampling), None)
            # the step without its sampling: where that fails too, the capture itself is what failed (the caller
            # falls back to the plain loop); where it works, sampling stays outside the graph from now on
            logits = self._run(b, S, None)
            self.graph_sampling = False
            warnings.warn(f"rollout.cuda_graphs: capturing the decode step with its sampling failed "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); the steps sample "
                          "after the graph", stacklevel=3)
        return sample_in_graph(logits, *extra)

    def compact(self, keep: torch.Tensor, written: int) -> None:
        """Rows `keep` (nb,) of the current layout become rows 0..nb-1: their written slots (0..written-1) and
        decode mask."""
        nb = int(keep.numel())
        for t in (*self.cache.keys, *self.cache.values):
            t[:nb, :, :written] = t[:, :, :written].index_select(0, keep)
        self.mask[:nb] = self.mask.index_select(0, keep)


def _to_device(values: list[int], dev, pinned: bool) -> torch.Tensor:
    """A long tensor on the device without waiting for the device's queue (pinned host memory, asynchronous)."""
    t = torch.tensor(values, dtype=torch.long)
    return t.pin_memory().to(dev, non_blocking=True) if pinned else t.to(dev)


def row_counts(B: int) -> list[int]:
    """The batch sizes finished rows are compacted to: B, then halves down to max(MIN_ROWS, B // 16)."""
    out, floor = [B], max(MIN_ROWS, B // 16)
    while -(-out[-1] // 2) >= floor and out[-1] > 1:
        out.append(-(-out[-1] // 2))
    return out


def generate_chunk_static(gen, prompts, prompt_ids, chunk, spec, base_seed, emit=None):
    """HFGenerator._generate_chunk on the slot cache (module docstring); the same Rollouts. emit (generate's
    on_finished for this chunk, rlvr.rollout.hf_generator._Emitter): the rows a host check finds ended are handed
    on at that check (their logprobs come to the host with their tokens, block by block)."""
    dev = gen.device
    B, T = len(chunk), spec.max_tokens
    p_ids = [list(prompt_ids[i]) for i, _ in chunk]
    L0 = -(-max(len(p) for p in p_ids) // PAD_MULTIPLE) * PAD_MULTIPLE
    uniq = list(dict.fromkeys(i for i, _ in chunk))
    expand = None
    if gen.shared_prefix and len(uniq) < B:  # each distinct prompt forwarded once, its keys/values to its rows
        where = {p: k for k, p in enumerate(uniq)}
        src = [list(prompt_ids[p]) for p in uniq]
        expand = torch.tensor([where[i] for i, _ in chunk], dtype=torch.long, device=dev)
    else:
        src = p_ids
    ids = torch.tensor([[gen.pad_id] * (L0 - len(p)) + p for p in src], dtype=torch.long).to(dev)
    attn = torch.tensor([[0] * (L0 - len(p)) + [1] * len(p) for p in src], dtype=torch.long).to(dev)
    # slots: the prompt, then one per decoded token, rounded up to a multiple of 16 (SDPA's memory-efficient
    # kernel wants the mask's last dimension aligned; the spare slots stay masked)
    T16 = -(-T // PAD_MULTIPLE) * PAD_MULTIPLE
    block = -(-T16 // SLOT_BLOCKS // PAD_MULTIPLE) * PAD_MULTIPLE  # the attended response slots grow by this
    dec = gen._static_decoder(B, L0 + T16)
    uniforms = gen._uniforms(chunk, spec, base_seed)
    # the rows' uniforms, and a spare row B read by the padding rows of a compacted batch
    u_dev = None if uniforms is None else torch.cat([uniforms, torch.full((1, T), 0.5, dtype=uniforms.dtype)]).to(dev)
    eos = torch.tensor(gen.eos_ids, dtype=torch.long, device=dev)
    eos_cpu = eos.cpu()
    # (step, row): the tokens and logprobs of original row r in column r; column B takes the padding rows' writes
    toks = torch.full((T, B + 1), gen.pad_id, dtype=torch.long, device=dev)
    tlps = torch.zeros((T, B + 1), dtype=torch.float32, device=dev)
    n_tok = [T] * B
    finish: list[str | None] = [None] * B
    stop_reason: list[str | None] = [None] * B
    cut_text: list[str | None] = [None] * B
    stops = StopStrings(gen.tokenizer, spec.stop, spec.include_stop_str_in_output) if spec.stop else None
    seen = torch.empty((B, T), dtype=torch.long)  # the host's copy of the tokens checked so far (for stop strings)
    pinned = dev.type == "cuda"

    def check(s0: int, blk: torch.Tensor) -> None:
        """Host bookkeeping of steps s0.. (blk (B, k) tokens), in the plain path's order per step: a row ends at
        its first EOS or at the first earlier step (from min_tokens on) whose token completed a stop string, which
        only the candidate tokens of StopStrings may have done (only those are decoded)."""
        k = blk.shape[1]
        is_eos = torch.isin(blk, eos_cpu) if len(eos_cpu) else torch.zeros_like(blk, dtype=torch.bool)
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), k).tolist()
        if stops is not None:
            seen[:, s0 : s0 + k] = blk
            col = torch.arange(k)
            cand = stops.candidates(blk) & (col < torch.tensor(first).unsqueeze(1)) & (s0 + col + 1 >= spec.min_tokens)
            for r, c in cand.nonzero().tolist():  # row-major: each row's candidates in step order
                if finish[r] is not None:  # ended at an earlier step
                    continue
                hit = stops.check(seen[r, : s0 + c + 1].tolist())
                if hit is not None:
                    finish[r], stop_reason[r], cut_text[r], n_tok[r] = "stop", hit[0], hit[1], s0 + c + 1
        for r in range(B):
            if finish[r] is None and first[r] < k:
                finish[r], stop_reason[r], n_tok[r] = "stop", "<eos>", s0 + first[r] + 1

    logits = dec.prefill(ids, attn, expand)
    n_real = attn.sum(-1)  # the first new token's position
    if expand is not None:
        n_real = n_real.index_select(0, expand)
    counts = row_counts(B) if gen.drop_finished else [B]
    at_host = list(range(B))  # the original row of each row of the batch (B: a padding row)
    at = torch.arange(B, device=dev)
    pending: list[tuple] = []  # (first step, tokens, logprobs or None, event): blocks on their way, not yet checked
    # emit: the host's copies of the checked steps' tokens and logprobs, a row handed on as soon as it is final
    h_toks = torch.empty((B, T), dtype=torch.long) if emit is not None else None
    h_lps = torch.empty((B, T), dtype=torch.float32) if emit is not None else None

    def checked(b0: int, b: torch.Tensor, lb: torch.Tensor | None) -> None:
        """check() of a block that arrived, then (emit) the rows it ended handed on."""
        was = [f is None for f in finish]
        check(b0, b.t())
        if emit is None:
            return
        h_toks[:, b0 : b0 + b.shape[0]] = b.t()
        h_lps[:, b0 : b0 + b.shape[0]] = lb.t()
        ended = [r for r in range(B) if was[r] and finish[r] is not None]
        if ended:
            emit.rows(gen, ended, prompts, chunk, p_ids, h_toks, h_lps, n_tok, finish, stop_reason, cut_text, spec)

    s0 = 0
    tok = None  # the token sampled at the previous step
    dec.set_sampling(spec, eos, logits.shape[-1])
    for step in range(T):
        u = None if u_dev is None else u_dev[at, step]
        # the step feeds the previous token at slot L0 + step - 1 and attends to the slots written so far
        feed = (tok, L0 + step - 1, n_real + (step - 1), min(dec.max_len, L0 + -(-step // block) * block))
        if step and dec.sampling is not None:  # sampled inside the step (its graph's outputs, read right away)
            if step == spec.min_tokens:
                dec.lift_ban()
            tok, lp = dec.step_sample(*feed, u)
        else:
            if step:
                logits = dec.step(*feed)
            logp, tok = sample_step(logits, step, spec, eos, u)
            lp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float()
        toks[step].index_copy_(0, at, tok)
        tlps[step].index_copy_(0, at, lp)
        if (step + 1) % gen.sync_every and step + 1 < T:
            continue
        # the block to the host without waiting for it; the previous block is checked meanwhile
        blk = torch.empty((step + 1 - s0, B), dtype=torch.long, pin_memory=pinned)
        blk.copy_(toks[s0 : step + 1, :B], non_blocking=pinned)
        lblk = None
        if emit is not None:
            lblk = torch.empty((step + 1 - s0, B), dtype=torch.float32, pin_memory=pinned)
            lblk.copy_(tlps[s0 : step + 1, :B], non_blocking=pinned)
        event = None
        if pinned:
            event = torch.cuda.Event()
            event.record()
        pending.append((s0, blk, lblk, event))
        s0 = step + 1
        if len(pending) > 1:
            b0, b, lb, ev = pending.pop(0)
            if ev is not None:
                ev.synchronize()
            checked(b0, b, lb)
            live = [r for r in range(B) if finish[r] is None]
            if not live:
                break
            nb = min(c for c in counts if c >= len(live))
            if nb < len(at_host) and step + 1 < T:  # compaction: the live rows move to the first nb rows
                row_of = {r: i for i, r in enumerate(at_host)}
                keep_host = [row_of[r] for r in live] + [row_of[live[0]]] * (nb - len(live))
                keep = _to_device(keep_host, dev, pinned)
                dec.compact(keep, L0 + step)
                tok, n_real = tok.index_select(0, keep), n_real.index_select(0, keep)
                at_host = live + [B] * (nb - len(live))
                at = _to_device(at_host, dev, pinned)
    for b0, b, lb, ev in pending:
        if all(f is not None for f in finish):
            break
        if ev is not None:
            ev.synchronize()
        checked(b0, b, lb)
    for r in range(B):
        if finish[r] is None:
            finish[r] = "length"
    out = gen._assemble(prompts, chunk, p_ids, toks[:, :B].t().cpu(), tlps[:, :B].t().cpu(), n_tok, finish,
                        stop_reason, cut_text, spec)
    return out if emit is None else emit.final(out)
