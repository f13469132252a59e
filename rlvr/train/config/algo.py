"""The policy-gradient objective of `rlvr train` (AlgoConfig), the tables of which key each loss, advantage
and correction reads, and every rule that reads only this section (AlgoConfig.validate: the names, the ranges,
the combinations refused and the keys another key makes inert, all at once). The rules that read other
sections too are TrainConfig.validate's (rlvr.train.config.pg).

The names of the rlvr.algo registries come from rlvr.algo.names (torch-free; each registry checks it agrees):
the closed sets (aggregation, KL estimator, rollout correction, length reward) are Literal fields; the open
ones (loss, advantage: users register more) are checked against the live registries, imported in the check."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlvr.algo.names import (
    ADVANTAGE_ESTIMATOR_NAMES,
    POLICY_LOSS_NAMES,
    KlEstimatorName,
    LengthRewardName,
    LossAggregationName,
    RolloutCorrectionName,
)
from rlvr.train.config.checks import Checks, changed, default_of

# KL estimators whose gradient as a loss term is 0 in expectation (docs/algorithms.md section 4): refused
# with algo.kl_in=loss.
_KL_ZERO_LOSS_GRADIENT = ("k1",)
# KL "estimators" whose expected gradient as a loss term is that of no divergence (k1_clamped: pi's mass on
# {pi > ref}; docs/algorithms.md section 4): refused with algo.kl_in=loss too.
_KL_NO_DIVERGENCE_LOSS_GRADIENT = ("k1_clamped",)
# algo.advantage values besides the registry's: the critic's values (gae, rlvr.train.pg.critic) and step rewards
# (process, rlvr.train.pg.process) make the advantages.
_TARGET_ADVANTAGES = ("gae", "process")


# Which policy losses read which keys (rlvr.algo.losses; tests/train/config/test_config_inert.py checks each against the
# loss functions themselves): grpo_clip and gspo clip the ratio at [1 - clip_low, 1 + clip_high] and take the
# dual clip, cispo clips its detached weight; no_baseline / reinforce_with_baseline (REINFORCE), grpo_no_clip
# and kimi clip nothing; only kimi reads tau (algo.kimi_tau).
CLIPPING_LOSSES = ("grpo_clip", "gspo", "cispo")
DUAL_CLIP_LOSSES = ("grpo_clip", "gspo")
# Advantages that divide by a standard deviation, so read algo.adv_std and algo.adv_eps (rlvr.algo.advantages;
# process normalises its step rewards the same way, rlvr.train.pg.process); no_baseline, zero, group_mean, rloo and
# gae (the critic's values) read neither.
STD_ADVANTAGES = ("grpo", "batch_std", "process")
# PPO's critic keys: read only with algo.advantage=gae (rlvr.train.pg.critic, rlvr.train.pg.targets.gae_targets).
_GAE_KEYS = ("gamma", "gae_lambda", "value_coef", "value_clip", "critic_lr")


@dataclass
class AlgoConfig:
    """The policy-gradient objective; every name is a key of a registry in rlvr.algo."""

    advantage: str = field(default="grpo", metadata={"names": (*ADVANTAGE_ESTIMATOR_NAMES, *_TARGET_ADVANTAGES)})
    """Advantage estimator (rlvr.algo.ADVANTAGE_ESTIMATORS), gae (PPO's critic) or process (per-step rewards)."""
    adv_std: Literal["population", "sample"] = "population"
    """Std used by dividing estimators (grpo, batch_std, process): population (1/G, DeepSeekMath) or sample (1/(G-1))."""
    adv_eps: float = 1e-6
    """Stabilizer added to the std before dividing (grpo, batch_std, process)."""
    process_outcome_coef: float = 0.0
    """advantage=process: weight of the outcome's GRPO advantage added to every token's step advantage; 0 = steps only."""
    process_baseline: Literal["group", "step"] = "group"
    """advantage=process: group (DeepSeekMath: step rewards minus the mean of all the group's step rewards) or step
    (minus the group's mean at the same step index, so a step every response fails pushes on nothing); both / group std."""
    loss: str = field(default="grpo_clip", metadata={"names": POLICY_LOSS_NAMES})
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
    aggregation: LossAggregationName = "seq_mean_token_mean"
    """How per-token losses become one number (rlvr.algo.LOSS_AGGREGATIONS)."""
    norm_length: int = 0
    """Constant of algo.aggregation=seq_mean_token_sum_norm (Dr. GRPO), read by it only; 0 = sampling.max_tokens."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy; 0 = no reference model at all."""
    kl_estimator: KlEstimatorName = "k3"
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
    length_reward: LengthRewardName = ""
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
    packing: Literal["auto", True, False, "varlen"] = "auto"
    """Padding-free learner forwards (rlvr.models.packed): a micro-batch's rows concatenated into one sequence,
    attention by a flex_attention document mask, the LM head on response tokens only, micro_batch_tokens
    counting real tokens; with shared_prefix each group's prompt is in the sequence once, its responses
    attending to it through the mask; same numbers up to float rounding. auto = on when the policy is on
    CUDA (compiled flex_attention) and off on CPU, where the padded (cascade) path is faster; true also packs
    on CPU (a dense mask there: for checks). varlen = packs as true does, attention by FlashAttention's
    variable-length kernel (torch's varlen_attn; each response's keys: its prompt's, copied, then its own),
    checked once per process against the mask (bf16/fp16 on CUDA; a failed check warns and flex_attention
    packs); on CPU a per-sequence SDPA. Off by default until measured on a GPU. LoRA (peft) policies pack too."""
    rollout_correction: Literal["auto", "none", RolloutCorrectionName] = "auto"
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
        """Why the KL term as configured regularises nothing, or toward no divergence, or None."""
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
        """Every rule that reads only the algo section, all problems at once: the names (the closed sets are
        Literal fields; the loss and the advantage are checked against the live registries, to which a user may
        have added), the process-supervision keys, the ranges and refused combinations, and the keys another
        algo key makes inert (inert_algo_problems). rlvr.config runs it at load; TrainConfig.validate again for a
        config built in Python."""
        c = Checks("algo")
        c.choices(self)
        self._check_names(c)
        self._check_process(c)
        self._check_objective(c)
        c.at_least("rollout_correction_cap", self.rollout_correction_cap, 1)
        c.fraction("entropy_mask_quantile", self.entropy_mask_quantile)
        c.need("rollout_correction_low", self.rollout_correction_low, 0 <= self.rollout_correction_low <= 1,
               "in [0, 1]")
        for problem in inert_algo_problems(self):
            c.error(problem)
        c.done()

    def _check_names(self, c: Checks) -> None:
        """algo.advantage and algo.loss: open sets, read from the registries themselves (torch: only here)."""
        from rlvr.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

        if self.advantage not in _TARGET_ADVANTAGES:
            c.one_of("advantage", self.advantage, sorted(ADVANTAGE_ESTIMATORS))
        c.one_of("loss", self.loss, sorted(POLICY_LOSSES))

    def _check_process(self, c: Checks) -> None:
        """The process-supervision keys (algo.advantage=process, rlvr.train.pg.process)."""
        if self.process_outcome_coef < 0:
            c.error(f"algo.process_outcome_coef={self.process_outcome_coef} must be >= 0")
        if self.advantage != "process":
            if self.process_outcome_coef > 0:
                c.error(f"algo.process_outcome_coef={self.process_outcome_coef} is only used by "
                        "algo.advantage='process'; set algo.advantage=process or leave it 0")
            if self.process_baseline != "group":
                c.error(f"algo.process_baseline={self.process_baseline!r} is only used by "
                        "algo.advantage='process'; set algo.advantage=process or leave it 'group'")
        elif self.loss == "kimi":
            c.error("algo.loss='kimi' needs one advantage per response; algo.advantage='process' gives one per token")

    def _check_objective(self, c: Checks) -> None:
        """The ranges of the loss, KL, critic and batch keys, and the combinations `rlvr train` refuses."""
        if self.loss == "cispo":  # the clipped weight floors at 1 - clip_low; 1 = no lower bound (MiniMax-M1)
            if not 0 <= self.clip_low <= 1:
                c.error(f"algo.clip_low={self.clip_low} must be in [0, 1] with algo.loss=cispo "
                        "(1 = no lower bound on the importance weight)")
        elif not 0 <= self.clip_low < 1:
            c.error(f"algo.clip_low={self.clip_low} must be in [0, 1)")
        if self.clip_high < 0:
            c.error(f"algo.clip_high={self.clip_high} must be >= 0")
        if self.dual_clip and self.dual_clip <= 1:
            c.error(f"algo.dual_clip={self.dual_clip} must be > 1 (or 0 = off)")
        if self.dual_clip and self.loss == "cispo":
            c.error(f"algo.dual_clip={self.dual_clip} bounds the clipped surrogate of grpo_clip / gspo; "
                    "algo.loss=cispo has none (its weight is capped at 1 + algo.clip_high): set algo.dual_clip=0")
        if self.kl_coef < 0 or self.entropy_coef < 0 or self.length_reward_coef < 0:
            c.error("algo.kl_coef, algo.entropy_coef and algo.length_reward_coef must be >= 0")
        if (problem := self.kl_loss_problem()) is not None:
            c.error(problem)
        if self.kl_in == "reward" and self.kl_coef == 0:
            # refused rather than a silent no-op: whoever sets kl_in=reward expects a KL penalty
            c.error("algo.kl_in='reward' with algo.kl_coef=0 shapes nothing; set algo.kl_coef > 0 "
                    "(or leave algo.kl_in=loss)")
        if self.loss == "kimi" and (self.kl_in == "reward" or self.whiten_advantages):
            c.error("algo.loss='kimi' needs one advantage per response (A_i = r_i - tau log Z); algo.kl_in=reward "
                    "and algo.whiten_advantages make per-token advantages, so use them with another algo.loss")
        if (self.advantage == "gae") != bool(self.critic):
            c.error("algo.advantage='gae' needs a value model: set algo.critic=shared or separate"
                    if self.advantage == "gae" else
                    f"algo.critic={self.critic!r} is only used by algo.advantage='gae' (PPO); set algo.advantage=gae "
                    "or leave algo.critic empty")
        if self.loss == "kimi" and self.entropy_mask_quantile < 1:
            c.error("algo.entropy_mask_quantile < 1 selects tokens, but algo.loss='kimi' is one loss per "
                    "response (the same value on each of its tokens); use another algo.loss or leave "
                    "algo.entropy_mask_quantile=1")
        if self.advantage == "gae" and self.loss == "kimi":
            c.error("algo.loss='kimi' needs one advantage per response; GAE gives one per token")
        if not 0 < self.gamma <= 1 or not 0 <= self.gae_lambda <= 1:
            c.error(f"algo.gamma={self.gamma} must be in (0, 1] and algo.gae_lambda={self.gae_lambda} in [0, 1]")
        if self.value_coef < 0 or self.value_clip < 0 or self.critic_lr < 0:
            c.error("algo.value_coef, algo.value_clip and algo.critic_lr must be >= 0")
        if self.refill_rounds < 0 or self.length_reward_warmup_steps < 0 or self.num_minibatches < 0:
            c.error("algo.refill_rounds, algo.length_reward_warmup_steps and algo.num_minibatches must be >= 0")
        if self.refill_rounds and not self.filter_zero_variance:
            c.error(f"algo.refill_rounds={self.refill_rounds} refills the groups that "
                    "algo.filter_zero_variance drops; set algo.filter_zero_variance=true too")
        if self.ref_refresh_every < 0:
            c.error(f"algo.ref_refresh_every={self.ref_refresh_every} must be >= 0")


def inert_algo_problems(a: AlgoConfig) -> list[str]:
    """The algo keys set to a non-default value that another algo key makes do nothing, one line each naming both
    keys (issue 36); a default is never one of them. The rollout-correction keys, whose mode
    algo.rollout_correction=auto takes from rollout.backend, are TrainConfig's (rlvr.train.config.pg.check_inert)."""
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
    if a.dual_clip and a.loss not in DUAL_CLIP_LOSSES and a.loss != "cispo":  # cispo: AlgoConfig._check_objective
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
    return out
