"""Tiny character-level policies for CPU tests, demos and benchmarks.

`build_tiny_model` returns a *real* transformers causal LM (Qwen2ForCausalLM or LlamaForCausalLM)
and a `PreTrainedTokenizerFast` built with the `tokenizers` library, so the tiny-model path runs
exactly the same code as a real checkpoint: only the weights and the vocabulary differ.

Tokenizer design (decided here, relied on by tests and the CPU demo):
- one token per character of `alphabet` (WordLevel model over single characters, split by an
  "isolate every character" pre-tokenizer, `Fuse` decoder), so spaces and newlines round-trip
  exactly and sequence lengths are easy to reason about ("12+345=" is 7 tokens);
- special tokens `<pad>`, `<bos>`, `<eos>`, `<unk>` (ids 0..3); characters outside the alphabet
  encode to `<unk>` and therefore do not round-trip;
- no BOS/EOS is added by `tokenizer(text)` (like Qwen), so prompt + response tokenization is
  exactly the concatenation of the parts;
- multi-character tags such as "<think>", "</think>", "<answer>", "</answer>" are plain character
  sequences by default (the r1_zero template therefore round-trips with no special casing and a
  tiny model must learn the tags character by character). Pass `added_tokens=("<answer>", ...)`
  to make them single ids instead; added tokens are not special, so `decode(...,
  skip_special_tokens=True)` keeps them. `special_tokens=("<|im_end|>", ...)` adds single-id
  special tokens, which that decode drops.
- a minimal chat template (`<|user|>...\n<|assistant|>`) so code that renders chat prompts can be
  tested with the tiny tokenizer.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from rlvr.models.loading import resolve_attn_implementation

DEFAULT_ALPHABET = string.digits + string.ascii_letters + string.punctuation + " \n"
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, added_tokens: Sequence[str] = (), special_tokens: Sequence[str] = ()
):
    """A character-level `PreTrainedTokenizerFast`: ids 0..3 are pad/bos/eos/unk, then one id per
    distinct character of `alphabet` (in order), then one id per entry of `added_tokens`
    (ordinary single-id tokens, kept by decode), then one per entry of `special_tokens`
    (single-id special tokens such as "<|im_end|>", dropped by skip_special_tokens decode)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))  # de-duplicate, keep order
    clash = [c for c in chars if c in SPECIAL_TOKENS]
    if clash:
        raise ValueError(f"alphabet characters clash with special tokens: {clash}")
    if not chars:
        raise ValueError("alphabet is empty")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # "[\s\S]" matches every character including newlines: each character is one pre-token.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate, never insert spaces
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL_TOKENS])
    multi = [t for t in added_tokens if t not in vocab]
    if multi:
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in multi])
    extra_special = [t for t in special_tokens if t not in vocab and t not in SPECIAL_TOKENS]
    if extra_special:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in extra_special])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        # Right padding is for training/scoring; rlvr's generators build their own left-padded
        # batches, so nothing in rlvr depends on this attribute.
        padding_side="right",
        # The default clean-up would turn "a , b" into "a, b": never wanted for exact round-trips.
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )
    if extra_special:
        hf.add_special_tokens({"additional_special_tokens": list(extra_special)})
    hf.chat_template = TINY_CHAT_TEMPLATE
    return hf


def build_tiny_model(
    *,
    alphabet: str = DEFAULT_ALPHABET,
    added_tokens: Sequence[str] = (),
    special_tokens: Sequence[str] = (),
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 4096,
    arch: str = "qwen2",
    tie_word_embeddings: bool = False,
    seed: int = 0,
    dtype: str = "float32",
    attn_implementation: str = "auto",
):
    """Build a randomly initialized tiny causal LM and its character tokenizer.

    Returns (model, tokenizer). The model is a transformers `Qwen2ForCausalLM` (arch="qwen2") or
    `LlamaForCausalLM` (arch="llama") in eval mode on CPU; vocab size = 4 + len(alphabet) +
    len(added_tokens) + len(special_tokens) (see build_char_tokenizer). Initialization uses a private RNG seeded with `seed`, so the caller's
    global torch RNG state is left untouched and the same seed gives identical weights.
    intermediate_size defaults to 2 * hidden_size (small but non-trivial MLP).
    tie_word_embeddings defaults to False: with tied weights and the standard 0.02 init the
    residual stream is dominated by the input embedding, so a fresh model greedily repeats its
    last input token forever, which makes generation tests vacuous.
    attn_implementation: auto (sdpa where the class supports it, else eager), sdpa, eager, ...
    (rlvr.models.loading.resolve_attn_implementation).
    max_position_embeddings: positions the trainers and `rlvr eval` allow prompt + response
    (rlvr.models.positions); both archs use RoPE, so it shapes no weight. 4096 lets the character
    tokenizer hold a real task's prompt (MATH-500 under r1_zero: up to 1186 characters).
    """
    import torch


    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny arch {arch!r}; known: {sorted(TINY_ARCHS)}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size={hidden_size} must be divisible by num_heads={num_heads}")
    tokenizer = build_char_tokenizer(alphabet, added_tokens, special_tokens)
    config_cls, model_cls = TINY_ARCHS[arch]()
    config = config_cls(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        intermediate_size=intermediate_size or 2 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation=resolve_attn_implementation(attn_implementation, model_cls),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    model.to(getattr(torch, dtype))
    # Make greedy/sampled generation from transformers' own `generate` consistent with ours.
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    return model, tokenizer


# Shapes of real checkpoints, for memory and speed measurements with random weights (the shape,
# not the weights, decides memory). Values from the models' published config.json files.
REAL_SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
}


def build_bpe_tokenizer(texts: Sequence[str], vocab_size: int = 512, eos_token: str = "<|endoftext|>"):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts` in-process (no download).

    Byte-level, so every string round-trips; `eos_token` doubles as the pad token (as in Qwen).
    Ids at or above len(tokenizer) (a model with a larger vocabulary can sample them) decode to
    nothing. For measurements with a real model's shape, where only sequence lengths matter.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(eos_token, special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos_token,
        pad_token=eos_token,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def build_shaped_model(shape: str, tokenizer, *, seed: int = 0, dtype: str = "bfloat16", arch: str = "qwen2"):
    """A randomly initialized causal LM with the shape of a real checkpoint (REAL_SHAPES[shape]),
    built in `dtype` directly (no float32 copy of the weights is ever made). The vocabulary size
    stays the real one whatever the tokenizer's size, so embedding, LM head and logits have their
    real memory cost. Returns the model in eval mode on CPU."""
    import torch

    if shape not in REAL_SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(REAL_SHAPES)}")
    config_cls, model_cls = TINY_ARCHS[arch]()
    config = config_cls(
        **REAL_SHAPES[shape],
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        attn_implementation="sdpa",
    )
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_cls(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.eval()
    return model


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2Config, Qwen2ForCausalLM


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaConfig, LlamaForCausalLM


# Registered by name: (config class, model class), imported lazily.
TINY_ARCHS = {"qwen2": _qwen2, "llama": _llama}
