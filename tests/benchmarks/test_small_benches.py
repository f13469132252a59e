"""benchmarks/generation.py, sandbox.py, eval_cpu_batch.py and score_overlap.py at their smallest (a few seconds): each still runs against the
current package and writes its table where asked (--results-dir), never into benchmarks/results/. Benchmarks that
no test runs rot unnoticed (benchmarks/step.py stopped working at the rlvr/train split; tests/benchmarks/
test_step_bench.py)."""

from __future__ import annotations

import importlib.util
import json

from helpers import REPO


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_generation_benchmark_runs_and_writes_where_asked(tmp_path):
    _load("generation").main(["--sequences", "8", "--new-tokens", "4", "--repeats", "1", "--threads", "1",
                              "--results-dir", str(tmp_path)])
    data = json.loads((tmp_path / "generation.json").read_text())
    assert data["rows"] and all(r["tokens_per_s"] > 0 for r in data["rows"]), data["rows"]
    assert "| HFGenerator, KV cache |" in (tmp_path / "generation.md").read_text()


def test_the_sandbox_benchmark_runs_and_writes_where_asked(tmp_path):
    _load("sandbox").main(["--n", "3", "--workers", "1", "--results-dir", str(tmp_path)])
    rows = json.loads((tmp_path / "sandbox.json").read_text())["rows"]
    assert len(rows) == 3 and all(r["workers"] == 1 for r in rows), rows
    assert (tmp_path / "sandbox.md").exists()


def test_the_cpu_eval_batching_benchmark_runs_and_writes_where_asked(tmp_path):
    data = tmp_path / "math.jsonl"  # its default is MATH-500 in ../shared; three problems of that shape
    data.write_text("".join(json.dumps(r) + "\n" for r in [{"problem": "What is $1+1$?", "answer": "2"},
                                                         {"problem": "Compute $3 \\cdot 4$.", "answer": "12"},
                                                         {"problem": "Find $x$ if $x+2=5$.", "answer": "3"}]))
    _load("eval_cpu_batch").main(["--num", "3", "--max-tokens", "4", "--data", str(data), "--batches", "2",
                                  "--budgets", "4096", "--results-dir", str(tmp_path)])
    out = json.loads((tmp_path / "eval_cpu_batch.json").read_text())
    assert out["info"]["problems"] == 3
    assert [r["policy"] for r in out["rows"]][:2] == ["batch 2", "tokens 4096"] and out["rows"][0]["calls"] == 2


def test_the_score_overlap_benchmark_runs_and_writes_where_asked(tmp_path):
    res = _load("score_overlap").main(["--rounds", "1", "--prompts", "4", "--group-size", "4", "--max-tokens", "24",
                                       "--reward-ms", "2", "--threads", "1", "--results-dir", str(tmp_path)])
    after, during = res["rows"]
    assert after["side"] == "score after generation" and after["hidden_s"] == 0.0
    assert during["side"] == "score while generating" and during["hidden_s"] > 0  # some scoring ran inside generate
    assert min(res["lengths"]) < max(res["lengths"])  # responses ended at different steps
    assert "| score while generating |" in (tmp_path / "score_overlap.md").read_text()
