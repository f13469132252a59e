"""Batch scoring: N (response, example) pairs -> N Rewards, in input order, never raising.

    rewards = score_batch("r1_zero", responses, examples, workers=4, timeout_s=3.0)
    counters = ScoreCounters.of(rewards)          # per-status counts, timeouts, errors

Two modes, one signature:

* default (`isolate=False`): each reward function runs in the calling process, on `workers`
  threads. Its cheap parts (extraction, guard, the exact fast path) need no IPC at all; only the
  symbolic tier is sent to the shared killable worker pool (rlvr.rewards.pool), sized to at least
  `workers`, each call bounded by `timeout_s`. Pure-Python fast paths hold the GIL, so threads
  mainly overlap the symbolic waits.
* `isolate=True`: the WHOLE reward function runs in a killable worker process per call under
  `timeout_s`. For reward functions that are not ours (or the code sandbox's), which might hang in
  their own code; a hung call becomes Reward(0, status=TIMEOUT). The function must be importable
  by name: a registered name, a "module:function" string, or a picklable module-level callable.

Results are deterministic for a given input (each item is scored independently; the (pred, gold)
cache only stores verdicts that a re-run would reproduce), except that a timeout depends on the
machine's speed by nature. Timeouts and errors are counted in `ScoreCounters`, never hidden.
"""

from __future__ import annotations

import collections
import contextvars
import importlib
import importlib.util
import math
import numbers
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.rewards import pool as _pool
from rlvr.rewards.grader import DEFAULT_TIMEOUT_S, verifier_timeout
from rlvr.rewards.registry import get_reward_fn
from rlvr.rewards.types import ExampleLike, Reward, RewardFn, SimpleExample, Status
from rlvr.runtime import serialize_ast_parse


@dataclass
class ScoreCounters:
    """What happened in one or more batches. `by_status` counts every status (correct,
    incorrect, unparsable, timeout, error); `seconds` is wall time spent in score_batch."""

    total: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: {s.value: 0 for s in Status})
    format_ok: int = 0  # rewards with Reward.formatted (a "format" part > 0)
    with_format: int = 0  # rewards that report a "format" part at all
    seconds: float = 0.0

    @property
    def timeouts(self) -> int:
        return self.by_status.get(Status.TIMEOUT.value, 0)

    @property
    def errors(self) -> int:
        return self.by_status.get(Status.ERROR.value, 0)

    @property
    def accuracy(self) -> float:
        return self.by_status.get(Status.CORRECT.value, 0) / self.total if self.total else 0.0

    @property
    def format_rate(self) -> float:
        """rlvr.rewards.types.format_rate over the rewards added: NaN when none had a format part."""
        return self.format_ok / self.total if self.with_format else math.nan

    @property
    def per_second(self) -> float:
        return self.total / self.seconds if self.seconds > 0 else 0.0

    def add(self, rewards: Sequence[Reward], seconds: float = 0.0) -> None:
        for r in rewards:
            self.total += 1
            key = r.status.value if isinstance(r.status, Status) else str(r.status)
            self.by_status[key] = self.by_status.get(key, 0) + 1
            self.with_format += "format" in r.parts
            self.format_ok += r.formatted
        self.seconds += seconds

    @classmethod
    def of(cls, rewards: Sequence[Reward], seconds: float = 0.0) -> ScoreCounters:
        c = cls()
        c.add(rewards, seconds)
        return c

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "accuracy": self.accuracy,
            "format_rate": None if math.isnan(self.format_rate) else self.format_rate,  # JSON has no NaN
            "by_status": dict(self.by_status),
            "timeouts": self.timeouts,
            "errors": self.errors,
            "seconds": self.seconds,
            "per_second": self.per_second,
        }


def _as_example(ex: ExampleLike | str | Mapping) -> ExampleLike:
    if isinstance(ex, str):
        return SimpleExample(ex)
    if isinstance(ex, Mapping):
        return SimpleExample(str(ex["reference"]), dict(ex.get("meta") or {}))
    return ex


class RewardSpecError(ValueError):
    """A reward spec of the user's ("module:function", "path/to/file.py:function") that cannot be used: its
    module does not load (a SyntaxError, TabError, NameError ... at import: the message names the file and
    line, in one line) or it names no function."""


