"""Token log-probabilities and entropy from logits, in bounded memory.

A (B, T, V) logits tensor for a 151,936-token vocabulary is ~5 GB in fp32 at B*T = 8192 rows.
Materialising ``log_softmax(logits)`` doubles that, and ``logits.float()`` on bf16 logits adds
another full copy that autograd keeps alive until backward. Here every pass walks the B*T rows in
chunks of ``chunk_size`` rows, so the only full-size tensors are the logits themselves and, under
autograd, their gradient (which backward must produce anyway). The extra working memory is
a few (chunk_size, V) fp32 buffers, whatever B and T are.

Under autograd a custom ``torch.autograd.Function`` saves only the logits and the labels and
recomputes the softmax chunk by chunk in backward:

    d logp_t / d x_j = 1[j == y_t] - p_j
    d H_t    / d x_j = -p_j * (x_j - sum_i p_i x_i)        (H = logsumexp(x) - sum_i p_i x_i)

Both are divided by the temperature when logits are scaled by ``1 / temperature``.
All outputs are float32 whatever the logits dtype (float64 for float64 logits); the gradient has the logits' dtype.

With a ``Truncation`` (the sampler's top-k / top-p) the distribution scored is the one the sampler
draws from, pi_K = softmax(x) restricted to the kept set K and renormalized (``kept_mask`` is the
rule, the same function ``rlvr.rollout.hf_generator.process_logits`` samples with). K is recomputed
from the logits in every chunk, in forward and again in backward, and is a constant of the forward
(it changes only where a logit crosses the boundary, a set of measure zero), so for kept j

    d logp_K(y) / d x_j = 1[j == y] - p_K,j        d H_K / d x_j = -p_K,j (x_j - E_pK[x])

and 0 for removed j. A label outside K has no probability under pi_K: it gets TRUNCATED_LOGPROB and
no gradient. Truncation costs a top-k per chunk (top-p: of the 1,024 largest values, a sort only of the rows
whose kept set reaches past them); ``truncation=None`` (or top_p = 1 and
top_k <= 0) is the untruncated path, untouched.

Under truncation the same pass also returns the label's logprob under the untruncated softmax(x)
(``TokenScores.full_logp``, one more logsumexp per chunk), differentiable with its own gradient
1[j == y] - p_j: the KL penalty is a divergence between the policy and the reference (or a teacher)
as models, so it reads these (docs/algorithms.md, "KL under top-p / top-k"), while the importance ratio
reads the truncated ones. Its backward term is computed only when a loss uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlvr.runtime import use_compile_cache

IGNORE_INDEX = -100
DEFAULT_CHUNK_SIZE = 512  # rows of B*T; 512 x 151,936 x 4 bytes ~ 311 MB of fp32 work space
# logprob of a label outside the trainer's kept set K (its true value under pi_K is -inf). Finite so that
# exp of any difference of two logprobs stays finite in float32 (exp(40) = 2.4e17 < 3.4e38, and its square
# too), so KL estimators and ratios never make inf/NaN; low enough that no label a sampler really draws
# has it (a probability of 4e-18), so `logp <= TRUNCATED_LOGPROB` marks the label as outside K
# (rlvr.algo.correction gives such a token weight 0; the trainer drops it from the loss).
TRUNCATED_LOGPROB = -40.0


def truncates(vocab: int, top_k: int = 0, top_p: float = 1.0) -> bool:
    """Whether kept_mask removes anything from rows of `vocab` values: a top-k below the vocabulary, or top-p < 1."""
    return 0 < top_k < vocab or top_p < 1.0


def kept_mask(x: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor | None:
    """The sampler's truncation rule: which tokens of each row survive top-k, then top-p.

    x (n, V): logits already divided by the temperature (float; -inf allowed). top_k > 0 keeps the
    tokens whose value is at least the k-th largest; then, over softmax(x) restricted to those, top_p < 1
    keeps every token whose strictly more likely tokens hold less than top_p of the mass (the smallest
    set whose mass reaches top_p; the most likely token is always kept). Tokens tied at a boundary are
    all kept, so the set depends only on the values (not on a sort's order of ties). Returns (n, V)
    bool, or None when nothing is removed (top_k <= 0 or >= V, and top_p >= 1).
    """
    V = x.shape[-1]
    if not truncates(V, top_k, top_p):
        return None
    k = top_k if 0 < top_k < V else 0
    keep = None
    if k:
        vals = torch.topk(x, k, dim=-1).values  # (n, k) descending
        keep = x >= vals[:, -1:]
    if top_p < 1.0:
        # mass over the top-k set (ties at the k-th value included), then the mass strictly before each
        # sorted value; the kept values are the first m, m >= 1 since the first has 0 before it
        lse = torch.logsumexp(x if keep is None else x.masked_fill(~keep, float("-inf")), dim=-1, keepdim=True)
        if k:
            threshold, _ = _top_p_threshold(vals, lse, top_p)
        else:
            threshold = _top_p_threshold_of_rows(x, lse, top_p)
        keep = x >= threshold  # implies the top-k condition: the threshold is >= the k-th value
    return keep


TOP_P_PREFIX = 1024  # top-p looks for its threshold among each row's largest values first (a top-k, not a sort)


def _top_p_threshold(vals: torch.Tensor, lse: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """vals (n, j) the rows' largest values, descending (a prefix of the sorted row); lse (n, 1) the row's
    logsumexp -> (the value of the last kept sorted position (n, 1), how many positions are kept, m (n, 1)). When
    m < j the mass strictly before position m reached top_p inside the prefix, so the full sort gives the same m."""
    p = (vals - lse).exp_()
    before = p.cumsum(-1).sub_(p)  # the prefix of the full row's running mass (a running sum reads left to right)
    del p
    m = (before < top_p).sum(-1, keepdim=True).clamp_min_(1)
    return vals.gather(-1, m - 1), m


def _top_p_threshold_of_rows(x: torch.Tensor, lse: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p threshold of every row of x (n, V) without sorting whole rows where it can: the TOP_P_PREFIX
    largest values first (torch.topk), and a full sort only for the rows whose kept set may reach past them (a
    flat distribution). The same threshold as sorting every row."""
    V = x.shape[-1]
    if V <= 2 * TOP_P_PREFIX:
        return _top_p_threshold(torch.sort(x, dim=-1, descending=True).values, lse, top_p)[0]
    threshold, m = _top_p_threshold(torch.topk(x, TOP_P_PREFIX, dim=-1).values, lse, top_p)
    rest = (m.squeeze(-1) >= TOP_P_PREFIX).nonzero().squeeze(-1)  # (on a GPU, one sync a call: the rows to sort)
    if rest.numel():
        full = torch.sort(x.index_select(0, rest), dim=-1, descending=True).values
        threshold = threshold.index_copy(0, rest, _top_p_threshold(full, lse.index_select(0, rest), top_p)[0])
    return threshold


@dataclass(frozen=True)
class Truncation:
    """The sampler's top-k / top-p: the trainer scores the distribution the sampler drew from.
    top_k <= 0 and top_p = 1 remove nothing (use None, or check `active`)."""

    top_k: int = 0  # keep the k most likely tokens (after temperature); <= 0 = off
    top_p: float = 1.0  # then the smallest set whose mass reaches top_p; 1.0 = off

    def __post_init__(self):
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def active(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0

    @classmethod
    def of(cls, top_k: int = 0, top_p: float = 1.0) -> Truncation | None:
        """Truncation(top_k, top_p), or None when it removes nothing (the untruncated path)."""
        t = cls(int(top_k), float(top_p))
        return t if t.active else None

    def keep(self, x: torch.Tensor) -> torch.Tensor | None:
        """kept_mask(x, top_k, top_p): (n, V) bool or None."""
        return kept_mask(x, self.top_k, self.top_p)


def _truncate(x: torch.Tensor, truncation: Truncation | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scaled chunk x (n, V) -> (x with removed tokens at a huge finite negative value, kept mask or None).
    Out of place: x may alias the caller's logits."""
    keep = truncation.keep(x) if truncation is not None else None
    if keep is None:
        return x, None
    return x.masked_fill(~keep, torch.finfo(x.dtype).min / 4), keep


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    # float32 for half/bf16/fp32 logits; float64 logits stay float64 (exact reference checks).
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _chunk_input(rows: torch.Tensor, cdt: torch.dtype, temperature: float) -> torch.Tensor:
    """(n, V) rows of the logits -> scaled compute-dtype values, never aliasing the caller's logits
    when modified. -inf entries (masked vocabulary) are raised to a huge finite negative number so
    that p * x is 0 * finite = 0 there instead of 0 * -inf = nan; exp() still gives exactly 0."""
    x = rows.to(cdt)
    if temperature != 1.0:
        x = x / temperature
    if x.is_cuda:  # no host round trip on an accelerator: clamp always (one elementwise pass)
        return x.clamp_min(torch.finfo(cdt).min / 4)
    if x.numel() and bool(x.amin() == float("-inf")):  # amin is ~20x cheaper than isinf().any()
        x = x.clamp_min(torch.finfo(cdt).min / 4)
    return x


def _rowdot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum_j a[i, j] * b[i, j] -> (n,) without an (n, V) temporary (batched matmul)."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).reshape(-1)


def _softmax_lse(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, V) -> (p (n, V), lse (n,)) with ONE (n, V) allocation (exp in place)."""
    m = x.amax(dim=-1, keepdim=True)  # (n, 1)
    p = x - m
    p.exp_()
    z = p.sum(dim=-1, keepdim=True)
    p.div_(z)
    return p, (m + z.log()).squeeze(1)


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """Forward and backward chunked over rows; saves only (logits, labels) for backward.

    Per chunk the work memory is about two (chunk_size, V) compute-dtype buffers (plus one more
    when the logits need a dtype conversion or temperature scaling).
    """

    @staticmethod
    def forward(ctx, logits2d, labels1d, chunk_size, temperature, with_logp, with_entropy, truncation):
        n = logits2d.shape[0]
        dev = logits2d.device
        cdt = _compute_dtype(logits2d)
        ctx.fused = _use_fused(logits2d, truncation, with_logp)
        if ctx.fused:
            return _ChunkedLogprobEntropy._fused_forward(ctx, logits2d, labels1d, chunk_size, temperature,
                                                         with_entropy, cdt)
        with_full = with_logp and truncation is not None  # the untruncated logprob beside the truncated one
        logp = torch.zeros(n, dtype=cdt, device=dev) if with_logp else None
        ent = torch.zeros(n, dtype=cdt, device=dev) if with_entropy else None
        full = torch.zeros(n, dtype=cdt, device=dev) if with_full else None
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            x0 = _chunk_input(logits2d[s:e], cdt, temperature)
            x, keep = _truncate(x0, truncation)
            if with_entropy:
                p, lse = _softmax_lse(x)
                ent[s:e] = lse - _rowdot(p, x)  # H = lse - E_p[x]
                del p
            else:
                lse = torch.logsumexp(x, dim=-1)
            if with_logp:
                lab = labels1d[s:e]
                picked = x.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1)
                lp = picked - lse
                scored = lab != IGNORE_INDEX
                if with_full:  # log softmax(x)[y], whatever K is (equal to lp when nothing is removed)
                    fl = lp if keep is None else x0.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1) - \
                        torch.logsumexp(x0, dim=-1)
                    full[s:e] = torch.where(scored, fl, torch.zeros_like(lse))
                if keep is not None:  # a label outside the kept set: the floor (no gradient in backward)
                    inside = keep.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1)
                    lp = torch.where(inside, lp, torch.full_like(lp, TRUNCATED_LOGPROB))
                logp[s:e] = torch.where(scored, lp, torch.zeros_like(lse))
        ctx.save_for_backward(logits2d, labels1d if with_logp else None)
        # an output nobody differentiates (the entropy of a loss without an entropy bonus, kept only
        # as a metric) gets None in backward instead of zeros, and its (n, V) term is skipped
        ctx.set_materialize_grads(False)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.truncation = truncation
        ctx.with_logp = with_logp
        ctx.with_entropy = with_entropy
        ctx.with_full = with_full
        if not with_logp:
            logp = torch.zeros(0, dtype=cdt, device=dev)
        if not with_entropy:
            ent = torch.zeros(0, dtype=cdt, device=dev)
        if not with_full:
            full = torch.zeros(0, dtype=cdt, device=dev)
        ctx.mark_non_differentiable(*[t for t, w in ((logp, with_logp), (ent, with_entropy), (full, with_full))
                                      if not w])
        return logp, ent, full

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp, g_ent, g_full):
        if ctx.fused:
            return _ChunkedLogprobEntropy._fused_backward(ctx, g_logp, g_ent)
        logits2d, labels1d = ctx.saved_tensors
        n = logits2d.shape[0]
        t = ctx.temperature
        cdt = _compute_dtype(logits2d)
        grad = torch.empty_like(logits2d)
        use_logp = ctx.with_logp and g_logp is not None
        use_ent = ctx.with_entropy and g_ent is not None
        use_full = ctx.with_full and g_full is not None
        for s in range(0, n, ctx.chunk_size):
            e = min(n, s + ctx.chunk_size)
            x0 = _chunk_input(logits2d[s:e], cdt, t)
            x, keep = _truncate(x0, ctx.truncation)  # the forward's kept set
            p, _ = _softmax_lse(x)  # (n, V), becomes the gradient in place (0 on removed tokens)
            ent_term = None
            if use_ent:
                # dH/dx_j = -p_j (x_j - E_p[x])
                ge = g_ent[s:e].to(cdt).unsqueeze(1)
                ent_term = x - _rowdot(p, x).unsqueeze(1)
                ent_term.mul_(p).mul_(ge)
            if use_logp:
                # dlogp/dx_j = 1[j == y] - p_j
                lab = labels1d[s:e]
                gl = torch.where(lab != IGNORE_INDEX, g_logp[s:e].to(cdt), torch.zeros_like(p[:, 0]))
                if keep is not None:  # the floor of a label outside the kept set is a constant
                    gl = torch.where(keep.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1), gl, torch.zeros_like(gl))
                p.mul_(gl.unsqueeze(1))
                if ent_term is not None:
                    p.add_(ent_term)
                p.neg_()
                p.scatter_add_(1, lab.clamp_min(0).unsqueeze(1), gl.unsqueeze(1))
            elif ent_term is not None:
                p.copy_(ent_term).neg_()
            else:
                p.zero_()
            del ent_term
            if use_full:  # d log softmax(x)[y] / dx_j = 1[j == y] - softmax(x)_j, over the whole vocabulary
                lab = labels1d[s:e]
                gf = torch.where(lab != IGNORE_INDEX, g_full[s:e].to(cdt), torch.zeros_like(p[:, 0]))
                q, _ = _softmax_lse(x0)
                p.sub_(q.mul_(gf.unsqueeze(1)))
                del q
                p.scatter_add_(1, lab.clamp_min(0).unsqueeze(1), gf.unsqueeze(1))
            del x0
            if t != 1.0:
                p.div_(t)
            grad[s:e] = p
        return grad, None, None, None, None, None, None

    @staticmethod
    def _fused_forward(ctx, logits2d, labels1d, chunk_size, temperature, with_entropy, cdt):
        n = logits2d.shape[0]
        logp = torch.empty(n, dtype=cdt, device=logits2d.device)
        ent = torch.empty(n, dtype=cdt, device=logits2d.device)
        lse = torch.empty_like(logp)
        ex = torch.empty_like(logp)
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            logp[s:e], ent[s:e], lse[s:e], ex[s:e] = _Fused.call(
                "forward", logits2d.device, logits2d[s:e], labels1d[s:e], temperature, cdt)
        ctx.save_for_backward(logits2d, labels1d, lse, ex)
        ctx.set_materialize_grads(False)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.with_entropy = with_entropy
        full = torch.zeros(0, dtype=cdt, device=logits2d.device)  # untruncated: logp is the full logprob
        if not with_entropy:
            ent = torch.zeros(0, dtype=cdt, device=logits2d.device)
            ctx.mark_non_differentiable(ent, full)
        else:
            ctx.mark_non_differentiable(full)
        return logp, ent, full

    @staticmethod
    def _fused_backward(ctx, g_logp, g_ent):
        logits2d, labels1d, lse, ex = ctx.saved_tensors
        n = logits2d.shape[0]
        grad = torch.empty_like(logits2d)
        zeros = None
        if g_logp is None or g_ent is None or not ctx.with_entropy:
            zeros = torch.zeros(n, dtype=lse.dtype, device=lse.device)
        gl = g_logp if g_logp is not None else zeros
        ge = g_ent if (g_ent is not None and ctx.with_entropy) else zeros
        for s in range(0, n, ctx.chunk_size):
            e = min(n, s + ctx.chunk_size)
            grad[s:e] = _Fused.call("backward", logits2d.device, logits2d[s:e], labels1d[s:e], lse[s:e], ex[s:e],
                                    gl[s:e], ge[s:e], ctx.temperature, lse.dtype)
        return grad, None, None, None, None, None, None


def _fused_forward(rows: torch.Tensor, labels: torch.Tensor, temperature: float, cdt: torch.dtype):
    """One untruncated chunk as one function of its inputs (what torch.compile fuses on a GPU):
    (n, V) logits rows, (n,) labels -> (logp, entropy, lse, E_p[x]), each (n,) in cdt. backward needs
    only lse and E_p[x] besides the logits, so it never recomputes the max and the normalizer."""
    x = (rows.to(cdt) / temperature).clamp_min(torch.finfo(cdt).min / 4)
    m = x.amax(dim=-1, keepdim=True)
    e = (x - m).exp()
    z = e.sum(dim=-1)
    lse = m.squeeze(1) + z.log()
    ex = (e * x).sum(dim=-1) / z
    picked = x.gather(1, labels.clamp_min(0).unsqueeze(1)).squeeze(1)
    logp = torch.where(labels != IGNORE_INDEX, picked - lse, torch.zeros_like(lse))
    return logp, lse - ex, lse, ex


def _fused_backward(rows: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, ex: torch.Tensor,
                    g_logp: torch.Tensor, g_ent: torch.Tensor, temperature: float, cdt: torch.dtype):
    """Gradient of sum(g_logp * logp + g_ent * entropy) w.r.t. one chunk of logits, in their dtype:
    p_j = exp(x_j - lse); d/dx_j = g_logp (1[j == y] - p_j) - g_ent p_j (x_j - E_p[x]), over temperature."""
    x = (rows.to(cdt) / temperature).clamp_min(torch.finfo(cdt).min / 4)
    p = (x - lse.unsqueeze(1)).exp()
    gl = torch.where(labels != IGNORE_INDEX, g_logp.to(cdt), torch.zeros_like(lse))
    g = -(p * (gl.unsqueeze(1) + g_ent.to(cdt).unsqueeze(1) * (x - ex.unsqueeze(1))))
    g = g.scatter_add(1, labels.clamp_min(0).unsqueeze(1), gl.unsqueeze(1))
    return (g / temperature).to(rows.dtype)


class _Fused:
    """The fused chunk functions: compiled (torch.compile, dynamic shapes) for CUDA logits, where the
    eager chunk loop is a dozen memory-bound passes over (chunk, V) (a third of a learner step for a
    150k vocabulary, measured on an H200); eager elsewhere. A compile failure warns once and falls back
    to the eager functions (same numbers up to rounding)."""

    compiled: dict | None = None
    broken: bool = False

    @classmethod
    def get(cls, name: str, device: torch.device):
        eager = {"forward": _fused_forward, "backward": _fused_backward}[name]
        if device.type != "cuda" or cls.broken:
            return eager
        if cls.compiled is None:
            use_compile_cache()
            cls.compiled = {"forward": torch.compile(_fused_forward, dynamic=True),
                            "backward": torch.compile(_fused_backward, dynamic=True)}
        return cls.compiled[name]

    @classmethod
    def call(cls, name: str, device: torch.device, *args):
        fn = cls.get(name, device)
        if fn is _fused_forward or fn is _fused_backward:
            return fn(*args)
        try:
            return fn(*args)
        except Exception as exc:  # noqa: BLE001 - any compiler failure: the eager function computes the same
            cause: BaseException | None = exc
            for _ in range(16):  # out of memory (or a compiler error wrapping it) is not a compiler failure:
                if cause is None:  # the run must hear of it, not continue slower on the eager path
                    break
                if isinstance(cause, torch.OutOfMemoryError):
                    raise
                cause = cause.__cause__ or cause.__context__
            import warnings

            warnings.warn(f"rlvr.algo.logprobs: torch.compile of the fused logprob/entropy failed "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}); "
                          "using the eager path", stacklevel=2)
            cls.broken = True
            return cls.call(name, device, *args)


# Which logits take the fused chunk functions (untruncated, with labels): CUDA ones by default; tests set
# it to "always" to check the fused math on CPU against the chunk loop, "never" turns it off.
FUSED_ON = "cuda"


def _use_fused(logits2d: torch.Tensor, truncation, with_logp: bool) -> bool:
    if truncation is not None or not with_logp:
        return False
    return FUSED_ON == "always" or (FUSED_ON == "cuda" and logits2d.is_cuda)


def _check(logits: torch.Tensor, labels: torch.Tensor | None, chunk_size: int) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must have shape (..., V), got {tuple(logits.shape)}")
    if labels is not None and tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits shape without vocab "
            f"{tuple(logits.shape[:-1])}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


@dataclass(frozen=True)
class TokenScores:
    """What one pass over the logits gives (token_scores): logp (...) float32 or None, the label's logprob
    under the distribution scored (truncated to the kept set under a Truncation); entropy (...) float32 or
    None; full_logp (...) float32, the label's logprob under the untruncated softmax(logits / temperature),
    only under an active truncation with labels (None otherwise: then it equals logp)."""

    logp: torch.Tensor | None
    entropy: torch.Tensor | None
    full_logp: torch.Tensor | None = None


def token_scores(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    temperature: float = 1.0,
    *,
    truncation: Truncation | None = None,
) -> TokenScores:
    """Per-token log p(label) and entropy of softmax(logits / temperature), chunked over rows.

    logits: (..., V) any float dtype (typically (B, T, V)); already aligned with labels, i.e.
        logits[b, t] predicts labels[b, t] (shift before calling).
    labels: (...) int64 token ids, IGNORE_INDEX (-100) where there is no target; or None to
        skip the logprob.
    chunk_size: rows of the flattened (..., V) processed at once; bounds work memory.
    truncation: the sampler's top-k / top-p (see the module docstring): logp and entropy are those of
        the truncated, renormalized distribution; a label outside the kept set gets TRUNCATED_LOGPROB and
        no gradient; full_logp holds the untruncated logprob. None (or an inactive one) = the full softmax.
    Returns TokenScores (logp, entropy in nats, full_logp). logp and full_logp are 0 (and get no gradient)
    where labels == -100. Differentiable w.r.t. logits.
    """
    _check(logits, labels, chunk_size)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if truncation is not None and not truncation.active:
        truncation = None
    lead = logits.shape[:-1]
    logits2d = logits.reshape(-1, logits.shape[-1])
    labels1d = labels.reshape(-1).long() if labels is not None else None
    logp, ent, full = _ChunkedLogprobEntropy.apply(
        logits2d, labels1d, int(chunk_size), float(temperature), labels is not None, with_entropy, truncation
    )
    return TokenScores(
        logp.reshape(lead) if labels is not None else None,
        ent.reshape(lead) if with_entropy else None,
        full.reshape(lead) if labels is not None and truncation is not None else None,
    )


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    temperature: float = 1.0,
    *,
    truncation: Truncation | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(logp, entropy) of token_scores: logp (...) float32 or None (labels None), entropy (...) float32
    in nats or None (with_entropy False). See token_scores."""
    out = token_scores(logits, labels, chunk_size, with_entropy, temperature, truncation=truncation)
    return out.logp, out.entropy


def token_logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    temperature: float = 1.0,
) -> torch.Tensor:
    """log softmax(logits / temperature)[label]. logits (B, T, V), labels (B, T) -> (B, T) float32.

    Labels equal to -100 give 0. Numerically stable (logsumexp in float32), chunked over B*T rows.
    """
    logp, _ = logprobs_and_entropy(logits, labels, chunk_size, False, temperature)
    return logp


def entropy_from_logits(
    logits: torch.Tensor, chunk_size: int = DEFAULT_CHUNK_SIZE, temperature: float = 1.0
) -> torch.Tensor:
    """Entropy in nats of softmax(logits / temperature). logits (B, T, V) -> (B, T) float32."""
    _, ent = logprobs_and_entropy(logits, None, chunk_size, True, temperature)
    return ent
