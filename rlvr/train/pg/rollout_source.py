"""Where a step's rollouts come from, chosen once before the loop (`build_rollout_source`).

One protocol for every way of sampling, so the training loop reads the same whatever is configured:

    source.start(start_step, model)         # a resumed run's weights to the engine, first snapshot
    sampled = source.collect(step, data_pos, timer)   # rollouts, rewards, advantages (Sampled)
    old_fn  = source.old_logprobs_fn(rows, step)      # None: the learner's own forward is the old policy
    source.sleep()                          # colocated vLLM hands its memory to the learner
    source.after_update(step, model)        # push the weights, check the push, snapshot the version
    metrics |= source.metrics()             # push check, async/*, partial/*, env/*, gateway/*
    source.close()                          # at the run's end: what the source started (the gateway)

The kinds, each a class whose no-op hooks do nothing:
- RolloutSource: generate, then score (the synchronous loop);
- EnvSource (data.env): multi-turn episodes rewarded by the environment (rlvr.envs), or run by an agent
  program through the rollout gateway (data.env=external / verifiers:<env>, rlvr.envs.external);
- AheadSource (distributed.max_staleness / queue_size): the generator actors sample the next steps'
  batches while the learner trains (rlvr.distributed.staleness); old logprobs under each rollout's
  own policy version (BehaviourPolicy);
- PartialSource (distributed.segment_tokens): long responses sampled in segments across steps
  (rlvr.distributed.partial), their groups in flight checkpointed with the run.

Every kind samples a step the same way (`sample_groups`): sampling.n_prompts problems from the problem
source (the shuffled stream, or the online band / curriculum), group_size responses each, DAPO's refill
rounds when algo.refill_rounds is set, then the objective's advantages.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import torch

from rlvr.distributed.partial import PartialRollouts
from rlvr.distributed.staleness import AheadSampler, BehaviourPolicy
from rlvr.models.export import push_tensors
from rlvr.rewards.types import Reward, Status
from rlvr.rollout import with_thinking_budget
from rlvr.rollout.push_check import PushCheck
from rlvr.rollout.types import SamplingSpec, answer_length
from rlvr.train.session import say, step_seed, take
from rlvr.train.tasks import task_scorer


@dataclass
class Sampled:
    """One step's rollouts, possibly from several sampling rounds (DAPO refill)."""

    rollouts: list
    examples: list  # one per rollout
    rewards: list[Reward]
    lengths: torch.Tensor  # (N,) answer tokens (rlvr.rollout.types.answer_length): what the length terms count
    shaped: torch.Tensor  # (N,)
    adv: torch.Tensor  # (N,)
    keep: torch.Tensor  # (N,) bool
    zero_var: float  # share of sampled groups with equal rewards
    data_pos: int  # position in the training stream after this step
    rounds: int = 1

    def metrics(self, group_size: int) -> dict[str, float]:
        groups = len(self.rollouts) // group_size
        return {
            "dynamic/rounds": self.rounds,
            "dynamic/groups_sampled": groups,
            "dynamic/groups_dropped": int(round(self.zero_var * groups)),
            "dynamic/groups_kept": int(self.keep.sum()) // group_size,
            "dynamic/extra_samples": len(self.rollouts) - len(self.rollouts) // self.rounds,
        }