def reward_file_spec(spec: str) -> tuple[str, str] | None:
    """(file, function) of a path-form reward spec, verl's `./my_checker.py:fn` or `rewards/check.py:fn`
    (the part before the last ':' ends with .py or holds a path separator); None for any other spec."""
    if not isinstance(spec, str) or "," in spec:
        return None
    left, sep, name = spec.strip().rpartition(":")
    if not sep or not left or not name or not name.replace(".", "_").isidentifier():
        return None
    if left.endswith(".py") or "/" in left or os.sep in left:
        return left, name
    return None


def _user_spec(spec: str) -> bool:
    """A "module:function" or path-form spec (anything after ':' that is not a number)."""
    if ":" not in spec or "," in spec:
        return False
    try:
        float(spec.rpartition(":")[2])
    except ValueError:
        return True
    return False


_FILE_MODULES: dict[str, Any] = {}  # resolved file path -> its module (loaded once per process)


def _error_line(exc: BaseException, files: Sequence[str]) -> str:
    """`FILE:LINE: Type: message` of an exception raised while a user's module loads: a SyntaxError's own
    place, else the innermost traceback frame in one of `files` (else the innermost frame)."""
    def shown(file: str) -> str:  # relative to the working directory when under it
        try:
            return str(Path(file).resolve().relative_to(Path.cwd().resolve()))
        except (ValueError, OSError):
            return file

    if isinstance(exc, SyntaxError):
        where = f"{shown(exc.filename)}:{exc.lineno}" if exc.filename else "?"
        return f"{where}: {type(exc).__name__}: {exc.msg}"
    frames = traceback.extract_tb(exc.__traceback__)
    wanted = {str(Path(f).resolve()) for f in files if f}
    mine = [f for f in frames if str(Path(f.filename).resolve()) in wanted] or frames[-1:]
    where = f"{shown(mine[-1].filename)}:{mine[-1].lineno}" if mine else "?"
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{where}: {type(exc).__name__}: {text}"


def _load_file_module(file: str, spec: str):
    path = Path(file).expanduser()
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise RewardSpecError(f"{file}: {what} (a reward given as FILE.py:function)")
    key = str(path.resolve())
    if key in _FILE_MODULES:
        return _FILE_MODULES[key]
    name = "rlvr_user_reward_" + "".join(c if c.isalnum() else "_" for c in path.stem) + f"_{abs(hash(key)):x}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    if mod_spec is None or mod_spec.loader is None:
        raise RewardSpecError(f"{file}: not a Python file that can be loaded")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module  # (dataclasses and pickling look modules up by name)
    try:
        mod_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any error of the user's module is reported in one line
        sys.modules.pop(name, None)
        raise RewardSpecError(f"the reward module does not load: {_error_line(exc, [key])}") from None
    _FILE_MODULES[key] = module
    return module


def _import_user_module(module: str):
    """importlib.import_module(module); when it is not found there, the working directory is tried too (a
    `my_checker.py` beside the command needs no PYTHONPATH=.). Errors of the module itself raise
    RewardSpecError naming its file and line."""
    try:
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as exc:
            top = module.partition(".")[0]
            cwd = os.getcwd()
            here = Path(cwd) / top
            if exc.name != top or cwd in sys.path or not (here.with_suffix(".py").is_file() or here.is_dir()):
                raise
            sys.path.append(cwd)
            return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, TabError, NameError ... at import: one line
        parts = module.split(".")
        if isinstance(exc, ModuleNotFoundError) and exc.name in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise  # the module itself is not found (the config says where a module must be)
        try:
            origin = getattr(importlib.util.find_spec(module), "origin", None)
        except Exception:  # noqa: BLE001 - only for naming the file
            origin = None
        raise RewardSpecError(f"the reward module does not load: {_error_line(exc, [origin or ''])}") from None


def describe_error(exc: BaseException, fn: Any = None) -> str:
    """`FILE:LINE: Type: message` of an exception a user's reward function raised (the innermost frame in
    the function's own file)."""
    target = getattr(fn, "fn", fn)
    code = getattr(target, "__code__", None)
    return _error_line(exc, [code.co_filename] if code is not None else [])


