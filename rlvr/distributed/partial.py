"""Partial rollouts (Kimi k1.5): long responses are sampled in segments across iterations.

distributed.segment_tokens = S > 0 is the per-iteration token budget of a response. Every step
draws n_prompts new problems as usual; then one round continues every unfinished response of
every group in flight (this step's and the ones carried over) by up to S tokens under the
generator's current weights (its prompt is the prompt plus the response so far). The groups whose
responses have all finished (EOS, a stop string, or sampling.max_tokens in total) are ready; the
step trains on at most n_prompts of them, oldest first. If none is ready, more rounds run until
one is; if n_prompts groups were already ready, no round runs (the backlog stays bounded).
Unfinished responses are kept and continued next step under the newer policy, so a step no longer
waits for its longest answer and no answer is cut. A step's batch can thus hold fewer than
n_prompts groups (fewer optimizer steps that step).

Each rollout records its segments (Rollout.segments: (first response token, weight version));
Rollout.weight_version is the oldest one. The learner's old logprobs take each token under the
version that sampled it (rlvr.distributed.staleness.BehaviourPolicy), so the PPO ratio uses the
true behaviour policy. Known limit: a stop string that straddles two segments is not seen (EOS is).

Checkpoints: the groups in flight (unfinished and ready, with their problems as positions in the
training examples) and the behaviour-policy snapshots of the versions their segments were sampled
under are trainer state (PartialCheckpoint, saved as partial_rollouts.pt), so a resumed run
continues them exactly as an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlvr.rollout.types import Rollout, SamplingSpec, WrappedGenerator, sequence_seed


@dataclass
class _Part:
    """One response being sampled in segments."""

    prompt: str
    prompt_ids: list[int]
    sample_index: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    segments: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | None = None
    tail_text: str | None = None  # the last segment's text when it ended on a stop string


@dataclass
class _Group:
    example: object
    parts: list[_Part]
    uid: int

    @property
    def done(self) -> bool:
        return all(p.finish_reason is not None for p in self.parts)


class PartialRollouts(WrappedGenerator):
    """The trainer's sampler with partial rollouts; see the module docstring.

    generator: any Generator (local or RayGenerator) taking prompt_ids. sample(examples, prompts,
    spec) -> (rollouts of len(examples) finished groups, one example per rollout)."""

    def __init__(self, generator, tokenizer, segment_tokens: int):
        if segment_tokens < 1:
            raise ValueError(f"distributed.segment_tokens={segment_tokens} must be >= 1")
        super().__init__(generator)
        self.tokenizer = tokenizer
        self.segment = segment_tokens
        self.active: list[_Group] = []  # groups with unfinished responses, oldest first
        self.ready: list[_Group] = []  # finished groups not yet trained on, oldest first
        self._uid = 0
        self.rounds = 0  # rounds of the last sample() call
        self.carried = 0  # unfinished responses left after the last call

    def generate(self, prompts, spec, *, prompt_ids=None):
        return self.gen.generate(prompts, spec, prompt_ids=prompt_ids)  # evaluation: whole responses

    def sample(self, examples: list, prompts: list[str], spec: SamplingSpec) -> tuple[list[Rollout], list]:
        want = len(examples)
        ids = [self.tokenizer.encode(p) for p in prompts]
        for ex, p, pid in zip(examples, prompts, ids, strict=True):
            self.active.append(_Group(ex, [_Part(p, list(pid), j) for j in range(spec.n)], self._uid))
            self._uid += 1
        self.rounds = 0
        if len(self.ready) < want:
            while self.rounds == 0 or not self.ready:
                self._round(spec)
                self.rounds += 1
                self.ready += [g for g in self.active if g.done]
                self.active = [g for g in self.active if not g.done]
        batch, self.ready = self.ready[:want], self.ready[want:]
        self.carried = sum(p.finish_reason is None for g in self.active for p in g.parts)
        rollouts, out_examples = [], []
        for gi, g in enumerate(batch):
            for p in g.parts:
                rollouts.append(self._rollout(p, gi, spec))
                out_examples.append(g.example)
        return rollouts, out_examples

    def metrics(self) -> dict[str, float]:
        return {"partial/rounds": self.rounds, "partial/carried": self.carried,
                "partial/ready_backlog": len(self.ready)}

    def _round(self, spec: SamplingSpec) -> None:
        """Continue every unfinished response by up to S tokens (one generate call per budget)."""
        todo = [(g, p) for g in self.active for p in g.parts if p.finish_reason is None]
        by_budget: dict[int, list] = {}
        for g, p in todo:
            by_budget.setdefault(min(self.segment, spec.max_tokens - len(p.ids)), []).append((g, p))
        for budget, items in sorted(by_budget.items()):
            seg_spec = dataclasses.replace(
                spec, n=1, max_tokens=budget, min_tokens=min(budget, max(0, spec.min_tokens - len(items[0][1].ids))),
                seed=None if spec.seed is None else sequence_seed(spec.seed, self.rounds, budget))
            if len({max(0, spec.min_tokens - len(p.ids)) for _, p in items}) > 1:
                seg_spec = dataclasses.replace(seg_spec, min_tokens=0)  # (min_tokens: only before the 1st segment)
            ros = self.gen.generate([p.prompt for _, p in items], seg_spec,
                                    prompt_ids=[p.prompt_ids + p.ids for _, p in items])
            for (_, p), ro in zip(items, ros, strict=True):
                p.segments.append((len(p.ids), ro.weight_version))
                p.ids += ro.response_ids
                p.logprobs += ro.logprobs or [0.0] * len(ro.response_ids)
                if ro.finish_reason == "stop":
                    p.finish_reason, p.stop_reason = "stop", ro.stop_reason
                    p.tail_text = ro.text if ro.stop_reason not in (None, "<eos>") else None
                elif len(p.ids) >= spec.max_tokens:
                    p.finish_reason = "length"

    def _rollout(self, p: _Part, group: int, spec: SamplingSpec) -> Rollout:
        if p.tail_text is not None:  # cut at the stop string, as the generator did in the last segment
            last = p.segments[-1][0]
            text = self.tokenizer.decode(p.ids[:last], skip_special_tokens=True) + p.tail_text
        else:
            text = self.tokenizer.decode(p.ids, skip_special_tokens=True)
        return Rollout(prompt=p.prompt, prompt_ids=p.prompt_ids, response_ids=p.ids, text=text,
                       logprobs=p.logprobs if spec.logprobs else None, finish_reason=p.finish_reason,
                       group=group, weight_version=min(v for _, v in p.segments), sample_index=p.sample_index,
                       stop_reason=p.stop_reason, segments=list(p.segments))

    def state_versions(self) -> list[int]:
        """Versions still needed by carried responses (for the behaviour-policy snapshots)."""
        return sorted({v for g in self.active + self.ready for p in g.parts for _, v in p.segments})

    def checkpoint_state(self, behaviour, examples: Sequence) -> PartialCheckpoint:
        """The checkpoint extra holding this sampler's groups in flight and the behaviour-policy
        snapshots they need (examples: the training examples the problems are drawn from)."""
        return PartialCheckpoint(self, behaviour, examples)


_PART_FIELDS = ("prompt", "prompt_ids", "sample_index", "ids", "logprobs", "finish_reason", "stop_reason", "tail_text")


class PartialCheckpoint:
    """partial_rollouts.pt of a checkpoint (a trainer `extras` entry: state_dict / load_state_dict).

    Holds PartialRollouts' active and ready groups (each problem as its index in `examples`, the
    prompt, ids, logprobs and (first token, version) segments of every response) and the CPU
    snapshots of BehaviourPolicy for every version those segments were sampled under (the old
    logprobs of a carried segment are taken under its own version, which the resumed learner no
    longer has). Only plain containers and tensors: it loads with torch.load(weights_only=True)."""

    def __init__(self, sampler: PartialRollouts, behaviour, examples: Sequence):
        self.sampler, self.behaviour, self.examples = sampler, behaviour, examples

    def state_dict(self) -> dict:
        pr = self.sampler
        index = {id(ex): i for i, ex in reversed(list(enumerate(self.examples)))}

        def group(g: _Group) -> dict:
            if id(g.example) not in index:
                raise RuntimeError("partial rollouts: a problem in flight is not one of the training examples; "
                                   "it cannot be checkpointed")
            return {"example": index[id(g.example)], "uid": g.uid,
                    "parts": [{**{f: getattr(p, f) for f in _PART_FIELDS},
                               "segments": [list(x) for x in p.segments]} for p in g.parts]}

        versions = pr.state_versions()
        snaps = {} if self.behaviour is None else self.behaviour.snapshots
        return {"format": 1, "uid": pr._uid, "active": [group(g) for g in pr.active],
                "ready": [group(g) for g in pr.ready],
                "snapshots": {int(v): snaps[v] for v in versions if v in snaps}}

    def load_state_dict(self, state: dict) -> None:
        pr = self.sampler

        def group(d: dict) -> _Group:
            parts = [_Part(**{f: p[f] for f in _PART_FIELDS}, segments=[tuple(x) for x in p["segments"]])
                     for p in d["parts"]]
            return _Group(self.examples[int(d["example"])], parts, int(d["uid"]))

        pr.active = [group(d) for d in state["active"]]
        pr.ready = [group(d) for d in state["ready"]]
        pr._uid = int(state["uid"])
        pr.carried = sum(p.finish_reason is None for g in pr.active for p in g.parts)
        if self.behaviour is not None:
            self.behaviour.snapshots.update({int(v): sd for v, sd in state["snapshots"].items()})
