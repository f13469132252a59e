"""rlvr.runtime.serialize_ast_parse: ast.parse one thread at a time while rewards and tools run in threads.

CPython 3.11 raises `SystemError: AST constructor recursion depth mismatch` when two threads build parsed trees at
once and one is switched out mid-way (a finalizer run by the garbage collector is enough): it scored a correct
reference program of the code task set 0 in this suite (tests/data/test_code_tasks.py, 4 reward threads). Each
check runs in a fresh interpreter, so the process-wide wrapper is installed there and nowhere else."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

CONCURRENCY = """
import ast, threading, time, sys
inside, most = [0], [0]
def slow_parse(*args, **kwargs):  # stands for the original: records how many threads are in it at once
    inside[0] += 1
    most[0] = max(most[0], inside[0])
    time.sleep(0.05)
    inside[0] -= 1
ast.parse = slow_parse
if sys.argv[1] == "1":
    from rlvr.runtime import serialize_ast_parse
    serialize_ast_parse()
    serialize_ast_parse()  # idempotent: wrapped once
    assert ast.parse.__wrapped__ is slow_parse
ts = [threading.Thread(target=ast.parse, args=("x = 1",)) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
print(most[0])
"""

RACE = """
import ast, threading, time
from rlvr.runtime import serialize_ast_parse
serialize_ast_parse()
class Cycle:  # garbage whose finalizer releases the GIL while another thread is inside ast.parse
    def __init__(self): self.me = self
    def __del__(self): time.sleep(0)
src = "\\n".join(f"def f{i}(x):\\n    return [y * {i} for y in range(x) if y % 3 == 0 and (y + 1) or y]"
                for i in range(100))
errors, stop = [], []
def garbage():
    while not stop:
        for _ in range(5):
            Cycle()
        time.sleep(0.0005)
def parse_many():
    for _ in range(60):
        try:
            ast.parse(src)
        except SystemError as e:
            errors.append(str(e))
g = threading.Thread(target=garbage)
g.start()
ts = [threading.Thread(target=parse_many) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
stop.append(1)
g.join()
print(len(errors), errors[:1])
"""

SCORED = """
import ast
from rlvr.rewards import score_batch
assert not hasattr(ast.parse, "__wrapped__")
score_batch("r1_zero", ["<answer>1</answer>"], ["1"], workers=1)
assert not hasattr(ast.parse, "__wrapped__")  # one thread: nothing installed
score_batch("r1_zero", ["<answer>1</answer>", "<answer>2</answer>"], ["1", "3"], workers=2)
print(hasattr(ast.parse, "__wrapped__"))
"""


def _run(code: str, *args: str) -> str:
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout.strip().splitlines()[-1]


def test_threads_enter_ast_parse_one_at_a_time():
    assert int(_run(CONCURRENCY, "0")) > 1  # without it, the four threads are inside at once
    assert int(_run(CONCURRENCY, "1")) == 1


def test_the_race_gives_no_system_error_once_serialized():
    """The race reproduced: four threads parsing while garbage with a GIL-releasing finalizer is collected.
    Without serialize_ast_parse this script raised the SystemError in each of 4 runs here (240 parses each);
    serialized, never."""
    assert _run(RACE) == "0 []"


def test_scoring_in_threads_installs_it():
    assert _run(SCORED) == "True"
