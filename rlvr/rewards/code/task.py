"""The code task format, and the comparison of outputs.

A code task travels to the reward function inside `example.meta` (the rewards layer never
imports the data layer). Keys (all validated by `task_from_meta`, errors name the key):

    language        "python" (the only runner so far)
    entry_point     function name, required for "calls"/"asserts" tests
    tests           {"io": [{"stdin": str, "stdout": str}, ...],          # run as a script
                     "calls": [{"args": [...], "kwargs": {...}, "expected": value}, ...],
                     "asserts": ["assert f(1) == 2", ...],               # one test per string
                     "assert_setup": "optional code run before each assert test"}
    time_limit_s    per test (default 1.0); the process also gets a fixed startup allowance
    memory_limit_mb address-space cap (default 256)
    code_format     "fenced" (default: a ```python block, see extract.py) or "raw"
    public_examples optional, shown in the prompt only; never used for scoring

JSON cannot spell tuples, sets or bytes: write {"__tuple__": [...]}, {"__set__": [...]},
{"__bytes__": "hex"}; any other JSON object is a dict with string keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

LANGUAGES = ("python",)
CODE_FORMATS = ("fenced", "raw")
MAX_TIME_LIMIT_S = 30.0


class CodeTaskError(ValueError):
    """A malformed code task; the message names the offending key."""


@dataclass(frozen=True)
class IOCase:
    stdin: str
    stdout: str


@dataclass(frozen=True)
class CallCase:
    args: tuple
    expected: Any
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CodeTask:
    """One programming problem with its hidden tests. `solution` (optional) is a reference
    program used by the tests of the task set, never shown to the model."""

    prompt: str = ""
    language: str = "python"
    entry_point: str | None = None
    io_tests: tuple[IOCase, ...] = ()
    call_tests: tuple[CallCase, ...] = ()
    assert_tests: tuple[str, ...] = ()
    assert_setup: str = ""
    time_limit_s: float = 1.0
    memory_limit_mb: int = 256
    code_format: str = "fenced"
    public_examples: tuple[Any, ...] = ()
    task_id: str = ""

    @property
    def n_tests(self) -> int:
        return len(self.io_tests) + len(self.call_tests) + len(self.assert_tests)


def json_to_value(data: Any, where: str = "value") -> Any:
    """Task-file JSON -> Python value: tagged objects become tuple/set/frozenset/bytes, other
    objects become dicts."""
    if isinstance(data, list):
        return [json_to_value(v, where) for v in data]
    if isinstance(data, dict):
        if len(data) == 1:
            (tag, body), = data.items()
            if tag in ("__tuple__", "__set__", "__frozenset__") and isinstance(body, list):
                items = [json_to_value(v, where) for v in body]
                return {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset}[tag](items)
            if tag == "__bytes__":
                try:
                    return bytes.fromhex(body)
                except (TypeError, ValueError):
                    raise CodeTaskError(f"{where}: __bytes__ needs a hex string") from None
        return {k: json_to_value(v, where) for k, v in data.items()}
    return data


def _need(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise CodeTaskError(f"code task {where}: {msg}")


def task_from_meta(meta: Mapping[str, Any], prompt: str = "", task_id: str = "") -> CodeTask:
    """Validate `meta` and build a CodeTask. Raises CodeTaskError naming the bad key."""
    _need(isinstance(meta, Mapping), "meta", "must be a mapping")
    known = {"language", "entry_point", "tests", "time_limit_s", "memory_limit_mb", "code_format",
             "public_examples", "solution", "wrong_solutions", "task_id", "prompt", "domain", "family"}
    language = meta.get("language", "python")
    _need(language in LANGUAGES, "meta['language']", f"{language!r} not supported; known: {LANGUAGES}")
    code_format = meta.get("code_format", "fenced")
    _need(code_format in CODE_FORMATS, "meta['code_format']", f"{code_format!r}; known: {CODE_FORMATS}")
    tests = meta.get("tests")
    _need(isinstance(tests, Mapping), "meta['tests']", "missing or not a mapping")
    unknown = set(tests) - {"io", "calls", "asserts", "assert_setup"}
    _need(not unknown, "meta['tests']", f"unknown keys {sorted(unknown)}; known: io, calls, asserts, assert_setup")
    io_tests, call_tests = [], []
    for i, case in enumerate(tests.get("io", [])):
        w = f"meta['tests']['io'][{i}]"
        _need(isinstance(case, Mapping) and isinstance(case.get("stdin", ""), str)
              and isinstance(case.get("stdout"), str), w, "needs string 'stdin' and 'stdout'")
        io_tests.append(IOCase(case.get("stdin", ""), case["stdout"]))
    entry = meta.get("entry_point")
    for i, case in enumerate(tests.get("calls", [])):
        w = f"meta['tests']['calls'][{i}]"
        _need(isinstance(case, Mapping) and isinstance(case.get("args", []), list) and "expected" in case,
              w, "needs a list 'args' and an 'expected' value")
        kwargs = case.get("kwargs", {})
        _need(isinstance(kwargs, Mapping), w, "'kwargs' must be a mapping")
        call_tests.append(CallCase(tuple(json_to_value(case.get("args", []), w)),
                                   json_to_value(case["expected"], w),
                                   {k: json_to_value(v, w) for k, v in kwargs.items()}))
    asserts = tests.get("asserts", [])
    _need(isinstance(asserts, list) and all(isinstance(a, str) for a in asserts),
          "meta['tests']['asserts']", "must be a list of strings")
    setup = tests.get("assert_setup", "")
    _need(isinstance(setup, str), "meta['tests']['assert_setup']", "must be a string")
    if call_tests or asserts:
        _need(isinstance(entry, str) and entry.isidentifier(), "meta['entry_point']",
              "calls/asserts tests need the function name")
    _need(bool(io_tests or call_tests or asserts), "meta['tests']", "has no tests")
    tl = meta.get("time_limit_s", 1.0)
    _need(isinstance(tl, (int, float)) and 0 < tl <= MAX_TIME_LIMIT_S, "meta['time_limit_s']",
          f"must be in (0, {MAX_TIME_LIMIT_S}]")
    mem = meta.get("memory_limit_mb", 256)
    _need(isinstance(mem, int) and 32 <= mem <= 8192, "meta['memory_limit_mb']", "must be an int in [32, 8192]")
    del known  # extra keys (solutions, ids) are allowed: tasks carry data for tests and prompts
    return CodeTask(prompt=prompt or meta.get("prompt", ""), language=language, entry_point=entry,
                    io_tests=tuple(io_tests), call_tests=tuple(call_tests), assert_tests=tuple(asserts),
                    assert_setup=setup, time_limit_s=float(tl), memory_limit_mb=mem,
                    code_format=code_format, public_examples=tuple(meta.get("public_examples", ())),
                    task_id=task_id or str(meta.get("task_id", "")))


def normalize_stdout(text: str) -> list[str]:
    """Lines with trailing whitespace removed and trailing blank lines dropped (the usual judge
    rule: "1 2 \\n" matches "1 2"). Leading whitespace and blank lines inside are significant."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def values_equal(got: Any, expected: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Compare a decoded candidate value with the expected one. Rules: bool is not int; an int
    result never matches a float expectation-free int (2.0 != 2 when 2 is expected); floats match
    within tolerance; lists and tuples compare as sequences (JSON has no tuples); dicts by keys;
    sets exactly."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, float):
        if not isinstance(got, (int, float)):
            return False
        if math.isnan(expected):
            return isinstance(got, float) and math.isnan(got)
        return math.isclose(float(got), expected, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(expected, int):
        return type(got) is int and got == expected
    if isinstance(expected, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(expected)
                and all(values_equal(g, e, rel_tol, abs_tol) for g, e in zip(got, expected, strict=True)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(values_equal(got[k], expected[k], rel_tol, abs_tol) for k in expected))
    if isinstance(expected, (set, frozenset)):
        return isinstance(got, (set, frozenset)) and got == expected
    return type(got) is type(expected) and got == expected
