"""benchmarks/step.py (where one GRPO step's time goes; issue 38 names it for the CPU step's profile) at a tiny
size, two steps: every phase it wraps inside the real loop is reached and timed. The loop's functions moved when
rlvr/train/ was split (the step's old-logprob forward left rlvr.train.pg.loop): the script then stopped at its
first wrap, unnoticed, until it was run by hand."""

from __future__ import annotations

import ast
import re
import subprocess
import sys

from helpers import REPO

SCRIPT = REPO / "benchmarks" / "step.py"


def test_every_phase_of_a_tiny_run_is_timed():
    # a KL reference, so the no-grad logprob forwards run (the demo's GRPO phase has none)
    res = subprocess.run([sys.executable, str(SCRIPT), "--fresh", "--steps", "2", "--warmup", "0", "--no-write",
                          "--set", "model.hidden_size=32", "--set", "model.intermediate_size=64",
                          "--set", "sampling.n_prompts=4", "--set", "algo.kl_coef=0.05"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    phases = {m[1]: ast.literal_eval(m[2]) for m in re.finditer(r"^  (\S+(?: \S+)?)\s+(\{.*\})$", res.stdout, re.M)}
    assert set(phases) == {"generate", "score", "old/ref logprobs", "forward", "backward", "optimizer", "bookkeeping"}
    for name in ("generate", "old/ref logprobs", "forward", "backward", "optimizer"):
        assert phases[name]["seconds"] > 0, (name, res.stdout)
    assert phases["bookkeeping"]["seconds"] >= 0  # the step's rest: the phases are inside it, not beside it
    for name in ("generate", "forward", "backward"):
        assert phases[name]["gflop"] > 0, (name, res.stdout)
