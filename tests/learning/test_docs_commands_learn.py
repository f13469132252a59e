"""Every documented training sequence that starts from a trained policy keeps (or raises) its held-out
accuracy when run as the page says (issue 25, item 3): tests/docs/test_docs_examples.py runs every documented
command at a toy size and checks only that it exits 0, so a page whose commands run but do not learn (the
process-reward page's RL step took an 89% SFT model to 0%; training.md's first block ended at 0%) passed it.

Each case names a page and, in order, the commands of that page it runs (found by a text each contains once,
so a case follows the page: change the command there and the test runs the new one). They run as a user runs
them (the installed `rlvr` script, one working directory per page, page order, a ```yaml block of the page
for a config file it names), at the documented size unless the case names a smaller one and why. After each
command the run's held-out accuracy (the last `eval/accuracy` of its metrics.jsonl; greedy, as every trainer
evaluates by default) is read, and each check asserts a trained run's accuracy against its start's:

    before >= start_floor           (the start is partly right: it has something to keep or lose)
    after >= before - margin

with margins measured (the cases and their margins, with what was measured, are LEARNING_CASES in
tests/helpers/docs.py, beside the reader of the pages' commands; fixed seeds: the pages' own).
Measured time (one thread): 974 s for the four cases on 2 cores shared with other jobs (load ~7); the
process case alone took 117 s on a quieter machine.

Documented training commands not here, and why:
- `rlvr demo` (README, index.md, training.md): tests/train/test_demo.py::test_full_demo_meets_its_targets
  (slow) asserts its gain on the median of three seeds.
- agents.md, distributed.md, config.md: they train a fresh tiny model (no `model.init_from`); a random
  start has no accuracy to lose.
- GPU / hub-model commands (README's and real_model.md's examples): tests/docs/test_docs_examples.py's SKIP_RULES.
- filtering.md: `rlvr filter` does not train (its `rlvr sft` line is the 3-digit one training.md had).
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest
from helpers import REPO as ROOT
from helpers.docs import LEARNING_CASES, doc_commands, fenced_blocks, run_documented

pytestmark = pytest.mark.slow


def _find(page: Path, text: str):
    cmds = doc_commands(page)
    found = [c for c in cmds if c.text == text] or [c for c in cmds if text in c.text]
    assert len(found) == 1, f"{page.relative_to(ROOT)}: {len(found)} commands contain {text!r}: {found}"
    return found[0]


def _config_block(page: Path, name: str, after_line: int) -> str:
    """The ```yaml block of the page that holds `name`: the one whose text names it, else the first one
    after the command (expert_iteration.md: "with this `ei.yaml`:")."""
    blocks = [(start, "\n".join(lines)) for info, start, lines in fenced_blocks(page.read_text(encoding="utf-8"))
              if info.split()[:1] in (["yaml"], ["yml"])]
    named = [text for _, text in blocks if name in text.splitlines()[0]]
    later = [text for start, text in blocks if start > after_line]
    assert named or later, f"{page.relative_to(ROOT)}: no ```yaml block for {name}"
    return (named or later)[0]


def _held_out_accuracy(run_dir: Path) -> float:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r["eval/accuracy"] for r in rows if r.get("eval/accuracy") is not None]
    assert evals, f"{run_dir}: no eval/accuracy in metrics.jsonl"
    return evals[-1]


@pytest.mark.parametrize("case", LEARNING_CASES, ids=lambda c: c.page)
def test_documented_training_commands_do_not_lose_accuracy(case, tmp_path):
    page = ROOT / case.page
    acc: dict[str, float] = {}
    for text, reads in case.commands:
        cmd = _find(page, text)
        argv = []
        for arg in cmd.argv:
            if arg.endswith((".yaml", ".yml")) and "=" not in arg and not (ROOT / arg).is_file():
                (tmp_path / arg).write_text(_config_block(page, arg, cmd.line))
            argv.append(arg)
        argv += case.smaller.get(text, [])  # (no progress bars: run_documented sets RLVR_PROGRESS=off)
        t0 = time.perf_counter()
        res = run_documented(argv, tmp_path, cmd.env)
        assert res.returncode == 0, (f"{cmd.where}: `{cmd.text}` exited {res.returncode}\n(ran: rlvr {shlex.join(argv)})"
                                     f"\nstdout:\n{res.stdout[-2000:]}\nstderr:\n{res.stderr[-2000:]}")
        for label, run_dir in reads.items():
            acc[label] = _held_out_accuracy(tmp_path / run_dir)
        shown = ", ".join(f"{label} {100 * acc[label]:.1f}%" for label in reads)
        print(f"{time.perf_counter() - t0:6.1f} s  {cmd.where}: held-out {shown}  {cmd.text}")
        for check in case.checks:  # as soon as its numbers are in: a start with nothing to lose fails at once
            if check.before in reads:
                assert acc[check.before] >= check.start_floor, (
                    f"{cmd.where}: {check.before} ends at {100 * acc[check.before]:.1f}% held-out, below "
                    f"{100 * check.start_floor:.1f}%: the documented start is not partly right, so {check.after} "
                    "has nothing to keep or learn from")
            if check.after in reads:
                before, after = acc[check.before], acc[check.after]
                assert after >= before - check.margin - 1e-9, (
                    f"{cmd.where}: {check.after} ends at {100 * after:.1f}% held-out, from {100 * before:.1f}% after "
                    f"{check.before} (allowed: a drop of at most {100 * check.margin:.1f} points)")