class UserReward:
    """A reward function of the user's ("module:function" or "FILE.py:function"), as the trainers call it.
    It may return a Reward, or a float or bool as verl's compute_score does: a number x is
    Reward(total=float(x), parts={}, status=CORRECT if x > 0 else INCORRECT) (True is 1.0, False 0.0; NaN or
    inf raises, so it is counted as the reward's error). Pickles as its spec (isolate mode's workers load
    the function again)."""

    def __init__(self, spec: str, fn: Callable):
        self.spec, self.fn = spec, fn
        self.__name__ = getattr(fn, "__name__", spec)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __call__(self, response: str, example: ExampleLike) -> Reward:
        return as_reward(self.fn(response, example))

    def __reduce__(self):
        return resolve_reward_fn, (self.spec,)

    def __repr__(self) -> str:
        return f"UserReward({self.spec!r})"


def as_reward(out: Any) -> Reward:
    """A user's reward function's return value as a Reward (UserReward's rule); anything else raises
    TypeError."""
    if isinstance(out, Reward):
        return out
    if isinstance(out, bool | numbers.Real) or type(out).__name__ == "bool_":
        x = float(out)
        if not math.isfinite(x):
            raise ValueError(f"the reward function returned {x}; a reward is a finite number")
        return Reward(x, {}, Status.CORRECT if x > 0 else Status.INCORRECT)
    raise TypeError(f"the reward function returned {type(out).__name__}, not a Reward, a float or a bool")


def load_user_reward(spec: str) -> UserReward:
    """The UserReward of a "module:function" or "FILE.py:function" spec. RewardSpecError (one line naming
    the file and line) when its module does not load, AttributeError when it has no such function,
    ImportError when the module is not found, TypeError when the name is not a function."""
    file_form = reward_file_spec(spec)
    if file_form is not None:
        file, name = file_form
        module = _load_file_module(file, spec)
        where = file
        pickle_spec = f"{Path(file).expanduser().resolve()}:{name}"
    else:
        module_name, _, name = spec.partition(":")
        if not module_name or not name:
            raise ValueError(f"{spec!r} is not 'module:function'")
        module = _import_user_module(module_name)
        file = getattr(module, "__file__", None)
        where = f"module {module_name!r}" + (f" ({file})" if file else "")
        pickle_spec = spec
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                             and getattr(v, "__module__", None) == module.__name__)
            raise AttributeError(f"{where} has no function {name!r}"
                                 + (f"; it defines {', '.join(defined[:8])}" if defined else ""))
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{spec} is not a function ({name} is a {type(obj).__name__})")
    return UserReward(pickle_spec, obj)


def resolve_reward_fn(reward_fn: str | RewardFn) -> RewardFn:
    """A RewardFn from a callable, a registered name / inline composition ("r1_zero:1,language:0.1"),
    a "module:function" (importable, or a module in the working directory) or a "path/to/file.py:function"
    (verl's form). A user's function is wrapped in UserReward (a float or bool return is a Reward)."""
    if callable(reward_fn):
        return reward_fn
    if not isinstance(reward_fn, str):
        raise TypeError(f"reward function must be a name or a callable, got {type(reward_fn).__name__}")
    if _user_spec(reward_fn):
        return load_user_reward(reward_fn.strip())
    return get_reward_fn(reward_fn)


def _safe(fn: RewardFn, response: str, example: ExampleLike) -> Reward:
    try:
        out = fn(response, example)
        if not isinstance(out, Reward):
            return Reward(0.0, {}, Status.ERROR, f"reward function returned {type(out).__name__}, not Reward")
        return out
    except Exception as exc:  # noqa: BLE001 - never raise into the trainer
        return Reward(0.0, {}, Status.ERROR, f"{type(exc).__name__}: {exc}"[:300])


def run_reward_in_worker(reward_fn: str | RewardFn, response: str, reference: str, meta: dict) -> Reward:
    """Worker-side entry point of isolate mode (importable by name)."""
    return _safe(resolve_reward_fn(reward_fn), response, SimpleExample(reference, meta))


