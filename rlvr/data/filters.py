"""Difficulty filtering and decontamination of training problems (docs/filtering.md).

Pass rates (Kimi k1.5, DAPO, Qwen3): sample each problem k times with a policy and count the answers
the checker marks CORRECT. A problem solved in all or none of its k samples gives a group with
identical rewards, which has zero advantage under every group baseline; the usual filter keeps the
medium band between. Kimi's best-of-eight filter keeps the other end (only problems never solved in
eight tries), and Qwen3 also drops problems the model solves without reasoning (a prompt whose think
block is already closed, `no_reasoning_prompt`).

    counts = estimate_pass_rates(generator, task, examples, spec)        # spec.n = k samples each
    kept = filter_by_band(examples, counts.rates, "medium")             # 0 < rate < 1
    probs = curriculum_weights(counts.rates)                            # favour rates near 0.5
    result = decontaminate(train, held_out, n=8, threshold=0.5)         # n-gram overlap

Bands are intervals of [0, 1] written as in mathematics: "[" / "]" include the end, "(" / ")"
exclude it. "(0, 1)" (the default, named "medium") drops never- and always-solved problems, "[0, 0]"
("never-solved") keeps only the never-solved ones, "[0, 1)" ("not-always-solved") drops only the
always-solved ones. See `Band` and `BANDS`.

Everything here is a plain function of its arguments (a trainer calls them between steps): the
generator is anything with `generate(prompts, spec) -> list[Rollout]` and the task anything with
`.prompt(example) -> str` and `.reward_fn` (rlvr.data.TaskData), so this module imports neither
the rollout nor the training layer.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlvr.data.templates import empty_think_block, think_style
from rlvr.rewards.batch import score_batch
from rlvr.rewards.types import Reward, Status

# A batch scorer (rlvr.train.tasks.task_scorer): (responses, examples) -> one Reward each.
Scorer = Callable[[Sequence[str], Sequence[Any]], Sequence[Reward]]
# A prompt function: example -> prompt text, or (prompt text, forced response prefix); see
# count_correct on what the prefix is for.
PromptFn = Callable[[Any], "str | tuple[str, str]"]

# ----------------------------------------------------------------------------------- pass rates


@dataclass
class PassCounts:
    """Correct samples out of k, per problem (in the order of the examples given).

    failed counts samples whose check timed out or errored: they count as not passed (a problem the
    checker cannot grade is not a solved one) but are reported, never hidden.
    """

    ids: list[str]  # example ids (str(index) for examples without one)
    correct: list[int]  # samples the checker marked CORRECT, per problem, in 0..k
    k: int  # samples per problem
    failed: list[int] = field(default_factory=list)  # timeouts + checker errors, per problem

    @property
    def rates(self) -> list[float]:
        """correct / k per problem, in [0, 1]."""
        return [c / self.k for c in self.correct]

    def __len__(self) -> int:
        return len(self.correct)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per problem: id, correct, k, pass_rate, failed."""
        failed = self.failed or [0] * len(self.correct)
        return [{"id": i, "correct": c, "k": self.k, "pass_rate": c / self.k, "failed": f}
                for i, c, f in zip(self.ids, self.correct, failed, strict=True)]


def _chunk_spec(spec: Any, start: int) -> Any:
    """The spec of the chunk starting at problem `start`: generators seed sample j of prompt i from
    (seed, i, j) with i counted within one generate() call, so each later chunk gets its own seed from
    (seed, start), else all chunks would reuse the first one's random streams. Same mixing as
    rlvr.eval.evaluate's chunks (this layer does not import rlvr.eval)."""
    seed = getattr(spec, "seed", None)
    if start == 0 or seed is None or not dataclasses.is_dataclass(spec):
        return spec
    mixed = (int(seed) * 0x9E3779B97F4A7C15 + (start + 1) * 0xBF58476D1CE4E5B9) % (1 << 62)
    return dataclasses.replace(spec, seed=mixed)


