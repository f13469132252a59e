"""What the packed-learner tests share (tests/models/test_packing.py, test_packing_varlen.py): a micro-batch of
groups sharing prompts, a tiny model, its gradients and their comparison."""

from __future__ import annotations

import random

from rlvr.models.tiny import build_tiny_model
from rlvr.models.tokenize import build_training_batch


def batch(seed=0, groups=3, per_group=3, resp_len=(1, 20), truncated_row=False):
    """Groups of rows sharing a prompt of 2..7 tokens, responses of mixed length, rows in random order;
    truncated_row: one row with no loss label (sampling.mask_truncated)."""
    rng = random.Random(seed)
    P, R = [], []
    for _ in range(groups):
        p = [rng.randrange(4, 90) for _ in range(rng.randrange(2, 8))]
        for _ in range(per_group):
            P.append(p)
            R.append([rng.randrange(4, 90) for _ in range(rng.randint(*resp_len))])
    order = list(range(len(P)))
    rng.shuffle(order)
    P, R = [P[i] for i in order], [R[i] for i in order]
    masks = [[True] * len(r) for r in R]
    if truncated_row:
        masks[1] = [False] * len(R[1])
    sampler = [[-rng.random() for _ in r] for r in R]
    return build_training_batch(P, R, 0, loss_masks=masks, sampler_logprobs=sampler)


def model(arch="qwen2", kv_heads=None, layers=2, seed=0):
    return build_tiny_model(hidden_size=32, num_layers=layers, num_heads=4 if kv_heads else 2, num_kv_heads=kv_heads,
                            arch=arch, seed=seed)[0]


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_close(got, ref, rel=1e-5):
    assert got.keys() == ref.keys()
    for n in ref:  # float32 rounding, relative to the tensor's largest entry
        assert float((got[n] - ref[n]).abs().max()) <= rel * float(ref[n].abs().max()), n
    assert ref["model.embed_tokens.weight"].abs().sum() > 0


def backward_scores(model, fn, w, m):
    """fn()'s ScoreOutput and the gradients of a weighted sum of its logprobs and entropies over the mask m (the
    gradient every packed-vs-padded comparison checks)."""
    model.zero_grad()
    out = fn()
    ((out.logprobs * w + 0.3 * w * out.entropy) * m).sum().backward()
    return out, grads(model)
