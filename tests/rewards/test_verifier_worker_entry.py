"""Verifier workers start from the library's own entry point, never from the caller's script.

multiprocessing's "spawn" and "forkserver" start methods import the parent's `__main__` in every
child, so a script that calls `grade_answer` at module level without an
`if __name__ == "__main__":` guard used to run again inside each verifier worker (it appended a
second line to its log below). The script here has no guard, and a symbolic pair forces the
worker tier."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

ROOT = REPO

SCRIPT = textwrap.dedent(
    """
    import os
    from rlvr.rewards.grader import grade_answer

    with open(os.environ["RLVR_TEST_MARKS"], "a") as f:
        f.write(f"ran in {os.getpid()}\\n")
    v = grade_answer("x^2-1", "(x-1)(x+1)", timeout_s=60)  # symbolic: needs a worker process
    w = grade_answer("\\\\sqrt{8}", "3\\\\sqrt{2}", timeout_s=60)
    print("VERDICT", v.status.value, w.status.value, v.tier)
    """
)


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_unguarded_script_runs_once(tmp_path, start_method):
    script = tmp_path / "grade_at_import.py"
    script.write_text(SCRIPT)
    marks = tmp_path / "marks.txt"
    env = dict(os.environ)
    env["RLVR_TEST_MARKS"] = str(marks)
    env["RLVR_VERIFIER_START_METHOD"] = start_method
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = marks.read_text().splitlines()
    assert len(lines) == 1, (lines, proc.stderr[-2000:])  # the script ran once: in its own process
    assert "VERDICT correct incorrect symbolic" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert "freeze_support" not in proc.stderr and "bootstrapping phase" not in proc.stderr


def test_worker_reports_a_target_it_cannot_load():
    # A callable that is not importable in the worker (here: a lambda) cannot be pickled; one
    # defined in a script's __main__ cannot be loaded there. Both come back as errors.
    from rlvr.rewards.pool import WorkerPool

    with WorkerPool(size=1, mem_limit_mb=None, preload=()) as pool:
        res = pool.call(lambda: 1, (), timeout_s=30)
        assert res.status == "error" and "could not send" in res.info
        ok = pool.call("builtins:len", ("abcd",), timeout_s=30)
        assert ok.status == "ok" and ok.value == 4
