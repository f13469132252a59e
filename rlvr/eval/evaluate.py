"""`evaluate`: sample with any Generator, score with any reward function, aggregate.

    result = evaluate(generator, examples, prompts, get_reward_fn("arithmetic"),
                      SamplingSpec(n=1, temperature=0.0, max_tokens=16, seed=0))    # greedy
    result.accuracy, result.format_rate, result.pass_at_k, result.maj_at_k, result.metrics("eval/")

Metric definitions are in rlvr/eval/metrics.py (and docs/runs.md).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.eval.metrics import (
    default_ks,
    is_formatted,
    length_stats,
    mean_maj_at_k,
    mean_pass_at_k,
    status_counts,
    vote_key,
)
from rlvr.eval.reflection import reflection_rate
from rlvr.models.positions import prompt_lengths
from rlvr.rewards.batch import score_batch
from rlvr.rewards.extract import final_answer
from rlvr.rewards.types import Reward, Status, format_rate
from rlvr.rollout.types import sampled_length, unsampled_length

BatchScorer = Callable[[Sequence[str], Sequence[Any]], Sequence[Reward]]


@dataclass
class EvalSample:
    """One scored response."""

    example_index: int  # position of the example in the `examples` argument
    example_id: str  # example.id when it has one, else str(example_index)
    sample_index: int  # j in 0..n-1 within the example's group
    prompt: str
    response: str
    reference: str
    reward: float  # Reward.total
    parts: dict[str, float]  # Reward.parts
    status: str  # Status value: correct / incorrect / unparsable / timeout / error
    num_tokens: int  # response length in tokens: the sampled ones (rlvr.rollout.types.sampled_length)
    finish_reason: str  # "stop" | "length"
    info: str = ""  # Reward.info (why it was judged so)
    answer: str | None = None  # the graded answer maj@k votes with; None when not graded (see graded_answer)
    unsampled_tokens: int = 0  # response tokens the policy did not sample (a thinking budget's forced text)

    @property
    def graded(self) -> bool:
        """The reward judged an answer (correct or incorrect); other statuses abstain in maj@k."""
        return self.status in (Status.CORRECT.value, Status.INCORRECT.value)

    @property
    def correct(self) -> bool:
        return self.status == Status.CORRECT.value

    @property
    def formatted(self) -> bool:
        return is_formatted(self.parts, self.status)


@dataclass
class EvalResult:
    """Per-sample records (prompt-major: the n samples of example i are consecutive) and aggregates."""

    samples: list[EvalSample]
    n: int  # samples per example
    temperature: float  # 0 = greedy
    num_examples: int
    accuracy: float  # fraction of samples with status correct (= mean pass@1)
    format_rate: float  # fraction of samples judged formatted; NaN when the reward has no format part
    mean_reward: float  # mean Reward.total
    truncated_rate: float  # fraction of samples that hit max_tokens
    lengths: dict[str, float]  # len/mean, len/median, len/max, len/correct, len/incorrect (tokens)
    status_counts: dict[str, int]  # samples per reward status
    pass_at_k: dict[int, float] = field(default_factory=dict)  # k -> mean unbiased pass@k (n > 1)
    maj_at_k: dict[int, float] = field(default_factory=dict)  # k -> mean maj@k over disjoint groups (n > 1, k > 1)
    seconds: float = 0.0  # wall time of generation and scoring (evaluate); 0 when only summarized
    reflection_rate: float = math.nan  # share of responses with a reflection phrase (rlvr.eval.reflection)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def metrics(self, prefix: str = "") -> dict[str, float]:
        """Flat numbers for metrics.jsonl / tables: accuracy, format_rate, reward, lengths, counts,
        pass@k, maj@k; keys prefixed (e.g. "eval/"). Timing is not included (it is not a property
        of the policy); the caller adds it where wanted."""
        out: dict[str, float] = {
            "accuracy": self.accuracy,
            "format_rate": self.format_rate,
            "reward": self.mean_reward,
            "truncated_rate": self.truncated_rate,
            **self.lengths,
            "text/reflection_rate": self.reflection_rate,
        }
        for k, v in self.pass_at_k.items():
            out[f"pass@{k}"] = v
        for k, v in self.maj_at_k.items():
            out[f"maj@{k}"] = v
        for status, count in self.status_counts.items():
            out[f"status/{status}"] = count
        return {prefix + k: v for k, v in out.items()}

    def per_example(self) -> list[list[EvalSample]]:
        """Samples grouped by example (n each)."""
        return [self.samples[i * self.n:(i + 1) * self.n] for i in range(self.num_examples)]

    def sample_rows(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Samples as plain dicts (for samples.jsonl / RunDir.log_samples)."""
        rows = [dataclasses.asdict(s) for s in self.samples]
        return rows if limit is None else rows[:limit]


