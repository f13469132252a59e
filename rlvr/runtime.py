"""Process-wide runtime settings: CPU thread count, seeding, memory figures, and the FLOPs work really does
(FlopTerms, FlopCounter) against the device's peak (PEAK_BF16_TFLOPS, mfu) for model FLOPs utilisation.

On small CPU machines the thread count matters a lot (a prototype ran 6x faster with one
thread per process under load), so it is an explicit setting everywhere: the `RLVR_NUM_THREADS`
environment variable, or `run.num_threads` in a trainer config, which calls `set_num_threads`.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

_GIB = float(1 << 30)


_AST_PARSE: list = []  # the original ast.parse, once serialize_ast_parse has wrapped it


def serialize_ast_parse() -> None:
    """Make ast.parse one thread at a time in this process (idempotent): called before reward and tool threads
    start (rlvr.rewards.batch.score_batch, rlvr.envs.rollout).

    Why: CPython (3.11 here) turns a parsed tree into Python objects with one recursion counter per interpreter,
    reset by each call to its own thread's depth. When two threads parse at once and one is switched out in the
    middle (a garbage collection running a finalizer that releases the GIL is enough), the other resets the
    counter, and the first raises `SystemError: AST constructor recursion depth mismatch` (python/cpython#106905
    and the reports that cite it). In rlvr that is a correct response scored as an error: the code reward's
    empty-program check and sympy's parse_expr(evaluate=False) under math-verify both call ast.parse from reward
    threads (seen in the test suite: a correct reference program scored 0). The lock costs microseconds per
    parse; compile() of source to bytecode does not build these objects and is left alone."""
    import ast
    import threading

    if _AST_PARSE:
        return
    original, lock = ast.parse, threading.Lock()

    def parse(*args, **kwargs):
        with lock:
            return original(*args, **kwargs)

    parse.__doc__, parse.__wrapped__ = original.__doc__, original
    _AST_PARSE.append(original)
    ast.parse = parse


def default_num_threads() -> int:
    """Threads for torch when nothing is configured: RLVR_NUM_THREADS, else torch's default (0)."""
    value = os.environ.get("RLVR_NUM_THREADS", "").strip()
    if not value:
        return 0
    try:
        n = int(value)
    except ValueError as exc:
        raise ValueError(f"RLVR_NUM_THREADS must be an integer, got {value!r}") from exc
    if n < 0:
        raise ValueError(f"RLVR_NUM_THREADS must be >= 0, got {n}")
    return n


def set_num_threads(n: int | None = None) -> int:
    """Set torch's intra-op thread count; n=0/None keeps torch's default. Returns the count in use."""
    import torch

    n = default_num_threads() if n is None else n
    if n > 0:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def seed_everything(seed: int) -> None:
    """Seed python, numpy (if present) and torch (CPU and CUDA)."""
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional at this layer
        pass
    torch.manual_seed(seed)


def compile_cache_dir() -> Path | None:
    """Where torch.compile's caches live across processes: RLVR_COMPILE_CACHE (a folder; "off" = torch's own
    defaults), else $XDG_CACHE_HOME/rlvr/torch_compile (~/.cache/rlvr/torch_compile), as vLLM keeps its compile
    cache under ~/.cache/vllm. Not /tmp (torch's default): containers and job schedulers often give each job a
    fresh /tmp, so every run would compile cold."""
    value = os.environ.get("RLVR_COMPILE_CACHE", "").strip()
    if value.lower() in ("off", "0", "none", "false"):
        return None
    if value:
        return Path(value).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rlvr" / "torch_compile"


