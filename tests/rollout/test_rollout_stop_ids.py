"""Stop strings detected from token ids (rlvr.rollout.sampling.StopStrings, issue 38 S1): only a row whose newest
token may have completed a stop string is decoded. The table of such tokens never misses a stop (checked against
find_completed_stop on byte-level, SentencePiece-like and byte-fallback tokenizers), and a generate call gives the
same ids, texts, logprobs and finish/stop reasons as decoding every row at every token (the loop before), on the
plain loop and the static-cache path, with a handful of tokenizer decodes per finished row."""

import functools
import random
import warnings

import pytest
import torch

from rlvr.models import build_tiny_model
from rlvr.rollout import sampling
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.sampling import StopStrings, find_completed_stop, stop_candidates
from rlvr.rollout.types import SamplingSpec

CORPUS = ["<think>thé café</think> <answer>42 €</answer>", "日本語のテキスト 1+1=2 </answer>",
          "naïve façade — ok!\n\nAnswer: the end", "so the answer is <answer> 7 </answer>"] * 20


def _fast(tok, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, clean_up_tokenization_spaces=False, **special)


@functools.cache
def byte_level():
    """GPT-2 / Qwen style: byte-level BPE; characters of several bytes are split across tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<pad>", "<eos>"]))
    return _fast(tok, pad_token="<pad>", eos_token="<eos>")


@functools.cache
def metaspace():
    """SentencePiece style: "▁the" decodes alone to "the" but to " the" after a token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<pad>", "<eos>"]))
    return _fast(tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


@functools.cache
def byte_fallback():
    """Llama-2 style: BPE with byte fallback (<0xE2> tokens for unseen characters), the decoder replaces "▁",
    fuses bytes and strips the text's first space."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    base.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=250, special_tokens=["<unk>", "<pad>", "<eos>"]))
    vocab = base.get_vocab()
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    import json

    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
              for m in json.loads(base.to_str())["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<unk>", "<pad>", "<eos>")])
    return _fast(tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def char_level():
    return build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)[1]


TOKENIZERS = {"byte_level": byte_level, "metaspace": metaspace, "byte_fallback": byte_fallback, "char": char_level}
STOP_SETS = [("</answer>",), ("€",), ("é>", "\n\n"), ("Answer: ",), (" the", "日本"), ("a",), ("🙂",), ("ü!",)]


def test_the_tokenizers_exercise_what_they_should():
    bl, ms, bf = byte_level(), metaspace(), byte_fallback()
    assert any(bl.decode([t]) == "\ufffd" for t in bl("€ 日本")["input_ids"])  # a character split across tokens
    ids = ms("Answer: the end")["input_ids"]
    assert ms.decode(ids[2:3]) == "the" and ms.decode(ids[1:3]).endswith(" the")  # space only in context
    ids = bf("ok 🙂 ü!")["input_ids"]
    assert any(bf.convert_ids_to_tokens(t).startswith("<0x") for t in ids)  # byte-fallback tokens
    assert bf.decode(ids) == "ok 🙂 ü!"


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_candidate_table_never_misses_a_stop(name):
    """Every prefix of random id sequences (random bytes and pieces: broken characters, special tokens) and of
    encoded texts holding the stops: where find_completed_stop finds a stop completed by the last token (decoding
    everything, no window), that token is a candidate."""
    tok = TOKENIZERS[name]()
    rng = random.Random(0)
    n = len(tok)
    texts = [c for c in CORPUS[:4]] + ["x </answer> y", "€€ é> ü! 🙂\n\n", "Answer: the 日本 end</answer>"]
    hits = 0
    for stops in STOP_SETS:
        table = stop_candidates(tok, stops)
        assert table.shape == (n,) and table.dtype == torch.bool
        seqs = [[rng.randrange(n) for _ in range(30)] for _ in range(25)]
        for t in texts:
            ids = tok(t)["input_ids"]
            seqs += [ids, [rng.randrange(n) for _ in range(3)] + ids]
        for seq in seqs:
            for k in range(1, len(seq) + 1):
                hit = find_completed_stop(tok, seq[:k], stops, False, None)
                if hit is not None:
                    hits += 1
                    assert table[seq[k - 1]], (name, stops, seq[:k], hit)
    assert hits >= 20  # the check saw stops completed
    # selective: besides the pieces of broken characters (the 128 non-ASCII bytes of a byte-level vocabulary,
    # few of a real one's 150k) and the special tokens, only tokens holding ">" are candidates of "</answer>"
    alone, _ = sampling.token_texts(tok)
    table = stop_candidates(tok, ("</answer>",))
    assert {x for t, x in enumerate(alone) if table[t] and x and "\ufffd" not in x} <= {x for x in alone if ">" in x}
    assert stop_candidates(tok, ("</answer>",)) is stop_candidates(tok, ("</answer>",))  # made once


def test_candidates_past_the_vocabulary_are_checked():
    tok = char_level()
    s = StopStrings(tok, ("</answer>",), True)
    ids = torch.tensor([[tok.convert_tokens_to_ids(">"), tok.convert_tokens_to_ids("a"), len(tok), len(tok) + 7]])
    assert s.candidates(ids).tolist() == [[True, False, True, True]]


# -- generate: the same outputs as decoding every row at every token, with few decodes ----------------------------

PROMPTS = ["1+1=", "12*3", "ab: ", "7 x="]  # equal lengths: the bias hook below reads each row's last input token
CHAIN = "</answer>"


class Decodes:
    """Counts the sequences the tokenizer decodes (its Rust backend's decode and decode_batch: tokenizer.decode
    and the batched decode both go through it)."""

    def __init__(self, tok, monkeypatch):
        self.n, self.backend = 0, tok._tokenizer
        monkeypatch.setattr(tok, "_tokenizer", self)

    def decode(self, *a, **k):
        self.n += 1
        return self.backend.decode(*a, **k)

    def decode_batch(self, seqs, **k):
        self.n += len(seqs)
        return self.backend.decode_batch(seqs, **k)

    def __getattr__(self, name):
        return getattr(self.backend, name)


@pytest.fixture(scope="module", params=["qwen2", "llama_gqa"])
def answer_model(request):
    """A tiny char model pushed to write "</answer>": '<' likelier everywhere, and after each character of the
    chain its next one very likely, so rows end by the r1_zero stop string at scattered steps (some by EOS or
    length)."""
    if request.param == "qwen2":
        model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, seed=0)
    else:
        model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, arch="llama", seed=1)
    V = model.config.vocab_size
    nxt = torch.zeros((V, V))
    for a, b in zip(CHAIN, CHAIN[1:], strict=False):
        nxt[tok.convert_tokens_to_ids(a), tok.convert_tokens_to_ids(b)] = 9.0
    nxt[:, tok.convert_tokens_to_ids("<")] += 2.0
    last = {}

    def pre(_m, args, kwargs):
        last["ids"] = kwargs["input_ids"][:, -1]

    def post(_m, _i, out):
        return out + nxt[last["ids"]].unsqueeze(1).to(out.dtype)

    h1 = model.register_forward_pre_hook(pre, with_kwargs=True)
    h2 = model.lm_head.register_forward_hook(post)
    yield model, tok
    h1.remove()
    h2.remove()


def every_token(monkeypatch):
    """The reference: every unfinished row decoded at every token (find_completed_stop on each, as before)."""
    monkeypatch.setattr(StopStrings, "candidates", lambda self, tok: torch.ones(tok.shape, dtype=torch.bool))


def assert_same(a, b, tol=0.0):
    assert [r.response_ids for r in a] == [r.response_ids for r in b]
    assert [r.text for r in a] == [r.text for r in b]
    assert [(r.finish_reason, r.stop_reason) for r in a] == [(r.finish_reason, r.stop_reason) for r in b]
    for x, y in zip(a, b, strict=True):
        assert len(x.logprobs) == len(y.logprobs)
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0.0) <= tol


def run(model, tok, spec, *, static=False, **kw):
    gen = HFGenerator(model, tok, batch_size=16, static_cache=static or None, sync_every=3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback of the static path would warn
        out = gen.generate(PROMPTS, spec)
    assert gen._static == static
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("include", [True, False])
def test_answer_stop_same_outputs_few_decodes(answer_model, monkeypatch, seed, include):
    model, tok = answer_model
    spec = SamplingSpec(n=4, max_tokens=40, seed=seed, stop=(CHAIN,), include_stop_str_in_output=include,
                        min_tokens=2)
    StopStrings(tok, spec.stop, include)  # the table, once per (tokenizer, stops): not counted below
    counted = {}
    for path in ("plain", "static"):
        with monkeypatch.context() as m:
            d = Decodes(tok, m)
            counted[path] = (run(model, tok, spec, static=path == "static"), d.n)
    with monkeypatch.context() as m:
        every_token(m)
        d = Decodes(tok, m)
        ref = run(model, tok, spec)
        ref_decodes = d.n
    rows = len(ref)
    assert sum(r.stop_reason == CHAIN for r in ref) >= rows // 2  # most rows end by the stop string
    if include:
        assert all(r.text.endswith(CHAIN) for r in ref if r.stop_reason == CHAIN)
    plain, n_plain = counted["plain"]
    static, n_static = counted["static"]
    assert_same(plain, ref)  # the same sampled tokens: bit-equal logprobs
    assert_same(static, ref, tol=1e-5)
    # a handful of decodes per row (every token before): the '>' tokens of a row, 3 for the one that stops it,
    # one for the text of a row that did not end by a stop string
    assert n_plain <= 4 * rows and n_static <= 4 * rows, (n_plain, n_static)
    assert ref_decodes >= 5 * n_plain


def test_static_path_decodes_only_candidates(answer_model, monkeypatch):
    """The static path's host check (one block behind the device) asks StopStrings only about candidate tokens."""
    model, tok = answer_model
    spec = SamplingSpec(n=4, max_tokens=40, seed=5, stop=(CHAIN,), include_stop_str_in_output=True)
    asked = []
    check = StopStrings.check
    monkeypatch.setattr(StopStrings, "check", lambda self, ids: (asked.append(ids[-1]), check(self, ids))[1])
    out = run(model, tok, spec, static=True)
    assert tok.convert_tokens_to_ids(">") in asked
    assert set(asked) <= {tok.convert_tokens_to_ids(">"), *tok.all_special_ids}  # specials decode to "": checked
    assert len(asked) <= 3 * len(out)  # "e" -> "r" -> ">" is also likely outside the chain


# -- a byte-level model: stops spanning tokens and characters split across tokens ---------------------------------


@pytest.fixture(scope="module")
def byte_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = byte_level()
    cfg = Qwen2Config(vocab_size=len(tok) + 5, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,  # +5:
                      num_key_value_heads=2, intermediate_size=64, pad_token_id=tok.pad_token_id,  # a padded vocab
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = Qwen2ForCausalLM(cfg).eval()
    return model, tok


def spanning_stops(tok, rollouts, k=5):
    """Stop strings cut from the free texts across a token boundary: their characters come from two tokens."""
    out = []
    for r in rollouts:
        ends = [len(tok.decode(r.response_ids[:i])) for i in range(1, len(r.response_ids) + 1)]
        for a, b in zip(ends, ends[1:], strict=False):
            text = tok.decode(r.response_ids)
            if 0 < a - 1 and a + 1 <= b and "\ufffd" not in text[a - 1 : a + 1]:
                out.append(text[a - 1 : a + 1])
                break
        if len(out) >= k:
            break
    return tuple(dict.fromkeys(out))


@pytest.mark.parametrize("seed", [0, 1])
def test_byte_level_stops_across_tokens(byte_model, monkeypatch, seed):
    model, tok = byte_model
    free = HFGenerator(model, tok, batch_size=16).generate(PROMPTS, SamplingSpec(n=3, max_tokens=24, seed=seed))
    stops = spanning_stops(tok, free)
    assert len(stops) >= 2
    nonascii = [c for r in free for c in tok.decode(r.response_ids) if ord(c) > 127 and c != "\ufffd"]
    if nonascii:
        stops += (nonascii[0],)  # a character of several bytes (often split across tokens) as a stop
    for include in (False, True):
        spec = SamplingSpec(n=3, max_tokens=24, seed=seed, stop=stops, include_stop_str_in_output=include)
        with monkeypatch.context() as m:
            every_token(m)
            ref = run(model, tok, spec)
        plain = run(model, tok, spec)
        static = run(model, tok, spec, static=True)
        assert sum(r.stop_reason in stops for r in ref) >= 3
        assert_same(plain, ref)
        assert_same(static, ref, tol=1e-5)


def test_table_is_built_from_one_batched_decode(monkeypatch):
    tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)[1]  # a fresh tokenizer: no cache
    d = Decodes(tok, monkeypatch)
    calls = []
    monkeypatch.setattr(sampling, "_decode_each", lambda t, seqs, _o=sampling._decode_each: (calls.append(len(seqs)),
                                                                                          _o(t, seqs))[1])
    StopStrings(tok, ("</answer>",), True)
    StopStrings(tok, ("</answer>",), False)
    StopStrings(tok, ("\n\n",), False)
    assert calls == [len(tok), len(tok)]  # alone and after an anchor, once per tokenizer
    assert d.n == 2 * len(tok)
