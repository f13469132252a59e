"""benchmarks/sampler.py: the step before and now at a small vocabulary (two blocks and a short one), its table
written where asked, and its traffic count (the passes each side makes over the (rows, vocab) tensors)."""

from __future__ import annotations

import importlib.util
import json

from helpers import REPO


def _load():
    spec = importlib.util.spec_from_file_location("sampler_bench", REPO / "benchmarks" / "sampler.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_runs_and_both_sides_agree(tmp_path):
    bench = _load()
    bench.main(["--rows", "3,5", "--vocab", "2500", "--repeats", "1", "--threads", "1", "--out-dir", str(tmp_path),
                "--fused"])
    rows = json.loads((tmp_path / "sampler.json").read_text())["rows"]
    assert [(r["top_p"], r["rows"]) for r in rows] == [(1.0, 3), (1.0, 5), (0.95, 3), (0.95, 5)]
    assert all(r["same_tokens_and_logprobs"] for r in rows)
    # the compiled in-graph sampler where nothing is truncated (top-p samples outside the graph)
    assert [r.get("fused_same") for r in rows] == [True, True, None, None]
    assert all(r["fused_ms"] > 0 for r in rows[:2])
    md = (tmp_path / "sampler.md").read_text()
    assert "| top-p 0.95 | 5 x 2500 |" in md and "| - | - |" in md


def test_traffic_counts_bytes_per_pass():
    bench = _load()
    old, new = bench.traffic_gb(512, 151936)
    n = 512 * 151936
    # before: 2+4 (float copy), 12 (log_softmax), 4+8 (double), 16 (exp), 16 (cumsum), 4+1, 1+1, 1 (mask, flip, argmax)
    assert abs(old - 70 * n / 1e9) < 1e-9 and abs(new - 20 * n / 1e9) < 1e-9
    assert 5.4 < old < 5.5 and 1.5 < new < 1.6