class ScoreWhileGenerating:
    """data.score_while_generating: the rollouts the sampler hands on as they finish (HFGenerator.generate's
    on_finished) are scored on one background thread while the other rows decode, so a step waits after
    generation only for the rows that finished last. The thread takes everything that arrived since its last call
    as one batch (the reward call's own workers, dedup and deadlines as for a whole batch); result() waits for the
    rest and returns the rewards in the rollouts' order: the same rewards as one call (a reward is a function of its
    response and example). A scorer that raises raises in result(), as the plain call would."""

    def __init__(self, score, batch: list):
        self.score, self.batch = score, batch
        self.cond = threading.Condition()
        self.waiting: list[tuple[int, object]] = []  # handed on, not yet taken by the thread
        self.done: list[tuple[list[int], list[Reward]]] = []
        self.calls: list[list[int]] = []  # the indices of each scoring call, in order
        self.spans: list[tuple[float, float]] = []  # (start, end) of each scoring call, perf_counter
        self.error: BaseException | None = None
        self.closed = False
        self.overlapped_s = 0.0
        self.thread = threading.Thread(target=self._run, name="rlvr-score-while-generating", daemon=True)
        self.thread.start()

    def add(self, i: int, rollout) -> None:
        """on_finished: called on the generating thread."""
        with self.cond:
            self.waiting.append((i, rollout))
            self.cond.notify()

    def _run(self) -> None:
        while True:
            with self.cond:
                while not self.waiting and not self.closed:
                    self.cond.wait()
                if not self.waiting or self.error is not None:
                    return
                todo, self.waiting = self.waiting, []
            idx, ros = [i for i, _ in todo], [ro for _, ro in todo]
            self.calls.append(idx)
            t0 = time.perf_counter()
            try:
                rewards = self.score(ros, [self.batch[ro.group] for ro in ros])
            except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread, in result()
                self.error = e
                return
            finally:
                self.spans.append((t0, time.perf_counter()))
            self.done.append((idx, list(rewards)))

    def result(self, rollouts: list) -> list[Reward]:
        """The rewards of `rollouts` (generate's return: every index handed on); overlapped_s: the seconds of
        scoring done before this call, while generation ran."""
        end_of_generation = time.perf_counter()
        with self.cond:
            self.closed = True
            self.cond.notify()
        self.thread.join()
        if self.error is not None:
            raise self.error
        self.overlapped_s = sum(max(0.0, min(b, end_of_generation) - a) for a, b in self.spans)
        out: list[Reward | None] = [None] * len(rollouts)
        for idx, rewards in self.done:
            for i, rw in zip(idx, rewards, strict=True):
                out[i] = rw
        missing = [i for i, rw in enumerate(out) if rw is None]
        if missing:  # (generate hands every index on; a sampler that did not is a bug, not a zero reward)
            raise RuntimeError(f"score_while_generating: {len(missing)} rollouts were never handed on to be scored "
                               f"(first index {missing[0]})")
        return out

    def abandon(self) -> None:
        """Generation failed (an error, Ctrl-C): nothing more is scored; the thread ends after the call it is in."""
        with self.cond:
            self.waiting.clear()
            self.closed = True
            self.cond.notify()


def score_while_generating(on: bool, sampler) -> bool:
    """Whether data.score_while_generating is in force for `sampler`: asked for, and the sampler hands rollouts on as
    they finish (streams_finished: the hf sampler; the config refuses true with the others)."""
    return bool(on) and getattr(type(sampler), "streams_finished", False) is True


class NoPushCheck:
    """The push check of an engine that shares the learner's module (hf): nothing to check."""

    last: dict[str, float] = {}

    def __call__(self, engine, model, tokenizer, step: int) -> None:
        pass


def build_push_check(cfg, task):
    """The health check after each weight push (rlvr.rollout.push_check): only engines that hold their own
    copy of the weights (vllm) can drift from the learner; hf shares its module (NoPushCheck)."""
    rc = cfg.rollout
    if rc.backend != "vllm" or not rc.push_check:
        return NoPushCheck()
    prompts = [task.prompt(ex) for ex in task.train[:2]]
    return PushCheck(prompts, tol=rc.push_check_tol, max_tokens=min(16, cfg.sampling.max_tokens), seed=cfg.run.seed,
                     say=say)  # a warning is printed even with run.progress=false


