"""benchmarks/gpu.py without a GPU: its arithmetic, its argument checks, and the whole pipeline on CPU
(`--dry-run`: tiny shape, every stage, the TRL stage when TRL is importable here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"


def _load():
    spec = importlib.util.spec_from_file_location("rlvr_gpu_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gb = _load()


def test_variants_parse_and_bad_ones_are_refused():
    assert gb.parse_variant("rlvr:") == ("rlvr", [])
    assert gb.parse_variant("packed:algo.packing=true, algo.micro_batch_tokens=8192") == (
        "packed", ["algo.packing=true", "algo.micro_batch_tokens=8192"])
    for bad in (":algo.x=1", "a b:algo.x=1", "p:algo.packing"):
        with pytest.raises(ValueError, match="--variant"):
            gb.parse_variant(bad)
    a = gb.parse_args(["--dry-run"])
    assert [n for n, _ in a.variants] == ["rlvr", "rlvr_plain"]
    assert a.variants[1][1] == ["algo.shared_prefix=false"] and a.device == "cpu" and a.shape == "tiny"
    full = gb.parse_args([])
    assert (full.n_prompts, full.group_size, full.max_tokens, full.micro_batch_tokens, full.dtype) == (
        64, 8, 256, 16384, "bfloat16")
    with pytest.raises(SystemExit):
        gb.parse_args(["--variant", "a:", "--variant", "a:algo.shared_prefix=false"])
    with pytest.raises(SystemExit):
        gb.parse_args(["--skip", "generat"])


def test_token_budget_batches_stay_within_the_budget():
    lengths = [100, 120, 90, 300, 50, 50, 50, 400]
    batches = gb.token_budget_batches(lengths, 400)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 400 or len(b) == 1
    assert batches == [[0, 1, 2], [3], [4, 5, 6], [7]]
    assert gb.token_budget_batches([5] * 5, 0, max_rows=2) == [[0, 1], [2, 3], [4]]


def test_mfu_and_the_acceptance_ratios():
    assert gb.mfu(494_032_768, 189_000, 2.0, 989.0) == pytest.approx(6 * 494_032_768 * 189_000 / 2.0 / 989e12)
    assert gb.mfu(10, 100, 1.0, None) is None and gb.mfu(10, None, 1.0, 1.0) is None
    results = {"forward+backward ceiling": {"learner_tok_s": 100.0},
               "rlvr": {"overrides": [], "step_s": 10.0, "learner_tok_s": 90.0, "sampler_tok_s": 30.0},
               "TRL 1.16.0 GRPOTrainer": {"step_s": 12.5, "sampler_tok_s": 20.0}}
    (line,) = gb.comparisons(results)
    assert "step 0.80x TRL's" in line and "90% of the forward+backward" in line and "sampler 1.50x" in line


def test_a_bad_variant_key_fails_in_one_line_before_the_build(tmp_path):
    env = {**os.environ, "RLVR_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--variant", "typo:algo.shared_prefx=false",
                          "--work", str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2
    assert "--variant typo" in res.stderr and "algo.shared_prefx" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "w" / "model").exists()  # nothing built


def test_dry_run_runs_every_stage_to_the_table(tmp_path):
    env = {**os.environ, "RLVR_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--profile", "--variant",
                          "plain:algo.shared_prefix=false", "--work", str(tmp_path / "w"), "--out-dir", str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    raw = json.loads((out / "gpu_bench.json").read_text())
    assert raw["errors"] == {}
    r, cfg = raw["results"], raw["config"]
    rows = cfg["n_prompts"] * cfg["group_size"]
    assert r["transformers generate"]["rows"] == rows
    assert 0 < r["transformers generate"]["generated_tokens"] <= rows * cfg["max_tokens"]
    ceiling = r["forward+backward ceiling"]
    assert ceiling["learner_tokens"] > rows * cfg["max_tokens"] and ceiling["learner_tok_s"] > 0
    plain = r["plain"]
    assert plain["overrides"] == ["algo.shared_prefix=false"]
    # the profiled step is one more than --steps, and not among the timed ones
    assert [s["step"] for s in plain["steps"]] == list(range(1, cfg["steps"] + 2))
    assert not any(k.startswith("eval/") for s in plain["steps"] for k in s)  # no held-out eval at the end
    assert plain["learner_s"] == pytest.approx(plain["steps"][1]["time/step"] - plain["steps"][1]["time/generate"])
    assert plain["learner_tokens"] == plain["steps"][1]["tokens/trained"] and plain["sampler_tok_s"] > 0
    g = raw["env"]["graphs_check"]  # the sampler's static-cache path on CPU (no capture) against its plain loop
    assert g["path_chosen"] and g["path_used"] and not g["graph_captured"] and g["warnings"] == []
    assert g["first8_agree"] == 1.0 and g["logprob_gap_max"] < 1e-4 and g["rows"] == min(16, cfg["n_prompts"]) * 4
    prof = (out / "gpu_profile.txt").read_text()
    assert "top 40 ops by self_cpu_time_total" in prof and "host synchronisations" in prof
    md = (out / "gpu_bench.md").read_text()
    assert "| plain |" in md and "| forward+backward ceiling |" in md
    if importlib.util.find_spec("trl") is not None:
        (name,) = [k for k in r if k.startswith("TRL")]
        assert 0 < r[name]["generated_tokens"] <= rows * cfg["max_tokens"]
        assert r[name]["learner_s"] == pytest.approx(r[name]["step_s"] - r[name]["sampler_s"])
        assert r[name]["gradient_accumulation_steps"] == rows // cfg["trl_micro"]
    else:
        assert "trl skipped" in res.stdout
