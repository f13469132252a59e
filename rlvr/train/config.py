"""Config dataclasses of the trainers: one per trainer, composed of small sections.

Every field has a one-line docstring on the line after it (an attribute docstring); `rlvr.config`
reads those for `--help` and `rlvr train --help-config`. Values derived from others and checks that
involve several fields (the batch-size arithmetic) live in `validate_*` functions, called right
after parsing and before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# ---------------------------------------------------------------------------------------- sections


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
    dtype: str = "float32"
    """Parameter dtype: float32 | bfloat16 (float16 is refused: AdamW's eps underflows in it)."""
    master_weights: str = "float32"
    """Optimizer (master) copy of the weights when dtype=bfloat16: float32 (bf16 forward/backward, fp32 AdamW
    update copied back) or same (update in the parameter dtype)."""
    device: str = "cpu"
    """torch device of the policy (cpu, cuda, cuda:0)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    attn_implementation: str = "auto"
    """Attention kernel for real models: auto (sdpa where available), sdpa, eager, flash_attention_2."""


@dataclass
class DataConfig:
    """Where prompts and references come from."""

    task: str = "arithmetic"
    """Task name from rlvr.data's registry (arithmetic, gsm8k, ...): loader, prompt template and checker."""
    train_path: str = ""
    """JSONL of training examples; '' = the task's built-in source (synthetic tasks generate their own)."""
    sft_path: str = ""
    """`rlvr sft` only: JSONL of {"prompt", "response"} pairs to train on instead of the task's own targets."""
    eval_path: str = ""
    """JSONL of held-out examples; '' = the task's built-in held-out split."""
    template: str = ""
    """Prompt template name (r1_zero, question_only, ...); '' = the task's default."""
    reward: str = ""
    """Reward function name from rlvr.rewards; '' = the task's default checker."""
    reward_workers: int = 1
    """Threads (and verifier processes) that score a rollout batch (rlvr.rewards.score_batch)."""
    reward_timeout_s: float = 0.0
    """Deadline per symbolic check (or per reward call with reward_isolate); 0 = RLVR_VERIFIER_TIMEOUT_S or 3 s."""
    reward_isolate: bool = False
    """Run every reward call in a killable worker process (for untrusted or slow reward functions)."""
    num_train: int = 20000
    """Synthetic tasks: how many training problems to generate (others: cap on rows read, 0 = all)."""
    num_eval: int = 200
    """Held-out problems used for periodic and final evaluation."""
    seed: int = 1234
    """Seed of the synthetic data generator and of the training-order shuffle."""
    digits: int = 3
    """Arithmetic task only: digits per operand."""
    operands: int = 2
    """Arithmetic task only: terms per problem ("3+5+7=" has 3)."""


@dataclass
class SamplingConfig:
    """How rollouts are sampled from the current policy."""

    n_prompts: int = 32
    """Prompts per RL step."""
    group_size: int = 8
    """Responses sampled per prompt (G); the rollout batch is n_prompts * group_size."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (evaluation has its own)."""
    top_p: float = 1.0
    """Nucleus sampling threshold of rollouts; 1.0 = off."""
    max_tokens: int = 16
    """Maximum response length in tokens; also the constant of seq_mean_token_sum_norm when algo.norm_length is 0."""
    stop: list[str] = field(default_factory=list)
    """Stop strings added to the task's own (r1_zero already stops at </answer>) and the end-of-sequence token."""
    keep_stop: bool = True
    """Keep the stop string at the end of the response text (the r1_zero reward needs the closing </answer>)."""
    thinking_budget: int = -1
    """Qwen3-style thinking budget: at most this many reasoning tokens, then "stop thinking" text is forced
    (kept out of the loss) and the answer sampled; -1 = off, 0 = no thinking."""
    stop_thinking_text: str = ""
    """Text forced when the thinking budget runs out; '' = Qwen3's ("Considering the limited time ... </think>")."""


@dataclass
class RolloutConfig:
    """Which engine samples rollouts, and where it runs."""

    backend: str = "hf"
    """hf (transformers, CPU or GPU, our own KV-cache loop) or vllm (GPU; pip install 'rlvr[vllm]')."""
    batch_size: int = 0
    """hf: sequences decoded together; 0 = the whole rollout batch (at least 64)."""
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
    sleep_mode: bool = True
    """vllm colocated: free the engine's KV cache and weights while the learner runs, wake for generation."""
    dtype: str = ""
    """vllm: engine dtype; '' = bfloat16."""


@dataclass
class AlgoConfig:
    """The policy-gradient objective; every name is a key of a registry in rlvr.algo."""

    advantage: str = "grpo"
    """Advantage estimator (rlvr.algo.ADVANTAGE_ESTIMATORS)."""
    adv_std: str = "population"
    """Std used by dividing estimators (grpo, batch_std): population (1/G, DeepSeekMath) or sample (1/(G-1))."""
    adv_eps: float = 1e-6
    """Stabilizer added to the std before dividing."""
    loss: str = "grpo_clip"
    """Per-token policy loss (rlvr.algo.POLICY_LOSSES)."""
    clip_low: float = 0.2
    """Lower clip range: ratio is clipped at 1 - clip_low."""
    clip_high: float = 0.2
    """Upper clip range: ratio is clipped at 1 + clip_high (DAPO's clip-higher sets it above clip_low)."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens; 0 = off."""
    kimi_tau: float = 1.0
    """kimi loss: the KL-regularization temperature tau."""
    aggregation: str = "seq_mean_token_mean"
    """How per-token losses become one number (rlvr.algo.LOSS_AGGREGATIONS)."""
    norm_length: int = 0
    """Constant of seq_mean_token_sum_norm (Dr. GRPO); 0 = sampling.max_tokens."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy; 0 = no reference model at all."""
    kl_estimator: str = "k3"
    """KL estimator (rlvr.algo.KL_ESTIMATORS): k1, k2, k3."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where kl_coef applies: loss (KL term added to the per-token loss) or reward (per-token penalty
    -kl_coef*KL(old || ref) whose reward-to-go is added to each token's advantage, REINFORCE++ style)."""
    ref_refresh_every: int = 0
    """Replace the reference policy by the current policy every k steps; 0 = keep the start policy."""
    epochs_per_rollout_batch: int = 1
    """Passes over each rollout batch; above 1 the ratio departs from 1 and clipping matters."""
    train_batch_size: int = 0
    """Rollouts per optimizer step; 0 = the whole rollout batch (one optimizer step per epoch)."""
    micro_batch_size: int = 0
    """Rollouts per forward/backward; 0 = train_batch_size (no accumulation)."""
    micro_batch_tokens: int = 0
    """Token budget per forward/backward (prompt + response, padded); > 0 replaces micro_batch_size by
    micro-batches of at most this many tokens (long responses get fewer rows)."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal from the loss (DAPO dynamic sampling, without resampling)."""
    length_reward: str = ""
    """Length-shaping term added to rewards before advantages: '' (none), kimi, dapo_overlong."""
    length_reward_coef: float = 0.0
    """Weight of the length term (kimi: multiplies lambda_i; dapo_overlong: multiplies the penalty)."""
    overlong_buffer: int = 4
    """dapo_overlong: soft-penalty window in tokens before sampling.max_tokens."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus (subtracted from the loss); 0 = none."""
    whiten_advantages: bool = False
    """Whiten advantages (after KL shaping) over the batch's valid response tokens: (A - mean) / std."""
    reuse_logprobs_on_policy: bool = True
    """On-policy with one optimizer step per rollout batch: take old logprobs as logp.detach() of the
    training forward instead of a separate no-grad forward (same numbers, one forward saved)."""


@dataclass
class OptimConfig:
    """AdamW, warmup, schedule and clipping."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear warmup from 0 to lr over this many optimizer steps."""
    schedule: str = "constant"
    """Learning-rate schedule after warmup: constant, linear, cosine (to min_lr_ratio * lr at the last step)."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of lr for linear/cosine."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping."""


@dataclass
class RunConfig:
    """Run directory, length, seeds, logging and checkpoints."""

    out_dir: str = "runs/train"
    """Run directory (created; resume with --resume out_dir)."""
    overwrite: bool = False
    """Replace an existing run in out_dir (its metrics, checkpoints and plots are deleted); else refuse."""
    steps: int = 60
    """Training steps (RL: rollout batches; SFT: optimizer steps)."""
    seed: int = 0
    """Seed of the model init, sampling and data order; the sampler's seed at step s is derived from (seed, s)."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    eval_every: int = 0
    """Evaluate on the held-out set every k steps; 0 = only at the end."""
    eval_greedy: bool = True
    """Evaluation uses greedy decoding (else samples at eval_temperature)."""
    eval_temperature: float = 1.0
    """Sampling temperature of sampled evaluation."""
    eval_batch_size: int = 256
    """Prompts per generate call during evaluation."""
    log_samples_every: int = 10
    """Write a few generations (prompt, response, reference, reward parts, entropy) every k steps; 0 = never."""
    num_log_samples: int = 4
    """Generations written each time samples are logged."""
    checkpoint_every: int = 0
    """Save a checkpoint every k steps (and always at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep on disk."""
    progress: bool = True
    """Show a live progress bar."""


# ---------------------------------------------------------------------------------------- trainers


@dataclass
class TrainConfig:
    """Policy-gradient (GRPO family) training: `rlvr train`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and references."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout sampling."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory and logging."""


@dataclass
class SFTAlgoConfig:
    """Supervised fine-tuning objective and batching."""

    batch_size: int = 32
    """Examples per optimizer step."""
    micro_batch_size: int = 0
    """Examples per forward/backward; 0 = batch_size (no accumulation)."""
    aggregation: str = "token_mean"
    """How token losses are normalized (rlvr.algo.LOSS_AGGREGATIONS): token_mean, seq_mean_token_mean, ..."""
    max_length: int = 256
    """Truncate prompt + response to this many tokens."""


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompt/response pairs, loss on response tokens only: `rlvr sft`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Examples; the response is the task's worked solution or its reference answer."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0))
    """Sampling for periodic evaluation (max_tokens, stop)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine of the periodic evaluation."""
    algo: SFTAlgoConfig = field(default_factory=SFTAlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """Optimizer."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/sft", steps=400))
    """Run directory and logging."""