def _chunk_spec(spec: Any, start: int) -> Any:
    """The spec for the chunk starting at prompt `start`. Generators seed sample j of prompt i
    from (seed, i, j) with i counted within one generate call, so every chunk after the first
    gets its own seed derived from (seed, start); otherwise chunks would repeat the first one's
    random streams. The first chunk keeps the seed, so chunk_size >= len(prompts) is unchanged."""
    seed = getattr(spec, "seed", None)
    if start == 0 or seed is None or not dataclasses.is_dataclass(spec):
        return spec
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + (start + 1) * 0xBF58476D1CE4E5B9) % (1 << 62)
    return dataclasses.replace(spec, seed=mixed)


# Token budget of one generate call of a CPU evaluation: rows x (longest prompt + max_tokens). On CPU the
# prefill's attention over a padded batch grows with rows x length^2 and stops fitting in cache, so a fixed
# 256 prompts of MATH-500 under r1_zero (400-1200 tokens each) took 4.5x the time of token-sized calls
# (benchmarks/eval_cpu_batch.py). GPUs keep the fixed batch: there a wide batch is what is fast.
CPU_EVAL_TOKENS = 16384


def token_chunks(lengths: Sequence[int], *, n: int, max_tokens: int, budget: int, max_prompts: int) -> list[int]:
    """Sizes of consecutive prompt chunks (they sum to len(lengths)): each holds as many prompts as keep
    its rows (prompts x n samples) times (its longest prompt + max_tokens) within `budget` tokens, at
    most `max_prompts`, and at least one prompt."""
    sizes: list[int] = []
    i = 0
    while i < len(lengths):
        size, longest = 0, 0
        while i + size < len(lengths) and size < max(1, max_prompts):
            widest = max(longest, lengths[i + size])
            if size and (size + 1) * n * (widest + max_tokens) > budget:
                break
            size, longest = size + 1, widest
        sizes.append(size)
        i += size
    return sizes


def cpu_chunks(tokenizer: Any, prompts: Sequence[str], *, n: int, max_tokens: int, max_prompts: int, device: str,
               backend: str = "hf") -> list[int] | None:
    """token_chunks with CPU_EVAL_TOKENS for the HF engine on CPU (the prompts tokenized as the sampler
    encodes them); None elsewhere (a GPU or vLLM: `max_prompts` per call, as configured)."""
    if backend != "hf" or not str(device).startswith("cpu") or not prompts:
        return None

    return token_chunks(prompt_lengths(tokenizer, prompts), n=n, max_tokens=max_tokens, budget=CPU_EVAL_TOKENS,
                        max_prompts=max_prompts)


def summarize(
    samples: list[EvalSample], n: int, temperature: float, ks: Sequence[int] | None = None
) -> EvalResult:
    """Aggregate already-scored samples (prompt-major, n per example) into an EvalResult."""
    if n < 1 or len(samples) % n:
        raise ValueError(f"{len(samples)} samples is not a multiple of n={n}")
    num_examples = len(samples) // n
    total = len(samples)
    correct = [s.correct for s in samples]
    per_example = [(n, sum(correct[i * n:(i + 1) * n])) for i in range(num_examples)]
    pass_k: dict[int, float] = {}
    maj_k: dict[int, float] = {}
    if n > 1 and num_examples:
        votes = [vote_key(s.correct, s.answer) if s.graded else None for s in samples]
        per_example_votes = [votes[i * n:(i + 1) * n] for i in range(num_examples)]
        for k in ks if ks is not None else default_ks(n):
            if 1 <= k <= n:
                pass_k[k] = mean_pass_at_k(per_example, k)
                if k > 1:  # maj@1 is accuracy again
                    maj_k[k] = mean_maj_at_k(per_example_votes, k)
    return EvalResult(
        samples=samples,
        n=n,
        temperature=temperature,
        num_examples=num_examples,
        accuracy=sum(correct) / total if total else math.nan,
        format_rate=format_rate([s.parts for s in samples]),  # NaN ("n/a") without a format part
        mean_reward=sum(s.reward for s in samples) / total if total else math.nan,
        truncated_rate=sum(s.finish_reason == "length" for s in samples) / total if total else math.nan,
        lengths=length_stats([s.num_tokens for s in samples], correct),
        status_counts=status_counts([s.status for s in samples]),
        pass_at_k=pass_k,
        maj_at_k=maj_k,
        reflection_rate=reflection_rate([s.response for s in samples]),
    )


def graded_answer(reward: Reward, response: str) -> str | None:
    """The answer a graded sample votes with in maj@k: Reward.answer when the reward reports it,
    else rlvr.rewards.extract.final_answer of the response, else the response's last 1000
    characters (the reward graded *something*; a distinct wrong answer must still be a vote).
    None for samples the reward did not grade (unparsable, timeout, error)."""
    if Status(reward.status) not in (Status.CORRECT, Status.INCORRECT):
        return None
    answer = getattr(reward, "answer", None)
    if answer is not None:
        return str(answer)

    found = final_answer(response)
    return found if found is not None else response[-1000:]


