"""scripts/gpu_check.sh / gpu_check.py without a GPU: every part that runs on CPU.

Fast (default suite): the tokenizer it trains (padded to the model's vocabulary, every id decodes), the
GSM8K-like rows it writes (valid for the real gsm8k task), the `rlvr train` command line of the GPU run
(loads and validates with the real config loader: the H200 run cannot die of a typo in a key), and the
verdicts of the report on hand-made metrics (a drifting sampler or a dropped push must FAIL).
Slow: the whole CPU mode end to end (`bash scripts/gpu_check.sh --dry-run`: tiny shape, hf backend, two
real `rlvr train` subprocesses, the bare generator stage) down to the table; ~2 min on 2 busy cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

ROOT = REPO
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gc = _load()


def test_tokenizer_is_padded_to_the_model_vocab_and_every_id_decodes():
    texts = [r["question"] + " " + r["answer"] for r in gc.word_problems(200, seed=0)]
    tok = gc.train_tokenizer(texts, bpe_vocab=300, model_vocab=1024)
    assert len(tok) == 1024
    assert tok.convert_ids_to_tokens(tok.eos_token_id) == gc.EOS and tok.pad_token_id == tok.eos_token_id
    # a random model samples any id: each must decode, fillers to Greek letters
    for i in range(1024):
        tok.decode([i])
    assert any("\u03b1" <= ch <= "\u03c9" for ch in tok.decode(list(range(1000, 1024))))
    # encoding never produces a filler, and text round-trips (byte-level BPE)
    text = "Ava has 12 apples. </think> <answer> 14 </answer>"
    ids = tok.encode(text)
    assert max(ids) < 300 and tok.decode(ids) == text


def test_word_problems_are_valid_gsm8k_rows():
    from rlvr.data import get_task

    rows = gc.word_problems(50, seed=3)
    examples = get_task("gsm8k").from_rows(rows, "generated")
    for row, ex in zip(rows, examples, strict=True):
        expr = row["answer"].split("<<", 1)[1].split("=", 1)[0]  # e.g. "12+5"
        a, op, b = next(expr.partition(o) for o in "+-*/" if o in expr)
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) // int(b)}[op]
        assert ex.reference == str(value)
    assert gc.word_problems(5, seed=1) == gc.word_problems(5, seed=1)


@pytest.mark.parametrize("argv", [[], ["--backend", "hf"], ["--dry-run"]], ids=["vllm", "hf-gpu", "cpu"])
def test_trainer_command_line_is_a_valid_config(argv, tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    import torch

    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import validate_train_config

    # the loader checks the machine: answer as the GPU machine the check runs on would (a CUDA device,
    # vllm importable); the data files exist there because stage 1 writes them
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args, **kw: (
        importlib.machinery.ModuleSpec(name, None) if name == "vllm" else real_find_spec(name, *args, **kw)))
    a = gc.parse_args(argv)
    built = {"model_dir": str(tmp_path / "model"), "train": str(tmp_path / "train.jsonl"),
             "test": str(tmp_path / "test.jsonl")}
    (tmp_path / "train.jsonl").touch()
    (tmp_path / "test.jsonl").touch()
    for sleep in (True, False):
        cfg = load_config(TrainConfig, None, gc.trainer_overrides(a, built, tmp_path / "run", a.steps, sleep))
        plan = validate_train_config(cfg)
        assert plan.rollout_batch == a.n_prompts * a.group_size
        assert cfg.rollout.backend == a.backend and cfg.rollout.sleep_mode is sleep
        assert cfg.data.reward == "language" and cfg.model.name == built["model_dir"]
    if argv == []:  # the H200 run: the real shape in bf16 with vLLM colocated
        assert a.shape == "qwen2.5-0.5b" and a.dtype == "bfloat16" and cfg.model.device == "cuda"
        assert gc.SHAPES[a.shape]["vocab_size"] == 151936


def _rows(diffs, versions=None):
    versions = versions if versions is not None else list(range(len(diffs)))
    return [{"step": i + 1, "reward/mean": 0.5, "rollout/logprob_diff_mean": d, "rollout/logprob_diff_max": 3 * d,
             "rollout/policy_version": v, "tokens/generated": 1000, "kept_frac": 1.0, "time/generate": 2.0,
             "time/train": 1.0, "time/sync": 0.1}
            for i, (d, v) in enumerate(zip(diffs, versions, strict=True))]


GOOD_BARE = {"initial_engine_vs_initial_policy": (0.01, 0.1), "initial_engine_vs_final_policy": (0.5, 3.0),
             "pushed_engine_vs_final_policy": (0.01, 0.1), "pushed_engine_vs_final_policy_t0.7": (0.01, 0.1),
             "tokens_per_s": 5000.0, "generate_s": 1.0,
             "generated_tokens": 5000, "sleep_wake_same_greedy": 1.0}


def _verdicts(rows, bare, tol=0.1):
    return {name: ok for name, ok, _ in gc.checks(rows, bare, tol, len(rows))}


def test_checks_pass_a_healthy_run():
    assert all(_verdicts(_rows([0.01, 0.012, 0.011]), GOOD_BARE).values())


def test_checks_fail_when_the_sampler_drifts_or_the_push_is_dropped():
    # the sampler keeps its old weights: the diff grows step by step
    v = _verdicts(_rows([0.01, 0.05, 0.09]), GOOD_BARE)
    assert not v["no drift after pushes"]
    v = _verdicts(_rows([0.01, 0.3, 0.6]), GOOD_BARE)
    assert not v["sampler == trainer logprobs at every step"]
    # a push that does not reach the engine: as far off as no push at all
    bare = dict(GOOD_BARE, pushed_engine_vs_final_policy=(0.5, 3.0))
    assert not _verdicts(_rows([0.01, 0.01]), bare)["update_weights reaches the engine"]
    # a learner that did not move cannot prove anything about the push
    bare = dict(GOOD_BARE, initial_engine_vs_final_policy=(0.02, 0.1))
    assert not _verdicts(_rows([0.01, 0.01]), bare)["the learner's weights moved (else the push is untestable)"]
    # rollouts not carrying the previous step's version
    assert not _verdicts(_rows([0.01, 0.01], versions=[0, 0]), GOOD_BARE)["rollouts carry the previous step's weights"]
    bare = dict(GOOD_BARE, **{"pushed_engine_vs_final_policy_t0.7": (0.4, 2.0)})  # raw logprobs at T != 1
    assert not _verdicts(_rows([0.01, 0.01]), bare)["sampler == trainer logprobs at temperature 0.7"]
    assert not _verdicts(_rows([0.01, 0.01]), dict(GOOD_BARE, sleep_wake_same_greedy=0.5))["sleep/wake keeps greedy outputs"]


def test_report_has_the_promised_tables_and_mfu_arithmetic(tmp_path):
    a = gc.parse_args(["--backend", "vllm"])
    built = {"n_params": 494_032_768, "prompt_tokens_mean": 100.0, "bpe_vocab": 4096, "vocab": 151936}
    rows = _rows([0.01, 0.011, 0.012, 0.01, 0.011])
    runs = {"sleep": {"rows": rows, "smi_peak_mib": 50 * 1024, "smi_baseline_mib": 1024},
            "nosleep": {"rows": rows[:2], "smi_peak_mib": 90 * 1024, "smi_baseline_mib": 1024}}
    a.steps_nosleep = 2
    text, raw, ok = gc.report(a, built, runs, GOOD_BARE, {"gpu": "test"}, {"total": 1.0})
    assert ok
    for heading in ("## Per step", "## Push check", "## Throughput", "## Peak memory", "## Checks"):
        assert heading in text
    assert "989 TFLOP/s" in text
    # MFU of a step: 6 N D / time/train / peak, D = kept x (generated + rollouts x prompt tokens)
    d = raw["derived"][0]
    tokens = 1000 + a.n_prompts * a.group_size * 100.0
    assert d["trained_tokens"] == tokens
    assert d["mfu"] == pytest.approx(6 * 494_032_768 * tokens / 1.0 / 989e12)
    assert "| rollout.sleep_mode=false | 2 | 90.0 | 1.0 |" in text


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the real check")
def test_shell_script_refuses_without_a_gpu():
    res = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no NVIDIA GPU" in res.stderr


@pytest.mark.slow
def test_cpu_mode_runs_the_whole_pipeline_to_the_table(tmp_path):
    venv = Path(sys.executable).parent.parent  # the venv running the tests: rlvr, torch, tokenizers
    env = {**os.environ, "VENV": str(venv), "RLVR_NUM_THREADS": "1"}
    out = tmp_path / "gpu.md"
    res = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--work", str(tmp_path / "work"), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, f"{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    text = out.read_text()
    assert "ALL CHECKS PASSED" in res.stdout and "[FAIL]" not in text
    raw = json.loads(out.with_suffix(".json").read_text())
    assert raw["ok"] and len(raw["runs"]["sleep"]["rows"]) == raw["config"]["steps"]
    # hf: no sleep mode, so no second run of the same thing; no held-out eval unless --eval
    assert "nosleep" not in raw["runs"] and len(raw["runs"]["plain"]["rows"]) == raw["config"]["steps_plain"]
    assert not any("eval/accuracy" in r for r in raw["runs"]["sleep"]["rows"])
    first = raw["runs"]["sleep"]["rows"][0]
    assert first["rollout/policy_version"] == 0 and first["rollout/logprob_diff_mean"] < 1e-3
    # the counterfactual moved and the push closed the gap (fp32 on CPU: same kernels, ~1e-7)
    assert raw["bare"]["initial_engine_vs_final_policy"][0] > 100 * raw["bare"]["pushed_engine_vs_final_policy"][0]
    assert (tmp_path / "work" / "run_sleep" / "metrics.jsonl").exists()


def test_hf_gpu_check_fits_a_short_slot_and_evaluates_only_when_asked(tmp_path):
    a = gc.parse_args(["--backend", "hf"])
    # no sleep-mode rerun (HFGenerator.sleep is a no-op), fewer steps: ~4 min on an H200 (issue 27)
    assert (a.steps, a.steps_nosleep, a.steps_plain) == (3, 0, 2)
    assert gc.parse_args(["--backend", "hf", "--steps-nosleep", "1"]).steps_nosleep == 1  # still settable
    assert gc.parse_args([]).steps_nosleep == 2  # vLLM keeps its sleep/no-sleep pair
    built = {"model_dir": str(tmp_path / "model"), "train": str(tmp_path / "data" / "train.jsonl"),
             "test": str(tmp_path / "data" / "test.jsonl")}
    ov = gc.trainer_overrides(a, built, tmp_path / "run", a.steps, True)
    (eval_path,) = [o.split("=", 1)[1] for o in ov if o.startswith("data.eval_path=")]
    assert Path(eval_path).read_text() == ""  # an empty held-out file: no end-of-run eval
    a = gc.parse_args(["--backend", "hf", "--eval"])
    assert f"data.eval_path={built['test']}" in gc.trainer_overrides(a, built, tmp_path / "run", a.steps, True)


def test_system_python_mode_needs_no_venv_and_reaches_the_gpu_check(tmp_path):
    # a GPU machine without network (VENV=system): no venv, no install, this checkout on PYTHONPATH. Here a
    # fake nvidia-smi gets the script past its first check; the CPU torch then fails the CUDA one, after the
    # imports of rlvr, torch, tokenizers and transformers succeeded with the interpreter as it is
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'Fake GPU, 1 MiB, 0'\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "VENV": "system", "PYTHON": sys.executable, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": ""}
    res = subprocess.run(["bash", str(SCRIPT), "--backend", "hf"], capture_output=True, text=True, env=env,
                         timeout=120, cwd=tmp_path)
    assert res.returncode != 0
    assert "cannot import" not in res.stderr and "torch does not see the GPU" in res.stderr, res.stderr[-2000:]
    assert not (ROOT / ".venv-gpu").exists()  # nothing created
