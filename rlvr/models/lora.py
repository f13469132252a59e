"""LoRA through peft: wrap a policy, read its weights as the base model names them, save and load adapters.

Only the adapters train (model.lora_rank > 0): peft freezes every base weight, so the optimizer (which takes
the parameters with requires_grad) holds state for the adapters only, and the reference policy of the KL
penalty is the same module with its adapter off (rlvr.train.pg.reference), not a second copy.

What leaves the learner (rlvr.models.export.push_tensors): the merged weights W + scaling * B @ A under the
base model's own HF names, computed next to the learner's module without changing it (an engine with its own
copy of the model, a Ray generator actor, loads them as a full push). An in-process HF generator sharing the
module is given nothing to copy: the push is a LoraPush whose `module` is that module (HFGenerator.
update_weights). A vLLM engine built for a LoRA learner holds the base and takes the adapter alone
(VLLMGenerator: save_adapter into its folder, a new LoRARequest per push).

A checkpoint of a LoRA run (rlvr.runs.checkpoint) holds, in <checkpoint>/model, peft's adapter files
(adapter_model.safetensors, adapter_config.json) and the tokenizer; the base weights are written once per run
in RUN/base_model (a plain HF folder), which adapter_config.json's base_model_name_or_path names relative to
the adapter folder ("../../../base_model"). load_merged(<checkpoint>/model) loads base + adapter and merges
(merge_and_unload): what `rlvr eval` and model.init_from of a LoRA run get.

peft is an optional dependency (pip install 'rlvr[lora]'): it is imported inside the functions that need it.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_DIR = "base_model"  # RUN/base_model: the frozen base of a LoRA run, saved once
_PREFIX = "base_model.model."  # peft's prefix before the wrapped model's own names (its state_dict keys)


def is_lora(model) -> bool:
    """True for a peft-wrapped model (without importing peft)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def is_adapter_dir(path: str | Path) -> bool:
    """A folder holding a peft adapter (adapter_config.json)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def rank_of(model) -> int:
    """The LoRA rank of a peft model (its active adapter's r), 0 for a plain model."""
    if not is_lora(model):
        return 0
    cfg = model.peft_config[getattr(model, "active_adapter", "default")]
    return int(cfg.r)


def target_modules(spec: str) -> str | list[str]:
    """model.lora_target_modules as peft takes it: 'all-linear' or a list of module names."""
    spec = spec.strip()
    if spec == "all-linear":
        return spec
    return [t.strip() for t in spec.split(",") if t.strip()]


def wrap_lora(model, *, rank: int, alpha: float, dropout: float = 0.0, target: str = "all-linear"):
    """The model with LoRA adapters of rank `rank` on `target` (peft.get_peft_model): base weights frozen,
    adapters trainable; B starts at 0, so the wrapped model computes exactly what the base model did."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # ModelConfig.validate says so first; a config built in Python lands here
        raise ImportError("model.lora_rank > 0 needs the peft package: pip install 'rlvr[lora]'") from exc
    cfg = LoraConfig(r=int(rank), lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules(target),
                     bias="none", task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, cfg)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"model.lora_target_modules={target!r}: {exc}") from exc


def _lora_layers(base) -> dict[str, object]:
    from peft.tuners.lora import LoraLayer

    return {name: mod for name, mod in base.named_modules() if isinstance(mod, LoraLayer)}


def _hf_name(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _is_adapter_param(name: str) -> bool:
    return ".lora_" in name or name.startswith("lora_")


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded: FSDP2's DTensor) parameter; a collective when sharded."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _delta(layer, adapter: str, weight_of) -> torch.Tensor:
    """scaling * B @ A of one adapter of a LoRA Linear, from full tensors (weight_of: parameter -> full tensor),
    as peft's get_delta_weight computes it (transposed for fan_in_fan_out layers)."""
    a, b = weight_of(layer.lora_A[adapter].weight), weight_of(layer.lora_B[adapter].weight)
    delta = (b.float() @ a.float()) * layer.scaling[adapter]
    return delta.T if getattr(layer, "fan_in_fan_out", False) else delta


def _named_base_weights(model, merged: bool, state: dict[str, torch.Tensor] | None = None
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """(base HF name, tensor) of every base weight, merged with the active adapters when `merged`. The tensors
    come from the module (gathered one at a time when sharded: every rank must iterate) or, given `state`, from
    a full state dict of the peft model (its own names: base_model.model.<name>)."""
    base = model.get_base_model()
    layers = _lora_layers(base) if merged else {}
    if state is None:
        weight_of = full
    else:
        names = {id(p): _PREFIX + n for n, p in base.named_parameters()}

        def weight_of(p):
            return state[names[id(p)]]

    for name, p in base.named_parameters():
        if _is_adapter_param(name):
            continue
        w = weight_of(p).detach()
        if merged and name.endswith(".base_layer.weight"):
            layer = layers.get(name[: -len(".base_layer.weight")])
            if layer is not None and not getattr(layer, "merged", False):
                with torch.no_grad():
                    acc = None  # W + the deltas in float32, rounded to W's dtype once (rounding each delta to bf16
                    for adapter in layer.active_adapters:  # first loses an update under half a bf16 step of W)
                        if adapter in layer.lora_A:
                            acc = (w.float() if acc is None else acc) + _delta(layer, adapter, weight_of)
                    if acc is not None:
                        w = acc.to(w.dtype)
        yield _hf_name(name), w


class LoraPush:
    """push_tensors of a LoRA learner: iterates (base HF name, merged tensor), computed lazily one layer at a
    time (the learner's module is not modified); `module` is the learner, so a generator that shares it knows
    that there is nothing to copy."""

    def __init__(self, model):
        self.module = model

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return _named_base_weights(self.module, merged=True)


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors as peft saves them (get_peft_model_state_dict)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


# ------------------------------------------------------------------------------------ save / load


class _Weights:
    """A stand-in with save_pretrained for rlvr.models.loading.save_policy: a config and named tensors."""

    def __init__(self, config, tensors: dict[str, torch.Tensor]):
        self.config, self.tensors = config, tensors

    def save_pretrained(self, path: str) -> None:
        from safetensors.torch import save_file

        self.config.save_pretrained(path)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.tensors.items()},
                  str(Path(path) / "model.safetensors"), metadata={"format": "pt"})


