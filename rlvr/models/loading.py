"""Loading and saving a policy (model + tokenizer) with transformers.

Padding convention: rlvr never relies on `tokenizer.padding_side`. Training/scoring batches are
right-padded by `rlvr.models.tokenize` (CS336 semantics) and generators build their own
left-padded batches; the attention mask is always passed explicitly. `load_policy` only
guarantees that a pad token exists (falling back to EOS, which is safe because of the masks).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# Tokenizer classes that mean "just the tokenizer.json, no model-specific Python class".
_PLAIN_TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}

# model.attn_implementation values; "auto" = sdpa where the model class supports it, else eager.
ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")

# A hub repo id: "org/name" (letters, digits, '-', '_', '.'; no leading punctuation). Legacy
# single-name ids ("gpt2") are still served by the hub, so a bare name is accepted too.
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*$")


class ModelLoadError(OSError):
    """A model folder or hub id that cannot be loaded; the message names it and the way out (the
    commands print it as one `error:` line). An OSError, like transformers' own loading errors."""


# Files that make a folder's tokenizer loadable (any one of them; tokenizer_config.json may name a
# vocab file of its own for remote-code tokenizers).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                    "spiece.model", "sentencepiece.bpe.model")


def check_model_folder(path: Path) -> None:
    """Raise ModelLoadError for a local model folder transformers cannot load, naming the problem:
    a config.json that is empty, not JSON or not a JSON object, or no tokenizer files (without them
    AutoTokenizer falls back to an empty vocabulary and the run trains on nothing)."""
    cfg_file = path / "config.json"
    text = cfg_file.read_text(errors="replace")
    how = "write it again with save_pretrained, or copy it from the model the weights came from"
    if not text.strip():
        raise ModelLoadError(f"{cfg_file}: config.json is empty ({how})")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{cfg_file}: config.json is not valid JSON ({exc}; {how})") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{cfg_file}: config.json is not a JSON object ({how})")
    if not any((path / name).is_file() for name in _TOKENIZER_FILES) and not any(path.glob("*.tiktoken")):
        raise ModelLoadError(
            f"{path}: no tokenizer files (tokenizer.json and tokenizer_config.json, or a vocabulary such as "
            "tokenizer.model or vocab.json + merges.txt): copy them into the folder from the model the weights "
            "came from (e.g. `hf download ORG/NAME tokenizer.json tokenizer_config.json --local-dir FOLDER`)")


def _hub_offline() -> bool:
    import os

    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - only a hint; transformers decides
        return False


def _hub_cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001
        return "~/.cache/huggingface/hub"


def _hub_unreachable() -> str | None:
    """The hub's address when a 3-second TCP connection to it fails (no network: transformers would
    retry for about a minute before failing), else None. Behind a proxy nothing is checked."""
    import os
    import socket
    from urllib.parse import urlparse

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return None
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        return endpoint
    return None


def _offline_error(repo_id: str) -> ModelLoadError:
    return ModelLoadError(
        f"model.name={repo_id}: not in the local Hugging Face cache ({_hub_cache_dir()}) and HF_HUB_OFFLINE=1 is "
        f"set: unset HF_HUB_OFFLINE to download it, download it first where there is network (`hf download "
        f"{repo_id}`), or give a local folder path (model.name=/path/to/model)")


def check_hub_model(repo_id: str) -> None:
    """Before transformers is asked for a hub id that is not cached: refuse at once when the hub
    cannot be reached (instead of a minute of retries and a traceback)."""
    if _hub_offline() or _hub_cached(repo_id):
        return  # offline: transformers fails at once, and load_policy words its error
    endpoint = _hub_unreachable()
    if endpoint is not None:
        raise ModelLoadError(
            f"model.name={repo_id}: the Hugging Face hub ({endpoint}) cannot be reached and the model is not in "
            f"the local cache ({_hub_cache_dir()}): give a local folder path (model.name=/path/to/model), or "
            "download it first where there is network; with HF_HUB_OFFLINE=1 rlvr does not try the hub")


def _load_error(name_or_path, exc: Exception) -> ModelLoadError:
    """transformers' error for `name_or_path`, as one line that names it (and the offline way out)."""
    if not isinstance(name_or_path, Path) and model_source(name_or_path) == "hub" and _hub_offline() \
            and not _hub_cached(str(name_or_path)):
        return _offline_error(str(name_or_path))
    first = " ".join(str(exc).split("\n")[0].split()) or type(exc).__name__
    return ModelLoadError(f"model.name={name_or_path}: cannot load it: {first}")