class RolloutSource:
    """Generate, then score: the synchronous source (module docstring).

    engine: the generator the placement built (weights are pushed to it); sampler: what samples (the
    engine, with a thinking budget when sampling.thinking_budget is set), also used by evaluation and the
    curriculum; score: the placement's scorer (signature of rlvr.rewards.batch.score_rollouts)."""

    def __init__(self, engine, sampler, task, cfg, objective, problems, score, push_check, model, tokenizer):
        self.engine, self.sampler, self.task, self.cfg = engine, sampler, task, cfg
        self.objective, self.problems, self._score, self.push_check = objective, problems, score, push_check
        self.model, self.tokenizer = model, tokenizer
        self._task_scorer = task_scorer(task, cfg.data)  # the curriculum's pass-rate estimates
        # (only this class's draw and score hand rollouts on; the sources that override them sample otherwise)
        self._overlap = (type(self).draw is RolloutSource.draw
                         and score_while_generating(cfg.data.score_while_generating, sampler))
        self._pending: ScoreWhileGenerating | None = None
        self._overlapped_s = 0.0

    # -- one round of a step: draw the problems' rollouts, then their rewards
    def draw(self, batch: list, spec: SamplingSpec) -> tuple[list, list]:
        prompts = [self.task.prompt(ex) for ex in batch]
        if self._overlap:  # scored as they finish (data.score_while_generating)
            self._pending = ScoreWhileGenerating(self._score_batch, batch)
            try:
                ros = self.sampler.generate(prompts, spec, on_finished=self._pending.add)
            except BaseException:  # no scoring thread left waiting behind a failed generation
                self._pending.abandon()
                self._pending = None
                raise
        else:
            ros = self.sampler.generate(prompts, spec)
        return ros, [batch[ro.group] for ro in ros]

    def score(self, rollouts: list, examples: list) -> list[Reward]:
        pending, self._pending = self._pending, None
        if pending is None:
            return self._score_batch(rollouts, examples)
        rewards = pending.result(rollouts)
        self._overlapped_s += pending.overlapped_s
        return rewards

    def _score_batch(self, rollouts: list, examples: list) -> list[Reward]:
        d = self.cfg.data
        return self._score(rollouts, examples, self.task.reward_fn, workers=d.reward_workers,
                           timeout_s=d.reward_timeout_s, isolate=d.reward_isolate)

    # -- the step
    def begin_step(self, step: int, data_pos: int) -> None:
        """Called before a step samples (after the curriculum's refresh)."""

    def collect(self, step: int, data_pos: int, timer) -> Sampled:
        self.problems.before_step(step, data_pos, self.sampler, self.task, self.cfg.sampling, self._task_scorer,
                                  self.model, timer)
        self.begin_step(step, data_pos)
        return sample_groups(self, self.task, self.cfg, self.objective, step, data_pos, timer, self.problems)

    def old_logprobs_fn(self, rollouts: list, step: int):
        """None: every rollout was sampled by the learner's weights of the previous step."""
        return None

    def start(self, step: int, model) -> None:
        if step:  # the checkpoint's weights replaced those the generator was built with
            self.engine.update_weights(push_tensors(model), version=step)
        self.push_check(self.engine, model, self.tokenizer, step)

    def sleep(self) -> None:
        self.engine.sleep()

    def after_update(self, step: int, model) -> None:
        self.engine.update_weights(push_tensors(model), version=step)
        self.push_check(self.engine, model, self.tokenizer, step)  # the engine samples what was pushed, or stops

    def metrics(self) -> dict[str, float]:
        out = dict(self.push_check.last)
        if self._overlap:  # seconds of scoring hidden inside time/generate this step (time/score: what was left)
            out["time/score_while_generating"], self._overlapped_s = self._overlapped_s, 0.0
        return out

    def extras(self) -> dict:
        """Checkpoint extras of the source (state_dict / load_state_dict objects)."""
        return {}

    def close(self) -> None:
        """At the run's end (or Ctrl-C): what the source started (data.env's gateway) is stopped."""


class EnvSource(RolloutSource):
    """data.env: multi-turn episodes, rewarded by the environment (rlvr.envs)."""

    def draw(self, batch, spec):
        ros, self._rewards = self.task.env.rollouts(self.sampler, batch, spec)
        return ros, [batch[ro.group] for ro in ros]

    def score(self, rollouts, examples):
        return self._rewards

    def metrics(self):
        return super().metrics() | self.task.env.metrics()  # env/*: turns, tool calls, flags; gateway/*

    def close(self):
        self.task.env.close()  # data.env=external / verifiers: the gateway