@dataclass
class EvalSamplingConfig:
    """Decoding of `rlvr eval`."""

    n: int = 1
    """Samples per problem (n > 1 adds pass@k)."""
    temperature: float = 0.0
    """0 = greedy."""
    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off."""
    max_tokens: int = 16
    """Maximum response length in tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings added to the task's own and end-of-sequence."""
    keep_stop: bool = True
    """Keep the stop string at the end of the response text."""
    thinking_budget: int = -1
    """Qwen3-style thinking budget in tokens (-1 = off, 0 = no thinking); --thinking-budget 0,256,1024 sweeps."""
    stop_thinking_text: str = ""
    """Text forced when the thinking budget runs out; '' = Qwen3's."""
    batch_size: int = 256
    """Prompts per generate call."""


@dataclass
class EvalRunConfig:
    """Seed, threads and output of `rlvr eval`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out: str = ""
    """Write metrics (JSON) here, and the scored samples next to it as .samples.jsonl; '' = print only."""


@dataclass
class EvalConfig:
    """Evaluate a policy on a task's held-out problems: `rlvr eval`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy (model.init_from = run directory / checkpoint / model folder)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and held-out problems (data.num_eval of them)."""
    sampling: EvalSamplingConfig = field(default_factory=EvalSamplingConfig)
    """Decoding."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    run: EvalRunConfig = field(default_factory=EvalRunConfig)
    """Seed, threads, output file."""
