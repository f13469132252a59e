"""rlvr.compat.cs336: the assignment's names and conventions, checked against hand values and
against the assignment's own public snapshots (stanford-cs336/assignment5-alignment,
tests/_snapshots, vendored under tests/fixtures/cs336/ with a README naming the commit)."""

import hashlib
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import TESTS

from rlvr.algo import masked_mean as safe_masked_mean
from rlvr.compat import cs336
from rlvr.models import build_tiny_model


def _reward_fn(response, truth):
    ok = float(response == truth)
    return {"reward": ok, "format_reward": 1.0, "answer_reward": ok}


def test_group_normalized_rewards_uses_sample_std():
    responses = ["a", "b", "b", "b", "a", "a", "b", "b"]
    truths = ["a"] * 8
    # group 1 rewards [1,0,0,0]: mean 0.25, torch.std (sample) = sqrt(0.75/3) = 0.5
    #   -> [0.75/0.5, -0.25/0.5 x3] = [1.5, -0.5, -0.5, -0.5]
    # group 2 [1,1,0,0]: sample std sqrt(1/3) = 0.57735 -> +-0.5/0.57735 = +-0.866
    adv, raw, meta = cs336.compute_group_normalized_rewards(_reward_fn, responses, truths, 4, 1e-6, True)
    h = 0.5 * math.sqrt(3)
    assert adv.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, h, h, -h, -h], rel=1e-5)
    assert raw.tolist() == [1, 0, 0, 0, 1, 1, 0, 0]
    # independent check against torch.std on the grouped rewards
    g = raw.reshape(2, 4)
    ref = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + 1e-6)
    assert torch.allclose(adv, ref.reshape(-1))
    assert meta["reward_mean"] == pytest.approx(3 / 8) and meta["format_reward_mean"] == 1.0
    adv, _, _ = cs336.compute_group_normalized_rewards(_reward_fn, responses, truths, 4, 1e-6, False)
    assert adv.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5])


def test_policy_gradient_losses():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.25]])
    a = torch.tensor([[2.0], [-1.0]])
    # -A * logp: [[2, 4], [-0.5, -0.25]]
    assert cs336.compute_naive_policy_gradient_loss(a, logp).tolist() == [[2.0, 4.0], [-0.5, -0.25]]
    # ratio exp(0.5) = 1.6487 with A=+2, cliprange 0.2: -min(3.297, 2.4) = -2.4, clipped;
    # ratio 1 with A=-1: 1.0, not clipped
    old = torch.tensor([[-1.5, -2.0], [-0.5, -0.25]])
    loss, meta = cs336.compute_grpo_clip_loss(a, logp, old, 0.2)
    assert torch.allclose(loss, torch.tensor([[-2.4, -2.0], [1.0, 1.0]]))
    assert meta["clipped"].tolist() == [[True, False], [False, False]]
    l2, _ = cs336.compute_policy_gradient_loss(logp, "grpo_clip", None, a, old, 0.2)
    assert torch.equal(l2, loss)
    l3, _ = cs336.compute_policy_gradient_loss(logp, "no_baseline", raw_rewards=a)
    assert l3.tolist() == [[2.0, 4.0], [-0.5, -0.25]]
    with pytest.raises(ValueError, match="needs old_log_probs, cliprange"):
        cs336.compute_policy_gradient_loss(logp, "grpo_clip", advantages=a)
    with pytest.raises(KeyError, match="known: grpo_clip, no_baseline, reinforce_with_baseline"):
        cs336.compute_policy_gradient_loss(logp, "ppo", advantages=a)


def test_masked_helpers_and_entropy():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert cs336.masked_mean(x, m).item() == pytest.approx(7 / 3)  # (1 + 2 + 4) / 3
    assert cs336.masked_mean(x, m, dim=1).tolist() == [1.5, 4.0]
    assert cs336.masked_normalize(x, m, 2.0, dim=1).tolist() == [1.5, 2.0]  # (1+2)/2, 4/2
    assert cs336.masked_normalize(x, m, 2.0).item() == 3.5
    # uniform over 4 -> ln 4
    assert cs336.compute_entropy(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))