def use_compile_cache() -> Path | None:
    """Called before each torch.compile of the package (the fused logprobs, the packed learner's flex
    attention): inductor's FX-graph and AOTAutograd caches on, under compile_cache_dir() unless the user set
    TORCHINDUCTOR_CACHE_DIR (inductor keeps Triton's kernels in its triton/ subfolder), so the first step of a
    second run of the same shape starts from warm caches (issue 38: the first step was 58 s, 48 s of it
    compiling). Returns the inductor cache folder in use (None when RLVR_COMPILE_CACHE=off)."""
    folder = compile_cache_dir()
    if folder is None:
        return None
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    # torch writes its /tmp default back into the environment the first time it asks: that one is not the user's
    if not given or os.path.abspath(given) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def _rss_peak_bytes() -> int | None:
    """Peak resident set size of this process (getrusage ru_maxrss; since the last reset of the
    kernel's high-water mark, see reset_peak_memory)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports kibibytes, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def _rss_now_bytes() -> int | None:
    """Current resident set size (Linux /proc/self/statm: resident pages * page size)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            resident_pages = int(f.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _rss_hwm_bytes() -> int | None:
    """The kernel's resident high-water mark (Linux VmHWM), which reset_peak_memory can reset."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


# Largest RSS peak seen before a reset of the high-water mark: resetting VmHWM also lowers
# ru_maxrss (the kernel reports max(exited threads' peak, VmHWM)), so the lifetime peak is kept here.
_lifetime_peak_bytes = 0


def _cuda_device(device):
    """torch.device when `device` is a CUDA device and CUDA is up, else None."""
    import torch

    dev = torch.device(device) if device is not None else torch.device("cpu")
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    return dev


def memory_stats(device=None) -> dict[str, float]:
    """Memory figures of this process in GiB (2**30 bytes), for per-step logging.

    mem/rss_peak_gb: peak resident memory over the process's life (getrusage ru_maxrss; never goes
    down, so it includes model loading). mem/rss_gb: resident memory now. mem/rss_step_peak_gb:
    peak resident memory since the last reset_peak_memory (Linux VmHWM; with a reset at the start
    of each step, the step's own peak). On a CUDA `device`: mem/cuda_peak_gb
    (torch.cuda.max_memory_allocated since the last reset_peak_memory) and mem/cuda_reserved_gb
    (held by the caching allocator now). A figure the platform cannot give is left out, not 0.
    """
    import torch

    out: dict[str, float] = {}
    peak, now, hwm = _rss_peak_bytes(), _rss_now_bytes(), _rss_hwm_bytes()
    if peak is not None:
        # the kernel updates its high-water mark lazily; the current figure may be a little above it
        out["mem/rss_peak_gb"] = max(peak, now or 0, _lifetime_peak_bytes) / _GIB
    if now is not None:
        out["mem/rss_gb"] = now / _GIB
    if hwm is not None:
        out["mem/rss_step_peak_gb"] = max(hwm, now or 0) / _GIB
    dev = _cuda_device(device)
    if dev is not None:
        out["mem/cuda_peak_gb"] = torch.cuda.max_memory_allocated(dev) / _GIB
        out["mem/cuda_reserved_gb"] = torch.cuda.memory_reserved(dev) / _GIB
    return out


def reset_peak_memory(device=None) -> None:
    """Start new peaks: CUDA (torch.cuda.reset_peak_memory_stats) on a CUDA `device`, and on Linux
    the kernel's RSS high-water mark (writing 5 to /proc/self/clear_refs, which touches nothing
    else), so mem/rss_step_peak_gb and mem/cuda_peak_gb are per step. mem/rss_peak_gb stays the
    lifetime peak. Best effort: where /proc is not writable the RSS peak is simply not reset."""
    global _lifetime_peak_bytes
    import torch

    dev = _cuda_device(device)
    if dev is not None:
        torch.cuda.reset_peak_memory_stats(dev)
    if os.path.exists("/proc/self/clear_refs"):
        _lifetime_peak_bytes = max(_lifetime_peak_bytes, _rss_peak_bytes() or 0, _rss_hwm_bytes() or 0)
        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
        except OSError:
            pass


# Dense (no 2:4 sparsity) bf16 tensor-core peaks in TFLOP/s from the vendors' datasheets, matched against
# torch.cuda.get_device_name() (the first entry whose every word is in the name, case-insensitive): the
# denominator of perf/mfu when run.peak_tflops is 0 (auto).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("B100", 1750.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM and NVL
    ("H800", 989.0),
    ("H20", 148.0),
    ("GH200", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L40", 181.0),
    ("L4", 121.0),
    ("A10G", 70.0),
    ("A10", 125.0),
    ("MI300X", 1307.0),
    ("MI325X", 1307.0),
    ("MI250X", 383.0),
)


def peak_tflops(device=None, configured: float = 0.0) -> float:
    """The bf16 dense peak (TFLOP/s) MFU is measured against: `configured` when > 0 (run.peak_tflops);
    else the PEAK_BF16_TFLOPS entry of the CUDA device's name; 0.0 when unknown or on CPU (MFU not logged)."""
    if configured > 0:
        return float(configured)
    dev = _cuda_device(device)
    if dev is None:
        return 0.0
    import torch

    return peak_for_name(torch.cuda.get_device_name(dev))


