"""benchmarks/gpu.py (the one GPU check, issue 38 item 5) without a GPU: its arithmetic, its argument checks, its
budget (stages skipped with a line and a row, the report still written), `bash scripts/gpu_check.sh --bench` on CPU,
and (scale tier: ~100 s on 2 cores, a child process per stage, two under torchrun) the whole `--dry-run`: every
stage at the tiny shape, every correctness check passing."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from argparse import Namespace

import pytest
import torch
from helpers import REPO

ROOT = REPO
SCRIPT = ROOT / "benchmarks" / "gpu.py"


def _load():
    spec = importlib.util.spec_from_file_location("rlvr_gpu_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gb = _load()


def _env() -> dict:
    return {**os.environ, "RLVR_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}


def test_variants_parse_and_bad_ones_are_refused():
    assert gb.parse_variant("rlvr:") == ("rlvr", [])
    assert gb.parse_variant("packed:algo.packing=true, algo.micro_batch_tokens=8192") == (
        "packed", ["algo.packing=true", "algo.micro_batch_tokens=8192"])
    for bad in (":algo.x=1", "a b:algo.x=1", "p:algo.packing"):
        with pytest.raises(ValueError, match="--variant"):
            gb.parse_variant(bad)
    a = gb.parse_args(["--dry-run"])
    assert [n for n, _ in a.variants] == ["plain", "lora", "fsdp2", "fsdp2_lora", "compile", "varlen"]
    assert [gb.sharded(x) for _, x in a.variants] == [False, False, True, True, False, False]
    assert a.variants[3][1] == ["distributed.learner=fsdp2", "model.lora_rank=16", "model.lora_alpha=32"]
    # on the CPU the compiled layers run packed, as auto does on CUDA (the cascade would compile them four times)
    assert a.variants[4][1] == ["model.compile_layers=true", "algo.packing=true"]
    assert a.device == "cpu" and a.shape == "tiny" and a.budget_s == 600
    full = gb.parse_args([])
    # the compiled decode step (refused on a CPU policy) is left out of the dry run; varlen is the GPU run's last
    assert full.variants[-2] == ("compile_decode", ["rollout.compile_decode=true"]) and len(full.variants) == 7
    assert full.variants[-1] == ("varlen", ["algo.packing=varlen"])
    assert full.variants[4] == ("compile", ["model.compile_layers=true"])  # on CUDA algo.packing=auto decides
    assert (full.n_prompts, full.group_size, full.max_tokens, full.micro_batch_tokens, full.dtype, full.budget_s) == (
        64, 8, 256, 16384, "bfloat16", 420)
    assert gb.parse_args(["--skip", "fsdp2_lora,trl"]).skip == {"fsdp2_lora", "trl"}  # a variant or a stage
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


def test_mfu_on_the_flops_done_and_the_old_estimate():
    assert gb.mfu(989e12 * 0.7, 2.0, 989.0) == pytest.approx(0.35)
    assert gb.mfu_6n(494_032_768, 189_000, 2.0, 989.0) == pytest.approx(6 * 494_032_768 * 189_000 / 2.0 / 989e12)
    assert gb.mfu_6n(10, 100, 1.0, None) is None and gb.mfu(None, 1.0, 1.0) is None
    results = {"forward+backward ceiling": {"learner_tok_s": 100.0},
               "rlvr": {"overrides": [], "step_s": 10.0, "learner_tok_s": 90.0, "sampler_tok_s": 30.0},
               "TRL 1.16.0 GRPOTrainer": {"step_s": 12.5, "sampler_tok_s": 20.0}}
    (line,) = gb.comparisons(results)
    assert "step 0.80x TRL's" in line and "90% of the forward+backward" in line and "sampler 1.50x" in line


def test_ulps_counts_units_in_the_last_place():
    x = torch.tensor([1.0, -2.5, 3e-38, 0.0])
    assert gb.ulps(x, x.clone()) == 0
    up = torch.nextafter(x, torch.full_like(x, math.inf))
    assert gb.ulps(x, up) == 1 and gb.ulps(up, x) == 1
    assert gb.ulps(torch.tensor([0.0]), torch.tensor([-0.0])) == 1
    assert gb.ulps(torch.tensor([1.0]), torch.tensor([1.0 + 2**-21])) == 4
    one = torch.tensor([1.0], dtype=torch.bfloat16)  # bf16: its own ulps (2**-7 above 1)
    assert gb.ulps(one, torch.tensor([1.0 + 2**-7], dtype=torch.bfloat16)) == 1
    with pytest.raises(ValueError):
        gb.ulps(one, one.float())


def test_summarize_takes_the_timed_steps_and_the_first():
    rows = [{"step": s, "time/step": t, "time/generate": g, "tokens/generated": 100, "tokens/trained": 300,
             "perf/flops_done": f, "grad_norm": 0.5 + s, "mem/cuda_peak_gb": m, "rollout/logprob_diff_max": d}
            for s, t, g, f, m, d in ((1, 50.0, 5.0, 1e12, 30.0, 0.01), (2, 10.0, 4.0, 2e12, 31.0, 0.02),
                                     (3, 12.0, 6.0, 4e12, 32.0, 0.03), (4, 99.0, 9.0, 8e12, 40.0, 0.04))]
    r = gb.summarize(rows, 2, 3, ["x=1"])  # step 4: the profiled one, out of the medians
    assert (r["step_s"], r["sampler_s"], r["learner_s"], r["learner_flops"]) == (11.0, 5.0, 6.0, 3e12)
    assert r["first_step_s"] == 50.0 and r["grad_norm_step1"] == 1.5 and r["timed_steps"] == [2, 3]
    assert r["peak_gib"] == 40.0 and r["logprob_diff_max"] == 0.04 and r["sampler_tok_s"] == 20.0
    assert gb.summarize(rows[:1], 2, 3, [])["step_s"] == 50.0  # cut short: what there is


def _namespace(**kw) -> Namespace:
    base = dict(device="cuda", peak_tflops_used=989.0, variants=[gb.parse_variant(v) for v in gb.DEFAULT_VARIANTS])
    return Namespace(**(base | kw))


def test_targets_and_agreement_read_the_rows():
    a = _namespace()
    results = {"plain": {"overrides": [], "step_s": 2.5, "sampler_tok_s": 90_000.0, "learner_s": 1.0,
                         "learner_flops": 0.4 * 989e12, "first_step_s": 60.0, "grad_norm_step1": 1.0,
                         "logprob_diff_max": 0.05},
               "plain (2nd process)": {"overrides": [], "first_step_s": 6.0},
               "TRL 1.16.0 GRPOTrainer": {"step_s": 12.5},
               "lora": {"overrides": [], "grad_norm_step1": 0.2, "logprob_diff_max": 0.5},
               "fsdp2": {"overrides": [], "grad_norm_step1": 1.01},
               "fsdp2_lora": {"overrides": [], "grad_norm_step1": 0.25}}
    checks = gb.agreement_checks(a, results)
    by = {c["check"].split(" ")[0].rstrip(":") + (" push" if "sampler" in c["check"] else ""): c["ok"]
          for c in checks}
    assert by == {"fsdp2": True, "fsdp2_lora": False, "plain push": True, "lora push": False}
    rows = gb.targets(a, results, checks)

    def met(prefix: str) -> str:
        (hit,) = [ok for t, _, ok in rows if t.startswith(prefix)]
        return hit

    assert met("step <= 3") == met("sampler >=") == met("learner MFU >= 35%") == "yes"  # MFU: 40% of 989
    assert met("step >= 4x faster than TRL") == "yes"  # 12.5 s / 2.5 s = 5x
    assert met("fsdp2 rows agree") == "NO"  # fsdp2_lora's 25% gap
    warm = next(x for x in gb.targets(a, results, checks) if x[0].startswith("first step"))
    assert warm[1].startswith("2.40x") and warm[2] == "NO"  # a 6 s warm first step vs a 2.5 s steady step


def test_a_stage_past_its_deadline_is_interrupted():
    t0 = time.perf_counter()
    with pytest.raises(gb.StageTimeout), gb.deadline(0.2):
        while True:
            time.sleep(0.01)
    assert time.perf_counter() - t0 < 5
    with gb.deadline(math.inf):
        pass


def test_a_bad_variant_key_fails_in_one_line_before_the_build(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--variant", "typo:algo.shared_prefx=false",
                          "--work", str(tmp_path / "w")], capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 2
    assert "--variant typo" in res.stderr and "algo.shared_prefx" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "w" / "model").exists()  # nothing built


def test_an_exhausted_budget_skips_every_stage_and_still_reports(tmp_path):
    """--budget-s smaller than the build: every stage after it is skipped with a line and a row, the table and the
    JSON are written, and the exit status says the check did not run whole."""
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--budget-s", "0.5", "--work", str(tmp_path / "w"),
                          "--out-dir", str(out)], capture_output=True, text=True, env=_env(), timeout=300)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    raw = json.loads((out / "gpu_bench.json").read_text())
    stages = {"plain", "warm", "checks", "lora", "fsdp2", "fsdp2_lora", "compile", "varlen", "ceiling", "generate"}
    assert set(raw["skipped"]) - {"trl"} == stages  # trl: skipped for the budget, or not installed here
    assert all(v.startswith("budget") for v in raw["skipped"].values()) and raw["errors"] == {}
    assert "SKIPPED plain: budget" in res.stdout and "| fsdp2 | SKIPPED: budget" in (out / "gpu_bench.md").read_text()
    assert "## Targets (issue 38)" in res.stdout and "## Correctness on cpu" in res.stdout


def test_the_bench_command_runs_on_cpu(tmp_path):
    """`bash scripts/gpu_check.sh --bench --dry-run`: the one GPU command's CPU mode (stages cut down here; the
    scale test below runs them all)."""
    env = _env() | {"PYTHON": sys.executable}
    env.pop("OUT", None)
    measured = (ROOT / "benchmarks" / "results" / "sampler.md").read_text()
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bench", "--dry-run", "--skip",
                          "variants,warm,checks,trl,generate", "--work", str(tmp_path / "w")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "| forward+backward ceiling |" in res.stdout and "--budget-s 0" in res.stdout
    raw = json.loads((tmp_path / "w" / "gpu_bench.json").read_text())
    assert raw["results"]["forward+backward ceiling"]["learner_flops"] > 0 and raw["config"]["profile"] is True
    # then one sampling step before and now (benchmarks/sampler.py), its table not over the measured one
    assert "| top-p 0.95 | 2 x 3000 |" in res.stdout and "| NO |" not in res.stdout
    assert (ROOT / "benchmarks" / "results" / "sampler.md").read_text() == measured


@pytest.mark.scale
def test_dry_run_runs_every_stage_to_the_table(tmp_path):
    out = tmp_path / "out"
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--profile", "--work", str(tmp_path / "w"),
                          "--out-dir", str(out)], capture_output=True, text=True, env=_env(), timeout=900)
    secs = time.perf_counter() - t0
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-3000:]}"
    print(f"dry run: {secs:.0f} s")
    raw = json.loads((out / "gpu_bench.json").read_text())
    assert raw["errors"] == {} and raw["skipped"] == {}
    r, cfg = raw["results"], raw["config"]
    rows = cfg["n_prompts"] * cfg["group_size"]
    for name in ("plain", "plain (2nd process)", "lora", "fsdp2", "fsdp2_lora"):
        v = r[name]
        assert v["learner_flops"] > 0 and v["sampler_tok_s"] > 0 and v["first_step_s"] > 0, name
        assert v["launcher"] == ("torchrun (group of one)" if name.startswith("fsdp2") else "python")
    plain = r["plain"]
    # the profiled step is one more than --steps, and not among the timed ones
    assert [s["step"] for s in plain["steps"]] == list(range(1, cfg["steps"] + 2))
    assert plain["timed_steps"] == list(range(2, cfg["steps"] + 1))
    assert [s["step"] for s in r["lora"]["steps"]] == list(range(1, cfg["variant_steps"] + 1))
    assert not any(k.startswith("eval/") for s in plain["steps"] for k in s)  # no held-out eval at the end
    assert plain["learner_tokens"] == plain["steps"][1]["tokens/trained"]
    # LoRA does no weight gradients for the frozen base: fewer FLOPs for the same kind of step
    assert r["lora"]["learner_flops"] < plain["learner_flops"]
    assert r["transformers generate"]["rows"] == rows
    ceiling = r["forward+backward ceiling"]
    assert ceiling["learner_tokens"] > rows * cfg["max_tokens"]
    # rlvr's learner forwards each group's prompt once per micro-batch; the ceiling every row whole
    assert plain["learner_flops"] < 0.8 * ceiling["learner_flops"]
    checks = {c["check"]: c for c in raw["checks"]}
    assert all(c["ok"] for c in checks.values()), [c for c in checks.values() if not c["ok"]]
    names = " / ".join(checks)
    for part in ("full model: packed, each prompt once", "LoRA (peft): packed, every row whole", "optimizer:",
                 "sampler: CUDA-graph decode", "fsdp2 (torchrun, group of one) vs plain",
                 "fsdp2_lora (torchrun, group of one) vs lora"):
        assert part in names, part
    stop, sampled = [c for c in checks.values() if c["check"].startswith("sampler:")]
    assert "stop string" in stop["check"] and "0 stopped" not in stop["measured"]  # the stop string did end rows
    assert "sampled inside the graph" in sampled["check"] and "identical" in sampled["measured"]
    targets = {t: met for t, _, met in raw["targets"]}
    assert targets["fsdp2 rows agree with the one-process learner (step 1)"] == "yes"
    assert (out / "gpu_profile.txt").read_text().count("host synchronisations") == 1
    md = (out / "gpu_bench.md").read_text()
    assert "| plain |" in md and "| plain (2nd process) |" in md and "| fsdp2_lora |" in md
    if importlib.util.find_spec("trl") is not None:
        (name,) = [k for k in r if k.startswith("TRL")]
        assert r[name]["learner_flops"] > 0
    else:
        assert "trl skipped" in res.stdout
