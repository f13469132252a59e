"""`rlvr demo` (tiny model, SFT warm-up, then GRPO with only the verifier): DemoConfig, flat (it builds the
SFT and RL configs itself, rlvr.train.demo)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DemoConfig:
    """`rlvr demo`: tiny model, SFT warm-up, then GRPO with only the verifier."""

    out_dir: str = "runs/demo"
    """Where the SFT and GRPO run directories and demo.json go (overwritten)."""
    seed: int = 0
    """Seed of the model init, data order and sampling."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS, else 1 (fastest on small shared machines)."""
    digits: int = 1
    """Digits per operand of the additions."""
    operands: int = 4
    """Terms per addition ("3+5+7+1=")."""
    num_train: int = 8000
    """Synthetic training problems (SFT uses the first sft_examples; RL draws from the rest)."""
    sft_examples: int = 3000
    """Labeled problems the SFT warm-up may see."""
    num_eval: int = 200
    """Held-out problems of the before/after table."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 2
    """Transformer layers."""
    sft_steps: int = 1500
    """Most SFT optimizer steps (batch sft_batch_size); SFT stops earlier once partly right."""
    sft_target_accuracy: float = 0.2
    """Stop SFT once greedy accuracy on a validation slice (training-split problems, not the
    held-out ones) reaches this; checked every sft_eval_every steps."""
    sft_eval_every: int = 25
    """SFT steps between validation checks."""
    sft_lr: float = 3e-3
    """SFT learning rate (constant after 20 warmup steps)."""
    sft_batch_size: int = 64
    """SFT examples per step."""
    rl_steps: int = 100
    """GRPO steps."""
    rl_lr: float = 5e-4
    """GRPO learning rate (2e-3 and above collapsed in tuning runs)."""
    n_prompts: int = 64
    """GRPO prompts per step."""
    group_size: int = 8
    """GRPO samples per prompt."""
    max_tokens: int = 4
    """Maximum response length (sums of four digits have at most 2 digits + EOS)."""
    progress: bool = True
    """Show progress bars."""
