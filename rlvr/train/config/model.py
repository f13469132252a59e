"""The model sections: the policy every stage loads (ModelConfig) and the teacher of on-policy and offline
distillation (TeacherConfig); `resuming`, under which a resumed run's config loads."""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from rlvr.train.config.checks import Checks

# model.attn_implementation values: rlvr.models.loading.ATTN_IMPLEMENTATIONS (a test checks they agree),
# spelled out because importing rlvr.models imports torch.
AttnImplementation = Literal["auto", "sdpa", "eager", "flash_attention_2"]
ATTN_IMPLEMENTATIONS: tuple[str, ...] = get_args(AttnImplementation)
# Not a style choice: AdamW's eps (1e-8) is 0 in float16 (smallest subnormal 6e-8), and so are second moments of
# gradients below ~2e-4, so updates divide by zero and go to NaN. The loader says this for model.dtype=float16.
_FLOAT16 = ("AdamW's eps and small second moments underflow to 0 in float16 and training goes to NaN; use "
            "{key}=bfloat16 (same memory) or float32")


@dataclass
class ModelConfig:
    """Which policy to train and how to build or load it."""

    name: str = "tiny"
    """'tiny' builds a small Qwen2-style model with a char-level tokenizer from scratch; else a local model folder or a hub id."""
    init_from: str = ""
    """Start from these weights: a run directory (its last checkpoint) or a checkpoint directory; '' = fresh."""
    hidden_size: int = 64
    """Tiny model only: hidden width."""
    num_layers: int = 2
    """Tiny model only: transformer layers."""
    num_heads: int = 4
    """Tiny model only: attention heads."""
    intermediate_size: int = 256
    """Tiny model only: MLP width."""
    tie_embeddings: bool = False
    """Tiny model only: share input embedding and output head (learns 3-digit addition faster from scratch)."""
    dtype: Literal["float32", "bfloat16"] = field(default="float32", metadata={"refused": {"float16": _FLOAT16}})
    """Parameter dtype: float32 | bfloat16 (float16 is refused: AdamW's eps underflows in it)."""
    master_weights: Literal["float32", "same"] = "float32"
    """Optimizer (master) copy of the weights when dtype=bfloat16: float32 (bf16 forward/backward, fp32 AdamW
    update copied back) or same (update in the parameter dtype)."""
    device: str = "cpu"
    """torch device of the policy (cpu, cuda, cuda:0)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    compile_layers: bool = False
    """Regional torch.compile of the decoder layers for the learner's forwards (one layer's compile serves all;
    dynamic shapes; cached in ~/.cache/rlvr/torch_compile); the samplers run them eager. Meant for CUDA and the
    packed layout (algo.packing, auto there): on the shared-prefix cascade (the CPU default) the layers compile
    several times, which a warning says (set algo.packing=true); off by default until measured on a GPU
    (benchmarks/gpu.py's compile row); not with distributed.learner=fsdp2. Read by the stages that train (train, sft,
    ei, distill); eval and filter only sample, and keep it off."""
    attn_implementation: AttnImplementation = "auto"
    """Attention kernel for real models: auto (sdpa where available), sdpa, eager, flash_attention_2."""
    disable_dropout: bool = True
    """Turn every dropout of the model off after loading (TRL's name). RL needs it (the training forward runs in
    train mode, old-logprob / reference / sampling forwards in eval mode: with dropout the on-policy ratio is not
    1); rlvr sft defaults to false (its evaluation forwards run in eval mode, so only its training keeps dropout)."""
    lora_rank: int = 0
    """LoRA (needs peft: pip install 'rlvr[lora]'): rank r of the adapters on model.lora_target_modules; only the
    adapters train (and hold optimizer state), the reference policy is the model with its adapter off; 0 = off."""
    lora_alpha: float = 16.0
    """LoRA: the adapter's update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """LoRA: dropout on the adapters' input in train mode (needs model.disable_dropout=false: RL needs none)."""
    lora_target_modules: str = "all-linear"
    """LoRA: the linear layers that get an adapter: all-linear (every projection of attention and MLP, not the
    output head) or a comma list of module names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)."""

    def validate(self) -> None:
        """Names and ranges of the model section, before any model is built."""
        c = Checks("model")
        c.choices(self)
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            c.at_least(name, getattr(self, name), 1)
        if self.name == "tiny" and not self.init_from and self.num_heads >= 1 and self.hidden_size % self.num_heads:
            c.error(f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}")
        if self.init_from:
            if not Path(self.init_from).exists() and not (self.lora_rank <= 0 and _resumed_run_has_weights()):
                c.error(f"model.init_from={self.init_from}: no such run, checkpoint or model directory")
        c.device("device", self.device)
        self._validate_lora(c)
        c.done()

    def _validate_lora(self, c: Checks) -> None:
        c.at_least("lora_rank", self.lora_rank, 0)
        if self.lora_rank <= 0:
            return
        if importlib.util.find_spec("peft") is None:
            c.error(f"model.lora_rank={self.lora_rank} needs the peft package: pip install 'rlvr[lora]' "
                    "(or pip install peft); or model.lora_rank=0 to train every weight")
        c.need("lora_alpha", self.lora_alpha, self.lora_alpha > 0, "> 0")
        c.need("lora_dropout", self.lora_dropout, 0 <= self.lora_dropout < 1, "in [0, 1)")
        if self.lora_dropout > 0 and self.disable_dropout:
            c.error(f"model.lora_dropout={self.lora_dropout} would be switched off by model.disable_dropout=true "
                    "(RL needs no dropout: the on-policy ratio is not 1 with it); set model.lora_dropout=0, or "
                    "model.disable_dropout=false to keep it")
        names = [t.strip() for t in self.lora_target_modules.split(",")]
        if not all(names) or not all(re.fullmatch(r"[A-Za-z0-9_.\-]+", t) for t in names):
            c.error(f"model.lora_target_modules={self.lora_target_modules!r}: use all-linear or a comma list of "
                    "module names such as q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")


@dataclass
class TeacherConfig:
    """On-policy distillation (`rlvr train`): the KL reference is a teacher model instead of the start policy."""

    model: str = ""
    """The teacher: a model folder, run directory, checkpoint or hub id ('' = none, the reference is the start
    policy). With it the student samples, the teacher scores every sampled token, and the KL settings
    (algo.kl_coef, algo.kl_in, algo.kl_estimator) pull the student to it; algo.kl_in=reward is the per-token
    reverse KL as the signal. It must share the student's tokenizer."""
    dtype: Literal["", "float32", "bfloat16", "float16"] = ""
    """Teacher weights' dtype ('' = model.dtype)."""
    device: str = ""
    """Device the teacher runs on ('' = model.device)."""

    def validate(self) -> None:
        c = Checks("teacher")
        c.choices(self)
        c.done()


_RESUMING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("rlvr_resuming", default=None)


@contextlib.contextmanager
def resuming(run_dir):
    """While a resumed run's config loads (`--resume RUN`): a model.init_from that is gone is no error when the
    run holds a checkpoint with a full model, from which the resume loads the policy (rlvr.train.session.
    resume_weights): a resume needs only the run directory."""
    token = _RESUMING.set(Path(run_dir))
    try:
        yield
    finally:
        _RESUMING.reset(token)


def _resumed_run_has_weights() -> bool:
    run = _RESUMING.get()
    return run is not None and any((m.parent / "model" / "config.json").is_file()
                                   for m in (run / "checkpoints").glob("step_*/meta.json"))