def peak_for_name(name: str) -> float:
    """PEAK_BF16_TFLOPS's value for a device name (e.g. 'NVIDIA H200'); 0.0 when none matches."""
    words = name.upper().replace("-", " ").split()
    for key, value in PEAK_BF16_TFLOPS:
        if all(k in words for k in key.upper().split()):
            return value
    return 0.0


# ------------------------------------------------------------------------------------------ FLOPs done


class FlopTerms:
    """A causal LM's matmul FLOPs by what they scale with (model FLOPs: no recomputation, no elementwise work).

    linear: forward FLOPs per token of the decoder's matmuls, 2 x the elements of every weight of two or more
    dimensions but the embedding and the LM head (LoRA's A and B included: they are matmuls too);
    linear_grad: the backward's weight-gradient FLOPs per token, 2 x the elements of those weights that train (a
    full fine-tune: = linear; LoRA: the adapters' only); head: forward FLOPs per position the LM head runs at,
    2 x its weight's elements (hidden x vocab; a tied embedding is this weight); head_grad: its weight gradient
    when it trains; attention: forward FLOPs per (query, key) pair, 4 x heads x head_dim x layers (scores
    Q K^T and the weighted sum P V, 2 each per head dimension).

    A forward over t tokens with k LM-head positions and a query-key pairs does linear t + head k + attention
    a; its backward (input gradients, the same as the forward, plus the weight gradients of what trains, plus
    twice the attention's: dQ, dK, dV and dP) does linear t + linear_grad t + head k + head_grad k +
    2 attention a. A full fine-tune's forward + backward is thus 3x its forward (the "6 N per token" rule,
    plus the attention and minus the LM head's positions that are not computed).
    """

    __slots__ = ("linear", "linear_grad", "head", "head_grad", "attention")

    def __init__(self, linear: float, linear_grad: float, head: float, head_grad: float, attention: float):
        self.linear, self.linear_grad, self.head, self.head_grad, self.attention = (
            float(linear), float(linear_grad), float(head), float(head_grad), float(attention))

    def __repr__(self) -> str:
        return "FlopTerms(" + ", ".join(f"{k}={getattr(self, k):.6g}" for k in self.__slots__) + ")"

    @classmethod
    def of(cls, model) -> FlopTerms:
        """The terms of a transformers causal LM (also wrapped by peft, or sharded by FSDP2: the weights' global
        sizes). Attention from the config: num_hidden_layers, num_attention_heads, head_dim (hidden_size /
        heads when absent); 0 when the config does not say."""
        head_w = _weight(model, "get_output_embeddings")
        emb_w = _weight(model, "get_input_embeddings")
        linear = linear_grad = head = head_grad = 0
        seen: set[int] = set()
        for p in model.parameters():
            if id(p) in seen or p.dim() < 2:
                continue
            seen.add(id(p))
            if p is head_w:
                head, head_grad = p.numel(), p.numel() if p.requires_grad else 0
            elif p is emb_w:
                continue  # a lookup, no matmul (tied: it is head_w, counted above)
            else:
                linear += p.numel()
                linear_grad += p.numel() if p.requires_grad else 0
        hf_config = getattr(model, "config", None)
        layers = getattr(hf_config, "num_hidden_layers", 0) or 0
        heads = getattr(hf_config, "num_attention_heads", 0) or 0
        head_dim = getattr(hf_config, "head_dim", None) or ((getattr(hf_config, "hidden_size", 0) or 0) // heads if heads else 0)
        return cls(2 * linear, 2 * linear_grad, 2 * head, 2 * head_grad, 4 * heads * head_dim * layers)

    def forward(self, tokens: float, logits: float, pairs: float) -> float:
        """FLOPs of a forward over `tokens` tokens, the LM head at `logits` positions, `pairs` query-key pairs."""
        return self.linear * tokens + self.head * logits + self.attention * pairs

    def backward(self, tokens: float, logits: float, pairs: float) -> float:
        """FLOPs of the backward of that forward (input gradients everywhere, weight gradients where they train)."""
        return ((self.linear + self.linear_grad) * tokens + (self.head + self.head_grad) * logits
                + 2 * self.attention * pairs)


def _weight(model, getter: str):
    try:
        module = getattr(model, getter)()
    except (AttributeError, NotImplementedError):
        return None
    return getattr(module, "weight", None)


def _cache_length(kwargs: dict) -> int:
    for key in ("past_key_values", "cache"):
        cache = kwargs.get(key)
        if cache is not None and hasattr(cache, "get_seq_length"):
            try:
                return int(cache.get_seq_length())
            except Exception:  # noqa: BLE001 - an exotic cache: positions then come from position_ids alone
                return 0
    return 0


class FlopCounter:
    """The FLOPs a block of work really does through some models, counted from their forward calls.

    A forward pre-hook on each model reads what each call is given: the tokens (input_ids' positions, less those a
    2-D attention_mask marks as padding), the query-key pairs attention computes (each token at position p sees p + 1
    keys: its own row's causal prefix; in a packed sequence positions restart per row and a shared prompt's
    suffix continues its prompt's positions, so the count holds for every layout rlvr forwards: padded rows,
    packed rows, a group's prompt once and its rows' suffixes, a suffix over a cached prefix), and the positions
    the LM head runs at (`logits_to_keep`: a tensor of positions or the last k; else every counted token). A call
    made with grad enabled is counted with its backward (FlopTerms.backward); a no-grad call as a forward only.
    So the count follows the pack plan and the micro-batches actually run: with algo.shared_prefix each group's
    prompt once per micro-batch holding the group, no pad tokens in a packed forward, the LM head at the loss
    labels only where the packed path keeps only those, the old-logprob and reference forwards as forwards.
    What a forward without an attention mask is handed (the cascade path's right-padded prefix forward) counts
    whole: those FLOPs are done. Not counted: recomputation (activation checkpointing), elementwise work, the
    embedding lookup, models not attached (a critic's own trunk), work in other processes (data-parallel workers:
    each process counts its own).

    Only calls made inside `counting()` and on the thread that entered it are counted (a sampler thread running
    the same model at the same time is not). The counts stay on the model's device until read (`flops()`, one
    host sync), so counting adds no synchronisation to the forwards.

        counter = FlopCounter(model)
        with counter.counting():
            ...forwards and backwards...
        counter.flops()  # -> float
    """

    def __init__(self, *models):
        self._terms: dict[int, FlopTerms] = {}
        self._handles: list = []
        self._acc: dict[tuple[int, bool], list] = {}  # (model id, with grad) -> [tokens, logits, pairs] (ints or tensors)
        self._thread: int | None = None
        self.error: str | None = None  # a call the counter could not read (its FLOPs are missing from the count)
        for m in models:
            if m is not None:
                self.attach(m)

    def attach(self, model) -> None:
        """Count `model`'s forward calls too (once per model)."""
        key = id(model)
        if key in self._terms:
            return
        self._terms[key] = FlopTerms.of(model)

        def hook(module, args, kwargs):
            if self._thread is not None and self._thread == _thread_id():
                try:
                    self._count(key, args, kwargs)
                except Exception as exc:  # noqa: BLE001 - counting must never break a forward
                    self.error = f"{type(exc).__name__}: {exc}"

        self._handles.append(model.register_forward_pre_hook(hook, with_kwargs=True))

    def detach(self) -> None:
        """Remove the hooks."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._terms.clear()

    def terms(self, model) -> FlopTerms:
        return self._terms[id(model)]

    def reset(self) -> None:
        self._acc.clear()

    def counting(self):
        """Context manager: counts start from zero and run on this thread until it exits."""
        import contextlib

        @contextlib.contextmanager
        def window():
            self.reset()
            self._thread = _thread_id()
            try:
                yield self
            finally:
                self._thread = None

        return window()

    def suspend(self):
        """Context manager: nothing is counted inside (e.g. a sampler's forwards inside a counted step)."""
        import contextlib

        @contextlib.contextmanager
        def paused():
            was, self._thread = self._thread, None
            try:
                yield self
            finally:
                self._thread = was

        return paused()

    def _count(self, key: int, args: tuple, kwargs: dict) -> None:
        import torch

        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None and kwargs.get("inputs_embeds") is not None:
            ids = kwargs["inputs_embeds"][..., 0]
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            return
        b, L = ids.shape
        am, pos = kwargs.get("attention_mask"), kwargs.get("position_ids")
        real = None
        if isinstance(am, torch.Tensor) and am.dim() == 2 and am.shape[0] == b and am.shape[1] >= L:
            real = am[:, am.shape[1] - L:] != 0
        if isinstance(pos, torch.Tensor):
            keys = (pos.to(torch.int64) + 1).expand(b, L)
        elif real is not None:
            keys = am.to(torch.int64).cumsum(-1)[:, am.shape[1] - L:]
        else:
            keys = (torch.arange(L, device=ids.device, dtype=torch.int64) + 1 + _cache_length(kwargs)).expand(b, L)
        if real is None:
            tokens, pairs = b * L, keys.sum()
        else:
            tokens, pairs = real.sum(), (keys * real).sum()
        keep = kwargs.get("logits_to_keep", 0)
        if isinstance(keep, torch.Tensor):
            logits = b * (keep.numel() if keep.dim() <= 1 else keep.shape[-1])
        elif isinstance(keep, int) and keep > 0:
            logits = b * min(keep, L)
        else:
            logits = tokens
        acc = self._acc.setdefault((key, torch.is_grad_enabled()), [0, 0, 0])
        for i, v in enumerate((tokens, logits, pairs)):
            acc[i] = acc[i] + v  # device scalars stay on the device: no sync here

    def _read(self) -> dict[tuple[int, bool], list[int]]:
        """The accumulators as Python ints: the device scalars read back together (one host sync)."""
        import torch

        flat = [(k, i, v) for k, acc in self._acc.items() for i, v in enumerate(acc)]
        tensors = [v for _, _, v in flat if isinstance(v, torch.Tensor)]
        if tensors:
            values = iter(torch.stack([t.to(tensors[0].device, torch.int64) for t in tensors]).tolist())
        out = {k: [0, 0, 0] for k in self._acc}
        for k, i, v in flat:
            out[k][i] = int(next(values)) if isinstance(v, torch.Tensor) else int(v)
        return out

    def counts(self) -> dict[str, int]:
        """Tokens, LM-head positions and query-key pairs counted, with grad and without (one host sync)."""
        out = {f"{k}_{g}": 0 for g in ("grad", "nograd") for k in ("tokens", "logits", "pairs")}
        for (_, grad), acc in self._read().items():
            for name, v in zip(("tokens", "logits", "pairs"), acc, strict=True):
                out[f"{name}_{'grad' if grad else 'nograd'}"] += v
        return out

    def flops(self) -> float:
        """The FLOPs counted since counting() began (forwards, and the backwards of grad-enabled forwards; one
        host sync)."""
        total = 0.0
        for (key, grad), (t, k, a) in self._read().items():
            terms = self._terms[key]
            total += terms.forward(t, k, a) + (terms.backward(t, k, a) if grad else 0.0)
        return total


def _thread_id() -> int:
    import threading

    return threading.get_ident()


def mfu(flops: float | None, seconds: float | None, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: FLOPs done / seconds / the device's peak; None when a term is missing or 0."""
    if not flops or not seconds or not peak_tflops:
        return None
    return float(flops) / float(seconds) / (float(peak_tflops) * 1e12)
