"""tokenize_prompt_and_output / build_training_batch layout, and score_tokens vs a naive forward."""

import pytest
import torch

from rlvr.models import build_tiny_model, build_training_batch, score_tokens, tokenize_prompt_and_output


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)


def test_tokenize_prompt_and_output_hand_computed(tiny):
    _, tok = tiny
    c = tok.convert_tokens_to_ids
    out = tokenize_prompt_and_output(["ab", "c", "xyz", "p"], ["12", "345", "9", "q"], tok)
    # lengths P+R: 4, 4, 4, 2 -> T = 4, tensors (4, 3). pad id 0.
    assert out["input_ids"].tolist() == [
        [c("a"), c("b"), c("1")],
        [c("c"), c("3"), c("4")],
        [c("x"), c("y"), c("z")],
        [c("p"), c("q"), 0],
    ]
    assert out["labels"].tolist() == [
        [c("b"), c("1"), c("2")],
        [c("3"), c("4"), c("5")],
        [c("y"), c("z"), c("9")],
        [c("q"), 0, 0],
    ]
    # response label positions are t in [P-1, P+R-1): [1,3), [0,3), [2,3), [0,1)
    assert out["response_mask"].tolist() == [
        [False, True, True],
        [True, True, True],
        [False, False, True],
        [True, False, False],
    ]
    assert out["response_mask"].dtype == torch.bool


def test_prompt_gets_bos_when_the_tokenizer_adds_one_and_the_output_does_not():
    from tokenizers.processors import TemplateProcessing

    from rlvr.models import build_char_tokenizer

    tok = build_char_tokenizer()
    tok._tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    c = tok.convert_tokens_to_ids
    out = tokenize_prompt_and_output(["ab"], ["cd"], tok)
    # ids = [<bos>, a, b, c, d]: P = 3 (with BOS), R = 2 -> response labels at t in [2, 4)
    assert out["input_ids"].tolist() == [[1, c("a"), c("b"), c("c")]]
    assert out["labels"].tolist() == [[c("a"), c("b"), c("c"), c("d")]]
    assert out["response_mask"].tolist() == [[False, False, True, True]]


def test_build_training_batch_loss_mask_and_sampler_logprobs():
    b = build_training_batch(
        [[5, 6], [7]],
        [[8, 9, 10], [11]],
        pad_token_id=0,
        loss_masks=[[True, False, True], [True]],
        sampler_logprobs=[[-0.1, -0.2, -0.3], [-0.4]],
    )
    # T = 5: row0 ids [5,6,8,9,10]; row1 ids [7,11,0,0,0]
    assert b.input_ids.tolist() == [[5, 6, 8, 9], [7, 11, 0, 0]]
    assert b.labels.tolist() == [[6, 8, 9, 10], [11, 0, 0, 0]]
    assert b.response_mask.tolist() == [[False, True, False, True], [True, False, False, False]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert torch.allclose(b.sampler_logprobs, torch.tensor([[0, -0.1, -0.2, -0.3], [-0.4, 0, 0, 0]]))
    with pytest.raises(ValueError, match="row 0: loss mask has 1 entries for 3 tokens"):
        build_training_batch([[5, 6]], [[8, 9, 10]], 0, loss_masks=[[True]])


def _naive(model, ids, labels):
    # independent reference: full log_softmax in float64
    logits = model(input_ids=ids).logits.double()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def test_score_tokens_matches_naive_forward_and_micro_batches(tiny):
    model, tok = tiny
    out = tokenize_prompt_and_output(["12+3=", "7*8=", "1"], ["15", "56 ok", "+1=2"], tok)
    ids, labels = out["input_ids"], out["labels"]
    ref_lp, ref_ent = _naive(model, ids, labels)
    with torch.no_grad():
        s = score_tokens(model, ids, labels, with_entropy=True, chunk_size=4)
        s2 = score_tokens(model, ids, labels, with_entropy=True, micro_batch_size=1, chunk_size=7)
    assert s.logprobs.shape == ids.shape and s.logprobs.dtype == torch.float32
    assert torch.allclose(s.logprobs.double(), ref_lp, atol=1e-5)
    assert torch.allclose(s.entropy.double(), ref_ent, atol=1e-5)
    assert torch.allclose(s2.logprobs, s.logprobs, atol=1e-6)
    assert torch.allclose(s2.entropy, s.entropy, atol=1e-6)
    # entropy of a V-way distribution is in (0, log V]
    assert (s.entropy > 0).all() and (s.entropy <= torch.log(torch.tensor(float(len(tok)))) + 1e-5).all()


def test_score_tokens_left_padding_and_trimming_with_attention_mask(tiny):
    model, tok = tiny
    a = tok.encode("9-4=5")
    ids = torch.tensor([[0, 0] + a[:-1], a[:-1] + [0, 0]])  # row0 left-padded, row1 right-padded
    labels = torch.tensor([[0, 0] + a[1:], a[1:] + [0, 0]])
    am = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        s = score_tokens(model, ids, labels, am, with_entropy=True)
        alone = score_tokens(model, torch.tensor([a[:-1]]), torch.tensor([a[1:]]))
    assert torch.allclose(s.logprobs[0, 2:], alone.logprobs[0], atol=1e-5)
    assert torch.allclose(s.logprobs[1, :4], alone.logprobs[0], atol=1e-5)
    assert (s.logprobs[0, :2] == 0).all() and (s.logprobs[1, 4:] == 0).all()
    assert (s.entropy[1, 4:] == 0).all()


def test_score_tokens_gradients_match_naive(tiny):
    model, tok = tiny
    out = tokenize_prompt_and_output(["3+4="], ["7"], tok)
    ids, labels, mask = out["input_ids"], out["labels"], out["response_mask"]
    model.zero_grad()
    s = score_tokens(model, ids, labels, with_entropy=True, micro_batch_size=1)
    (-(s.logprobs * mask).sum() + 0.1 * s.entropy.sum()).backward()
    g1 = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    lp, ent = _naive(model, ids, labels)
    (-(lp * mask).sum() + 0.1 * ent.sum()).backward()
    g2 = model.model.embed_tokens.weight.grad.clone()
    model.zero_grad()
    assert g1.abs().sum() > 0
    assert torch.allclose(g1, g2.float(), atol=1e-5)


def test_score_tokens_temperature_divides_logits(tiny):
    model, tok = tiny
    ids = torch.tensor([tok.encode("12+34")])
    labels = torch.tensor([tok.encode("2+34=")])
    with torch.no_grad():
        s = score_tokens(model, ids, labels, temperature=0.5)
        ref = (
            torch.log_softmax(model(ids).logits.double() / 0.5, -1)
            .gather(-1, labels.unsqueeze(-1))
            .squeeze(-1)
        )
    assert torch.allclose(s.logprobs.double(), ref, atol=1e-5)