class _Behind(RolloutSource):
    """A source whose rollouts can be older than the learner: the behaviour policy's snapshots give their
    old logprobs (rlvr.distributed.staleness.BehaviourPolicy)."""

    behaviour: BehaviourPolicy

    def old_logprobs_fn(self, rollouts, step):
        return self.behaviour.old_logprobs_fn(rollouts, current=step - 1)

    def start(self, step, model):
        super().start(step, model)
        self.behaviour.record(step, model)

    def after_update(self, step, model):
        super().after_update(step, model)
        self.behaviour.record(step, model)

    def metrics(self):
        return super().metrics() | self.sampler.metrics()


class AheadSource(_Behind):
    """distributed.max_staleness / queue_size: sampling ahead on the generator actors."""

    def __init__(self, *args, behaviour: BehaviourPolicy, **kw):
        super().__init__(*args, **kw)
        self.behaviour = behaviour
        d, s = self.cfg.distributed, self.cfg.sampling
        self.sampler = AheadSampler(self.engine, self._planned, max_staleness=d.max_staleness,
                                    queue_size=d.queue_size, prompts_per_step=s.n_prompts)

    def _planned(self, step: int, pos: int):
        s, task = self.cfg.sampling, self.task
        batch = take(task.train, pos, s.n_prompts, self.cfg.data.seed)
        return [task.prompt(ex) for ex in batch], SamplingSpec.for_task(task, s, seed=step_seed(self.cfg.run.seed, step))

    def begin_step(self, step, data_pos):
        self.sampler.begin_step(step, data_pos)  # queue the batches of the next steps


class PartialSource(_Behind):
    """distributed.segment_tokens: partial rollouts; a step trains on the groups that finished."""

    def __init__(self, *args, behaviour: BehaviourPolicy, **kw):
        super().__init__(*args, **kw)
        self.behaviour = behaviour
        self.sampler = PartialRollouts(self.engine, self.tokenizer, self.cfg.distributed.segment_tokens)

    def draw(self, batch, spec):  # finished groups, maybe of earlier steps' problems
        return self.sampler.sample(batch, [self.task.prompt(ex) for ex in batch], spec)

    def extras(self):  # the responses in flight are trainer state
        return {"partial_rollouts": self.sampler.checkpoint_state(self.behaviour, self.task.train)}


