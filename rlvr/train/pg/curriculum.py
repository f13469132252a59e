"""Which problems a training step draws: the shuffled stream, an online difficulty band, a curriculum.

Default (data.filter_band="" and data.curriculum=""): the endless shuffled stream of
rlvr.train.session.take, unchanged. With either set, a PassRateTable (rlvr.data.filters) holds the
latest pass-rate estimate of each training problem, from two sources:
- every training step's own groups (group_size samples of each drawn problem: free estimates);
- a refresh before step 1 and every data.filter_every steps: data.filter_k samples of each of the
  next data.filter_pool problems of the stream (0 = every training problem) under the current policy.

data.filter_band keeps a band of pass rates (rlvr.data.filters.Band: "medium" = (0, 1), "never-solved",
"[0.1, 0.9]", ...); problems never measured are kept. The stream then skips problems outside the band
(at most one pass over the data per draw: when fewer are in the band, the draw is topped up from the
stream unfiltered and `filter/short` counts the shortfall). data.curriculum=pass_rate draws each step's
problems without replacement with probabilities rlvr.data.filters.curriculum_weights (peak at a 50%
pass rate, data.curriculum_floor for the rest; out-of-band problems get weight 0), from an RNG seeded
by (run seed, step, round), so a resumed run draws what an uninterrupted one would.

The table is part of the checkpoint (trainer_state["pass_rates"]).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from rlvr.data.filters import (
    Band,
    PassCounts,
    PassRateTable,
    band_mask,
    curriculum_sample,
    curriculum_weights,
    estimate_pass_rates,
)
from rlvr.rewards.types import Status
from rlvr.rollout.types import SamplingSpec
from rlvr.train.session import data_order, step_seed, take


class ProblemSource:
    """Draws each step's problems (see the module doc). examples: the task's training problems."""

    def __init__(self, examples: Sequence[Any], data_cfg, run_seed: int):
        self.examples = list(examples)
        self.cfg = data_cfg
        self.seed = data_cfg.seed
        self.run_seed = run_seed
        self.band = Band.parse(data_cfg.filter_band) if data_cfg.filter_band else None
        self.curriculum = data_cfg.curriculum
        self.active = self.band is not None or bool(self.curriculum)
        self.table = PassRateTable()
        self.ids = [str(getattr(ex, "id", i)) for i, ex in enumerate(self.examples)]
        self._index = {id(ex): i for i, ex in enumerate(self.examples)}
        self.last: dict[str, float] = {}
        self.refreshed: dict[str, float] = {}  # the pass-rate refresh of this step, when one ran

    # ----------------------------------------------------------------------------- drawing

    def draw(self, n: int, data_pos: int, step: int, round_: int = 0) -> tuple[list[Any], int]:
        """(n problems, the stream position after them)."""
        if not self.active:
            return take(self.examples, data_pos, n, self.seed), data_pos + n
        keep = band_mask(self.table.rates(self.ids), self.band) if self.band is not None else [True] * len(self.ids)
        self.last = {"filter/in_band": sum(keep) / len(keep)}
        if self.curriculum:
            rates = self.table.rates(self.ids)
            w = curriculum_weights(rates, floor=self.cfg.curriculum_floor)
            w = [x if k else 0.0 for x, k in zip(w, keep, strict=True)]
            avail = sum(x > 0 for x in w)
            if avail < n:  # too few in the band: every problem may be drawn
                w = curriculum_weights(rates, floor=self.cfg.curriculum_floor)
                self.last["filter/short"] = n - avail
            rng = random.Random(step_seed(self.run_seed + 1_000 * round_, step) ^ 0x5EED)
            picked = curriculum_sample(w, min(n, len(w)), rng)
            known = [r for r in (self.table.rate(self.ids[i]) for i in picked) if r is not None]
            if known:
                self.last["curriculum/drawn_pass_rate"] = sum(known) / len(known)
            return [self.examples[i] for i in picked], data_pos + n
        out, pos, scanned, total = [], data_pos, 0, len(self.examples)
        order_cache: dict[int, list[int]] = {}
        chosen: set[int] = set()
        # two passes of positions cover one whole epoch whatever the start; a problem is drawn once a batch
        while len(out) < n and scanned < 2 * total:
            epoch, j = divmod(pos, total)
            if epoch not in order_cache:
                order_cache[epoch] = data_order(total, self.seed, epoch)
            i = order_cache[epoch][j]
            pos += 1
            scanned += 1
            if keep[i] and i not in chosen:
                chosen.add(i)
                out.append(self.examples[i])
        self.last["filter/skipped"] = scanned - len(out)
        if len(out) < n:
            short = n - len(out)
            self.last["filter/short"] = short
            out += take(self.examples, pos, short, self.seed)
            pos += short
        return out, pos

    # -------------------------------------------------------------------------- estimates

    def observe(self, examples: Sequence[Any], rewards: Sequence[Any], group_size: int, step: int) -> None:
        """Each training group's share of CORRECT answers becomes its problem's estimate."""
        if not self.active:
            return
        ids, correct = [], []
        for g in range(0, len(rewards), group_size):
            i = self._index.get(id(examples[g]))
            if i is None:
                continue
            ids.append(self.ids[i])
            correct.append(sum(r.status is Status.CORRECT for r in rewards[g:g + group_size]))
        if ids:
            self.table.update(PassCounts(ids=ids, correct=correct, k=group_size), step=step)

    def due(self, step: int) -> bool:
        """A refresh runs before the first step and every data.filter_every steps after it."""
        every = self.cfg.filter_every
        return self.active and every > 0 and (step == 1 or (step - 1) % every == 0)

    def before_step(self, step: int, data_pos: int, sampler, task, sampling_cfg, scorer, model, timer) -> None:
        """The refresh of the pass rates when due (timed as `filter`), with the policy back in train mode
        after sampling; metrics() reports it with the step's."""
        self.refreshed = {}
        if self.due(step):
            with timer("filter"):
                self.refreshed = self.refresh(sampler, task, sampling_cfg, scorer, data_pos, step)
                model.train()

    def metrics(self) -> dict[str, float]:
        return self.last | self.refreshed

    def refresh(self, sampler, task, sampling_cfg, scorer, data_pos: int, step: int) -> dict[str, float]:
        """data.filter_k samples of the next data.filter_pool problems (0 = all) under the current
        policy; their counts replace older estimates. Returns metrics."""
        pool = self.cfg.filter_pool or len(self.examples)
        pool_examples = take(self.examples, data_pos, min(pool, len(self.examples)), self.seed)
        spec = SamplingSpec.for_task(task, sampling_cfg, seed=step_seed(self.run_seed ^ 0xF117E2, step), n=self.cfg.filter_k)
        counts = estimate_pass_rates(sampler, task, pool_examples, spec, scorer=scorer,
                                     chunk_size=max(1, sampling_cfg.n_prompts))
        self.table.update(counts, step=step)
        rates = counts.rates
        out = {"filter/refreshed": len(rates), "filter/pool_pass_rate": sum(rates) / max(1, len(rates))}
        if self.band is not None:
            out["filter/pool_in_band"] = sum(r in self.band for r in rates) / max(1, len(rates))
        return out

    def state_dict(self) -> dict:
        return self.table.state_dict()

    def checkpoint_state(self) -> dict:
        """The trainer-state entry of a checkpoint: the pass rates, when a band or curriculum uses them."""
        return {"pass_rates": self.state_dict()} if self.active else {}

    def load_state_dict(self, state: dict | None) -> None:
        if state:
            self.table.load_state_dict(state)