def test_microbatch_train_steps_backward():
    # SFT: rows with response log-probs [-1, -2] (2 tokens) and [-4] (1 token), constant 2,
    # 2 accumulation steps: per-seq -sum/2 = [1.5, 2.0], mean 1.75, /2 = 0.875;
    # gradient per valid token = -1 / (2 const * 2 seqs * 2 steps) = -0.125
    logp = torch.tensor([[-1.0, -2.0, -9.0], [-4.0, -9.0, -9.0]], requires_grad=True)
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = cs336.sft_microbatch_train_step(logp, m, 2, normalize_constant=2.0)
    assert loss.item() == pytest.approx(0.875)
    assert logp.grad.tolist() == [[-0.125, -0.125, 0.0], [-0.125, 0.0, 0.0]]
    # GRPO reinforce_with_baseline: A = [1, -2]; per-token -A*logp = [[1, 2], [-8]]; per-seq means
    # [1.5, -8], mean -3.25, /2 steps = -1.625; grad = -A / (n_i * 2 seqs * 2 steps)
    logp.grad = None
    adv = torch.tensor([[1.0], [-2.0]])
    loss, _ = cs336.grpo_microbatch_train_step(logp, m, 2, "reinforce_with_baseline", advantages=adv)
    assert loss.item() == pytest.approx(-1.625)
    assert torch.allclose(logp.grad, torch.tensor([[-0.125, -0.125, 0.0], [0.5, 0.0, 0.0]]))


def test_response_log_probs_and_tokenize_delegate_to_models():
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)
    batch = cs336.tokenize_prompt_and_output(["1+1="], ["2"], tok)
    assert set(batch) == {"input_ids", "labels", "response_mask"}
    # "1+1=" + "2" is 5 characters -> 4 positions; only the last label ("2") is response
    assert batch["input_ids"].shape == (1, 4) and batch["response_mask"].tolist() == [[False, False, False, True]]
    out = cs336.get_response_log_probs(model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=batch["input_ids"]).logits.float(), -1)
    ref_lp = ref.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(out["log_probs"], ref_lp, atol=1e-5)
    assert torch.allclose(out["token_entropy"], -(ref.exp() * ref).sum(-1), atol=1e-5)


# --- masked_mean: the assignment's NaN on an empty slice, rlvr.algo's safe 0 --------------------


def test_masked_mean_empty_slice_is_nan_here_and_zero_in_rlvr_algo():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    m = torch.tensor([[True, False], [False, False]])  # row 1 and column 1 hold no selected entry
    assert torch.isnan(cs336.masked_mean(x, torch.zeros_like(m)))  # 0 / 0 over everything
    by_row = cs336.masked_mean(x, m, dim=1)
    assert by_row[0].item() == 1.0 and torch.isnan(by_row[1])
    by_col = cs336.masked_mean(x, m, dim=0)
    assert by_col[0].item() == 1.0 and torch.isnan(by_col[1])
    # the library's own reduction keeps its promise of 0 for the same empty slices
    assert safe_masked_mean(x, m, dim=1).tolist() == [1.0, 0.0]
    assert safe_masked_mean(x, m, dim=0).tolist() == [1.0, 0.0]
    assert safe_masked_mean(x, torch.zeros_like(m)).item() == 0.0
    # a sequence without a response token makes the assignment's GRPO micro-batch loss NaN
    logp = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    loss, _ = cs336.grpo_microbatch_train_step(
        logp, m, 1, "reinforce_with_baseline", advantages=torch.tensor([[1.0], [1.0]])
    )
    assert torch.isnan(loss)


# --- the assignment's public snapshot tests ------------------------------------------------------
# Inputs are rebuilt exactly as the assignment's tests/conftest.py builds them (every random
# fixture re-seeds torch with 42 before drawing), the functions under test are rlvr.compat.cs336's,
# and the outputs are compared with the assignment's .npz snapshots. The assignment compares with
# rtol=1e-4, atol=1e-2; these checks are tighter (atol=1e-6). NaNs must sit where the snapshot has
# them (np.testing.assert_allclose treats NaN == NaN, and nothing else equals NaN).

SNAPSHOTS = TESTS / "fixtures" / "cs336" / "snapshots"
BATCH, SEQ, VOCAB = 2, 10, 100


def _load_snapshot(name: str) -> dict[str, np.ndarray]:
    with np.load(SNAPSHOTS / f"{name}.npz") as z:
        return {k: z[k] for k in z.files}


def _matches_snapshot(name: str, got, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    want = _load_snapshot(name)
    got = got if isinstance(got, dict) else {"array": got}
    got = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for k, v in got.items()}
    assert sorted(got) == sorted(want), name
    for key, expected in want.items():
        assert got[key].shape == expected.shape, (name, key)
        np.testing.assert_allclose(got[key], expected, rtol=rtol, atol=atol, err_msg=f"{name}: {key}")