def build_rollout_source(cfg, engine, model, tokenizer, task, objective, problems, score,
                         logprobs) -> RolloutSource:
    """The RolloutSource cfg asks for (module docstring). engine: the placement's generator; problems: the
    rlvr.train.pg.curriculum.ProblemSource; score: the placement's scorer; logprobs: the learner's no-grad
    forward (model, batch, ForwardSpec) -> (B, T), which the behaviour policy runs under older weights."""
    d, s = cfg.distributed, cfg.sampling
    sampler = with_thinking_budget(engine, s.thinking_budget, s.stop_thinking_text, template=task.template)
    args = (engine, sampler, task, cfg, objective, problems, score, build_push_check(cfg, task), model, tokenizer)
    if task.env is not None:
        return EnvSource(*args)
    if d.segment_tokens:
        keep = -(-s.max_tokens // d.segment_tokens) + 4  # a response spans at most this many versions (+ backlog)
        return PartialSource(*args, behaviour=BehaviourPolicy(model, keep=keep, logprobs=logprobs))
    if d.max_staleness or d.queue_size:
        return AheadSource(*args, behaviour=BehaviourPolicy(model, keep=max(d.max_staleness, d.queue_size),
                                                            logprobs=logprobs))
    return RolloutSource(*args)


def sample_groups(source: RolloutSource, task, cfg, objective, step: int, data_pos: int, timer,
                  problems=None) -> Sampled:
    """Sample sampling.n_prompts problems x group_size through `source` (its draw and score), compute
    advantages. With algo.filter_zero_variance and algo.refill_rounds = k, groups whose rewards are all
    equal are dropped and up to k more rounds of n_prompts new problems are sampled until n_prompts groups
    with a reward spread are in hand (DAPO's dynamic sampling); the batch then holds exactly n_prompts
    groups, or fewer when the budget ran out. Advantages are group-local, so groups of different rounds
    are computed together. problems: a rlvr.train.pg.curriculum.ProblemSource (the online band /
    curriculum); None = the shuffled stream."""
    s, r, a = cfg.sampling, cfg.run, cfg.algo
    rollouts, examples, rewards = [], [], []
    rounds = 0
    for rnd in range(1 + (a.refill_rounds if a.filter_zero_variance else 0)):
        if problems is not None:
            batch, data_pos = problems.draw(s.n_prompts, data_pos, step, rnd)
        else:
            batch = take(task.train, data_pos, s.n_prompts, cfg.data.seed)
            data_pos += s.n_prompts
        rounds += 1
        with timer("generate"):
            # round 0 keeps the seed of a run without refill; later rounds get seeds of their own
            seed = step_seed(r.seed, step) if rnd == 0 else step_seed(r.seed + 7_777_777 * rnd, step)
            ros, ro_examples = source.draw(batch, SamplingSpec.for_task(task, s, seed=seed))
        with timer("score"):
            rws = source.score(ros, ro_examples)
        rollouts += ros
        examples += ro_examples
        rewards += rws
        if _spread_groups(rewards, s.group_size) >= s.n_prompts:
            break
    with timer("score"):
        # what the length terms count: the tokens the policy wrote in its answer turn(s), those max_tokens bounds
        # (a thinking budget's answer phase, an episode's model turns; not forced text or tool output)
        lengths = torch.tensor([answer_length(ro) for ro in rollouts], dtype=torch.float32)
        shaped, adv, keep, zero_var = objective.advantages(rewards, lengths, step)
        if rounds > 1 or a.refill_rounds:
            # at most n_prompts groups with a spread: the first ones sampled
            keep_groups = keep.view(-1, s.group_size).any(dim=1)  # (a critic's unscored rows are out one by one)
            over = torch.nonzero(keep_groups).squeeze(1)[s.n_prompts:]
            keep_groups[over] = False
            keep = keep & keep_groups.repeat_interleave(s.group_size)
    return Sampled(rollouts=rollouts, examples=examples, rewards=rewards, lengths=lengths, shaped=shaped,
                   adv=adv, keep=keep, zero_var=zero_var, data_pos=data_pos, rounds=rounds)


def training_rows(sampled: Sampled) -> tuple[list, torch.Tensor, torch.Tensor]:
    """The rows the loss trains on: the kept rollouts, then the earlier segments of kept agent episodes
    (Rollout.earlier_segments: an episode through the gateway whose history was rewritten), each with its
    episode's advantage. (rows, advantages (R,), the step's rollout index of each row (R,))."""
    kept = torch.nonzero(sampled.keep).squeeze(1)
    rows = [sampled.rollouts[i] for i in kept.tolist()]
    extra = [(i, seg) for i in kept.tolist() for seg in (sampled.rollouts[i].earlier_segments or ())]
    if not extra:
        return rows, sampled.adv[kept], kept
    ids = torch.cat([kept, torch.tensor([i for i, _ in extra], dtype=kept.dtype)])
    return rows + [seg for _, seg in extra], sampled.adv[ids], ids


def _spread_groups(rewards: list[Reward], group_size: int) -> int:
    """Groups (consecutive runs of group_size rewards) whose scored task rewards are not all equal (an unscored
    reward, Status.ERROR, is no value: rlvr.train.pg.objective.Shaping)."""
    totals = [None if Status(r.status) is Status.ERROR else r.total for r in rewards]
    return sum(len({t for t in totals[i:i + group_size] if t is not None}) > 1
               for i in range(0, len(totals), group_size))
