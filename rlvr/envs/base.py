"""The environment interface of multi-turn (agent) rollouts.

An environment is a plain Python class registered by name (like tasks). One instance runs one
episode at a time:

    env = make_env("calculator", max_turns=4)
    obs = env.reset(example)             # the first user message (the problem)
    res = env.step(model_turn_text)      # StepResult(observation, reward_parts, done, info)
    ...                                  # until res.done or the turn limit / token budget ends it
    reward = env.final_reward()          # rlvr.rewards.Reward of the whole episode
    env.close()                          # remove the episode's files, kill leftovers

Everything the environment observes about the episode (tool calls by name, tool errors, blocked
calls, integrity flags) is collected in `env.log` (an EpisodeLog), outside the agent's process:
the agent only writes text; tools that execute anything run in rlvr's code sandbox
(rlvr.rewards.code.sandbox), never in the trainer's process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from rlvr.rewards.types import Reward, Status

IntegrityPolicy = Literal["zero", "report"]
INTEGRITY_POLICIES = ("zero", "report")


@dataclass(frozen=True)
class Flag:
    """One integrity finding: `name` (git_history, git_remote, network, test_edit, test_delete,
    hidden_tests, write_outside, ...), what triggered it, and whether the call was blocked
    (prevented) or only detected after the fact."""

    name: str
    detail: str
    blocked: bool = False


@dataclass
class EpisodeLog:
    """What happened in one episode, recorded by the environment (never by the agent)."""

    turns: int = 0
    tool_calls: Counter = field(default_factory=Counter)  # tool name -> calls
    tool_errors: int = 0  # calls whose tool reported an error (bad arguments, failing command, ...)
    blocked: list[str] = field(default_factory=list)  # tool calls refused by a rule (their text)
    flags: list[Flag] = field(default_factory=list)
    truncated: bool = False  # the token budget or the turn limit ended the episode

    def flag(self, name: str, detail: str, blocked: bool = False) -> None:
        self.flags.append(Flag(name, detail[:200], blocked))
        if blocked:
            self.blocked.append(detail[:200])

    @property
    def flag_names(self) -> list[str]:
        return sorted({f.name for f in self.flags})


class ToolError(Exception):
    """A tool call that cannot be carried out as written (a bad path, a directory where a file is needed,
    a NUL in an argument, ...). Environments raise it from their tools and turn it into the call's
    observation ("error: <message>"), counted in EpisodeLog.tool_errors: a failing tool call is
    feedback for the policy, never the end of the episode or of the run. The message is shown to the
    model, so it names the problem in the agent's own terms (workspace-relative paths)."""


def valid_text(text: str) -> str:
    """`text` with anything UTF-8 cannot encode (lone surrogates) replaced by '?': model text is
    made encodable once, before any tool writes it to a file, a pipe or a command line."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


@dataclass
class StepResult:
    """What `Environment.step` returns. observation: the text shown to the model next (tool
    output; '' when done); reward_parts: named reward terms earned by this step (summed over the
    episode); done: the episode is over (final answer given, or nothing more to do)."""

    observation: str
    reward_parts: Mapping[str, float] = field(default_factory=dict)
    done: bool = False


class Environment:
    """Base class. Subclasses set `name`, `stop` (strings that end a model turn, e.g. the closing
    tag of a tool call) and implement reset / step / (optionally) generate_examples and
    final_reward. Constructor keywords: max_turns (model turns per episode) and integrity
    ("zero": an integrity flag zeroes the episode's reward; "report": it is only logged)."""

    name: ClassVar[str] = ""
    stop: ClassVar[tuple[str, ...]] = ()
    system: ClassVar[str] = ""  # instructions put before the first observation

    def __init__(self, *, max_turns: int = 4, integrity: IntegrityPolicy = "zero"):
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        if integrity not in INTEGRITY_POLICIES:
            raise ValueError(f"integrity={integrity!r}; known: {', '.join(INTEGRITY_POLICIES)}")
        self.max_turns = max_turns
        self.integrity = integrity
        self.log = EpisodeLog()
        self.parts: dict[str, float] = {}
        self.solved = False  # set by subclasses: the episode reached the task's goal
        self.answered = True  # subclasses set False when the episode ended without a final answer

    # -- the interface ---------------------------------------------------------------------------
    def reset(self, example) -> str:
        """Start an episode on `example`; returns the first observation (the problem text)."""
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        """Apply one model turn (its text); returns the tool output / feedback."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the episode holds (files, processes). Idempotent."""

    @classmethod
    def generate_examples(cls, n: int, split: str, seed: int) -> list:
        """Built-in problems (rlvr.data.Example) of a split ("train" / "test")."""
        raise NotImplementedError(f"environment {cls.name!r} has no built-in problems")

    # -- shared helpers --------------------------------------------------------------------------
    def _begin(self) -> None:
        self.log = EpisodeLog()
        self.parts = {}
        self.solved = False
        self.answered = True

    def add_parts(self, parts: Mapping[str, float]) -> None:
        for k, v in parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + float(v)

    def final_reward(self) -> Reward:
        """The episode's Reward: the summed reward parts; with integrity="zero" any flag zeroes
        the total (the parts stay as earned, plus parts["integrity"] = -1 so the zeroing shows)."""
        parts = dict(self.parts)
        total = sum(parts.values())
        flagged = bool(self.log.flags)
        info = ""
        if flagged:
            info = "integrity: " + ", ".join(self.log.flag_names)
            parts["integrity"] = -1.0
            if self.integrity == "zero":
                total = 0.0
        solved = self.solved and not (flagged and self.integrity == "zero")
        status = Status.CORRECT if solved else Status.INCORRECT if self.answered else Status.UNPARSABLE
        return Reward(total=total, parts=parts, status=status, info=info)


ENVIRONMENTS: dict[str, type[Environment]] = {}


def register_env(cls: type[Environment]) -> type[Environment]:
    """Class decorator: add an environment to the registry under `cls.name` (clash -> error)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in ENVIRONMENTS and ENVIRONMENTS[cls.name] is not cls:
        raise ValueError(f"environment {cls.name!r} is already registered")
    ENVIRONMENTS[cls.name] = cls
    return cls


def get_env(name: str) -> type[Environment]:
    """Environment class by name; unknown name -> KeyError listing the known ones."""
    try:
        return ENVIRONMENTS[name]
    except KeyError:
        raise KeyError(f"unknown environment {name!r}; known: {', '.join(sorted(ENVIRONMENTS))}") from None


def make_env(name: str, **kwargs: Any) -> Environment:
    return get_env(name)(**kwargs)


EnvFactory = Callable[[], Environment]
