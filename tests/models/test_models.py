"""Tiny model factory, character tokenizer and the save/load round-trip."""

import json

import pytest
import torch

from rlvr.models import build_char_tokenizer, build_tiny_model, load_policy, save_policy

R1_ZERO = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant "
    "solves it.\nUser: What is 12+345?\nAssistant: <think> 12+345 = 357 </think> <answer>357</answer>"
)


def test_char_tokenizer_one_id_per_char_and_exact_round_trip():
    tok = build_char_tokenizer()
    ids = tok("12+345=")["input_ids"]
    # 7 characters -> 7 ids; no BOS/EOS added. ids 0..3 are pad/bos/eos/unk, then digits 0-9 at 4..13.
    assert ids == [5, 6, tok.convert_tokens_to_ids("+"), 7, 8, 9, tok.convert_tokens_to_ids("=")]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    for text in [R1_ZERO, "a , b .  double  spaces\n\nnew lines", " leading and trailing "]:
        enc = tok(text)["input_ids"]
        assert len(enc) == len(text)
        assert tok.decode(enc) == text


def test_unknown_characters_map_to_unk_and_added_tokens_are_single_ids():
    tok = build_char_tokenizer(added_tokens=("<answer>", "</answer>"))
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    ids = tok("<answer>7</answer>")["input_ids"]
    assert len(ids) == 3
    # added tokens are not special: skip_special_tokens keeps them, but drops <eos>.
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "<answer>7</answer>"
    tok = build_char_tokenizer(special_tokens=("<|im_end|>",))
    ids = tok("7<|im_end|>")["input_ids"]
    assert len(ids) == 2 and tok.decode(ids, skip_special_tokens=True) == "7"
    assert tok.decode(ids) == "7<|im_end|>"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_shapes_and_seeded_init(arch):
    torch.manual_seed(123)
    before = torch.rand(1).item()
    torch.manual_seed(123)
    model, tok = build_tiny_model(arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=7)
    assert torch.rand(1).item() == before  # the global RNG was not consumed
    model2, _ = build_tiny_model(arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=7)
    model3, _ = build_tiny_model(arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=8)
    ids = torch.tensor([tok("1+2=")["input_ids"]])
    logits = model(ids).logits
    assert logits.shape == (1, 4, len(tok))
    assert torch.equal(logits, model2(ids).logits)
    assert not torch.allclose(logits, model3(ids).logits)
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]


def test_unknown_arch_lists_known():
    with pytest.raises(ValueError, match="llama.*qwen2"):
        build_tiny_model(arch="gpt9")


def test_save_load_round_trip_same_ids_decode_and_logits(tmp_path):
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=3)
    save_policy(model, tok, tmp_path / "p")
    cfg = json.loads((tmp_path / "p" / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    model2, tok2 = load_policy(tmp_path / "p")
    ids = tok(R1_ZERO)["input_ids"]
    assert tok2(R1_ZERO)["input_ids"] == ids
    assert tok2.decode(ids) == R1_ZERO  # spaces and newlines survive (the Qwen2Tokenizer trap)
    assert tok2.pad_token_id == 0 and tok2.eos_token_id == 2
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(model(x).logits, model2(x).logits)
    msgs = [{"role": "user", "content": "1+1"}]
    assert (
        tok2.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        == "<|user|>1+1\n<|assistant|>"
    )


def test_save_load_even_when_config_class_is_the_backend_name(tmp_path):
    # transformers 5 writes "TokenizersBackend"; older folders say "PreTrainedTokenizerFast";
    # both must load tokenizer.json as is, not the Qwen2 tokenizer that drops spaces.
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    _, tok2 = load_policy(tmp_path)
    assert tok2.decode(tok2("a b  c")["input_ids"]) == "a b  c"


def test_load_policy_dtype_and_gradient_checkpointing(tmp_path):
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2)
    save_policy(model, tok, tmp_path)
    m, _ = load_policy(tmp_path, dtype="bfloat16", gradient_checkpointing=True)
    assert next(m.parameters()).dtype == torch.bfloat16
    assert getattr(m, "is_activation_checkpointing", None) or m.is_gradient_checkpointing
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        load_policy(tmp_path, dtype="float8")