def count_correct(
    generator,
    examples: Sequence[Any],
    prompts: Sequence[str | tuple[str, str]],
    spec,
    *,
    reward_fn: Callable | None = None,
    scorer: Scorer | None = None,
    chunk_size: int = 0,
    chunks: Sequence[int] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> PassCounts:
    """Sample spec.n responses to each prompt and count the CORRECT ones per example.

    prompts[i] is the prompt of examples[i]: a string, or (prompt, prefix) where `prefix` is text
    placed at the start of the response in the prompt (a no-reasoning prompt's closed think block):
    the checker then grades prefix + response, as it would grade a response that wrote the prefix
    itself (r1_zero's format needs `</think> <answer>` in the graded text).
    Scoring: `scorer(responses, examples)` if given (the task's verifier limits), else
    rlvr.rewards.score_batch(reward_fn, ...) (a raising reward is an ERROR, never a crash).
    chunk_size: problems per generate() call (0 = all at once); each later chunk gets a seed derived
    from spec.seed and its first problem. chunks: the sizes of consecutive chunks instead (rlvr.eval.token_chunks:
    sized by tokens). on_progress(done, total) is called after each chunk.
    """
    if len(examples) != len(prompts):
        raise ValueError(f"{len(examples)} examples but {len(prompts)} prompts")
    if reward_fn is None and scorer is None:
        raise ValueError("count_correct: give reward_fn or scorer")
    n = int(spec.n)
    ids = [str(getattr(ex, "id", i)) for i, ex in enumerate(examples)]
    correct = [0] * len(examples)
    failed = [0] * len(examples)
    if chunks is None:
        step = chunk_size if chunk_size and chunk_size > 0 else max(1, len(examples))
        chunks = [min(step, len(examples) - s) for s in range(0, len(examples), step)]
    elif sum(chunks) != len(examples) or any(c < 1 for c in chunks):
        raise ValueError(f"chunks {list(chunks)} do not split {len(examples)} problems")
    for start, step in zip([0, *itertools.accumulate(chunks)][:-1], chunks, strict=True):
        chunk = list(prompts[start:start + step])
        texts = [p if isinstance(p, str) else p[0] for p in chunk]
        prefixes = ["" if isinstance(p, str) else p[1] for p in chunk]
        rollouts = generator.generate(texts, _chunk_spec(spec, start))
        if len(rollouts) != len(chunk) * n:
            raise ValueError(f"generator returned {len(rollouts)} rollouts for {len(chunk)} x n={n}")
        owners = []
        for r, ro in enumerate(rollouts):
            group = getattr(ro, "group", r // n)
            if not 0 <= group < len(chunk):
                raise ValueError(f"rollout {r} has group {group}, outside the {len(chunk)} prompts of the call")
            owners.append(group)
        responses = [prefixes[g] + ro.text for g, ro in zip(owners, rollouts, strict=True)]
        owner_examples = [examples[start + g] for g in owners]
        if scorer is not None:
            rewards = list(scorer(responses, owner_examples))
        else:
            rewards = score_batch(reward_fn, responses, owner_examples)
        if len(rewards) != len(responses):
            raise ValueError(f"scorer returned {len(rewards)} rewards for {len(responses)} responses")
        for g, rew in zip(owners, rewards, strict=True):
            status = Status(rew.status)
            if status is Status.CORRECT:
                correct[start + g] += 1
            elif status in (Status.TIMEOUT, Status.ERROR):
                failed[start + g] += 1
        if on_progress is not None:
            on_progress(min(start + step, len(examples)), len(examples))
    return PassCounts(ids=ids, correct=correct, k=n, failed=failed)


def estimate_pass_rates(
    generator,
    task,
    examples: Sequence[Any],
    spec,
    *,
    prompt: PromptFn | None = None,
    scorer: Scorer | None = None,
    chunk_size: int = 0,
    chunks: Sequence[int] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> PassCounts:
    """Pass rates of `examples` under the policy behind `generator`, k = spec.n samples each.

    task: has .prompt(example) and .reward_fn (rlvr.data.TaskData). prompt: another prompt
    function, e.g. no_reasoning_prompt(task.prompt); default task.prompt. scorer: batch scorer with
    the task's verifier limits (rlvr.train.tasks.task_scorer(task, cfg.data)); default task.reward_fn
    through score_batch. chunk_size / chunks / on_progress: see count_correct.

    A trainer refreshing pass rates every N steps calls this with its own generator (the current
    policy) and a seed that changes per refresh, then feeds the counts to a PassRateTable.
    """
    render = prompt or task.prompt
    return count_correct(generator, examples, [render(ex) for ex in examples], spec,
                         reward_fn=None if scorer is not None else task.reward_fn, scorer=scorer,
                         chunk_size=chunk_size, chunks=chunks, on_progress=on_progress)


def pass_rates(
    generator, examples: Sequence[Any], prompts: Sequence[str], reward_fn: Callable, spec
) -> list[float]:
    """Share of spec.n samples per example whose reward status is CORRECT. Returns one float in
    [0, 1] per example. Timeouts and errors count as not passed (count_correct reports them)."""
    if len(examples) != len(prompts):
        raise ValueError(f"{len(examples)} examples but {len(prompts)} prompts")
    if not examples:
        return []
    return count_correct(generator, examples, prompts, spec, reward_fn=reward_fn).rates


def no_reasoning_prompt(prompt: Callable[[Any], str], *, style: str = "auto", think_start: str = "<think>",
                        think_end: str = "</think>") -> Callable[[Any], tuple[str, str]]:
    """A prompt function whose prompts already hold a closed, empty think block, so the model answers
    without reasoning (Qwen3 drops problems solved this way from its RL data).

    Returns example -> (prompt + block, block): count_correct grades block + response.
    style "qwen3": the block is Qwen3's non-thinking one, "<think>\\n\\n</think>\\n\\n" (only the
    "\\n\\n</think>\\n\\n" part when the prompt already ends with <think>), as its chat template writes
    with enable_thinking=False and as a thinking budget of 0 does (rlvr.rollout.thinking).
    style "r1": " </think> <answer>" after a prompt ending in <think> (the r1_zero template), so the
    response is the answer and its closing tag, and r1_zero's format check passes on block + response.
    style "auto": "r1" when the prompt ends with <think> and mentions <answer>, else "qwen3"
    (rlvr.data.templates.think_style; `rlvr filter` passes the task template's style).
    """
    if style not in ("auto", "qwen3", "r1"):
        raise ValueError(f"no_reasoning_prompt: style={style!r} is unknown; known: 'auto', 'qwen3', 'r1'")

    def render(example) -> tuple[str, str]:
        text = prompt(example)
        kind = think_style(prompt=text, think_start=think_start) if style == "auto" else style
        block = empty_think_block(text, kind, think_start, think_end)  # the one definition (rlvr.data.templates)
        return text + block, block

    return render


# ---------------------------------------------------------------------------------------- bands

# A pass rate of k samples is a multiple of 1/k; ends are compared with this slack so that
# "[0.333, 0.667]" and 1/3, 2/3 behave as written (float division is not exact).
_EPS = 1e-6


@dataclass(frozen=True)
class Band:
    """The pass rates kept: an interval of [0, 1]; each end inclusive or exclusive.

    Written as in mathematics: "[a, b]" keeps a <= r <= b, "(a, b)" keeps a < r < b, "[a, b)" and
    "(a, b]" mix. The default (0, 1) drops both ends; [0, 0] keeps only never-solved problems.
    """

    low: float = 0.0
    high: float = 1.0
    low_inclusive: bool = False
    high_inclusive: bool = False

    def __post_init__(self):
        if not 0.0 <= self.low <= self.high <= 1.0:
            raise ValueError(f"band {self}: need 0 <= low <= high <= 1")
        if self.low == self.high and not (self.low_inclusive and self.high_inclusive):
            raise ValueError(f"band {self} is empty: a single rate needs both ends inclusive, e.g. [0, 0]")

    @classmethod
    def between(cls, min_rate: float = 0.0, max_rate: float = 1.0) -> Band:
        """min_rate <= r <= max_rate (both ends inclusive)."""
        return cls(min_rate, max_rate, True, True)

    @classmethod
    def parse(cls, text: str | Band) -> Band:
        """A name from BANDS ("medium", "never-solved", ...) or an interval: "(0, 1)", "[0,0]",
        "[0.25, 0.75)". ValueError saying what is accepted otherwise."""
        if isinstance(text, Band):
            return text
        t = str(text).strip()
        if t.lower() in BANDS:
            return BANDS[t.lower()]
        m = re.fullmatch(r"([\[(])\s*([0-9.eE+-]+)\s*,\s*([0-9.eE+-]+)\s*([\])])", t)
        if m is None:
            raise ValueError(f"band {t!r}: expected a name ({', '.join(BANDS)}) or an interval such as "
                             "'(0, 1)' or '[0, 0]' ('[' / ']' include the end, '(' / ')' exclude it)")
        try:
            low, high = float(m.group(2)), float(m.group(3))
        except ValueError:
            raise ValueError(f"band {t!r}: the ends must be numbers in [0, 1]") from None
        return cls(low, high, m.group(1) == "[", m.group(4) == "]")

    def __str__(self) -> str:
        return f"{'[' if self.low_inclusive else '('}{self.low:g}, {self.high:g}{']' if self.high_inclusive else ')'}"

    def side(self, rate: float) -> str:
        """"below", "kept" or "above": where `rate` lies relative to the band."""
        if rate < self.low - _EPS or (not self.low_inclusive and rate <= self.low + _EPS):
            return "below"
        if rate > self.high + _EPS or (not self.high_inclusive and rate >= self.high - _EPS):
            return "above"
        return "kept"

    def __contains__(self, rate: float) -> bool:
        return self.side(rate) == "kept"

    @property
    def name(self) -> str | None:
        """The BANDS name of this band, if it has one."""
        return next((k for k, b in BANDS.items() if b == self), None)


# Named bands (the command's --band takes these or an interval).
BANDS: dict[str, Band] = {
    "medium": Band(0.0, 1.0, False, False),  # drop never- and always-solved: groups with a signal
    "never-solved": Band(0.0, 0.0, True, True),  # Kimi's best-of-k: only problems never solved in k tries
    "not-always-solved": Band(0.0, 1.0, True, False),  # drop only the always-solved ones
    "solved-at-least-once": Band(0.0, 1.0, False, True),  # drop only the never-solved ones
    "all": Band(0.0, 1.0, True, True),  # keep everything (report and histogram only)
}


def band_split(rates: Sequence[float | None], band: Band | str = "medium") -> dict[str, list[int]]:
    """Indices of `rates` by side of the band: {"kept": [...], "below": [...], "above": [...],
    "unknown": [...]} (unknown: rate None or NaN, not measured)."""
    b = Band.parse(band)
    out: dict[str, list[int]] = {"kept": [], "below": [], "above": [], "unknown": []}
    for i, r in enumerate(rates):
        if r is None or (isinstance(r, float) and math.isnan(r)):
            out["unknown"].append(i)
        else:
            out[b.side(float(r))].append(i)
    return out


def band_mask(rates: Sequence[float | None], band: Band | str = "medium", *, unknown: bool = True) -> list[bool]:
    """True for each rate inside the band; `unknown` for rates not measured (None / NaN): by default
    kept, so a trainer filtering online does not drop problems it has not sampled yet."""
    split = band_split(rates, band)
    mask = [False] * len(rates)
    for i in split["kept"]:
        mask[i] = True
    for i in split["unknown"]:
        mask[i] = unknown
    return mask


def filter_by_band(examples: Sequence[Any], rates: Sequence[float], band: Band | str = "medium") -> list[Any]:
    """The examples whose pass rate lies in `band` (a Band, a BANDS name or an interval string)."""
    if len(examples) != len(rates):
        raise ValueError(f"{len(examples)} examples but {len(rates)} pass rates")
    keep = set(band_split(rates, band)["kept"])
    return [ex for i, ex in enumerate(examples) if i in keep]


def filter_by_pass_rate(
    examples: Sequence[Any], rates: Sequence[float], *, low: float = 0.0, high: float = 1.0
) -> list[Any]:
    """Examples whose pass rate is strictly between `low` and `high` (defaults: drop the ones
    never and always solved). filter_by_band takes any band, inclusive ends included."""
    if len(examples) != len(rates):
        raise ValueError(f"{len(examples)} examples but {len(rates)} pass rates")
    if not 0.0 <= low < high <= 1.0:
        raise ValueError(f"need 0 <= low < high <= 1, got low={low}, high={high}")
    return [ex for ex, r in zip(examples, rates, strict=True) if low < r < high]


def rate_histogram(correct: Sequence[int], k: int, kept: Sequence[bool] | None = None) -> list[dict[str, Any]]:
    """One bin per possible pass rate j/k (j = 0..k): {"correct": j, "rate": j/k, "count", "kept"}."""
    bins = [{"correct": j, "rate": j / k, "count": 0, "kept": 0} for j in range(k + 1)]
    for i, c in enumerate(correct):
        bins[c]["count"] += 1
        if kept is not None and kept[i]:
            bins[c]["kept"] += 1
    return bins


# ----------------------------------------------------------------------------------- curriculum


def _variance(r: float, target: float) -> float:
    # Bernoulli variance r(1-r), scaled to peak 1 at r = 0.5: the expected size of a group's reward
    # spread, i.e. how much gradient signal a group of samples of the problem carries.
    return 4.0 * r * (1.0 - r)


def _triangle(r: float, target: float) -> float:
    # 1 at `target`, falling linearly to 0 at whichever end of [0, 1] is farther away.
    return max(0.0, 1.0 - abs(r - target) / max(target, 1.0 - target))


def _uniform(r: float, target: float) -> float:
    return 1.0


# name -> (rate, target) -> weight in [0, 1] before the floor.
CURRICULUM_SHAPES: dict[str, Callable[[float, float], float]] = {
    "variance": _variance,
    "triangle": _triangle,
    "uniform": _uniform,
}


def curriculum_weights(
    rates: Sequence[float | None],
    *,
    shape: str = "variance",
    floor: float = 0.05,
    target: float = 0.5,
    unknown: float | None = None,
) -> list[float]:
    """Sampling probabilities (summing to 1) of problems with these pass rates.

    w(r) = shape(r) + floor, normalized. shape "variance": 4 r (1 - r) (peak 1 at r = 0.5, 0 at 0
    and 1); "triangle": peak 1 at `target`, linear to 0 at the far end; "uniform": 1. floor > 0 keeps
    every problem reachable (a problem's rate moves as the policy learns). A rate that is None or NaN
    (not measured yet) is read as `unknown`, by default `target` (the most wanted: try it).
    """
    if shape not in CURRICULUM_SHAPES:
        raise ValueError(f"curriculum shape {shape!r} is unknown; known: {', '.join(CURRICULUM_SHAPES)}")
    if floor < 0:
        raise ValueError(f"curriculum floor must be >= 0, got {floor}")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"curriculum target must be in [0, 1], got {target}")
    fn = CURRICULUM_SHAPES[shape]
    fill = target if unknown is None else unknown
    weights = []
    for r in rates:
        if r is None or (isinstance(r, float) and math.isnan(r)):
            r = fill
        weights.append(fn(min(1.0, max(0.0, float(r))), target) + floor)
    total = sum(weights)
    if total <= 0:
        if not weights:
            return []
        raise ValueError("curriculum weights are all 0 (shape gives 0 to every rate and floor=0): raise floor")
    return [w / total for w in weights]


def curriculum_sample(weights: Sequence[float], n: int, rng: random.Random, *, replace: bool = False) -> list[int]:
    """n indices drawn with probability proportional to `weights`. Without replacement (default: a
    batch does not repeat a problem) by Efraimidis-Spirakis keys u^(1/w); weight-0 items are never
    drawn, and asking for more than the items with weight > 0 is a ValueError."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if replace:
        return rng.choices(range(len(weights)), weights=weights, k=n) if n else []
    positive = [i for i, w in enumerate(weights) if w > 0]
    if n > len(positive):
        raise ValueError(f"cannot draw {n} distinct problems: only {len(positive)} have weight > 0")
    keys = [(math.log(rng.random() or 1e-300) / weights[i], i) for i in positive]
    return [i for _, i in heapq.nlargest(n, keys)]


class PassRateTable:
    """The latest pass-rate estimate per problem id, for a trainer that refreshes rates every N steps
    (estimate_pass_rates on the current policy) and filters or weights the problems it draws.

    update() replaces a problem's counts (the policy moved; old counts describe an older one).
    rates(ids) gives None for problems never measured (band_mask keeps them by default,
    curriculum_weights reads them as its target). state_dict()/load_state_dict() for checkpoints.
    """

    def __init__(self) -> None:
        self._counts: dict[str, tuple[int, int, int]] = {}  # id -> (correct, k, step of the estimate)

    def update(self, counts: PassCounts, step: int = 0) -> None:
        for i, c in zip(counts.ids, counts.correct, strict=True):
            self._counts[i] = (int(c), int(counts.k), int(step))

    def rate(self, example_id: str) -> float | None:
        got = self._counts.get(str(example_id))
        return None if got is None else got[0] / got[1]

    def rates(self, ids: Iterable[str]) -> list[float | None]:
        return [self.rate(i) for i in ids]

    def step_of(self, example_id: str) -> int | None:
        """The step at which a problem's estimate was made (None: never)."""
        got = self._counts.get(str(example_id))
        return None if got is None else got[2]

    def __len__(self) -> int:
        return len(self._counts)

    def state_dict(self) -> dict[str, Any]:
        return {"counts": {i: list(v) for i, v in self._counts.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._counts = {str(i): (int(v[0]), int(v[1]), int(v[2])) for i, v in state.get("counts", {}).items()}


# ------------------------------------------------------------------------------- decontamination

# Word n-grams of 8 by default. GPT-3 used 13-gram collisions to find test documents in web-scale
# training text; math and code problems are short (many MATH problems have under 20 words, a
# GSM8K question about 45), so a 13-gram misses a re-worded copy that differs every dozen words,
# while below ~6 words common phrasings ("what is the value of") collide across unrelated problems.
# 8 words with an overlap share (not a single hit) sits between the two.
DEFAULT_NGRAM = 8
DEFAULT_OVERLAP = 0.5

_WORD = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """Lower-cased runs of letters and digits: punctuation, LaTeX markup and spacing do not count
    ("$x^2+3$" -> ["x", "2", "3"])."""
    return _WORD.findall(text.lower())


def ngrams(text: str, n: int = DEFAULT_NGRAM) -> set[tuple[str, ...]]:
    """The set of word n-grams of `text`. A text of fewer than n words is one gram (all its words),
    so short problems still match their exact (normalized) copies."""
    if n < 1:
        raise ValueError(f"n-gram size must be >= 1, got {n}")
    w = words(text)
    if not w:
        return set()
    if len(w) < n:
        return {tuple(w)}
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


@dataclass
class Contamination:
    """One dropped training problem and the evaluation problem it overlaps most."""

    index: int  # position in the training examples given
    id: str  # training example id
    eval_index: int  # position in the evaluation examples given
    eval_id: str
    overlap: float  # shared n-grams / the training problem's n-grams, in (0, 1]
    shared: int  # number of shared n-grams
    ngram: str  # one shared n-gram, as words
    text: str  # start of the training problem
    eval_text: str  # start of the evaluation problem

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class Decontamination:
    """What decontaminate() kept and dropped (indices refer to the training examples given)."""

    kept: list[Any]
    dropped: list[Any]
    matches: list[Contamination]  # one per dropped example, same order
    kept_indices: list[int]
    n: int
    threshold: float


def _text_of(example: Any) -> str:
    if isinstance(example, str):
        return example
    for key in ("question", "problem", "prompt"):
        value = example.get(key) if isinstance(example, dict) else getattr(example, key, None)
        if value is not None:
            return str(value)
    raise ValueError(f"cannot find the text of {example!r}: give text=")


def _id_of(example: Any, index: int) -> str:
    value = example.get("id") if isinstance(example, dict) else getattr(example, "id", None)
    return str(index) if value is None else str(value)


def _snippet(text: str, limit: int = 160) -> str:
    t = " ".join(text.split())
    return t if len(t) <= limit else t[: limit - 3] + "..."


def decontaminate(
    train: Sequence[Any],
    eval_set: Sequence[Any],
    *,
    n: int = DEFAULT_NGRAM,
    threshold: float = DEFAULT_OVERLAP,
    text: Callable[[Any], str] | None = None,
    eval_text: Callable[[Any], str] | None = None,
) -> Decontamination:
    """Drop training problems whose word n-grams overlap an evaluation problem's.

    overlap(t, e) = |ngrams(t) & ngrams(e)| / |ngrams(t)|: the share of the training problem that
    reappears in the evaluation problem. A training problem is dropped when, for some evaluation
    problem, it shares at least one n-gram and overlap >= threshold (threshold 0: any shared n-gram,
    as GPT-3's 13-gram filter; 1: every n-gram). Its match is the evaluation problem of highest
    overlap (ties: the first). Texts: text(example), default .question / "question" / "problem" /
    "prompt" (examples may be Examples, dicts or strings); eval_text likewise.
    """
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"overlap threshold must be in [0, 1], got {threshold}")
    get_text = text or _text_of
    get_eval_text = eval_text or text or _text_of
    eval_texts = [get_eval_text(e) for e in eval_set]
    index: dict[tuple[str, ...], list[int]] = {}
    for j, t in enumerate(eval_texts):
        for g in ngrams(t, n):
            index.setdefault(g, []).append(j)
    kept, dropped, matches, kept_indices = [], [], [], []
    for i, ex in enumerate(train):
        t = get_text(ex)
        grams = ngrams(t, n)
        hits: dict[int, int] = {}
        first: dict[int, tuple[str, ...]] = {}
        for g in sorted(grams):  # sorted: the reported n-gram does not depend on set order
            for j in index.get(g, ()):
                hits[j] = hits.get(j, 0) + 1
                first.setdefault(j, g)
        best = max(hits, key=lambda j: (hits[j], -j)) if hits else None
        if best is not None and hits[best] / len(grams) >= threshold:
            dropped.append(ex)
            matches.append(Contamination(
                index=i, id=_id_of(ex, i), eval_index=best, eval_id=_id_of(eval_set[best], best),
                overlap=hits[best] / len(grams), shared=hits[best], ngram=" ".join(first[best]),
                text=_snippet(t), eval_text=_snippet(eval_texts[best]),
            ))
        else:
            kept.append(ex)
            kept_indices.append(i)
    return Decontamination(kept=kept, dropped=dropped, matches=matches, kept_indices=kept_indices, n=n,
                           threshold=threshold)


# ------------------------------------------------------------------------------ multiple choice

# Kimi k1.5 drops multiple-choice questions from RL data: a choice can be guessed, so a correct answer does not
# show reasoning. An option is an upper-case letter label: "(A)" (also "\\textbf{(A)}"), or "A." / "A)" / "A:"
# at the start of a line; "dot(A)" (a function call) and "(a)" (a part of a question) are not options.
_PAREN_OPTION = re.compile(r"(?<![\w])\(\s*([A-J])\s*\)")
_LINE_OPTION = re.compile(r"^[ \t]*([A-J])[.):][ \t]+\S", re.MULTILINE)
_CHOICE_CUE = re.compile(r"which of the following|answer choices|correct option|choose (?:the|one)|select (?:the|one)"
                         r"|options?:|choices?:", re.IGNORECASE)
_LETTER_ANSWER = re.compile(r"^\s*(?:\\text(?:bf)?\{)?\(?\s*([A-J])\s*\)?\}?\s*$")


def multiple_choice(question: str, reference: str | None = None) -> str | None:
    """Why `question` is a multiple-choice question, or None: its options run A, B, C, ... (at least three,
    or two with a cue such as "which of the following" or a reference that is a single option letter)."""
    for pattern in (_PAREN_OPTION, _LINE_OPTION):
        labels = {m.group(1) for m in pattern.finditer(question)}
        run = 0
        while chr(ord("A") + run) in labels:
            run += 1
        if run >= 3:
            return f"options (A)-({chr(ord('A') + run - 1)})"
        if run == 2:
            if (cue := _CHOICE_CUE.search(question)) is not None:
                return f"options (A)-(B) and {cue.group(0).lower()!r}"
            if reference is not None and _LETTER_ANSWER.match(str(reference)):
                return f"options (A)-(B) and the answer {str(reference).strip()!r}"
    return None