def save_base(model, tokenizer, path: str | Path, state: dict[str, torch.Tensor] | None = None) -> Path:
    """The frozen base of a LoRA model as a plain HF folder (load_policy loads it); `state`: a full state dict of
    the peft model to read instead of the module (a sharded learner's, gathered)."""
    from rlvr.models.loading import save_policy

    base = model.get_base_model()
    return save_policy(_Weights(base.config, dict(_named_base_weights(model, False, state))), tokenizer, path)


def save_adapter(model, path: str | Path, *, base_ref: str, state: dict[str, torch.Tensor] | None = None) -> None:
    """peft's adapter files into `path`, with base_model_name_or_path = base_ref (relative: to `path`); `state`:
    a full state dict of the peft model to take the adapter from (a sharded learner's, gathered)."""
    path = Path(path)
    model.save_pretrained(str(path), **({} if state is None else {"state_dict": state}))
    cfg_file = path / ADAPTER_CONFIG
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    cfg["base_model_name_or_path"] = base_ref
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def base_dir_of(adapter_dir: str | Path) -> str:
    """The base model folder or hub id an adapter folder names (a relative path is relative to the folder)."""
    adapter_dir = Path(adapter_dir)
    ref = json.loads((adapter_dir / ADAPTER_CONFIG).read_text(encoding="utf-8")).get("base_model_name_or_path") or ""
    if not ref:
        raise FileNotFoundError(f"{adapter_dir}/{ADAPTER_CONFIG}: no base_model_name_or_path: the base model is unknown")
    local = adapter_dir / ref
    if not Path(ref).is_absolute() and (local / "config.json").exists():
        return str(local.resolve())
    if Path(ref).is_absolute() or ref.startswith("."):
        if not (Path(ref) / "config.json").exists():
            raise FileNotFoundError(f"{adapter_dir}: the base model {ref!r} its {ADAPTER_CONFIG} names is not there")
    return ref


def load_adapter(model, adapter_dir: str | Path, *, base: bool = True) -> None:
    """Restore a LoRA model from a checkpoint folder bit-exactly: the adapter's tensors, and with `base` the
    base weights from the folder its adapter_config names (they are frozen, but a resume must not depend on
    rebuilding them identically)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    state = load_file(str(adapter_dir / ADAPTER_WEIGHTS))
    result = set_peft_model_state_dict(model, state)
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise RuntimeError(f"{adapter_dir}: adapter does not match the model (model.lora_rank / "
                           f"model.lora_target_modules changed?): unexpected {unexpected[:5]}")
    ours = adapter_state(model)
    missing = [k for k in ours if k not in state]
    if missing:
        raise RuntimeError(f"{adapter_dir}: adapter does not match the model: missing {missing[:5]}")
    if base:
        base_path = Path(base_dir_of(adapter_dir))
        shards = sorted(base_path.glob("*.safetensors"))
        if not shards:
            return  # a hub base: rebuilt from its name, nothing on disk to compare
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_file(str(shard)))
        own = model.get_base_model()
        with torch.no_grad():
            for name, p in own.named_parameters():
                if _is_adapter_param(name):
                    continue
                hf = _hf_name(name)
                if hf in weights:
                    p.copy_(weights[hf].to(p.dtype))
                elif not _tied(own, hf):
                    raise RuntimeError(f"{base_path}: base weights lack {hf}")


def _tied(model, name: str) -> bool:
    return bool(getattr(model.config, "tie_word_embeddings", False)) and name.endswith("lm_head.weight")


def load_merged(adapter_dir: str | Path, *, dtype="float32", device="cpu", attn_implementation=None):
    """(model, tokenizer) of a LoRA checkpoint folder: its base loaded, the adapter applied and merged
    (peft merge_and_unload): a plain model, what `rlvr eval` and model.init_from of a LoRA run use. The
    tokenizer is the base folder's (the one the run trained with: save_base wrote it)."""
    from peft import PeftModel

    from rlvr.models.loading import load_policy

    adapter_dir = Path(adapter_dir)
    base, tok = load_policy(base_dir_of(adapter_dir), dtype=dtype, device=device,
                            attn_implementation=attn_implementation)
    model = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    model.eval()
    return model, tok
