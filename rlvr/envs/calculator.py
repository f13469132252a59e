"""Arithmetic word problems with a tool: the `calculator` and `python_tool` environments.

Protocol (what the model writes, what it sees):

    <|user|>Ann has 37 pens and gets 24 more. How many pens now?     (prompt)
    <calc>37+24</calc>                                              model turn (stops at </calc>)
    <out>61</out>                                                   tool output (out of the loss)
    Answer: 61                                                      model turn (final)

`calculator`: the expression (digits, + - * / // % and parentheses, at most 64 characters) is
parsed with Python's ast and only number literals and those operators are evaluated: no code runs.
`python_tool`: the model writes <python>print(37+24)</python>; the code runs in rlvr's code
sandbox (a fresh box per call, see rlvr.envs.sandboxed) and its stdout is the tool output.

Reward parts: answer = 1 when the final "Answer: N" equals the reference, else 0. A turn with
neither a tool call nor an answer ends the episode (reward 0). A tool error (bad expression,
exception) is shown to the model as <out>error: ...</out> and counted (env/tool_errors).
"""

from __future__ import annotations

import ast
import operator
import random
import re

from rlvr.data.example import Example
from rlvr.envs.base import Environment, StepResult, register_env, valid_text
from rlvr.envs.sandboxed import run_python

_ANSWER = re.compile(r"Answer:\s*(-?\d+)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}
MAX_EXPR = 64

TEMPLATES = {
    "+": "{name} has {a} pens and gets {b} more. How many pens now?",
    "-": "{name} has {a} pens and gives away {b}. How many pens now?",
    "*": "{name} has {a} bags with {b} pens each. How many pens?",
}
NAMES = ("Ann", "Bob", "Eve", "Tom", "Kim")


def safe_eval(expr: str) -> int | float:
    """Value of an arithmetic expression of numbers and + - * / // %; anything else -> ValueError."""
    if len(expr) > MAX_EXPR:
        raise ValueError(f"expression longer than {MAX_EXPR} characters")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ValueError("not an arithmetic expression") from None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ValueError("division by zero")
            return _OPS[type(node.op)](left, right)
        raise ValueError("only numbers and + - * / // % are allowed")

    return ev(tree)


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return str(v)


@register_env
class CalculatorEnv(Environment):
    name = "calculator"
    stop = ("</calc>",)
    open_tag, close_tag = "<calc>", "</calc>"
    tool_name = "calc"

    def reset(self, example) -> str:
        self._begin()
        self.example = example
        return example.question

    def run_tool(self, body: str) -> tuple[str, bool]:
        """(output, ok) of one tool call."""
        try:
            return _fmt(safe_eval(body)), True
        except (ValueError, ArithmeticError, RecursionError) as exc:
            return f"error: {exc}", False

    def step(self, action: str) -> StepResult:
        action = valid_text(action)
        k = action.find(self.open_tag)
        if k >= 0 and action.find(self.close_tag, k) > k:
            body = action[k + len(self.open_tag): action.find(self.close_tag, k)]
            self.log.tool_calls[self.tool_name] += 1
            out, ok = self.run_tool(body)
            if not ok:
                self.log.tool_errors += 1
            return StepResult(observation=f"<out>{out}</out>")
        m = _ANSWER.search(action)
        if m is None:
            self.answered = False
            return StepResult("", {"answer": 0.0}, done=True)
        right = m.group(1) == str(self.example.reference).strip()
        self.solved = right
        return StepResult("", {"answer": 1.0 if right else 0.0}, done=True)

    @classmethod
    def generate_examples(cls, n: int, split: str, seed: int, digits: int = 2) -> list:
        """n distinct problems a OP b (a, b with `digits` digits; a >= b for "-"); the train and
        test splits never share an (a, op, b) triple. Raises ValueError when there are fewer than n."""
        rng = random.Random(f"{cls.name}:{split}:{seed}")
        lo, hi = (10 ** (digits - 1) if digits > 1 else 0), 10**digits - 1
        total = 3 * (hi - lo + 1) ** 2
        if n > 0.7 * total:
            raise ValueError(f"{cls.name}: {n} {split} problems asked, but {digits}-digit operands give only "
                             f"{total} triples (about 80% train, 20% test); lower data.num_train/num_eval or raise data.digits")
        out, seen = [], set()
        while len(out) < n:
            op = rng.choice("+-*")
            a, b = rng.randint(lo, hi), rng.randint(lo, hi)
            if op == "-" and a < b:
                a, b = b, a
            key = (a, op, b)
            # the split is a function of the triple, so train and test are disjoint
            if key in seen or (hash_split(key) == "test") != (split == "test"):
                continue
            seen.add(key)
            name = NAMES[rng.randrange(len(NAMES))]
            value = {"+": a + b, "-": a - b, "*": a * b}[op]
            out.append(Example(id=f"{cls.name}:{split}:{a}{op}{b}", question=TEMPLATES[op].format(name=name, a=a, b=b),
                               reference=str(value), meta={"a": a, "b": b, "op": op},
                               solution=f"{cls.open_tag}{cls.call_text(a, op, b)}{cls.close_tag}"))
        return out

    @classmethod
    def call_text(cls, a: int, op: str, b: int) -> str:
        return f"{a}{op}{b}"


def hash_split(key) -> str:
    """A fixed 1-in-5 test split of the (a, op, b) triples (stable across runs and processes)."""
    import zlib

    return "test" if zlib.crc32(repr(key).encode()) % 5 == 0 else "train"


@register_env
class PythonToolEnv(CalculatorEnv):
    """Same problems; the tool is Python run in the code sandbox: <python>print(37+24)</python>."""

    name = "python_tool"
    stop = ("</python>",)
    open_tag, close_tag = "<python>", "</python>"
    tool_name = "python"

    def run_tool(self, body: str) -> tuple[str, bool]:
        r = run_python(body)
        for name, detail in r.flags:
            self.log.flag(name, detail)
        if not r.ok:
            tail = (r.stderr.strip().splitlines() or [r.killed or f"exit {r.returncode}"])[-1]
            return f"error: {tail[:120]}", False
        return r.stdout.strip()[:200], True

    @classmethod
    def call_text(cls, a: int, op: str, b: int) -> str:
        return f"print({a}{op}{b})"