def score_batch(
    reward_fn: str | RewardFn,
    responses: Sequence[str],
    examples: Sequence[ExampleLike | str | Mapping],
    *,
    workers: int = 1,
    timeout_s: float | None = None,
    isolate: bool = False,
    counters: ScoreCounters | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Reward]:
    """Score responses[i] against examples[i] for all i; returns rewards in input order.

    reward_fn: registered name ("r1_zero", "r1_zero:1,language:0.1"), "module:function", or a
      RewardFn. examples: ExampleLike objects, reference strings, or {"reference", "meta"} dicts.
    workers: threads (and at least this many verifier processes). timeout_s: deadline per
      symbolic check (isolate=False) or per whole reward call (isolate=True); default
      RLVR_VERIFIER_TIMEOUT_S or 3 s. counters: updated in place if given.
    progress: called with the number of items finished so far (from worker threads).
    An identical (response, example object) pair is scored once and its Reward shared."""
    if len(responses) != len(examples):
        raise ValueError(f"{len(responses)} responses but {len(examples)} examples")
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    timeout = DEFAULT_TIMEOUT_S if timeout_s is None else float(timeout_s)
    exs = [_as_example(e) for e in examples]
    t0 = time.perf_counter()
    out: list[Reward | None] = [None] * len(responses)
    done = [0]

    if isolate:
        resolve_reward_fn(reward_fn)  # fail now on an unknown name
        pool = _pool.get_pool(min_size=workers)

        def one(i: int) -> None:
            ex = exs[i]
            meta = dict(getattr(ex, "meta", None) or {})
            res = pool.call(
                "rlvr.rewards.batch:run_reward_in_worker", (reward_fn, responses[i], ex.reference, meta), timeout
            )
            if res.status == "ok":
                out[i] = res.value
            elif res.status == "timeout":
                out[i] = Reward(0.0, {}, Status.TIMEOUT, res.info)
            else:
                out[i] = Reward(0.0, {}, Status.ERROR, res.info)

    else:
        fn = resolve_reward_fn(reward_fn)
        if workers > 1:
            _pool.get_pool(min_size=workers)
        if hasattr(fn, "prepare_batch"):  # batch work first (the model judge's requests, rlvr.rewards.judge)
            fn.prepare_batch(list(responses), exs, workers=workers, timeout_s=timeout)

        def one(i: int) -> None:
            with verifier_timeout(timeout):
                out[i] = _safe(fn, responses[i], exs[i])

    # An identical (response, example) pair is scored once (a verifiable reward is a function of the two;
    # a group's samples often agree: 357 distinct of the demo's 512), the copies take its Reward.
    n = len(responses)
    first: dict[tuple[str, int], int] = {}
    source = [first.setdefault((responses[i], id(examples[i])), i) for i in range(n)]
    todo = list(first.values())
    copies = collections.Counter(source)

    def run_chunk(indices: Sequence[int]) -> None:
        for i in indices:
            one(i)
            if progress is not None:
                done[0] += copies[i]
                progress(done[0])

    m = len(todo)
    if workers == 1 or m <= 1:
        run_chunk(todo)
    else:
        serialize_ast_parse()  # (a CPython race between threads in ast.parse: rlvr.runtime)
        # interleaved chunks keep slow items (symbolic checks) spread over the threads
        chunks = [todo[k::workers] for k in range(min(workers, m))]
        with ThreadPoolExecutor(max_workers=len(chunks), thread_name_prefix="rlvr-score") as ex:
            futures = [ex.submit(contextvars.copy_context().run, run_chunk, c) for c in chunks]
            for f in futures:
                f.result()
    rewards: list[Reward] = [out[j] if out[j] is not None else Reward(0.0, {}, Status.ERROR, "not scored")
                             for j in source]
    if counters is not None:
        counters.add(rewards, time.perf_counter() - t0)
    return rewards


def score_rollouts(rollouts, examples, reward_fn, *, workers: int = 1, timeout_s: float = 0.0,
                   isolate: bool = False) -> list[Reward]:
    """Task rewards of each rollout through rlvr.rewards.score_batch: hard deadlines, and a timeout
    or a crash becomes a TIMEOUT / ERROR status that is counted (verifier/*), never a silent 0."""
    return score_batch(reward_fn, [r.text for r in rollouts], list(examples), workers=workers,
                       timeout_s=timeout_s or None, isolate=isolate)