def evaluate(
    generator: Any,
    examples: Sequence[Any],
    prompts: Sequence[str],
    reward_fn: Callable[[str, Any], Reward] | None,
    spec: Any,
    *,
    ks: Sequence[int] | None = None,
    scorer: BatchScorer | None = None,
    chunk_size: int | None = None,
    chunks: Sequence[int] | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
) -> EvalResult:
    """Generate spec.n responses per prompt with `generator`, score each against its example and
    aggregate.

    generator: has `generate(prompts, spec) -> list[Rollout]` (prompt-major, n per prompt).
    examples: objects with `.reference` (and `.meta`, `.id` if the reward function needs them);
      examples[i] is scored against the responses to prompts[i].
    reward_fn: `(response, example) -> Reward`; or None when `scorer` is given.
    spec: a SamplingSpec (temperature 0 = greedy; n > 1 adds pass@k and maj@k (k > 1) for ks,
      default 1, 2, 4, .., n).
    scorer: optional batch scorer `(responses, examples) -> list[Reward]` (e.g. the rewards
      layer's pool with hard timeouts); used instead of calling reward_fn per response.
    chunk_size: prompts per generate call (None = all at once); on_chunk(done, total) is called
      after each chunk (for progress bars). Greedy results do not depend on it; sampled ones do
      (each chunk gets a seed derived from spec.seed and its first prompt, see _chunk_spec).
    chunks: the sizes of consecutive chunks instead (token_chunks: sized by tokens), summing to len(prompts).
    """
    if len(examples) != len(prompts):
        raise ValueError(f"evaluate: {len(examples)} examples but {len(prompts)} prompts")
    if reward_fn is None and scorer is None:
        raise ValueError("evaluate: give reward_fn or scorer")
    n = int(spec.n)
    t0 = time.perf_counter()
    if chunks is None:
        step = chunk_size or max(1, len(prompts))
        chunks = [min(step, len(prompts) - s) for s in range(0, len(prompts), step)]
    elif sum(chunks) != len(prompts) or any(c < 1 for c in chunks):
        raise ValueError(f"evaluate: chunks {list(chunks)} do not split {len(prompts)} prompts")
    starts = [0, *itertools.accumulate(chunks)][:-1]
    samples: list[EvalSample] = []
    for start, step in zip(starts, chunks, strict=True):
        chunk_prompts = list(prompts[start:start + step])
        chunk_examples = examples[start:start + step]
        rollouts = generator.generate(chunk_prompts, _chunk_spec(spec, start))
        if len(rollouts) != len(chunk_prompts) * n:
            raise RuntimeError(
                f"generator returned {len(rollouts)} rollouts for {len(chunk_prompts)} prompts x n={n}"
            )
        # rollout r belongs to prompt r // n (prompt-major order, checked via Rollout.group if present)
        owners = [chunk_examples[r // n] for r in range(len(rollouts))]
        for r, ro in enumerate(rollouts):
            group = getattr(ro, "group", r // n)
            if group != r // n:
                raise RuntimeError(f"rollout {r} has group {group}, expected {r // n}: not prompt-major")
        texts = [ro.text for ro in rollouts]
        if scorer is not None:
            rewards = list(scorer(texts, owners))
            if len(rewards) != len(texts):
                raise RuntimeError(f"scorer returned {len(rewards)} rewards for {len(texts)} responses")
        else:
            # The same scorer as training: a raising reward becomes an ERROR status, symbolic checks
            # run under the verifier's hard deadline; never a crash of the evaluation.
            rewards = score_batch(reward_fn, texts, owners)
        for r, (ro, rew) in enumerate(zip(rollouts, rewards, strict=True)):
            idx = start + r // n
            ex = owners[r]
            samples.append(
                EvalSample(
                    example_index=idx,
                    example_id=str(getattr(ex, "id", idx)),
                    sample_index=r % n,
                    prompt=chunk_prompts[r // n],
                    response=ro.text,
                    reference=str(getattr(ex, "reference", "")),
                    reward=float(rew.total),
                    parts={k: float(v) for k, v in dict(rew.parts).items()},
                    status=Status(rew.status).value,
                    num_tokens=sampled_length(ro),
                    finish_reason=str(ro.finish_reason),
                    info=str(rew.info),
                    answer=graded_answer(rew, ro.text),
                    unsampled_tokens=unsampled_length(ro),
                )
            )
        if on_chunk is not None:
            on_chunk(min(start + step, len(prompts)), len(prompts))
    result = summarize(samples, n, float(spec.temperature), ks)
    result.seconds = time.perf_counter() - t0
    return result

