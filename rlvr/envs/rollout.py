"""Multi-turn rollouts: episodes of an Environment driven through any Generator (hf or vllm).

One episode's transcript is: prompt, model turn, tool output, model turn, ... Per turn, every
unfinished episode of the batch is sampled in ONE generator call (prompt_ids = the episode's
transcript so far), then each environment steps on its turn's text. The episode becomes one
Rollout whose response_ids are all tokens after the prompt; loss_mask is True only for the
model's own sampled tokens (tool output and chat-template glue are context, out of the loss) and
logprobs hold the sampler's logprobs for model tokens and 0.0 elsewhere.

Limits per episode: env.max_turns model turns, and a token budget (max_tokens_total) on everything
after the prompt; each turn samples at most min(spec.max_tokens, what is left of the budget).
A tool output that would overflow the budget ends the episode (truncated).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlvr.envs.base import Environment, EpisodeLog
from rlvr.envs.format import TurnFormat
from rlvr.rewards.types import Reward, Status
from rlvr.rollout.types import Rollout, SamplingSpec
from rlvr.runtime import serialize_ast_parse


@dataclass
class Episode:
    """One finished episode: its whole transcript as a Rollout, the reward and the log."""

    example: Any
    rollout: Rollout
    reward: Reward
    log: EpisodeLog
    turn_texts: list[str]  # the model's turns, as the environment saw them


@dataclass
class _State:
    group: int
    sample: int
    env: Environment
    prompt: str
    prompt_ids: list[int]
    resp: list[int]
    lps: list[float]
    mask: list[bool]
    turns: list[str]
    done: bool = False
    stop_reason: str | None = None
    crashed: str = ""  # the environment's exception ("Type: message"): the episode is unscored


def _step(s: _State, text: str):
    """s.env.step(text), or None when the environment itself raised (a bug of the environment, not a tool
    error it reports to the model): the episode ends and is unscored (its Reward's status is ERROR, so it is
    kept out of its group's baseline, counted and printed by the run's reward error log)."""
    try:
        return s.env.step(text)
    except Exception as exc:  # noqa: BLE001 - one crashed episode must not end the run
        s.crashed = f"environment {getattr(s.env, 'name', type(s.env).__name__)} crashed in step(): " \
                    f"{type(exc).__name__}: {exc}"[:300]
        return None


def _final_reward(s: _State) -> Reward:
    """The episode's Reward: the environment's, or an unscored one (Status.ERROR) when it crashed."""
    if not s.crashed:
        try:
            return s.env.final_reward()
        except Exception as exc:  # noqa: BLE001
            s.crashed = f"environment {getattr(s.env, 'name', type(s.env).__name__)} crashed in final_reward(): " \
                        f"{type(exc).__name__}: {exc}"[:300]
    return Reward(0.0, {}, Status.ERROR, s.crashed)


def _turn_seed(base: int, turn: int) -> int:
    return (base * 1_000_003 + 7919 * turn) % (1 << 62)


def run_episodes(generator, make_env: Callable[[], Environment], examples: Sequence[Any], spec: SamplingSpec,
                 tokenizer, *, fmt: TurnFormat | None = None, max_tokens_total: int = 256,
                 workers: int = 1) -> list[Episode]:
    """len(examples) * spec.n episodes, prompt-major (like Generator.generate). spec: per-turn
    sampling (max_tokens per turn; its stop strings are added to the environment's; the stop
    string is kept in the turn's text). workers > 1 steps the environments of a turn in threads
    (their tools run in sandbox processes, so threads overlap the waiting)."""
    if max_tokens_total < 1:
        raise ValueError(f"max_tokens_total={max_tokens_total} must be >= 1")
    fmt = fmt or TurnFormat(tokenizer)
    base = spec.seed if spec.seed is not None else int(torch.randint(0, 2**62, (), dtype=torch.int64))
    states: list[_State] = []
    try:
        for i, ex in enumerate(examples):
            for j in range(spec.n):
                env = make_env()
                states.append(_State(i, j, env, "", [], [], [], [], []))
                obs = env.reset(ex)
                prompt = fmt.prompt(env.system, obs)
                states[-1].prompt, states[-1].prompt_ids = prompt, list(tokenizer.encode(prompt))
        turn = 0
        if workers > 1:
            serialize_ast_parse()  # tools and rewards in threads (a CPython race in ast.parse: rlvr.runtime)
        pool = ThreadPoolExecutor(workers) if workers > 1 else None
        try:
            while True:
                active = [s for s in states if not s.done]
                if not active:
                    break
                turn += 1
                # rows with the same per-turn length limit are sampled together (usually all of them)
                by_limit: dict[int, list[_State]] = {}
                for s in active:
                    by_limit.setdefault(min(spec.max_tokens, max_tokens_total - len(s.resp)), []).append(s)
                stepped: list[tuple[_State, Rollout]] = []
                for limit, rows in by_limit.items():
                    stops = tuple(dict.fromkeys((*rows[0].env.stop, *spec.stop)))
                    tspec = replace(spec, n=1, max_tokens=limit, min_tokens=min(spec.min_tokens, limit),
                                    stop=stops, include_stop_str_in_output=True, seed=_turn_seed(base, turn))
                    outs = generator.generate([s.prompt for s in rows], tspec,
                                              prompt_ids=[s.prompt_ids + s.resp for s in rows])
                    stepped += list(zip(rows, outs, strict=True))
                for s, ro in stepped:
                    n = len(ro.response_ids)
                    s.resp += ro.response_ids
                    s.lps += list(ro.logprobs) if ro.logprobs is not None else [0.0] * n
                    s.mask += list(ro.loss_mask) if ro.loss_mask is not None else [True] * n
                    s.turns.append(ro.text)
                    s.stop_reason = ro.stop_reason
                    s.env.log.turns += 1
                    if ro.finish_reason == "length" and len(s.resp) >= max_tokens_total:
                        s.env.log.truncated = True  # the budget cut this turn (the env still sees it)
                results = list(pool.map(lambda sr: _step(sr[0], sr[1].text), stepped)) if pool else \
                    [_step(s, ro.text) for s, ro in stepped]
                for (s, ro), res in zip(stepped, results, strict=True):
                    if res is None:  # the environment raised: the episode ends unscored (s.crashed)
                        s.done = True
                        continue
                    s.env.add_parts(res.reward_parts)
                    if res.done:
                        s.done = True
                        continue
                    if s.env.log.turns >= s.env.max_turns or len(s.resp) >= max_tokens_total:
                        s.done, s.env.log.truncated = True, True
                        continue
                    between = tokenizer.encode(fmt.observation(res.observation, ro.stop_reason == "<eos>"),
                                               add_special_tokens=False)
                    if len(s.resp) + len(between) >= max_tokens_total:
                        s.done, s.env.log.truncated = True, True  # no room left for a model turn
                        continue
                    s.resp += between
                    s.lps += [0.0] * len(between)
                    s.mask += [False] * len(between)
        finally:
            if pool is not None:
                pool.shutdown()
        episodes = []
        for s in states:
            reward = _final_reward(s)
            ro = Rollout(prompt=s.prompt, prompt_ids=s.prompt_ids, response_ids=s.resp,
                         text=tokenizer.decode(s.resp, skip_special_tokens=True),
                         logprobs=s.lps if spec.logprobs else None,
                         finish_reason="length" if s.env.log.truncated else "stop", group=s.group,
                         weight_version=getattr(generator, "weight_version", 0), sample_index=s.sample,
                         stop_reason=s.stop_reason, loss_mask=s.mask)
            episodes.append(Episode(examples[s.group], ro, reward, s.env.log, s.turns))
        return episodes
    finally:
        for s in states:
            s.env.close()


def episode_metrics(episodes: Sequence[Episode], prefix: str = "env/") -> dict[str, float]:
    """Per-step agent metrics: turns per episode, tool calls per episode by tool name, tool errors
    and blocked calls per episode, integrity flags (count per flag name and the share of flagged
    episodes), the share of episodes that ran out of turns or tokens."""
    n = len(episodes)
    if not n:
        return {}
    m: dict[str, float] = {f"{prefix}turns": sum(e.log.turns for e in episodes) / n}
    calls: Counter = Counter()
    flags: Counter = Counter()
    for e in episodes:
        calls.update(e.log.tool_calls)
        flags.update(f.name for f in e.log.flags)
    m[f"{prefix}tool_calls"] = sum(calls.values()) / n
    for name, c in sorted(calls.items()):
        m[f"{prefix}tool_calls/{name}"] = c / n
    m[f"{prefix}tool_errors"] = sum(e.log.tool_errors for e in episodes) / n
    m[f"{prefix}blocked_calls"] = sum(len(e.log.blocked) for e in episodes)
    m[f"{prefix}flagged_frac"] = sum(bool(e.log.flags) for e in episodes) / n
    for name, c in sorted(flags.items()):
        m[f"{prefix}flags/{name}"] = c
    m[f"{prefix}truncated_frac"] = sum(e.log.truncated for e in episodes) / n
    return m
