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
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100
DEFAULT_CHUNK_SIZE = 512  # rows of B*T; 512 x 151,936 x 4 bytes ~ 311 MB of fp32 work space


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
    def forward(ctx, logits2d, labels1d, chunk_size, temperature, with_logp, with_entropy):
        n = logits2d.shape[0]
        dev = logits2d.device
        cdt = _compute_dtype(logits2d)
        logp = torch.zeros(n, dtype=cdt, device=dev) if with_logp else None
        ent = torch.zeros(n, dtype=cdt, device=dev) if with_entropy else None
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            x = _chunk_input(logits2d[s:e], cdt, temperature)
            if with_entropy:
                p, lse = _softmax_lse(x)
                ent[s:e] = lse - _rowdot(p, x)  # H = lse - E_p[x]
                del p
            else:
                lse = torch.logsumexp(x, dim=-1)
            if with_logp:
                lab = labels1d[s:e]
                picked = x.gather(1, lab.clamp_min(0).unsqueeze(1)).squeeze(1)
                logp[s:e] = torch.where(lab != IGNORE_INDEX, picked - lse, torch.zeros_like(lse))
        ctx.save_for_backward(logits2d, labels1d if with_logp else None)
        # an output nobody differentiates (the entropy of a loss without an entropy bonus, kept only
        # as a metric) gets None in backward instead of zeros, and its (n, V) term is skipped
        ctx.set_materialize_grads(False)
        ctx.chunk_size = chunk_size
        ctx.temperature = temperature
        ctx.with_logp = with_logp
        ctx.with_entropy = with_entropy
        if not with_logp:
            logp = torch.zeros(0, dtype=cdt, device=dev)
        if not with_entropy:
            ent = torch.zeros(0, dtype=cdt, device=dev)
        ctx.mark_non_differentiable(*[t for t, w in ((logp, with_logp), (ent, with_entropy)) if not w])
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_logp, g_ent):
        logits2d, labels1d = ctx.saved_tensors
        n = logits2d.shape[0]
        t = ctx.temperature
        cdt = _compute_dtype(logits2d)
        grad = torch.empty_like(logits2d)
        use_logp = ctx.with_logp and g_logp is not None
        use_ent = ctx.with_entropy and g_ent is not None
        for s in range(0, n, ctx.chunk_size):
            e = min(n, s + ctx.chunk_size)
            x = _chunk_input(logits2d[s:e], cdt, t)
            p, _ = _softmax_lse(x)  # (n, V), becomes the gradient in place
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
            if t != 1.0:
                p.div_(t)
            grad[s:e] = p
        return grad, None, None, None, None, None


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


def logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor | None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-token log p(label) and entropy of softmax(logits / temperature), chunked over rows.

    logits: (..., V) any float dtype (typically (B, T, V)); already aligned with labels, i.e.
        logits[b, t] predicts labels[b, t] (shift before calling).
    labels: (...) int64 token ids, IGNORE_INDEX (-100) where there is no target; or None to
        skip the logprob.
    chunk_size: rows of the flattened (..., V) processed at once; bounds work memory.
    Returns (logp (...) float32 or None, entropy (...) float32 in nats or None). logp is 0
    (and gets no gradient) where labels == -100. Differentiable w.r.t. logits.
    """
    _check(logits, labels, chunk_size)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    lead = logits.shape[:-1]
    logits2d = logits.reshape(-1, logits.shape[-1])
    labels1d = labels.reshape(-1).long() if labels is not None else None
    logp, ent = _ChunkedLogprobEntropy.apply(
        logits2d, labels1d, int(chunk_size), float(temperature), labels is not None, with_entropy
    )
    return (
        logp.reshape(lead) if labels is not None else None,
        ent.reshape(lead) if with_entropy else None,
    )


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
