"""Batched sampling with a transformers causal LM: our own decode loop over the KV cache.

Why our own loop instead of `model.generate`: per-sequence stop strings, min_tokens, exact
sampler logprobs and per-sequence RNGs (reproducible whatever the batch size) are each a few
lines here and fragile through generate's logits processors. benchmarks/generation.py measures
the loop with and without the KV cache.

Batch layout: prompts are left-padded to the longest prompt of the micro-batch; positions are
counted over real tokens only (so a padded row computes the same logits as an unpadded one,
up to float rounding). Rows that finished decode a pad token nobody reads until a quarter of the
batch is done; then finished rows are dropped from the batch and its KV cache. With the shared
prefix and cascade attention, each distinct prompt is prefilled once (right-padded, no mask) and the
decode steps attend to its keys/values in place, the rows' own generated keys/values appended per
step (rlvr.models.cascade.SharedPrefixKV). On a GPU (rollout.cuda_graphs) the chunks decode instead on a
static KV cache with the step replayed as a CUDA graph: rlvr.rollout.static_decode.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch

from rlvr.models import lora
from rlvr.models.cascade import SharedPrefixKV
from rlvr.models.cascade import attention as cascade_attention
from rlvr.models.cascade import supported as cascade_supported
from rlvr.models.packed import inner_model, is_out_of_memory
from rlvr.models.prefix import select_rows
from rlvr.rollout.sampling import (  # noqa: F401 - find_completed_stop, process_logits, sample_rows re-exported
    StopStrings,
    decode_batch,
    find_completed_stop,
    process_logits,
    sample_rows,
    sample_step,
)
from rlvr.rollout.static_decode import StaticDecoder, generate_chunk_static, unsupported_reason
from rlvr.rollout.types import Rollout, SamplingSpec, resolve_prompt_ids, sequence_seed


class HFGenerator:
    """Generator backed by a transformers model (CPU or GPU).

    model: a causal LM. It may be the trainer's own module (colocated: the generator always
    sees the current weights, and update_weights only checks and bumps the version) or a
    separate copy (update_weights copies tensors in). tokenizer: its tokenizer.
    batch_size: sequences decoded together (prompt-major chunks of the len(prompts) * n rows).
    use_cache: decode with the KV cache (False recomputes the whole prefix every step; only
    for benchmarks and checks). drop_finished: remove finished rows from the batch and cache
    once a quarter of it is done (the static-cache path: compact them out once the rest fits in half the
    batch) (False only for benchmarks). shared_prefix: the prompt of rows that
    share one (the n samples of a prompt) is prefilled once and the rows decode on its keys/values in
    place (cascade attention, rlvr.models.cascade; for models it does not support, and on the static-cache
    path, the KV cache is copied to the rows) (rollout.shared_prefix; False prefills every row).
    cuda_graphs: the static-cache decode with the step replayed as a CUDA graph (rlvr.rollout.static_decode;
    rollout.cuda_graphs): "auto" = on for a CUDA model of a supported type, True = on where supported (a
    warning otherwise), False = off. static_cache: run that decode path also off CUDA, without graph capture
    (tests and checks; None = only with CUDA graphs). Any failure of the path warns once and falls back to the
    plain loop. sync_every: that path copies the sampled tokens to the host every this many steps.
    compile_decode: that path's decode step compiled (torch.compile, dynamic shapes, once per process) before
    each graph's capture, for sdpa models (rollout.compile_decode; a failure warns once and the step runs
    uncompiled).
    """

    def __init__(
        self,
        model,
        tokenizer,
        *,
        batch_size: int = 64,
        device=None,
        use_cache: bool = True,
        drop_finished: bool = True,
        shared_prefix: bool = True,
        cuda_graphs: bool | str = "auto",
        static_cache: bool | None = None,
        sync_every: int = 16,
        compile_decode: bool = False,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        if next(model.parameters()).device != self.device:
            self.model.to(self.device)
        self.use_cache = use_cache
        self.drop_finished = drop_finished
        self.shared_prefix = shared_prefix
        # the arguments of the forward that really runs: a LoRA (peft) policy's is its base model's (peft's own
        # forward names none of them and hands its **kwargs on); transformers >= 5.2x renamed the
        # `past_key_values` argument/output to `cache`.
        fwd = inspect.signature(type(inner_model(model)).forward).parameters
        self._cache_kw = "cache" if "cache" in fwd else "past_key_values"
        # logits_to_keep=1 computes only the last position's logits (saves a (B, L, V) tensor);
        # models without the argument (older or remote-code classes) get full logits.
        self._keep_kw = {"logits_to_keep": 1} if "logits_to_keep" in fwd else {}
        self.weight_version = 0
        # decode steps attend to each prompt's K/V in place (rlvr.models.cascade) where the model allows
        self._cascade = shared_prefix and use_cache and cascade_supported(model)
        eos = tokenizer.eos_token_id
        cfg_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids = {eos} if eos is not None else set()
        ids |= set(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos] if cfg_eos is not None else [])
        self.eos_ids = sorted(ids)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.eos_ids[0] if self.eos_ids else 0)
        if cuda_graphs not in ("auto", True, False):
            raise ValueError(f"cuda_graphs must be 'auto', True or False, got {cuda_graphs!r}")
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.sync_every = sync_every
        self.compile_decode = compile_decode
        self._decoder = None  # rlvr.rollout.static_decode.StaticDecoder of the last shape
        self._static = self._choose_static(cuda_graphs, static_cache)

    def _choose_static(self, cuda_graphs, static_cache) -> bool:
        """Whether chunks decode on the static cache (module rlvr.rollout.static_decode)."""
        on_cuda = self.device.type == "cuda"
        wanted = static_cache if static_cache is not None else (cuda_graphs is True or (cuda_graphs == "auto" and on_cuda))
        if not wanted or not self.use_cache:
            return False
        why = unsupported_reason(self.model)
        if why is None and cuda_graphs is True and not on_cuda:
            why = f"the model is on {self.device}, not a CUDA device"
        if why is not None:
            if cuda_graphs is True or static_cache:
                warnings.warn(f"rollout.cuda_graphs: {why}; the hf sampler decodes without them", stacklevel=3)
            return False
        return True

    # -- weights -------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy the given tensors into the model (skipped when they already are its storage, or when they
        are a LoRA learner's merged push of this very module: rlvr.models.lora.LoraPush). A generator holding
        its own copy of a LoRA model turns it into the plain merged model at the first push it must copy."""
        if getattr(named_tensors, "module", None) is self.model:
            self.weight_version = int(version)
            return
        if lora.is_lora(self.model):
            # A copy of a LoRA learner (a Ray generator actor unpickles one): the pushes are merged weights under
            # the base model's names (rlvr.models.export.push_tensors), so the copy becomes the plain model they
            # address (peft's merge_and_unload of this copy; the learner's own module is another object).
            self.model = self.model.merge_and_unload()
            self._decoder = None
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in params:
                    known = ", ".join(list(params)[:5])
                    raise KeyError(f"update_weights: unknown tensor {name!r} (model has e.g. {known}, ...)")
                dst = params[name]
                if dst.data_ptr() == tensor.data_ptr():
                    continue  # colocated: it is the same storage
                if dst.shape != tensor.shape:
                    raise ValueError(
                        f"update_weights: {name} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                    )
                dst.copy_(tensor.to(dst.device, dst.dtype))
        self.weight_version = int(version)

    def sleep(self) -> None:
        """Nothing freed: the plain loop's KV cache lives only inside generate(); the static-cache decoder
        (rollout.cuda_graphs) keeps its cache and captured graph for the next call of the same shape."""

    # -- generation ----------------------------------------------------------------------------
    streams_finished = True  # generate() takes on_finished (rlvr.train.pg.rollout_source scores while it decodes)

    def generate(
        self, prompts: list[str], spec: SamplingSpec, *, prompt_ids: Sequence[Sequence[int]] | None = None,
        on_finished: Callable[[int, Rollout], None] | None = None,
    ) -> list[Rollout]:
        """len(prompts) * spec.n Rollouts in prompt-major order (see Generator). on_finished(i, rollout), if given,
        is called (on this thread) with each rollout as soon as it is final, while the other rows decode on: i is
        its index in the returned list, which holds that very object; every index once, before generate returns
        (the plain loop: at the step its row ends; the static-cache decode: at the host check that finds it
        ended, every sync_every steps)."""
        prompt_ids = resolve_prompt_ids(self.tokenizer, prompts, prompt_ids)
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: the first token would have no context (give a BOS)")
        base_seed = spec.seed
        if base_seed is None:
            base_seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        jobs = [(i, j) for i in range(len(prompts)) for j in range(spec.n)]
        out: list[Rollout] = []
        was_training = self.model.training
        self.model.eval()
        try:
            # eager layers: a learner's compiled ones (model.compile_layers) would compile again for every decode
            # shape, and the CUDA-graph decode captures eager kernels
            with torch.no_grad(), torch.compiler.set_stance("force_eager"):
                for s in range(0, len(jobs), self.batch_size):
                    chunk = jobs[s : s + self.batch_size]
                    emit = None if on_finished is None else _Emitter(on_finished, s)
                    out.extend(self._chunk(prompts, prompt_ids, chunk, spec, base_seed, emit))
        finally:
            self.model.train(was_training)
        return out

    def _chunk(self, prompts, prompt_ids, chunk, spec: SamplingSpec, base_seed: int, emit=None) -> list[Rollout]:
        """One chunk on the static cache where chosen; on any failure there, one warning and the plain loop
        from then on (the rows' uniforms are fixed by their seeds, so the redone chunk is the same; a row the
        failed decode had already handed to on_finished keeps that rollout)."""
        if self._static:
            try:
                return generate_chunk_static(self, prompts, prompt_ids, chunk, spec, base_seed, emit)
            except Exception as e:  # noqa: BLE001 - never crash a run for the fast path: the plain one is exact
                if is_out_of_memory(e):  # out of memory is the run's to know, not a reason to decode slower
                    raise
                self._static, self._decoder = False, None
                warnings.warn(f"rollout.cuda_graphs: the static-cache decode failed ({type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}); the hf sampler decodes without it",
                              stacklevel=3)
        return self._generate_chunk(prompts, prompt_ids, chunk, spec, base_seed, emit)

    def _static_decoder(self, B: int, max_len: int):
        """The StaticDecoder of this shape: the last one when equal (its captured graph replays), else new."""
        d = self._decoder
        weights = tuple(p.data_ptr() for p in self.model.parameters())  # a graph reads them by address
        if d is None or (d.B, d.max_len, d.weights) != (B, max_len, weights):
            self._decoder = None  # the old cache and graph freed before the new ones are allocated
            dtype = self.model.get_input_embeddings().weight.dtype
            self._decoder = d = StaticDecoder(self, B, max_len, dtype)
            d.weights = weights
        return d

    def _forward(self, ids, attn, past):
        """Logits (B, V) of the last position, and the cache to pass next time."""
        pos = (attn.cumsum(-1) - 1).clamp_min(0)
        kwargs = {}
        if past is not None:  # only the new token goes in; its position is the last one
            pos = pos[:, -ids.shape[1] :]
            kwargs[self._cache_kw] = past
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=pos,
            use_cache=self.use_cache,
            **self._keep_kw,
            **kwargs,
        )
        cache = getattr(out, self._cache_kw, None) if self.use_cache else None
        return out.logits[:, -1, :], cache

    def _prefill(self, ids, attn, prompt_of_row):
        """The prompt forward: with shared_prefix, once per distinct prompt. Returns (last logits of
        every row, cache, SharedPrefixKV or None). With cascade attention (rlvr.models.cascade) the
        prompts' K/V stay one per prompt and the decode steps attend to them in place (the cache
        returned is None); otherwise the prompt's KV cache is indexed out to every row."""
        uniq = list(dict.fromkeys(prompt_of_row))
        if not (self.shared_prefix and self.use_cache and len(uniq) < len(prompt_of_row)):
            return (*self._forward(ids, attn, None), None)
        first = {p: r for r, p in reversed(list(enumerate(prompt_of_row)))}  # a row of each prompt
        reps = torch.tensor([first[p] for p in uniq], dtype=torch.long, device=ids.device)
        where = {p: k for k, p in enumerate(uniq)}
        rows = torch.tensor([where[p] for p in prompt_of_row], dtype=torch.long, device=ids.device)
        if self._cascade:
            got = self._prefill_cascade(ids[reps], attn[reps], rows)
            if got is not None:
                return got
        logits, past = self._forward(ids[reps], attn[reps], None)
        if not hasattr(past, "batch_select_indices"):
            return (*self._forward(ids, attn, None), None)

        select_rows(past, rows)
        return logits[rows], past, None

    def _prefill_cascade(self, ids, attn, rows):
        """The prompts (left-padded ids, attn of the distinct prompts) forwarded right-padded with no
        mask (a causal model's real positions never see the pads after them; the cascade masks them as
        keys), so the model runs plain causal attention. Returns (last real logits of every row, None,
        SharedPrefixKV) or None when the model's cache does not expose its keys and values."""
        n = attn.sum(-1)  # (g,) real tokens of each prompt
        L = ids.shape[1]
        shift = (torch.arange(L, device=ids.device).unsqueeze(0) + (L - n).unsqueeze(1)) % L  # left -> right pad
        r_ids, r_ok = ids.gather(1, shift), attn.gather(1, shift).bool()
        pos = torch.arange(L, device=ids.device).unsqueeze(0).expand_as(r_ids)
        keep, at = {}, n - 1  # logits at each prompt's last position only: the distinct ones (a (g, k, V) tensor)
        if self._keep_kw:
            ends = torch.unique(n - 1)  # sorted
            keep, at = {"logits_to_keep": ends}, torch.searchsorted(ends, n - 1)
        out = self.model(input_ids=r_ids, position_ids=pos, use_cache=True, **keep)
        pk = SharedPrefixKV.from_cache(getattr(out, self._cache_kw, None), r_ok, rows, append=True)
        if pk is None:
            return None
        last = out.logits[torch.arange(len(n), device=ids.device), at]  # (g, V)
        return last[rows], None, pk

    def _decode_cascade(self, ids, attn, pk):
        """One decode step of every row with cascade attention over its prompt's K/V (pk): logits (B, V)."""
        pos = attn.sum(-1, keepdim=True) - 1  # the new token's position: real tokens before it
        with cascade_attention(self.model):
            out = self.model(input_ids=ids, position_ids=pos, use_cache=False, rlvr_prefix=pk, **self._keep_kw)
        return out.logits[:, -1, :]

    @staticmethod
    def _uniforms(chunk, spec: SamplingSpec, base_seed: int) -> torch.Tensor | None:
        """(B, max_tokens) float64 on the CPU: step t of row b uses [b, t], from the row's own RNG stream
        (CPU RNG: identical streams on CPU and GPU machines); None at temperature 0."""
        if spec.temperature <= 0:
            return None
        uniforms = torch.empty((len(chunk), spec.max_tokens), dtype=torch.float64)
        g = torch.Generator()
        for r, (i, j) in enumerate(chunk):
            g.manual_seed(sequence_seed(base_seed, i, j))
            torch.rand(spec.max_tokens, generator=g, dtype=torch.float64, out=uniforms[r])
        return uniforms

    def _generate_chunk(
        self, prompts, prompt_ids, chunk, spec: SamplingSpec, base_seed: int, emit=None
    ) -> list[Rollout]:
        dev = self.device
        B = len(chunk)
        p_ids = [list(prompt_ids[i]) for i, _ in chunk]
        Lp = max(len(p) for p in p_ids)
        # left-padded, built as lists and made a tensor once (a tensor per row cost ~10 ms a batch)
        ids = torch.tensor([[self.pad_id] * (Lp - len(p)) + p for p in p_ids], dtype=torch.long)
        attn = torch.tensor([[0] * (Lp - len(p)) + [1] * len(p) for p in p_ids], dtype=torch.long)
        ids, attn = ids.to(dev), attn.to(dev)
        uniforms = self._uniforms(chunk, spec, base_seed)

        # Tokens and logprobs go into (B, max_tokens) tensors, one row write per step for all rows; the
        # per-row Python work is only the stop-string check of rows whose new token may complete one
        # (StopStrings: decided from the token ids, decoded only then) and the rows that end.
        toks = torch.full((B, spec.max_tokens), self.pad_id, dtype=torch.long)
        tlps = torch.zeros((B, spec.max_tokens), dtype=torch.float32)
        n_tok = [spec.max_tokens] * B  # tokens kept per row (set when it finishes)
        finish: list[str | None] = [None] * B
        stop_reason: list[str | None] = [None] * B
        cut_text: list[str | None] = [None] * B
        done = torch.zeros(B, dtype=torch.bool)  # finished, by original row
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=dev)
        eos_cpu = eos.cpu()
        stops = StopStrings(self.tokenizer, spec.stop, spec.include_stop_str_in_output) if spec.stop else None

        logits, past, pk = self._prefill(ids, attn, [i for i, _ in chunk])
        full_ids = ids
        live = torch.arange(B)  # original row of each row of the current (compacted) batch
        for step in range(spec.max_tokens):
            logp, tok = sample_step(logits, step, spec, eos, None if uniforms is None else uniforms[live, step])
            tok = tok.to(dev)
            tok_lp = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1).float().cpu()
            tok_c = tok.cpu()
            act = ~done[live]  # (rows of the batch,) not finished before this step
            rows = live[act]
            toks[rows, step] = tok_c[act]
            tlps[rows, step] = tok_lp[act]
            ended = act & torch.isin(tok_c, eos_cpu) if len(eos_cpu) else torch.zeros_like(act)
            for r in live[ended].tolist():
                finish[r], stop_reason[r], n_tok[r] = "stop", "<eos>", step + 1
            if stops is not None and step + 1 >= spec.min_tokens:  # vLLM: stops count from min_tokens on
                for pos in (act & ~ended & stops.candidates(tok_c)).nonzero().flatten().tolist():
                    r = int(live[pos])
                    hit = stops.check(toks[r, : step + 1].tolist())
                    if hit is not None:
                        finish[r], stop_reason[r], cut_text[r], n_tok[r] = "stop", hit[0], hit[1], step + 1
                        ended[pos] = True
            if step + 1 >= spec.max_tokens:
                for r in live[act & ~ended].tolist():
                    finish[r] = "length"
                ended = act
            done[live[ended]] = True
            if emit is not None and bool(ended.any()):  # final now: handed on while the other rows decode
                emit.rows(self, live[ended].tolist(), prompts, chunk, p_ids, toks, tlps, n_tok, finish, stop_reason,
                          cut_text, spec)
            still = ~done[live]
            n_still = int(still.sum())
            if not n_still:
                break
            # Drop finished rows once a quarter of the batch is done, so long tails of a few
            # unfinished responses do not pay for the whole batch (index_select of the cache
            # costs about one decode step, hence not on every single finish).
            if (
                self.drop_finished
                and n_still <= 0.75 * len(live)
                and (not self.use_cache or pk is not None or hasattr(past, "batch_select_indices"))
            ):
                keep_cpu = still.nonzero().flatten()
                keep = keep_cpu.to(dev)
                if pk is not None:
                    pk.select_rows(keep)
                elif self.use_cache:
                    past.batch_select_indices(keep)
                else:
                    full_ids = full_ids[keep]
                attn = attn[keep]
                live = live[keep_cpu]
                tok_c = tok_c[keep_cpu]
            nxt = torch.where(done[live], torch.full_like(tok_c, self.pad_id), tok_c).unsqueeze(-1).to(dev)
            attn = torch.cat([attn, torch.ones((len(live), 1), dtype=torch.long, device=dev)], dim=1)
            if pk is not None:
                logits = self._decode_cascade(nxt, attn, pk)
            elif self.use_cache:
                logits, past = self._forward(nxt, attn, past)
            else:
                full_ids = torch.cat([full_ids, nxt], dim=1)
                logits, _ = self._forward(full_ids, attn, None)

        out = self._assemble(prompts, chunk, p_ids, toks, tlps, n_tok, finish, stop_reason, cut_text, spec)
        return out if emit is None else emit.final(out)

    def _assemble(self, prompts, chunk, p_ids, toks, tlps, n_tok, finish, stop_reason, cut_text, spec, rows=None):
        """The chunk's Rollouts from the host (B, max_tokens) tokens and logprobs, each row cut at n_tok[r]
        (cut_text[r]: its text where a stop string cut it, else decoded here); rows: only these rows' (in that
        order), from their own lines of toks and tlps."""
        if rows is None:  # the whole chunk: the (B, T) tensors to lists once
            rows = range(len(chunk))
            tok_rows, lp_rows = toks.tolist(), tlps.tolist() if spec.logprobs else None
        else:
            tok_rows = {r: toks[r].tolist() for r in rows}
            lp_rows = {r: tlps[r].tolist() for r in rows} if spec.logprobs else None
        resp = {r: tok_rows[r][: n_tok[r]] for r in rows}
        lps = {r: lp_rows[r][: n_tok[r]] for r in rows} if spec.logprobs else {}
        need = [r for r in rows if cut_text[r] is None]
        for r, t in zip(need, decode_batch(self.tokenizer, [resp[r] for r in need]), strict=True):
            cut_text[r] = t
        return [
            Rollout(
                prompt=prompts[chunk[r][0]],
                prompt_ids=p_ids[r],
                response_ids=resp[r],
                text=cut_text[r],
                logprobs=lps.get(r),
                finish_reason=finish[r] or "length",
                group=chunk[r][0],
                weight_version=self.weight_version,
                sample_index=chunk[r][1],
                stop_reason=stop_reason[r],
            )
            for r in rows
        ]


class _Emitter:
    """generate()'s on_finished for one chunk starting at index `start` of the call: each row handed on once, when
    final; the chunk's returned rollouts are then those very objects (a redone chunk, the plain loop after a failed
    static-cache decode, keeps the ones handed on)."""

    def __init__(self, on_finished: Callable[[int, Rollout], None], start: int):
        self.on_finished, self.start, self.sent = on_finished, start, {}

    def rows(self, gen: HFGenerator, rows: list[int], *args) -> None:
        new = [r for r in rows if r not in self.sent]
        for r, ro in zip(new, gen._assemble(*args, rows=new), strict=True):
            self.sent[r] = ro
            self.on_finished(self.start + r, ro)

    def final(self, out: list[Rollout]) -> list[Rollout]:
        """The chunk's rollouts with the ones handed on in their places; the rest handed on now."""
        out = [self.sent.get(r, ro) for r, ro in enumerate(out)]
        for r, ro in enumerate(out):
            if r not in self.sent:
                self.sent[r] = ro
                self.on_finished(self.start + r, ro)
        return out
