"""Process supervision in the trainer: `algo.advantage=process` (DeepSeekMath sec. 4.1.3).

A reward that judges steps reports them in the Reward (rlvr.rewards.types): `steps` (one reward per
step) and `step_ends` (the index in the response text of each step's last character). The trainer
turns them into per-token advantages in two places:

    marks   = step_marks(rollouts, rewards, tokenizer)       # step ends as token positions
    targets = process_targets(adv, mask, marks, algo, G)      # (B, T) advantages for the loss

Per-token advantage of token t of response i (rlvr.algo.process_supervision_advantages): the step
rewards of each group (its G responses, all their steps together) are normalized,
r~ = (r - mean) / (std + algo.adv_eps) (algo.adv_std: population or sample), and

    A[i, t] = sum of r~[i, j] over the steps j of response i that end at or after token t
              + algo.process_outcome_coef * A_outcome[i]

where A_outcome is GRPO's advantage of the task reward (the outcome, after any length shaping).
With algo.process_baseline=step (not in the paper) each step reward first has the group's mean at
its step index subtracted (center_by_step), so a step that every response fails pushes on nothing.
Tokens after the last step end (the end-of-sequence token) get only the outcome term. Then, as for
every estimator, algo.kl_in=reward adds the KL penalty's reward-to-go and algo.whiten_advantages
whitens over the batch's response tokens.

Rows whose reward reports no steps (a timeout, a checker error) add no process term and do not
enter the normalization; a batch whose rewards report no steps at all is an error (the reward does
not judge steps, so every process advantage would be 0). Steps whose ends fall in the same token
are merged (rlvr.train.pg.process.merge_shared_ends).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlvr.algo import kl_estimate, whiten
from rlvr.algo.advantages import process_supervision_advantages
from rlvr.train.pg.targets import Targets, TargetSettings, kl_reward_to_go


@dataclass
class StepMarks:
    """The per-step rewards of the trained rows and where their steps end, one entry per row."""

    rewards: list[tuple[float, ...]]  # rewards[i][j]: reward of step j of row i
    ends: list[tuple[int, ...]]  # ends[i][j]: index (in row i's response tokens) of step j's last token
    offsets: list[int]  # label position of row i's first response token (its prompt length - 1)


def token_ends(response_ids: Sequence[int], char_ends: Sequence[int], decode: Callable[[list[int]], str],
               text: str | None = None) -> list[int]:
    """Index of the token that completes each character index of `char_ends` (increasing) of the
    response text: the smallest k such that decode(response_ids[:k + 1]) starts with text[:c + 1],
    found by bisection over decoded prefixes, so any tokenizer works (a character per token, BPE
    merges, a character split over byte-level tokens: the token holding its last byte). An index
    c >= len(text) stands for the end of the response: the token after the one that completes the
    text (the end-of-sequence token; the last token when nothing follows the text).

    text: the response text the indices refer to (Rollout.text, possibly cut at a stop string);
    default decode(response_ids). When the decoded tokens do not start with it, the k with
    len(decode(response_ids[:k + 1])) > c is taken instead."""
    ids = list(response_ids)
    n = len(ids)
    if n == 0:
        return []
    cache: dict[int, str] = {}

    def dec(k: int) -> str:  # the text of tokens 0..k
        if k not in cache:
            cache[k] = decode(ids[: k + 1])
        return cache[k]

    full = dec(n - 1)
    text = full if text is None else text
    exact = full.startswith(text)

    def holds(k: int, c: int) -> bool:
        return dec(k).startswith(text[: c + 1]) if exact else len(dec(k)) > c

    def first(c: int, lo: int) -> int:
        hi = n - 1
        if not holds(hi, c):
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if holds(mid, c):
                hi = mid
            else:
                lo = mid + 1
        return lo

    out, lo = [], 0
    for c in char_ends:
        if c >= len(text):
            k = min(first(len(text) - 1, lo) + 1, n - 1) if text else 0
        else:
            k = first(c, lo)
        out.append(k)
        lo = k
    return out


def merge_shared_ends(rewards: Sequence[float], ends: Sequence[int]) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Steps whose last characters fall in the same token (a BPE token spanning "8\\n8") become one
    step: its reward is the smallest of theirs (the token closes a wrong step if any of them is)."""
    rs: list[float] = []
    es: list[int] = []
    for r, e in zip(rewards, ends, strict=True):
        if es and e <= es[-1]:
            rs[-1] = min(rs[-1], float(r))
        else:
            rs.append(float(r))
            es.append(e)
    return tuple(rs), tuple(es)