def model_source(name_or_path: str | Path) -> str:
    """"local" for an existing model folder, "hub" for something that can only be a hub id.

    Raises FileNotFoundError with a message naming the mistake instead of letting transformers
    report it as a sentencepiece or hub repo-id error:
    - an existing path without config.json: `not a Hugging Face model folder: PATH (no config.json)`;
    - a path that does not exist and does not look like a hub id (absolute, ./ ../ ~, more than one
      '/', characters a repo id cannot have): `model.name=PATH: no such folder, and not a hub id
      (org/name)`.
    A missing two-part path such as runs/sft is indistinguishable from a hub id and goes to the hub
    (transformers then says the repo does not exist, or that it is offline).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir() and (path / "config.json").is_file():
            return "local"
        raise FileNotFoundError(f"not a Hugging Face model folder: {text} (no config.json)")
    local_looking = (
        isinstance(name_or_path, Path)
        or text.startswith(("/", "./", "../", "~", "."))
        or "\\" in text
        or not _HUB_ID.match(text)
        or ".." in text
        or "--" in text
    )
    if local_looking:
        raise FileNotFoundError(f"model.name={text}: no such folder, and not a hub id (org/name)")
    return "hub"


def resolve_attn_implementation(requested: str | None, model_cls=None) -> str | None:
    """The attn_implementation to give transformers for `requested` (one of ATTN_IMPLEMENTATIONS).

    "auto" (or None) = "sdpa" when `model_cls` says it supports SDPA, else "eager"; without a
    class (remote code we cannot inspect before loading) None, which lets transformers make the
    same choice itself. Explicit names are returned as given (transformers reports what a
    model does not support, e.g. flash_attention_2 without the flash-attn package or a GPU).
    """
    if requested in (None, "auto"):
        if model_cls is None:
            return None
        return "sdpa" if getattr(model_cls, "_supports_sdpa", False) else "eager"
    if requested not in ATTN_IMPLEMENTATIONS:
        raise ValueError(
            f"model.attn_implementation={requested!r} is not one of {', '.join(ATTN_IMPLEMENTATIONS)}"
        )
    return requested


def _causal_lm_class(name_or_path: str | Path, trust_remote_code: bool):
    """The transformers class AutoModelForCausalLM would build for this folder/id, or None when it
    cannot be known cheaply (remote code, unknown config)."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code)
        return AutoModelForCausalLM._model_mapping[type(config)]
    except Exception:  # noqa: BLE001 - only a hint for "auto"; loading reports real errors
        return None


