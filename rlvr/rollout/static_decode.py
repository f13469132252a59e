"""The hf sampler's decode loop on a static KV cache, its decode step replayed as a CUDA graph on a GPU.

At batch 512 a decode step of a 0.5B model is a few ms of GPU work but ~50 ms of host work (the Python of
the transformers forward, ~1000 kernel launches, per-step copies of the sampled tokens to the host). This
path removes the host from the step:

- the prompts (left-padded, as the plain path) are prefilled into a transformers `StaticCache` of
  (rows, prompt_len + max_tokens) slots, with an explicit 4-D additive mask (causal, pads hidden);
- every decode step runs the model on static buffers: token ids (B, 1), position ids (B, 1) and a
  (B, 1, 1, max_len) additive mask whose slot for the newest token is opened in place. The cache keeps its own
  write index on the device (StaticLayer.cumulative_length, advanced in place by every forward, the
  transformers 5.x replacement of `cache_position`), so the step has no host-side input that changes;
- on CUDA the step is captured once per (rows, max_len) with `torch.cuda.CUDAGraph` (warm-up on a side
  stream, capture, replay) and replayed; on CPU it runs eagerly (the same numbers: what the tests check);
- sampling (process_logits / sample_rows, the rows' own uniforms moved to the device once) stays outside the
  graph but on the device: the tokens and logprobs go into (B, max_tokens) device tensors and come to the host
  every `sync_every` steps, one block behind the GPU, where EOS, stop strings and min_tokens are checked exactly
  as the plain path does (a row is cut where it finished; the steps it decoded after that are ignored);
- no rows are dropped: finished rows keep decoding (their outputs unread) until all rows have finished, which
  is checked every `sync_every` steps.

A row's tokens before it finishes depend only on its own prompt, tokens and uniforms, so the results equal
the plain path's up to float rounding (tests/test_rollout_static.py). Models: causal LMs whose every layer is
full attention in the supported list (Qwen2, Qwen3, Llama) with sdpa or eager attention; anything else, and
any failure here, falls back to the plain path with one warning (rlvr.rollout.hf_generator).
"""

from __future__ import annotations

import torch

from rlvr.rollout.sampling import find_completed_stop, sample_step

# model_type -> decoder-only models whose forward takes a 4-D mask, position ids and a StaticCache as-is
SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
SUPPORTED_ATTENTION = ("sdpa", "eager")
PAD_MULTIPLE = 16  # prompts left-padded to a multiple of this (chunks of similar prompts share one graph), cache too


def unsupported_reason(model) -> str | None:
    """Why the static-cache decode cannot run this model, or None when it can."""
    cfg = getattr(model, "config", None)
    mtype = getattr(cfg, "model_type", None)
    if mtype not in SUPPORTED_MODEL_TYPES:
        return f"model type {mtype!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    attn = getattr(cfg, "_attn_implementation", None)
    if attn not in SUPPORTED_ATTENTION:
        return f"attention implementation {attn!r} is not one of {', '.join(SUPPORTED_ATTENTION)}"
    types = getattr(cfg, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in types):
        return "the model has sliding-window or other non-full attention layers"
    try:
        from transformers import StaticCache  # noqa: F401
    except ImportError:
        return "this transformers has no StaticCache"
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