def _seed42(draw):
    torch.manual_seed(42)
    return draw()


def _logits():  # the assignment's `logits` (and `tensor`) fixture
    return _seed42(lambda: torch.randn(BATCH, SEQ, VOCAB))


def _logits_mask():  # `mask`: a coin flip per entry of `tensor`
    return _seed42(lambda: torch.rand(BATCH, SEQ, VOCAB) > 0.5)


def _policy_log_probs():
    return _seed42(lambda: torch.randn(BATCH, SEQ))


def _old_log_probs():  # policy_log_probs plus a fresh seed-42 draw of the same shape
    return _policy_log_probs() + _seed42(lambda: torch.randn(BATCH, SEQ))


def _raw_rewards():  # `raw_rewards_or_advantages`, also `raw_rewards`: (B, 1) in [0, 1)
    return _seed42(lambda: torch.rand(BATCH, 1))


def _advantages():  # raw rewards minus their mean over the batch
    r = _raw_rewards()
    return r - r.mean(dim=0)


def _response_mask():
    return _seed42(lambda: torch.rand(BATCH, SEQ) > 0.5)


def _hash_reward(response: str, ground_truth: str) -> dict[str, float]:
    # the assignment's dummy reward: last decimal digit of the SHA-256 of the response, / 10
    r = (int(hashlib.sha256(response.encode()).hexdigest(), 16) % 10) / 10.0
    return {"reward": r, "format_reward": r, "answer_reward": r}


@pytest.mark.parametrize("normalize_by_std", [True, False], ids=["normalize_by_std", "no_normalize_by_std"])
def test_snapshot_group_normalized_rewards(normalize_by_std):
    responses = [f"hmm I think ths answer is {i}" for i in range(8)]  # (sic) "ths", as in the fixture
    adv, raw, _ = cs336.compute_group_normalized_rewards(
        _hash_reward, responses, ["42"] * 8, group_size=4, advantage_eps=1e-6, normalize_by_std=normalize_by_std
    )
    name = "normalize_by_std" if normalize_by_std else "no_normalize_by_std"
    _matches_snapshot(f"test_compute_group_normalized_rewards_{name}", {"normalized_rewards": adv, "raw_rewards": raw})


def test_snapshot_naive_policy_gradient_loss():
    out = cs336.compute_naive_policy_gradient_loss(_raw_rewards(), _policy_log_probs())
    _matches_snapshot("test_compute_naive_policy_gradient_loss", out)


@pytest.mark.parametrize(("cliprange", "name"), [(10.0, "large"), (0.1, "small")])
def test_snapshot_grpo_clip_loss(cliprange, name):
    out, _ = cs336.compute_grpo_clip_loss(_advantages(), _policy_log_probs(), _old_log_probs(), cliprange)
    _matches_snapshot(f"test_compute_grpo_clip_loss_{name}_cliprange", out)


@pytest.mark.parametrize("loss_type", ["no_baseline", "reinforce_with_baseline", "grpo_clip"])
def test_snapshot_policy_gradient_loss(loss_type):
    out, _ = cs336.compute_policy_gradient_loss(
        _policy_log_probs(), loss_type, raw_rewards=_raw_rewards(), advantages=_advantages(),
        old_log_probs=_old_log_probs(), cliprange=0.5,
    )
    _matches_snapshot(f"test_compute_policy_gradient_loss_{loss_type}", out)


_DIMS = [(0, "dim0"), (1, "dim1"), (-1, "dimlast"), (None, "dimNone")]


@pytest.mark.parametrize(("dim", "name"), _DIMS)
def test_snapshot_masked_mean(dim, name):
    x, m = _logits(), _logits_mask()
    out = cs336.masked_mean(x, m) if dim is None else cs336.masked_mean(x, m, dim=dim)
    _matches_snapshot(f"test_masked_mean_{name}", out)
    if dim == 0:  # with 2 rows, a quarter of the columns have no selected entry: NaN in the snapshot
        empty = ~m.any(dim=0)
        assert empty.any()
        assert torch.equal(torch.isnan(out), empty)
        assert torch.equal(torch.from_numpy(np.isnan(_load_snapshot("test_masked_mean_dim0")["array"])), empty)


@pytest.mark.parametrize(("dim", "name"), _DIMS)
def test_snapshot_masked_normalize(dim, name):
    x, m = _logits(), _logits_mask()
    out = cs336.masked_normalize(x, m, normalize_constant=42.0, dim=dim)
    _matches_snapshot(f"test_masked_normalize_{name}", out)