def enable_gradient_checkpointing(model) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant, so it works
    with inputs that do not require grad and with no_grad scoring), and switch the config's KV
    cache off: a training forward must not build a cache. Generation is unaffected: rlvr's
    generators pass use_cache explicitly and run the model in eval mode, where transformers skips
    checkpointing."""
    # transformers 5 renamed gradient -> activation checkpointing; older versions lack the new name.
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def decoder_layers(model) -> list:
    """The decoder layers of a causal LM: model.model.layers (Qwen2, Llama, ... and the tiny model), else every
    submodule whose class name ends in DecoderLayer / Block (a LoRA-wrapped model, GPT-2's blocks)."""
    inner = getattr(getattr(model, "model", None), "layers", None)
    if inner is not None:
        return list(inner)
    return [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]


def compile_layers(model) -> int:
    """Regional compilation (model.compile_layers): each decoder layer's forward becomes its class's forward
    under torch.compile (dynamic shapes: every packed length is a new one), bound to the layer as an instance
    attribute. One compile serves every layer of a class (their parameters are the compiled graph's inputs),
    so compiling costs one layer, not the model. A copy of the model (copy.deepcopy: the KL reference, a
    separate critic, a sampler's twin) binds the same compiled function to its own layers, never to the
    original's. The samplers run the layers eager (rlvr.rollout: torch.compiler.set_stance("force_eager")
    around generation; the CUDA-graph decode captures eager kernels). Returns how many layers were compiled."""
    import types

    import torch

    from rlvr.runtime import use_compile_cache

    use_compile_cache()
    compiled: dict[type, object] = {}
    layers = decoder_layers(model)
    for layer in layers:
        cls = type(layer)
        if cls not in compiled:
            compiled[cls] = torch.compile(cls.forward, dynamic=True)
        layer.forward = types.MethodType(compiled[cls], layer)
    return len(layers)


# Float attributes through which transformers' attention modules apply dropout themselves (Qwen2, Llama,
# Mistral: `attention_dropout`, read at every forward as `0.0 if not self.training else ...`).
_DROPOUT_ATTRS = ("attention_dropout", "attn_dropout", "dropout", "dropout_p", "hidden_dropout", "activation_dropout")


def disable_dropout(model) -> int:
    """Switch every dropout of `model` off for good, in train() mode too; returns how many were on.

    Sets p = 0 on every nn.Dropout-family module (GPT-2's resid/embd/attn pdrop, Phi, ...) and zeroes the
    float dropout attributes of attention modules (`attention_dropout` of Qwen2 / Llama, which no
    nn.Dropout carries; TRL's disable_dropout_in_model misses those). The config is left as loaded, so
    a saved checkpoint keeps the model's own dropout for whoever fine-tunes it later. RL needs this: the
    training forward runs in train() mode while the old-logprob, reference and sampling forwards run in
    eval(), so with dropout on the first on-policy ratio is not 1 and the KL to an identical reference
    is not 0 (TRL and verl disable dropout for RL too)."""
    import torch

    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            changed += module.p > 0
            module.p = 0.0
            continue
        for name in _DROPOUT_ATTRS:
            value = getattr(module, name, None)
            if isinstance(value, float) and value > 0:
                setattr(module, name, 0.0)
                changed += 1
    return int(changed)


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

    if model_source(name_or_path) == "local":  # a clear error for a wrong local path, before transformers guesses
        name_or_path = Path(str(name_or_path)).expanduser()
        check_model_folder(name_or_path)
    else:
        check_hub_model(str(name_or_path))
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
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(name_or_path), trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise _load_error(name_or_path, exc) from exc
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
    """Load (model, tokenizer) from a local folder (or a hub id when a hub is reachable).

    dtype: "float32" | "bfloat16" | "float16" | "auto" | a torch.dtype. device: torch device
    string. attn_implementation: one of ATTN_IMPLEMENTATIONS or None (= "auto": sdpa where the
    model class supports it, else eager; see resolve_attn_implementation).
    gradient_checkpointing: see enable_gradient_checkpointing.
    A path that exists but has no config.json, or a local-looking path that does not exist,
    raises FileNotFoundError naming it (see model_source) before transformers is asked.
    The model is returned in eval mode; trainers call .train() themselves.
    """
    from transformers import AutoModelForCausalLM

    if model_source(name_or_path) == "local":
        name_or_path = Path(str(name_or_path)).expanduser()
    tokenizer = load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    kwargs = {"trust_remote_code": trust_remote_code}
    torch_dtype = _torch_dtype(dtype)
    if torch_dtype is not None:
        kwargs[_dtype_kwarg()] = torch_dtype
    if attn_implementation in (None, "auto"):
        attn = resolve_attn_implementation("auto", _causal_lm_class(name_or_path, trust_remote_code))
    else:
        attn = resolve_attn_implementation(attn_implementation)
    if attn is not None:
        kwargs["attn_implementation"] = attn
    try:
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
    except OSError as exc:  # e.g. no weights file
        raise _load_error(name_or_path, exc) from exc
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.to(device)
    model.eval()
    return model, tokenizer


def save_policy(model, tokenizer, path: str | Path, *, state_dict=None) -> Path:
    """Save model + tokenizer so that `load_policy(path)` round-trips exactly (same ids, decode
    and logits). state_dict: the weights to write instead of the model's own (a sharded learner's
    gathered full state). A plain fast tokenizer is recorded as "PreTrainedTokenizerFast" so that any
    loader (ours or AutoTokenizer-based tools that honour tokenizer_class) keeps tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), **({"state_dict": state_dict} if state_dict is not None else {}))
    tokenizer.save_pretrained(str(path))
    if type(tokenizer) is PreTrainedTokenizerFast or type(tokenizer).__name__ in _PLAIN_TOKENIZER_CLASSES:
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text())
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return path
