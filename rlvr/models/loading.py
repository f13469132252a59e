"""Loading and saving a policy (model + tokenizer) with transformers.

Padding convention: rlvr never relies on `tokenizer.padding_side`. Training/scoring batches are
right-padded by `rlvr.models.tokenize` (CS336 semantics) and generators build their own
left-padded batches; the attention mask is always passed explicitly. `load_policy` only
guarantees that a pad token exists (falling back to EOS, which is safe because of the masks).
"""

from __future__ import annotations

import json
from pathlib import Path

# Tokenizer classes that mean "just the tokenizer.json, no model-specific Python class".
_PLAIN_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def _torch_dtype(dtype):
    import torch

    if dtype is None or dtype == "auto":
        return "auto" if dtype == "auto" else None
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(table)} or 'auto'")
    return table[dtype]


def _dtype_kwarg() -> str:
    # transformers 4.56 renamed from_pretrained's `torch_dtype` to `dtype`; older versions would
    # silently ignore `dtype` and load float32 (vLLM's venv may hold a 4.x transformers).
    import transformers

    major, minor = (
        int("".join(c for c in p if c.isdigit()) or 0) for p in transformers.__version__.split(".")[:2]
    )
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def load_tokenizer(name_or_path: str | Path, *, trust_remote_code: bool = False):
    """Load a tokenizer and make sure it has a pad token.

    Trap avoided here: `AutoTokenizer` on a folder whose config.json says model_type "qwen2"
    returns the Qwen2 tokenizer class, which rebuilds the pre-tokenizer and silently drops the
    spaces of a character-level tokenizer. When tokenizer_config.json names a plain fast
    tokenizer class, the tokenizer.json is loaded as is.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    path = Path(name_or_path)
    cfg_file = path / "tokenizer_config.json"
    tok_class = None
    if cfg_file.is_file():
        try:
            tok_class = json.loads(cfg_file.read_text()).get("tokenizer_class")
        except json.JSONDecodeError as exc:
            raise ValueError(f"{cfg_file}: invalid JSON: {exc}") from exc
    if tok_class in _PLAIN_TOKENIZER_CLASSES and (path / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    name_or_path: str | Path,
    *,
    dtype="float32",
    device="cpu",
    attn_implementation: str | None = None,
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
):
    """Load (model, tokenizer) from a local folder (or a hub name when a hub is reachable).

    dtype: "float32" | "bfloat16" | "float16" | "auto" | a torch.dtype. device: torch device
    string. attn_implementation: passed to transformers ("eager", "sdpa", "flash_attention_2").
    gradient_checkpointing: enable non-reentrant checkpointing and turn off the KV cache in the
    config (the generators pass use_cache explicitly, so generation still uses a cache).
    The model is returned in eval mode; trainers call .train() themselves.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    kwargs = {"trust_remote_code": trust_remote_code}
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype is not None:
        kwargs[_dtype_kwarg()] = torch_dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if gradient_checkpointing:
        # transformers 5 renamed gradient -> activation checkpointing; older versions lack the new name.
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model.to(device)
    model.eval()
    return model, tokenizer


def save_policy(model, tokenizer, path: str | Path) -> Path:
    """Save model + tokenizer so that `load_policy(path)` round-trips exactly (same ids, decode
    and logits). A plain fast tokenizer is recorded as "PreTrainedTokenizerFast" so that any
    loader (ours or AutoTokenizer-based tools that honour tokenizer_class) keeps tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    if type(tokenizer) is PreTrainedTokenizerFast or type(tokenizer).__name__ in _PLAIN_TOKENIZER_CLASSES:
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return path