class StaticDecoder:
    """The static cache, the step's input buffers and (on CUDA) its graph, for one (rows, max_len) shape.
    Kept by HFGenerator between calls, so equal shapes (same batch, prompts of similar length) capture once."""

    def __init__(self, gen, B: int, max_len: int, dtype: torch.dtype):
        from transformers import StaticCache

        self.gen, self.B, self.max_len, self.dtype = gen, B, max_len, dtype
        dev = gen.device
        self.cache = StaticCache(config=gen.model.config, max_cache_len=max_len)
        self.tok = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((B, 1), dtype=torch.long, device=dev)
        self.mask = torch.zeros((B, 1, 1, max_len), dtype=dtype, device=dev)
        self.graph: _Graph | None = None
        self.use_graph = dev.type == "cuda"

    def _forward(self, ids, mask, pos) -> torch.Tensor:
        g = self.gen
        out = g.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                      **{g._cache_kw: self.cache}, **g._keep_kw)
        return out.logits[:, -1, :]

    def prefill(self, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Left-padded prompts (B, L0) into cache slots 0..L0-1; logits (B, V) of their last tokens. Sets the
        decode mask to the prompts' real tokens."""
        self.cache.reset()  # in place: the graph keeps pointing at the same tensors
        B, L0 = ids.shape
        neg = torch.finfo(self.dtype).min
        ok = attn.bool()
        causal = torch.ones((L0, L0), dtype=torch.bool, device=ids.device).tril()
        allowed = causal.unsqueeze(0) & ok.unsqueeze(1)  # (B, L0 queries, L0 keys)
        m = torch.full((B, 1, L0, self.max_len), neg, dtype=self.dtype, device=ids.device)
        m[:, 0, :, :L0].masked_fill_(allowed, 0.0)
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        logits = self._forward(ids, m, pos)
        self.mask.fill_(neg)
        self.mask[:, 0, 0, :L0].masked_fill_(ok, 0.0)
        return logits

    def step(self, tok: torch.Tensor, slot: int, pos: torch.Tensor) -> torch.Tensor:
        """Feed tok (B,) at cache slot `slot` (the cache's own index is there) and position pos (B,); logits (B, V)."""
        self.tok.copy_(tok.unsqueeze(-1))
        self.pos.copy_(pos.unsqueeze(-1))
        self.mask[:, 0, 0, slot] = 0.0  # the new token sees itself (its key is written before attention)
        if not self.use_graph:
            return self._forward(self.tok, self.mask, self.pos)
        if self.graph is None:
            index = [layer.cumulative_length.clone() for layer in self.cache.layers]
            self.graph = _Graph(lambda: self._forward(self.tok, self.mask, self.pos))
            for layer, i in zip(self.cache.layers, index, strict=True):  # the warm-ups advanced it
                layer.cumulative_length.copy_(i)
        return self.graph()


def generate_chunk_static(gen, prompts, prompt_ids, chunk, spec, base_seed):
    """HFGenerator._generate_chunk on the static cache (module docstring); the same Rollouts."""
    dev = gen.device
    B, T = len(chunk), spec.max_tokens
    p_ids = [list(prompt_ids[i]) for i, _ in chunk]
    L0 = -(-max(len(p) for p in p_ids) // PAD_MULTIPLE) * PAD_MULTIPLE
    ids = torch.tensor([[gen.pad_id] * (L0 - len(p)) + p for p in p_ids], dtype=torch.long).to(dev)
    attn = torch.tensor([[0] * (L0 - len(p)) + [1] * len(p) for p in p_ids], dtype=torch.long).to(dev)
    # slots: the prompt, then one per decoded token, rounded up to a multiple of 16 (SDPA's memory-efficient
    # kernel wants the mask's last dimension aligned; the spare slots stay masked)
    dec = gen._static_decoder(B, L0 + -(-T // PAD_MULTIPLE) * PAD_MULTIPLE)
    uniforms = gen._uniforms(chunk, spec, base_seed)
    u_dev = uniforms.to(dev) if uniforms is not None else None
    eos = torch.tensor(gen.eos_ids, dtype=torch.long, device=dev)
    eos_cpu = eos.cpu()
    toks = torch.full((B, T), gen.pad_id, dtype=torch.long, device=dev)
    tlps = torch.zeros((B, T), dtype=torch.float32, device=dev)
    n_tok = [T] * B
    finish: list[str | None] = [None] * B
    stop_reason: list[str | None] = [None] * B
    cut_text: list[str | None] = [None] * B
    resp: list[list[int]] = [[] for _ in range(B)]  # only for the stop-string check
    window = max((len(x) for x in spec.stop), default=0) + 16
    pinned = dev.type == "cuda"

    def check(s0: int, blk: torch.Tensor) -> None:
        """Host bookkeeping of steps s0.. (blk (B, k) tokens), in the plain path's order per step."""
        is_eos = torch.isin(blk, eos_cpu) if len(eos_cpu) else torch.zeros_like(blk, dtype=torch.bool)
        rows = [r for r in range(B) if finish[r] is None]
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), blk.shape[1]).tolist()
        if not spec.stop:
            for r in rows:
                if first[r] < blk.shape[1]:
                    finish[r], stop_reason[r], n_tok[r] = "stop", "<eos>", s0 + first[r] + 1
            return
        vals = blk.tolist()
        for r in rows:
            for k, t in enumerate(vals[r]):
                step = s0 + k
                resp[r].append(t)
                if k == first[r]:
                    finish[r], stop_reason[r], n_tok[r] = "stop", "<eos>", step + 1
                    break
                if step + 1 >= spec.min_tokens:  # vLLM: stops count from min_tokens on
                    hit = find_completed_stop(gen.tokenizer, resp[r], spec.stop, spec.include_stop_str_in_output,
                                              window)
                    if hit is not None:
                        finish[r], stop_reason[r], cut_text[r], n_tok[r] = "stop", hit[0], hit[1], step + 1
                        break

    logits = dec.prefill(ids, attn)
    n_real = attn.sum(-1)  # (B,) the first new token's position
    pending: list[tuple[int, torch.Tensor, object]] = []  # blocks copied to the host, not yet checked
    s0 = 0
    tok = None  # the token sampled at the previous step
    for step in range(T):
        if step:
            logits = dec.step(tok, L0 + step - 1, n_real + (step - 1))
        logp, tok = sample_step(logits, step, spec, eos, None if u_dev is None else u_dev[:, step])
        toks[:, step] = tok
        tlps[:, step] = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float()
        if (step + 1) % gen.sync_every and step + 1 < T:
            continue
        # the block to the host without waiting for it; the previous block is checked meanwhile
        blk = torch.empty((B, step + 1 - s0), dtype=torch.long, pin_memory=pinned)
        blk.copy_(toks[:, s0 : step + 1], non_blocking=pinned)
        event = None
        if pinned:
            event = torch.cuda.Event()
            event.record()
        pending.append((s0, blk, event))
        s0 = step + 1
        if len(pending) > 1:
            b0, b, ev = pending.pop(0)
            if ev is not None:
                ev.synchronize()
            check(b0, b)
            if all(f is not None for f in finish):
                break
    for b0, b, ev in pending:
        if all(f is not None for f in finish):
            break
        if ev is not None:
            ev.synchronize()
        check(b0, b)
    for r in range(B):
        if finish[r] is None:
            finish[r] = "length"
    return gen._assemble(prompts, chunk, p_ids, toks.cpu(), tlps.cpu(), n_tok, finish, stop_reason, cut_text, spec)
