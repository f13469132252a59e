"""Issue 37, item 11 (JSONL parts): a deeply nested JSON line was a raw RecursionError in `rlvr train` (data
files) and in `rlvr grade` (whose default is to skip bad lines), and a 20 MB question line was refused only
after 108 s of tokenizing. Now: a clear error naming file:line (train), a skipped bad line with its reason
(grade), and over-long lines / text fields refused while reading, naming file:line and the limit
(rlvr.data.jsonl: MAX_LINE_CHARS, MAX_TEXT_CHARS, MAX_JSON_DEPTH)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.data import jsonl
from rlvr.data.jsonl import DataError, iter_jsonl, read_jsonl, scan_jsonl

GOOD = json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"})
DEEP = '{"question": "q", "answer": "#### 1", "meta": ' + "[" * 100_000 + "]" * 100_000 + "}"  # RecursionError
DEEP_101 = '{"question": "q", "answer": "#### 1", "m": ' + "[" * 100 + "]" * 100 + "}"  # parses, 101 levels
DEEP_100 = '{"question": "q", "answer": "#### 1", "m": ' + "[" * 99 + "]" * 99 + "}"  # exactly the limit
BIG_QUESTION = json.dumps({"question": "x" * 20_000_000, "answer": "#### 1"})  # the 20 MB line
TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("line", [DEEP, DEEP_101], ids=["deep_100000", "deep_101"])
def test_a_deeply_nested_line_is_a_data_error_naming_file_and_line(tmp_path, line):
    p = _write(tmp_path / "d.jsonl", [GOOD, line])
    with pytest.raises(DataError, match=f"^{p}:2: JSON nested deeper than 100 levels") as exc:
        read_jsonl(p, ("question",))
    assert exc.value.line == 2 and exc.value.path == str(p)
    assert len(read_jsonl(_write(tmp_path / "ok.jsonl", [DEEP_100]))) == 1  # the limit itself is accepted


def test_scan_names_every_bad_line_and_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_CHARS", 10_000)
    long_line = json.dumps({"question": "y" * 50_000, "answer": "#### 1"})
    p = _write(tmp_path / "s.jsonl", [GOOD, DEEP_101, long_line, '{"question": ' + "7" * 5000 + "}", GOOD])
    good, errors = scan_jsonl(p, ("question",))
    assert good == 2
    assert [(e.line, e.reason) for e in errors] == [
        (2, "JSON nested deeper than 100 levels (rlvr.data.jsonl.MAX_JSON_DEPTH)"),
        (3, f"line is {len(long_line):,} characters long, over the limit of 10,000 (rlvr.data.jsonl.MAX_LINE_CHARS)"),
        (4, errors[2].reason),
    ]
    assert errors[2].reason.startswith("invalid JSON: Exceeds the limit")  # a raw ValueError before
    p = _write(tmp_path / "i.jsonl", [GOOD, GOOD, long_line, DEEP_101])
    with pytest.raises(DataError, match=f"^{p}:3: line is 50,0"):  # iter_jsonl stops at the first
        list(iter_jsonl(p))


def test_read_lines_never_holds_an_over_long_line_and_keeps_line_numbers(tmp_path):
    p = tmp_path / "l.txt"
    p.write_text("ab\n" + "c" * 25 + "\nd\n" + "e" * 10 + "\n" + "f" * 11)
    with p.open() as f:
        assert list(jsonl.read_lines(f, limit=10)) == [
            (1, "ab\n", 2), (2, None, 25), (3, "d\n", 1), (4, "e" * 10 + "\n", 10), (5, None, 11)]


def test_an_over_long_text_field_is_refused_fast_naming_file_line_and_limit(tmp_path):
    p = _write(tmp_path / "big.jsonl", [GOOD, BIG_QUESTION])
    t0 = time.perf_counter()
    with pytest.raises(DataError) as exc:
        read_jsonl(p, ("question", "answer"))
    assert time.perf_counter() - t0 < 10  # was 108 s of tokenizing
    assert str(exc.value) == (f'{p}:2: key "question" is 20,000,000 characters long, over the limit of 1,048,576 '
                              "for one text field (rlvr.data.jsonl.MAX_TEXT_CHARS)")
    # the well-known text keys are bounded even where a task requires none (math reads "problem" itself)
    m = _write(tmp_path / "m.jsonl", [json.dumps({"problem": "z" * (jsonl.MAX_TEXT_CHARS + 1), "answer": "1"})])
    with pytest.raises(DataError, match=f'^{m}:1: key "problem" is 1,048,577 characters long'):
        read_jsonl(m)
    ok = _write(tmp_path / "ok.jsonl", [json.dumps({"problem": "z" * jsonl.MAX_TEXT_CHARS, "answer": "1"})])
    assert len(read_jsonl(ok)) == 1


@pytest.mark.parametrize("line,needle", [
    (DEEP, "line 2: JSON nested deeper than 100 levels (rlvr.data.jsonl.MAX_JSON_DEPTH)"),
    (BIG_QUESTION, 'line 2: key "question" is 20,000,000 characters long, over the limit of 1,048,576'),
], ids=["deep", "20MB_question"])
def test_rlvr_train_refuses_the_file_before_the_model_loads(tmp_path, line, needle):
    path = _write(tmp_path / "train.jsonl", [GOOD, line])
    run = tmp_path / "run"
    t0 = time.perf_counter()
    r = CliRunner().invoke(app, ["train", *TINY, "data.task=gsm8k", f"data.train_path={path}", "data.num_eval=0",
                                 "run.steps=1", f"run.out_dir={run}"])
    assert time.perf_counter() - t0 < 30
    assert r.exit_code == 2, r.output
    assert not isinstance(r.exception, RecursionError) and "Traceback" not in r.output
    assert f"data.train_path={path}: 1 bad line of 2: {needle}" in r.output, r.output
    assert not run.exists()


def test_rlvr_grade_skips_a_deeply_nested_line_with_its_reason(tmp_path):
    ok = json.dumps({"response": "<think>x</think> <answer>2</answer>", "reference": "2"})
    src = _write(tmp_path / "r.jsonl", [ok, DEEP.replace('"question": "q", "answer": "#### 1"', '"response": "r"'),
                                        '{"response": ' + "1" * 5000 + "}", ok])
    out = tmp_path / "out.jsonl"
    r = CliRunner().invoke(app, ["grade", str(src), "--reward", "r1_zero", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert not isinstance(r.exception, RecursionError)
    assert f"{src}:2: JSON nested deeper than 100 levels (rlvr.data.jsonl.MAX_JSON_DEPTH)" in r.output
    assert f"{src}:3: invalid JSON: Exceeds the limit (4300 digits)" in r.output
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["line"], x["status"]) for x in rows] == [(1, "correct"), (2, "bad_line"), (3, "bad_line"), (4, "correct")]
    assert rows[1]["info"].startswith("JSON nested deeper than 100 levels")


def test_rlvr_grade_skips_an_over_long_line(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MAX_LINE_CHARS", 1000)
    ok = json.dumps({"response": "<answer>2</answer>", "reference": "2"})
    long_line = json.dumps({"response": "w" * 2000, "reference": "2"})
    src = _write(tmp_path / "r.jsonl", [long_line, ok])
    r = CliRunner().invoke(app, ["grade", str(src), "--reward", "r1_zero", "--out", str(tmp_path / "o.jsonl")])
    assert r.exit_code == 0, r.output
    assert f"{src}:1: line is {len(long_line):,} characters long, over the limit of 1,000" in r.output
