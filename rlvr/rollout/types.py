"""Sampling specs, rollouts and the Generator protocol shared by every generator backend."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingSpec:
    """How to sample. Mirrors vLLM's SamplingParams names so the two backends read the same.

    Reproducibility: sample j of prompt i uses its own RNG seeded from (seed, i, j), so the same
    seed gives the same rollouts whatever the batch size (up to float differences in logits
    between batch shapes, see docs/models.md). A trainer passes a different seed each step
    (e.g. base_seed + step); seed=None draws the base seed from torch's global RNG.
    """

    n: int = 1  # samples per prompt; the n samples of prompt i are consecutive in the output
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]; 1 = off
    top_k: int = 0  # keep the k most likely tokens; 0 or -1 = off
    max_tokens: int = 256  # new tokens per response (EOS and stop tokens included)
    min_tokens: int = 0  # EOS and stop strings are ignored before this many new tokens
    stop: tuple[str, ...] = ()  # stop when the response text contains one of these
    include_stop_str_in_output: bool = False  # keep the stop string at the end of `text`
    seed: int | None = None
    logprobs: bool = True  # return the sampler's per-token logprobs (see Rollout.logprobs)

    @classmethod
    def for_task(cls, task, s, *, seed: int | None, n: int | None = None, temperature: float | None = None,
                 logprobs: bool = True) -> SamplingSpec:
        """The spec for a task (rlvr.data.TaskData: its stop strings and keep_stop) from a sampling config
        section `s` (a rlvr.train.config DecodingConfig: top_p, max_tokens, stop, keep_stop, temperature unless
        given, and its spec_extras(): samples per prompt (the group size, eval's n) unless given, top_k,
        min_tokens). Stop strings: the task's, then the section's extra ones. The one place a task and a config
        section become a SamplingSpec."""
        extras = s.spec_extras()
        return cls(
            n=extras["n"] if n is None else n,
            temperature=s.temperature if temperature is None else temperature,
            top_p=s.top_p,
            top_k=extras["top_k"],
            max_tokens=s.max_tokens,
            min_tokens=min(extras["min_tokens"], s.max_tokens),
            stop=tuple(dict.fromkeys((*task.stop, *s.stop))),
            include_stop_str_in_output=bool(task.keep_stop and s.keep_stop),
            seed=seed,
            logprobs=logprobs,
        )

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"SamplingSpec.n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"SamplingSpec.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingSpec.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingSpec.top_k must be -1, 0 (off) or > 0, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingSpec.max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"SamplingSpec.min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if isinstance(self.stop, str):  # a bare string would be split into characters
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        if any(not s for s in self.stop):
            raise ValueError("SamplingSpec.stop contains an empty string")


@dataclass
class Rollout:
    """One sampled response.

    logprobs[k] is log pi_sample(response_ids[k]) under the distribution actually sampled from
    (logits / temperature, then top-k/top-p truncation, renormalized); for greedy decoding
    (temperature 0) it is the untempered model logprob. At temperature 1 without truncation it
    equals the scoring forward's logprob. Forced tokens (thinking budget) get 0.0 and
    loss_mask False.
    """

    prompt: str
    prompt_ids: list[int]  # (P,) token ids the response was conditioned on (BOS included if any)
    response_ids: list[int]  # (R,) sampled ids, incl. EOS and the token(s) that completed a stop string
    text: str  # decoded response without special tokens, cut at the stop string (kept per spec)
    logprobs: list[float] | None  # (R,) sampler logprobs, or None if spec.logprobs is False
    finish_reason: FinishReason  # "stop": EOS or a stop string; "length": max_tokens reached
    group: int  # index of the prompt in the generate() call
    weight_version: int = 0  # generator weight version that produced the sample
    sample_index: int = 0  # j in 0..n-1 within the group
    stop_reason: str | None = None  # the stop string that ended it, "<eos>" for EOS, None for length
    loss_mask: list[bool] | None = None  # (R,) False for tokens that were not sampled; None = all True
    # partial rollouts (rlvr.distributed.partial): (first response token, weight_version) of each
    # segment, sampled under different policy versions; None = one segment of weight_version
    segments: list[tuple[int, int]] | None = None
    # thinking budget (rlvr.rollout.thinking): tokens sampled in the answer phase, the part that
    # sampling.max_tokens bounds (0 when the model ended inside its reasoning); None = no answer phase
    # of its own: every sampled token (loss_mask True) is the answer. The length terms count this.
    answer_tokens: int | None = None
    # an agent episode whose history was rewritten (rlvr.envs.external): its earlier segments, each a row of its
    # own trained with this rollout's advantage (rlvr.train.pg.rollout_source.training_rows); None = none
    earlier_segments: list[Rollout] | None = None


class EngineError(RuntimeError):
    """A rollout engine failed (start, weight push, generation, the push check); the message names
    the setting to look at. Commands print it as `error: ...` (exit 1), without a traceback."""


class Generator(Protocol):
    """A sampler the trainer talks to without knowing the backend (transformers or vLLM)."""

    weight_version: int

    def generate(
        self, prompts: list[str], spec: SamplingSpec, *, prompt_ids: Sequence[Sequence[int]] | None = None
    ) -> list[Rollout]:
        """len(prompts) * spec.n rollouts, prompt-major (the n samples of prompt i consecutive).
        prompt_ids, if given, are used instead of tokenizing `prompts` (which then only label
        the rollouts)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load new policy weights (names as in model.named_parameters()) and set weight_version;
        every rollout sampled afterwards carries `version` (Rollout.weight_version)."""
        ...

    def sleep(self) -> None:
        """Free the accelerator memory the engine holds while the learner runs (colocated vLLM);
        a no-op for backends without it. The next generate() or update_weights() wakes it."""
        ...


def resolve_prompt_ids(tokenizer, prompts: list[str], prompt_ids: Sequence[Sequence[int]] | None):
    """The token ids each backend conditions on: `prompt_ids` when given (one per prompt), else the
    prompts encoded with add_special_tokens=True, so a BOS is added if the tokenizer adds one (as
    vLLM does) and Rollout.prompt_ids agree between backends."""
    if prompt_ids is None:  # one batch call (the Rust tokenizer's encode_batch), as encode() one by one
        return [list(x) for x in tokenizer(list(prompts), add_special_tokens=True)["input_ids"]] if prompts else []
    if len(prompt_ids) != len(prompts):
        raise ValueError(f"{len(prompt_ids)} prompt_ids for {len(prompts)} prompts")
    return prompt_ids


def sequence_seed(base_seed: int, group: int, sample_index: int) -> int:
    """Seed of the RNG for sample `sample_index` of prompt `group` (a fixed 63-bit mix, so seeds
    of different (group, sample) pairs do not collide for realistic sizes)."""
    x = (base_seed * 0x9E3779B97F4A7C15 + group * 0xBF58476D1CE4E5B9 + sample_index * 0x94D049BB133111EB) & (
        (1 << 64) - 1
    )
    x ^= x >> 31
    x = (x * 0xD6E8FEB86659FD93) & ((1 << 64) - 1)
    x ^= x >> 29
    return x & ((1 << 63) - 1)


class WrappedGenerator:
    """Base of a generator that wraps another (`self.gen`) and changes how it samples: the weight
    version, weight pushes and sleep go to the wrapped engine, so the trainer can push weights to
    the wrapper wherever it pushed them to the generator."""

    def __init__(self, generator):
        self.gen = generator

    @property
    def weight_version(self) -> int:
        return self.gen.weight_version

    def update_weights(self, named_tensors, version: int) -> None:
        self.gen.update_weights(named_tensors, version)

    def sleep(self) -> None:
        self.gen.sleep()



def answer_length(ro: Rollout) -> int:
    """The tokens of `ro` that the policy wrote in its answer turn(s), the ones sampling.max_tokens bounds
    (what the length terms of the objective count, rlvr.train.pg.objective): a thinking budget's answer
    phase (Rollout.answer_tokens), else every sampled token (loss_mask True: an episode's model turns,
    not its tool output or forced text)."""
    if ro.answer_tokens is not None:
        return ro.answer_tokens
    return sampled_length(ro)


def sampled_length(ro: Rollout) -> int:
    """The tokens of `ro` the policy sampled (loss_mask True; every token when loss_mask is None): what the
    reported lengths count (samples.jsonl's `length`, len/*, eval's num_tokens). A thinking budget's forced
    "stop thinking" text and an episode's tool output are in the response but were not sampled. (A rollout-like
    object without a loss_mask, as a scripted generator of rlvr.eval.evaluate may return: every token.)"""
    mask = getattr(ro, "loss_mask", None)
    return len(ro.response_ids) if mask is None else sum(map(bool, mask))


def unsampled_length(ro: Rollout) -> int:
    """The tokens of `ro`'s response the policy did not sample (loss_mask False): forced text, tool output."""
    return len(ro.response_ids) - sampled_length(ro)


def sampled_mean_logprob(ro: Rollout) -> float | None:
    """Mean sampler logprob (Rollout.logprobs) over the sampled tokens only: a forced token's 0.0 (or an
    episode's tool output) is no choice of the policy's. None without logprobs or without a sampled token."""
    lps = getattr(ro, "logprobs", None)
    if not lps:
        return None
    mask = getattr(ro, "loss_mask", None) or [True] * len(lps)
    sampled = [lp for lp, m in zip(lps, mask, strict=True) if m]
    return sum(sampled) / len(sampled) if sampled else None