def test_snapshot_compute_entropy():
    _matches_snapshot("test_compute_entropy", cs336.compute_entropy(_logits()))


def _grpo_step(logp):
    return cs336.grpo_microbatch_train_step(
        logp, _response_mask(), 2, "grpo_clip", raw_rewards=_raw_rewards(), advantages=_advantages(),
        old_log_probs=_old_log_probs(), cliprange=0.1,
    )


def _sft_step(logp, normalize_constant=1.0):
    return cs336.sft_microbatch_train_step(logp, _response_mask(), 2, normalize_constant=normalize_constant)


@pytest.mark.parametrize(
    ("step", "name"),
    [
        (_grpo_step, "test_grpo_microbatch_train_step_grpo_clip"),
        (_sft_step, "test_sft_microbatch_train_step"),
        (lambda lp: _sft_step(lp, 42.0), "test_sft_microbatch_train_step_normalize"),
    ],
    ids=["grpo_clip", "sft", "sft_normalize"],
)
def test_snapshot_microbatch_train_step(step, name):
    logp = _policy_log_probs().requires_grad_(True)
    loss, _ = step(logp)
    _matches_snapshot(name, {"loss": loss, "policy_log_probs_grad": logp.grad})


@pytest.mark.parametrize(
    ("step", "name"),
    [(_grpo_step, "test_grpo_microbatch_train_step_grpo_clip_10_steps"),
     (_sft_step, "test_sft_microbatch_train_step_10_steps")],
    ids=["grpo_clip", "sft"],
)
def test_snapshot_microbatch_train_step_ten_times(step, name):
    # Ten backward calls without zeroing: the gradient accumulates in place in the one .grad tensor,
    # and the snapshot stacks that same tensor ten times (so every slice holds the final sum).
    logp = _policy_log_probs().requires_grad_(True)
    losses, grads = [], []
    for _ in range(10):
        loss, _ = step(logp)
        losses.append(loss)
        grads.append(logp.grad)
    _matches_snapshot(name, {"loss": torch.stack(losses), "policy_log_probs_grad": torch.stack(grads)})


def _qwen25_stand_in_tokenizer():
    """A real fast tokenizer that encodes the fixture's strings exactly as Qwen2.5's does: Qwen2's
    pre-tokenizer (its split regex, then byte-level mapping, so " world" -> "Ġworld") and the
    Qwen2.5 vocabulary ids of the pieces these strings use. Only tokenization enters this snapshot,
    and Qwen2.5 adds no BOS and pads with <|endoftext|> (151643)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    vocab = {"!": 0, ",": 11, ".": 13, "Ġa": 264, "Ġtest": 1273, "Ġis": 374, "Ġworld": 1879, "This": 1986,
             "Ġanother": 2441, "Hello": 9707, "<|endoftext|>": 151643, "<unk>": 151700}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|endoftext|>")


def test_snapshot_tokenize_prompt_and_output():
    strs = ["Hello, world!", "This is a test.", "This is another test."]  # prompts and outputs alike
    tok = _qwen25_stand_in_tokenizer()
    assert tok.encode("This is another test.") == [1986, 374, 2441, 1273, 13]  # no piece fell to <unk>
    out = cs336.tokenize_prompt_and_output(strs, strs, tok)
    _matches_snapshot("test_tokenize_prompt_and_output", out, rtol=0, atol=0)
    assert out["response_mask"].dtype == torch.bool


QWEN_MATH = os.environ.get("RLVR_CS336_QWEN_MATH_1P5B", "/data/a5-alignment/models/Qwen2.5-Math-1.5B")


@pytest.mark.skipif(
    not Path(QWEN_MATH).is_dir(),
    reason="needs Qwen2.5-Math-1.5B weights (the snapshot holds that model's log-probs and entropies); "
    "set RLVR_CS336_QWEN_MATH_1P5B to a local copy to run it",
)
def test_snapshot_get_response_log_probs():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(QWEN_MATH)
    input_ids = _seed42(lambda: torch.randint(0, VOCAB, (BATCH, SEQ)))
    labels = torch.cat([input_ids[:, 1:], torch.zeros(BATCH, 1, dtype=input_ids.dtype)], dim=1)
    out = cs336.get_response_log_probs(model, input_ids, labels, return_token_entropy=True)
    # a 1.5B model's numbers vary with kernels: the assignment's own tolerances here
    _matches_snapshot("test_get_response_log_probs", out, rtol=1e-4, atol=1e-2)
