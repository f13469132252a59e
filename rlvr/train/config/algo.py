"""The policy-gradient objective of `rlvr train` (AlgoConfig), the tables of which key each loss, advantage
and correction reads, and the rules that read only this section: which keys another key makes inert
(inert_algo_problems) and the process-supervision keys (check_process). TrainConfig.validate
(rlvr.train.config.pg) runs them with the rules across sections.

The registries these names stand for live behind a torch import (rlvr.algo, rlvr.train.objective): the
names are spelled out here and tests check that they agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks, changed, default_of

# KL estimators whose gradient as a loss term is 0 in expectation (docs/algorithms.md section 4): refused
# with algo.kl_in=loss.
_KL_ZERO_LOSS_GRADIENT = ("k1",)
# KL "estimators" whose expected gradient as a loss term is that of no divergence (k1_clamped: pi's mass on
# {pi > ref}; docs/algorithms.md section 4): refused with algo.kl_in=loss too.
_KL_NO_DIVERGENCE_LOSS_GRADIENT = ("k1_clamped",)
# algo.rollout_correction values: auto, none and rlvr.algo.ROLLOUT_CORRECTIONS (a test checks they agree).
ROLLOUT_CORRECTION_MODES = ("auto", "none", "token_tis", "token_mask", "seq_tis", "seq_mask")
# algo.length_reward values: the keys of rlvr.train.objective.LENGTH_REWARDS (a test checks they agree),
# spelled out because that module imports the models.
LENGTH_REWARD_NAMES = ("", "kimi", "dapo_overlong")


# Which policy losses read which keys (rlvr.algo.losses; tests/test_config_inert.py checks each against the
# loss functions themselves): grpo_clip and gspo clip the ratio at [1 - clip_low, 1 + clip_high] and take the
# dual clip, cispo clips its detached weight; no_baseline / reinforce_with_baseline (REINFORCE), grpo_no_clip
# and kimi clip nothing; only kimi reads tau (algo.kimi_tau).
CLIPPING_LOSSES = ("grpo_clip", "gspo", "cispo")
DUAL_CLIP_LOSSES = ("grpo_clip", "gspo")
# Advantages that divide by a standard deviation, so read algo.adv_std and algo.adv_eps (rlvr.algo.advantages;
# process normalises its step rewards the same way, rlvr.train.process); no_baseline, zero, group_mean, rloo and
# gae (the critic's values) read neither.
STD_ADVANTAGES = ("grpo", "batch_std", "process")
# PPO's critic keys: read only with algo.advantage=gae (rlvr.train.critic, rlvr.train.targets.gae_targets).
_GAE_KEYS = ("gamma", "gae_lambda", "value_coef", "value_clip", "critic_lr")


@dataclass
class AlgoConfig:
    """The policy-gradient objective; every name is a key of a registry in rlvr.algo."""

    advantage: str = "grpo"
    """Advantage estimator (rlvr.algo.ADVANTAGE_ESTIMATORS), gae (PPO's critic) or process (per-step rewards)."""
    adv_std: str = "population"
    """Std used by dividing estimators (grpo, batch_std, process): population (1/G, DeepSeekMath) or sample (1/(G-1))."""
    adv_eps: float = 1e-6
    """Stabilizer added to the std before dividing (grpo, batch_std, process)."""
    process_outcome_coef: float = 0.0
    """advantage=process: weight of the outcome's GRPO advantage added to every token's step advantage; 0 = steps only."""
    process_baseline: Literal["group", "step"] = "group"
    """advantage=process: group (DeepSeekMath: step rewards minus the mean of all the group's step rewards) or step
    (minus the group's mean at the same step index, so a step every response fails pushes on nothing); both / group std."""
    loss: str = "grpo_clip"
    """Per-token policy loss (rlvr.algo.POLICY_LOSSES)."""
    clip_low: float = 0.2
    """Lower clip range: ratio is clipped at 1 - clip_low (cispo: the detached weight; 1 = no lower bound). Read by
    grpo_clip, gspo and cispo only (refused with another loss unless left at its default)."""
    clip_high: float = 0.2
    """Upper clip range: ratio is clipped at 1 + clip_high (DAPO's clip-higher sets it above clip_low); grpo_clip,
    gspo and cispo only."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (grpo_clip, gspo); 0 = off."""
    kimi_tau: float = 1.0
    """kimi loss only: the KL-regularization temperature tau."""
    aggregation: str = "seq_mean_token_mean"
    """How per-token losses become one number (rlvr.algo.LOSS_AGGREGATIONS)."""
    norm_length: int = 0
    """Constant of algo.aggregation=seq_mean_token_sum_norm (Dr. GRPO), read by it only; 0 = sampling.max_tokens."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy; 0 = no reference model at all."""
    kl_estimator: str = "k3"
    """KL estimator (rlvr.algo.KL_ESTIMATORS): k1, k2, k3, k1_clamped. In the loss k2's gradient is that of
    KL(pi || ref), k3's that of KL(ref || pi), k1's is 0 and k1_clamped's no divergence's (both refused there);
    in the reward only k1's is that of KL(pi || ref) (docs/algorithms.md section 4). Needs algo.kl_coef > 0."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where kl_coef applies: loss (KL term added to the per-token loss) or reward (per-token penalty
    -kl_coef*KL(old || ref) whose reward-to-go is added to each token's advantage, REINFORCE++ style)."""
    ref_refresh_every: int = 0
    """Replace the reference policy by the current policy every k steps (needs algo.kl_coef > 0); 0 = keep the
    start policy."""
    epochs_per_rollout_batch: int = 1
    """Passes over each rollout batch; above 1 the ratio departs from 1 and clipping matters."""
    train_batch_size: int = 0
    """Rollouts per optimizer step; 0 = the whole rollout batch (one optimizer step per epoch)."""
    num_minibatches: int = 0
    """Optimizer steps per epoch over the rollout batch (train_batch_size = rollout batch / this); 0 = use
    train_batch_size. Recipes set this (kimi, ppo) because it does not depend on the batch size."""
    micro_batch_size: int = 0
    """Rollouts per forward/backward; 0 = train_batch_size (no accumulation)."""
    micro_batch_tokens: int = 0
    """Token budget per forward/backward (prompt + response, padded; real tokens only with algo.packing); > 0 replaces micro_batch_size by
    micro-batches of at most this many tokens (long responses get fewer rows)."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal from the loss (DAPO dynamic sampling)."""
    refill_rounds: int = 0
    """With filter_zero_variance: sample up to this many extra batches of sampling.n_prompts new problems
    per step to replace the dropped groups until the batch holds n_prompts groups (DAPO); 0 = no refill."""
    length_reward: str = ""
    """Length-shaping term added to rewards before advantages: '' (none), kimi, dapo_overlong; needs
    algo.length_reward_coef > 0 (there is no default weight: Kimi k1.5 gives none)."""
    length_reward_coef: float = 0.0
    """Weight of the length term (kimi: multiplies lambda_i; dapo_overlong: multiplies the penalty, verl's
    overlong_buffer.penalty_factor); > 0 exactly when algo.length_reward is set (recipes: kimi 0.1, dapo 1.0)."""
    overlong_buffer: int = 4
    """dapo_overlong: soft-penalty window in tokens before sampling.max_tokens (verl's overlong_buffer.len)."""
    length_reward_warmup_steps: int = 0
    """Steps at the start during which the length term is off (Kimi k1.5's warm-up); 0 = on from step 1."""
    critic: Literal["", "shared", "separate"] = ""
    """Value model for algo.advantage=gae (PPO): shared (a value head on the policy's trunk, value loss
    added to the policy's) or separate (a copy of the start policy with a value head, own optimizer)."""
    gamma: float = 1.0
    """gae: discount per token."""
    gae_lambda: float = 0.95
    """gae: lambda of generalized advantage estimation (1 = Monte Carlo return minus value)."""
    value_coef: float = 0.5
    """gae: weight of the value loss in the summed loss."""
    value_clip: float = 0.2
    """gae: clip range of the value loss around the rollout-time values; 0 = unclipped."""
    critic_lr: float = 0.0
    """gae: learning rate of the value model's optimizer (head, and trunk when separate); 0 = optim.lr."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus (subtracted from the loss); 0 = none."""
    entropy_mask_quantile: float = 1.0
    """Train the policy term on the top-q share of response tokens by entropy ("80/20", TRL's top_entropy_quantile):
    the threshold is the (1 - q) quantile over the whole minibatch (a no-grad entropy forward before its first
    micro-batch); the others keep their KL / entropy terms and still count in the normalizers; 1 = all tokens."""
    whiten_advantages: bool = False
    """Whiten advantages (after KL shaping) over the batch's valid response tokens: (A - mean) / std."""
    reuse_logprobs_on_policy: bool = True
    """On-policy with one optimizer step per rollout batch: take old logprobs as logp.detach() of the
    training forward instead of a separate no-grad forward (same numbers, one forward saved)."""
    shared_prefix: bool = True
    """Training forwards run each group's prompt once and reuse its keys/values for the group's responses
    (rlvr.models.prefix: same numbers up to float rounding, less work); false = every row whole."""
    packing: Literal["auto", True, False] = "auto"
    """Padding-free learner forwards (rlvr.models.packed): a micro-batch's rows concatenated into one sequence,
    attention by a flex_attention document mask, the LM head on response tokens only, micro_batch_tokens
    counting real tokens; with shared_prefix each group's prompt is in the sequence once, its responses
    attending to it through the mask; same numbers up to float rounding. auto = on when the policy is on
    CUDA (compiled flex_attention) and off on CPU, where the padded (cascade) path is faster; true also packs
    on CPU (a dense mask there: for checks). LoRA (peft) policies pack too."""
    rollout_correction: str = "auto"
    """Correct the sampler/trainer mismatch with importance weights pi_old/pi_sampler (rlvr.algo.correction):
    token_tis (min(ratio, cap) per token), token_mask (tokens with ratio outside [low, cap] leave the loss),
    seq_tis / seq_mask (the same on the response's ratio), none; auto = token_tis for rollout.backend=vllm,
    none for hf (the sampler is the trainer's own code)."""
    rollout_correction_cap: float = 2.0
    """rollout_correction: the cap of the *_tis weights and the upper bound of the *_mask modes (>= 1; TRL, verl: 2)."""
    rollout_correction_low: float = 0.0
    """rollout_correction *_mask: ratios below this leave the loss too (in [0, 1]); 0 = only ratios above the cap,
    as TRL's masks."""

    def kl_loss_problem(self) -> str | None:
        """Why the KL term as configured regularises nothing, or toward no divergence, or None (also checked by
        TrainConfig.validate)."""
        if self.kl_coef > 0 and self.kl_in == "loss" and self.kl_estimator in _KL_ZERO_LOSS_GRADIENT:
            # E_{y~pi}[grad (log pi(y) - log ref(y))] = sum_y grad pi(y) = 0: a penalty that pulls on nothing
            return (f"algo.kl_estimator={self.kl_estimator!r} with algo.kl_in=loss regularises nothing: the "
                    "gradient of logp - ref_logp is 0 in expectation over tokens sampled from the policy; use "
                    "algo.kl_estimator=k2 (its loss gradient is that of KL(pi || ref)) or algo.kl_in=reward "
                    "(k1 as a per-token reward penalty, as PPO does)")
        if self.kl_coef > 0 and self.kl_in == "loss" and self.kl_estimator in _KL_NO_DIVERGENCE_LOSS_GRADIENT:
            # E_{y~pi}[grad max(d, 0)] = E[1[d > 0] grad log pi] = grad pi(S), S = {y: pi(y) > ref(y)}
            return (f"algo.kl_estimator={self.kl_estimator!r} with algo.kl_in=loss descends neither KL direction: "
                    "its expected gradient is that of pi(S), the policy's mass on the tokens it prefers to the "
                    "reference (docs/algorithms.md section 4); use algo.kl_estimator=k2 (KL(pi || ref)) or k3 "
                    "(KL(ref || pi)) in the loss, or algo.kl_in=reward (AlpacaFarm's reward shaping)")
        return None

    def validate(self) -> None:
        """k1 as a loss term, and the rollout-correction keys (the other names and cross-field checks:
        TrainConfig.validate)."""
        c = Checks("algo")
        if (problem := self.kl_loss_problem()) is not None:
            c.error(problem)
        c.one_of("rollout_correction", self.rollout_correction, ROLLOUT_CORRECTION_MODES)
        c.at_least("rollout_correction_cap", self.rollout_correction_cap, 1)
        c.fraction("entropy_mask_quantile", self.entropy_mask_quantile)
        c.need("rollout_correction_low", self.rollout_correction_low, 0 <= self.rollout_correction_low <= 1,
               "in [0, 1]")
        c.done()


def inert_algo_problems(a: AlgoConfig, backend: str = "hf") -> list[str]:
    """The algo keys that do nothing under the other keys' values (a default is never one of them)."""
    out = []
    # the length term: LENGTH_REWARDS[length_reward] * length_reward_coef, off for length_reward_warmup_steps
    if a.length_reward and a.length_reward_coef == 0:
        out.append(f"algo.length_reward={a.length_reward!r} adds nothing with algo.length_reward_coef=0 (the term is "
                   "multiplied by it; Kimi k1.5 gives no weight, verl's overlong_buffer.penalty_factor is 1.0): set "
                   "algo.length_reward_coef > 0 (recipe kimi: 0.1, recipe dapo: 1.0), or leave algo.length_reward "
                   "empty")
    if not a.length_reward and a.length_reward_coef > 0:
        out.append(f"algo.length_reward_coef={a.length_reward_coef} weights a length term, but algo.length_reward is "
                   "empty: set algo.length_reward=kimi or dapo_overlong, or algo.length_reward_coef=0")
    if changed(a, "overlong_buffer") and a.length_reward != "dapo_overlong":
        out.append(f"algo.overlong_buffer={a.overlong_buffer} is the window of algo.length_reward=dapo_overlong, and "
                   f"algo.length_reward={a.length_reward!r}: set algo.length_reward=dapo_overlong, or leave "
                   f"algo.overlong_buffer={default_of(a, 'overlong_buffer')}")
    if a.length_reward_warmup_steps > 0 and not (a.length_reward and a.length_reward_coef > 0):
        out.append(f"algo.length_reward_warmup_steps={a.length_reward_warmup_steps} delays a length term that is off "
                   f"(algo.length_reward={a.length_reward!r}, algo.length_reward_coef={a.length_reward_coef}): set "
                   "both, or leave algo.length_reward_warmup_steps=0")
    # the policy loss's keyword arguments (rlvr.algo.losses: each loss reads only its own)
    if a.loss not in CLIPPING_LOSSES:
        for name in ("clip_low", "clip_high"):
            if changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)} has no effect with algo.loss={a.loss!r}, which clips "
                           f"nothing: use a clipping loss ({', '.join(CLIPPING_LOSSES)}), or leave "
                           f"algo.{name}={default_of(a, name)}")
    if a.dual_clip and a.loss not in DUAL_CLIP_LOSSES and a.loss != "cispo":  # cispo: pg.check_policy_gradient
        out.append(f"algo.dual_clip={a.dual_clip} bounds the clipped surrogate of grpo_clip / gspo; algo.loss="
                   f"{a.loss!r} has none: set algo.dual_clip=0, or algo.loss=grpo_clip")
    if changed(a, "kimi_tau") and a.loss != "kimi":
        out.append(f"algo.kimi_tau={a.kimi_tau} is the temperature of algo.loss=kimi only, and algo.loss={a.loss!r}: "
                   f"set algo.loss=kimi, or leave algo.kimi_tau={default_of(a, 'kimi_tau')}")
    # the KL term: no reference policy at all with kl_coef=0
    if a.kl_coef == 0:
        if changed(a, "kl_estimator"):
            out.append(f"algo.kl_estimator={a.kl_estimator!r} picks the estimator of the KL term, which "
                       f"algo.kl_coef=0 turns off: set algo.kl_coef > 0, or leave "
                       f"algo.kl_estimator={default_of(a, 'kl_estimator')}")
        if a.ref_refresh_every:
            out.append(f"algo.ref_refresh_every={a.ref_refresh_every} refreshes the reference policy of the KL term, "
                       "which algo.kl_coef=0 turns off (no reference is loaded): set algo.kl_coef > 0, or leave "
                       "algo.ref_refresh_every=0")
    if a.norm_length and a.aggregation != "seq_mean_token_sum_norm":
        out.append(f"algo.norm_length={a.norm_length} is the constant of algo.aggregation=seq_mean_token_sum_norm "
                   f"only, and algo.aggregation={a.aggregation!r}: set that aggregation, or leave algo.norm_length=0")
    # the advantage: the std keys of the dividing estimators, the critic's keys of gae
    if a.advantage not in STD_ADVANTAGES:
        for name in ("adv_std", "adv_eps"):
            if changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)!r} is read by the advantages that divide by a std "
                           f"({', '.join(STD_ADVANTAGES)}), and algo.advantage={a.advantage!r} divides by none: "
                           f"use one of those, or leave algo.{name}={default_of(a, name)!r}")
    if a.advantage != "gae":
        for name in _GAE_KEYS:
            if changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)} is read by PPO's critic only (algo.advantage=gae), and "
                           f"algo.advantage={a.advantage!r}: set algo.advantage=gae with algo.critic, or leave "
                           f"algo.{name}={default_of(a, name)}")
    # the sampler/trainer correction (rlvr.algo.correction): the cap of every mode, the low bound of the masks
    mode = a.rollout_correction
    if mode == "auto":
        mode = "token_tis" if backend == "vllm" else "none"  # rlvr.train.objective.resolve_rollout_correction
    said = (f"algo.rollout_correction={a.rollout_correction!r}" if a.rollout_correction != "auto" else
            f"algo.rollout_correction='auto' (= {mode} with rollout.backend={backend})")
    if mode == "none" and changed(a, "rollout_correction_cap"):
        out.append(f"algo.rollout_correction_cap={a.rollout_correction_cap} bounds the importance weights of a "
                   f"rollout correction, and {said} corrects nothing: set algo.rollout_correction (token_tis, "
                   f"token_mask, seq_tis, seq_mask), or leave algo.rollout_correction_cap="
                   f"{default_of(a, 'rollout_correction_cap')}")
    if mode not in ("token_mask", "seq_mask") and changed(a, "rollout_correction_low"):
        out.append(f"algo.rollout_correction_low={a.rollout_correction_low} is the lower bound of the token_mask / "
                   f"seq_mask corrections, and {said} masks nothing: set algo.rollout_correction=token_mask or "
                   f"seq_mask, or leave algo.rollout_correction_low={default_of(a, 'rollout_correction_low')}")
    return out


def check_process(a: AlgoConfig) -> None:
    """The process-supervision keys (algo.advantage=process, rlvr.train.process)."""
    if a.process_outcome_coef < 0:
        raise ConfigError(f"algo.process_outcome_coef={a.process_outcome_coef} must be >= 0")
    if a.advantage != "process":
        if a.process_outcome_coef:
            raise ConfigError(f"algo.process_outcome_coef={a.process_outcome_coef} is only used by "
                              "algo.advantage='process'; set algo.advantage=process or leave it 0")
        if a.process_baseline != "group":
            raise ConfigError(f"algo.process_baseline={a.process_baseline!r} is only used by "
                              "algo.advantage='process'; set algo.advantage=process or leave it 'group'")
        return
    if a.loss == "kimi":
        raise ConfigError("algo.loss='kimi' needs one advantage per response; algo.advantage='process' gives one "
                          "per token")
