"""Batch scoring: input order, determinism, counters, isolation of hanging reward functions,
and `rlvr grade` (in-process and as a subprocess), including bad lines."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.rewards import ScoreCounters, score_batch
from rlvr.rewards.types import Reward, SimpleExample, Status

RESPONSES = [
    "t </think> <answer>72</answer>",  # correct (fast path)
    "t </think> <answer>\\frac{\\sqrt{2}}{2}</answer>",  # correct (symbolic tier)
    "no format",  # unparsable
    "t </think> <answer>71</answer>",  # incorrect
    "t </think> <answer>x^2-1</answer>",  # correct (symbolic)
    "t </think> <answer>\\prod_{k=1}^{10^{9}} k</answer>",  # timeout (a billion-factor product)
]
REFS = ["72", "\\frac{1}{\\sqrt{2}}", "1", "72", "(x-1)(x+1)", "1"]
EXPECTED = [Status.CORRECT, Status.CORRECT, Status.UNPARSABLE, Status.INCORRECT, Status.CORRECT, Status.TIMEOUT]


def hang_reward(response: str, example) -> Reward:
    """A reward function with a bug: it never returns on "hang"."""
    if response == "hang":
        time.sleep(3600)
    return Reward(1.0 if response == example.reference else 0.0, {}, Status.CORRECT)


def test_order_statuses_and_counters_with_threads():
    counters = ScoreCounters()
    # 2 s: ample for the symbolic pairs even on a loaded machine; the product always runs past it
    rewards = score_batch("r1_zero", RESPONSES * 2, REFS * 2, workers=3, timeout_s=2.0, counters=counters)
    assert [r.status for r in rewards] == EXPECTED * 2
    assert [r.total for r in rewards] == [1.0, 1.0, 0.0, 0.0, 1.0, 0.0] * 2
    assert counters.total == 12
    assert counters.by_status["correct"] == 6 and counters.timeouts == 2 and counters.errors == 0
    # format: every response but "no format" follows r1_zero -> 10 of 12
    assert counters.format_ok == 10 and counters.format_rate == pytest.approx(10 / 12)
    assert counters.accuracy == pytest.approx(0.5)


def test_deterministic_across_worker_counts():
    a = score_batch("r1_zero", RESPONSES[:5], REFS[:5], workers=1)
    b = score_batch("r1_zero", RESPONSES[:5], REFS[:5], workers=4)
    assert a == b


def test_identical_response_and_example_pairs_are_scored_once():
    calls = []

    def counting(response: str, example) -> Reward:
        calls.append((response, example.reference))
        return Reward(float(response == example.reference), {}, Status.CORRECT)

    a, b = SimpleExample("7", {}), SimpleExample("7", {})  # equal references, distinct examples
    responses = ["7", "8", "7", "7", "8", "7"]
    examples = [a, a, a, b, a, b]
    seen = []
    for workers in (1, 3):
        calls.clear()
        seen.clear()
        out = score_batch(counting, responses, examples, workers=workers, progress=seen.append)
        assert [r.total for r in out] == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
        # ("7", a), ("8", a), ("7", b): one call each, whatever the worker count
        assert sorted(calls) == [("7", "7"), ("7", "7"), ("8", "7")]
        assert out[2] is out[0] and out[5] is out[3] and out[3] is not out[0]
        assert max(seen) == 6  # progress counts every row, copies included


def test_examples_as_dicts_and_length_mismatch():
    out = score_batch("countdown", ["<answer>1+2</answer>"], [{"reference": "", "meta": {"numbers": [1, 2], "target": 3}}])
    assert out[0].status is Status.CORRECT
    with pytest.raises(ValueError, match="2 responses but 1 examples"):
        score_batch("r1_zero", ["a", "b"], ["1"])
    with pytest.raises(KeyError, match="known"):
        score_batch("no_such_reward", ["a"], ["1"])


def test_isolate_mode_kills_a_hanging_reward_function():
    responses = ["7", "hang", "8"]
    examples = [SimpleExample("7"), SimpleExample("7"), SimpleExample("7")]
    t0 = time.perf_counter()
    # 5 s: the worker imports this test module (typer, rich, ...) inside the first call
    out = score_batch(hang_reward, responses, examples, workers=2, timeout_s=5.0, isolate=True)
    assert time.perf_counter() - t0 < 30  # would be an hour without the kill
    assert [r.status for r in out] == [Status.CORRECT, Status.TIMEOUT, Status.CORRECT]
    assert [r.total for r in out] == [1.0, 0.0, 0.0]
    # by name too ("module:function"), and registered names
    out = score_batch("test_rewards_batch:hang_reward", ["7"], ["7"], isolate=True, timeout_s=5.0)
    assert out[0].total == 1.0
    out = score_batch("gsm8k", ["#### 72", "#### 7"], ["72", "72"], isolate=True, timeout_s=5.0)
    assert [r.total for r in out] == [1.0, 0.0]


def test_a_raising_reward_function_is_an_error_not_a_crash():
    def boom(response, example):
        raise RuntimeError("bug")

    out = score_batch(boom, ["a"], ["1"])
    assert out[0].status is Status.ERROR and "bug" in out[0].info


# --- rlvr grade ------------------------------------------------------------------------------


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n")


GOOD = [
    json.dumps({"response": "t </think> <answer>72</answer>", "reference": "#### 72"}),
    json.dumps({"response": "t </think> <answer>71</answer>", "reference": 72}),
    json.dumps({"response": "no format", "reference": "5"}),
]


def test_grade_cli_skips_and_reports_bad_lines(tmp_path):
    src = tmp_path / "resp.jsonl"
    _write(src, [GOOD[0], "{not json", GOOD[1], "", json.dumps({"reference": "1"}), GOOD[2], "[1, 2]"])
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["grade", str(src), "--reward", "r1_zero", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"{src}:2: invalid JSON" in res.output
    assert f"{src}:5: missing key(s) ['response']" in res.output
    assert f"{src}:7: expected a JSON object" in res.output
    records = [json.loads(x) for x in out.read_text().splitlines()]
    # one record per non-blank input line, in line order; nothing lost
    assert [r["line"] for r in records] == [1, 2, 3, 5, 6, 7]
    assert [r["status"] for r in records] == ["correct", "bad_line", "incorrect", "bad_line", "unparsable", "bad_line"]
    assert "accuracy" in res.output and "0.3333" in res.output  # 1 correct of 3 scored
    # the rest of the table: format rate 2/3 (lines 1 and 3 have the r1_zero tags, line 6 not),
    # one count per status, bad lines counted, answers/s
    table = {m.group(1).strip(): m.group(2) for m in re.finditer(r"│ ([a-z/ ()]+?) +│ +([\d.,]+) │", res.output)}
    assert table["format rate"] == "0.6667" and table["bad lines (skipped)"] == "3"
    assert [table[f"status {s}"] for s in ("correct", "incorrect", "unparsable", "timeout", "error")] == list("11100")
    assert "answers/s" in table


def test_grade_cli_fail_mode_writes_nothing(tmp_path):
    src = tmp_path / "resp.jsonl"
    _write(src, [GOOD[0], "{not json"])
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(app, ["grade", str(src), "--reward", "r1_zero", "--out", str(out), "--on-bad-line", "fail"])
    assert res.exit_code == 2 and f"{src}:2" in res.output
    assert not out.exists()


def test_grade_cli_rejects_unknown_reward_and_missing_file(tmp_path):
    src = tmp_path / "r.jsonl"
    _write(src, GOOD)
    res = CliRunner().invoke(app, ["grade", str(src), "--reward", "nope"])
    assert res.exit_code == 2 and "known:" in res.output
    res = CliRunner().invoke(app, ["grade", str(tmp_path / "missing.jsonl"), "--reward", "r1_zero"])
    assert res.exit_code == 2 and "no such file" in res.output


def test_grade_cli_subprocess_with_meta_keys_and_workers(tmp_path):
    src = tmp_path / "cd.jsonl"
    _write(
        src,
        [
            json.dumps({"completion": "<answer>(25-5)*3+1</answer>", "target": 61, "numbers": [25, 5, 3, 1]}),
            json.dumps({"completion": "<answer>25+5+3+1</answer>", "target": 61, "numbers": [25, 5, 3, 1]}),
        ],
    )
    cmd = [sys.executable, "-m", "rlvr.cli", "grade", str(src), "--reward", "countdown",
           "--response-key", "completion", "--reference-key", "target", "--workers", "2"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(x) for x in (tmp_path / "cd.graded.jsonl").read_text().splitlines()]
    assert [r["reward"] for r in records] == [1.0, 0.0]
    assert "answers/s" in proc.stdout
