"""Demonstrations: scripted episodes played through an environment (its real tool outputs, the same
transcript layout and loss mask as sampled episodes), and a short SFT warm start on them.

    eps = play(make_env, example, ["<calc>37+24</calc>", "Answer: 61"], tokenizer, fmt)
    sft_warm_start(model, tokenizer, episodes, steps=200)   # NLL on the model-written tokens only

Used by the calculator learning test (a tiny model that starts with a small share of tool use) and
by tests that need a scripted agent (the code-repair hostile suite).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch

from rlvr.envs.base import Environment
from rlvr.envs.format import TurnFormat
from rlvr.envs.rollout import Episode, run_episodes
from rlvr.models import build_training_batch
from rlvr.models.scoring import sft_loss
from rlvr.rollout.types import Rollout, SamplingSpec


class ReplayGenerator:
    """A Generator that writes the given turns in order (call k returns turns[k] for every row),
    with logprob 0.0: a scripted agent behind the real episode driver."""

    weight_version = 0

    def __init__(self, tokenizer, turns: Sequence[str]):
        self.tokenizer, self.turns, self.k = tokenizer, list(turns), 0

    def generate(self, prompts, spec, *, prompt_ids=None):
        text = self.turns[self.k] if self.k < len(self.turns) else ""
        self.k += 1
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids or ids[-1] != self.tokenizer.eos_token_id and not any(text.endswith(s) for s in spec.stop):
            ids = ids + [self.tokenizer.eos_token_id]  # a turn without a stop string ends with EOS
        return [Rollout(prompt=p, prompt_ids=list(prompt_ids[i]), response_ids=list(ids), text=text,
                        logprobs=[0.0] * len(ids), finish_reason="stop", group=i,
                        stop_reason="<eos>" if ids[-1] == self.tokenizer.eos_token_id else None)
                for i, p in enumerate(prompts)]


def play(make_env: Callable[[], Environment], example, turns: Sequence[str], tokenizer, fmt: TurnFormat | None = None,
         max_tokens_total: int = 4096) -> Episode:
    """One scripted episode: the agent writes `turns` (as many as the environment accepts)."""
    gen = ReplayGenerator(tokenizer, turns)
    (ep,) = run_episodes(gen, make_env, [example], SamplingSpec(n=1, max_tokens=4096, seed=0), tokenizer,
                         fmt=fmt, max_tokens_total=max_tokens_total)
    return ep


def sft_warm_start(model, tokenizer, episodes: Sequence[Episode], *, steps: int, batch_size: int = 32,
                   lr: float = 3e-3, seed: int = 0) -> list[float]:
    """AdamW on the token NLL of the model-written tokens of `episodes` (tool output masked), batches
    drawn with a seeded RNG. Returns the losses."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        rows = [episodes[rng.randrange(len(episodes))].rollout for _ in range(batch_size)]
        batch = build_training_batch([r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                     tokenizer.pad_token_id, loss_masks=[r.loss_mask for r in rows])
        opt.zero_grad(set_to_none=True)
        losses.append(sft_loss(model, batch, "token_mean", batch_size))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return losses