def step_marks(rollouts: Sequence, rewards: Sequence, tokenizer) -> StepMarks:
    """StepMarks of rollouts (rlvr.rollout.Rollout: prompt_ids, response_ids, text) scored by rewards
    (rlvr.rewards.Reward with steps / step_ends on the response text). Raises ValueError when no
    reward reports steps although some response has text: the reward does not judge steps."""
    if len(rollouts) != len(rewards):
        raise ValueError(f"{len(rollouts)} rollouts but {len(rewards)} rewards")
    if not any(r.steps for r in rewards) and any(ro.text.strip() for ro in rollouts):
        raise ValueError(
            "algo.advantage='process' needs a reward that judges steps (Reward.steps and Reward.step_ends, e.g. "
            "data.task=sum_steps with its reward 'sum_steps'); this task's reward reported none for "
            f"{len(rewards)} responses")

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    out = StepMarks(rewards=[], ends=[], offsets=[])
    for ro, rw in zip(rollouts, rewards, strict=True):
        tok = token_ends(ro.response_ids, rw.step_ends, decode, ro.text) if rw.steps else []
        rs, es = merge_shared_ends(rw.steps, tok) if rw.steps else ((), ())
        out.rewards.append(rs)
        out.ends.append(es)
        out.offsets.append(len(ro.prompt_ids) - 1)
    return out


def center_by_step(rewards: Sequence[Sequence[float]], group_size: int) -> list[list[float]]:
    """Each step reward minus the mean reward of the same step index over the group's responses that
    have that step (algo.process_baseline=step): r[i][j] - mean_{i' in group, len(r[i']) > j} r[i'][j]."""
    out = [list(map(float, r)) for r in rewards]
    for g0 in range(0, len(out), group_size):
        rows = out[g0:g0 + group_size]
        for j in range(max((len(r) for r in rows), default=0)):
            have = [r for r in rows if len(r) > j]
            mean = sum(r[j] for r in have) / len(have)
            for r in have:
                r[j] -= mean
    return out


def process_targets(outcome_adv: torch.Tensor, mask: torch.Tensor, marks: StepMarks, settings: TargetSettings,
                    group_size: int,
                    old_logp: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None):
    """Per-token advantages (B, T) of the trained rows (module doc); returns rlvr.train.pg.targets.Targets.

    outcome_adv (B,): GRPO's advantage of the outcome; mask (B, T): response tokens (label positions);
    marks: their StepMarks (rows in groups of group_size, as sampled); settings: the algo keys read
    (rlvr.train.pg.targets.TargetSettings); old_logp, ref_logp (B, T): only with kl_in=reward. 0 on every
    position outside the mask."""
    b, t = mask.shape
    if marks is None or len(marks.rewards) != b:
        raise ValueError(f"algo.advantage='process' needs the step marks of all {b} trained rows "
                         f"(got {None if marks is None else len(marks.rewards)})")
    rewards = [list(r) for r in marks.rewards]
    ends = [[o + e for e in row] for o, row in zip(marks.offsets, marks.ends, strict=True)]
    for i, row in enumerate(ends):
        if row and row[-1] >= t:
            raise ValueError(f"row {i}: step end at label position {row[-1]} outside the batch width {t}")
    # A group with fewer than two step rewards has nothing to compare (its normalized rewards are 0);
    # left out, so that std='sample' never divides by 0 steps - 1.
    for g0 in range(0, b, group_size):
        if sum(len(rewards[i]) for i in range(g0, min(g0 + group_size, b))) < 2:
            for i in range(g0, min(g0 + group_size, b)):
                rewards[i], ends[i] = [], []
    if settings.process_baseline == "step":
        rewards = center_by_step(rewards, group_size)
    per_token = process_supervision_advantages(rewards, ends, group_size, t, eps=settings.adv_eps, std=settings.adv_std)
    out = per_token.to(mask.device) + settings.process_outcome_coef * outcome_adv.float().to(mask.device).unsqueeze(1)
    out = torch.where(mask != 0, out, torch.zeros((), device=out.device))
    if settings.kl_in == "reward" and settings.kl_coef > 0:
        if old_logp is None or ref_logp is None:
            raise ValueError("algo.kl_in='reward' needs old and reference logprobs")
        kl = kl_estimate(settings.kl_estimator, old_logp.detach().to(mask.device), ref_logp.detach().to(mask.device))
        out = out + kl_reward_to_go(kl, settings.kl_coef, mask)
    if settings.whiten_advantages:
        out = whiten(out, mask)
    return Targets(advantages=out)

