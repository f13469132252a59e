"""GPU check of the sharded learner (distributed.learner=fsdp2) and LoRA against the one-process learner.

    python scripts/gpu_check_fsdp.py              # one CUDA GPU: a group of one over NCCL, bf16 + fp32 masters
    python scripts/gpu_check_fsdp.py --dry-run    # CPU: tiny shape, float32, gloo (tests/scripts/test_gpu_check_fsdp.py)

The one GPU check (`bash scripts/gpu_check.sh --bench`, benchmarks/gpu.py) runs the same four learners (its plain,
lora, fsdp2 and fsdp2_lora variants) with the same step-1 comparisons inside its time budget, beside the speed
table; this script stays for a standalone run with the adapter comparison after the last step.

Four `rlvr train` runs of --steps steps on the model, tokenizer and data scripts/gpu_check.py builds (a random
Qwen2.5-0.5B-shaped model, hf sampler, no network): the plain learner, `torchrun --nproc_per_node 1 ...
distributed.learner=fsdp2` (NCCL on the GPU: FSDP2's mixed-precision policy, the gathered weight push, the
DCP checkpoint), and both again with `model.lora_rank=16`. What it checks and writes (benchmarks/results/
gpu_fsdp.md + .json on a GPU, WORK/gpu_fsdp.md on CPU): the step-1 gradient norm of fsdp2 equals the plain
learner's (same weights, same rollouts: relative gap < --loss-tol), every step's sampler-vs-learner logprob gap stays
below --logprob-tol (a failed gathered push would blow it up), the LoRA adapters of the last step agree
(--weight-tol), and it reports seconds per step and the peak memory of each run (mem/ metrics).
On a GPU the plain and fsdp2 runs differ in numerics (bf16 parameters with fp32 masters vs fp32 shards
computed in bf16), so only step 1 is compared strictly. Estimated 3-4 minutes on one H200 (not run on a GPU yet).
Exit status 0 only if every check passes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check as gc  # noqa: E402 - the shared builder and run helpers of scripts/gpu_check.py

RUNS = {  # name -> extra overrides, launched under torchrun when sharded
    "local": [],
    "fsdp2": ["distributed.learner=fsdp2"],
    "local_lora": ["model.lora_rank=16", "model.lora_alpha=32"],
    "fsdp2_lora": ["distributed.learner=fsdp2", "model.lora_rank=16", "model.lora_alpha=32"],
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, float32, gloo")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--loss-tol", type=float, default=None, help="step-1 gradient-norm relative gap (GPU 2e-2, CPU 1e-4)")
    ap.add_argument("--logprob-tol", type=float, default=None, help="sampler vs learner (GPU 0.1, CPU 1e-3)")
    ap.add_argument("--weight-tol", type=float, default=None, help="adapter gap at the end (GPU 5e-2, CPU 1e-4)")
    ap.add_argument("--work", help="working folder (default: a new temp folder)")
    ap.add_argument("--out", help="report (markdown; .json beside it)")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    a = ap.parse_args(argv)
    base = gc.parse_args(["--backend", "hf"] + (["--dry-run"] if a.dry_run else []))
    for key, value in vars(base).items():
        if not hasattr(a, key) or getattr(a, key) is None:
            setattr(a, key, value)
    cpu = a.device == "cpu"
    a.loss_tol = a.loss_tol if a.loss_tol is not None else (1e-4 if cpu else 2e-2)
    a.logprob_tol = a.logprob_tol if a.logprob_tol is not None else (1e-3 if cpu else 0.1)
    a.weight_tol = a.weight_tol if a.weight_tol is not None else (1e-4 if cpu else 5e-2)
    a.n_prompts = min(a.n_prompts, 32)  # four runs in a few minutes of one GPU
    return a


def adapter(run: Path) -> dict:
    from safetensors.torch import load_file

    last = sorted((run / "checkpoints").glob("step_*"))[-1]
    return load_file(str(last / "model" / "adapter_model.safetensors"))


def main(argv: list[str] | None = None) -> int:
    a = parse_args(sys.argv[1:] if argv is None else argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="rlvr-gpu-fsdp-"))
    work.mkdir(parents=True, exist_ok=True)
    built = gc.build(work, a.shape, a.dtype, a.num_train, a.num_eval, a.seed)
    env = gc.child_env(a)
    env["OMP_NUM_THREADS"] = "1"
    rows, seconds, peak = {}, {}, {}
    for name, extra in RUNS.items():
        out = work / name
        args = ["train", *gc.trainer_overrides(a, built, out, a.steps, sleep_mode=False), *extra]
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "rlvr"] \
            if "distributed.learner=fsdp2" in extra else [sys.executable, "-m", "rlvr"]
        mem = None if a.device == "cpu" else gc.GpuMemorySampler("0")
        seconds[name] = gc.run_logged([*launcher, *args], work / f"{name}.log", env, a.timeout_s, mem)
        rows[name] = gc.read_metrics(out)
        peak[name] = None if mem is None else mem.peak_mib
        print(f"{name}: {seconds[name]:.1f} s", flush=True)

    checks = []
    for plain, sharded in (("local", "fsdp2"), ("local_lora", "fsdp2_lora")):
        # the step-1 gradient norm (the GRPO loss itself is ~0 on policy: advantages sum to zero per group)
        l1, s1 = rows[plain][0]["grad_norm"], rows[sharded][0]["grad_norm"]
        gap = abs(s1 - l1) / max(abs(l1), 1e-12)
        checks.append((f"{sharded}: step-1 gradient norm equals {plain}'s", gap < a.loss_tol,
                       f"{s1:.6g} vs {l1:.6g} ({gap:.2g})"))
        worst = max(r.get("rollout/logprob_diff_max", 0.0) for r in rows[sharded])
        checks.append((f"{sharded}: sampler vs learner logprobs after gathered pushes", worst < a.logprob_tol,
                       f"max {worst:.3g}"))
    la, sa = adapter(work / "local_lora"), adapter(work / "fsdp2_lora")
    wgap = max(float((la[k].float() - sa[k].float()).abs().max()) for k in la)
    checks.append(("LoRA adapters of the last step agree", wgap < a.weight_tol, f"max abs gap {wgap:.3g}"))

    table = ["| run | s / step (wall, incl. start) | loss step 1 | grad_norm step 1 | peak GPU MiB |", "|---|---:|---:|---:|---:|"]
    for name in RUNS:
        r = rows[name][0]
        table.append(f"| {name} | {seconds[name] / a.steps:.1f} | {r['loss']:.5g} | {r.get('grad_norm', float('nan')):.4g} "
                     f"| {peak[name] if peak[name] is not None else 'n/a'} |")
    lines = ["# GPU check: the sharded learner (fsdp2) and LoRA vs the one-process learner", "",
             f"device {a.device}, shape {a.shape}, dtype {a.dtype}, {a.steps} steps of {a.n_prompts} x {a.group_size}"
             f" rollouts (hf sampler), {built['n_params']:,} parameters", "", *table, "",
             "| check | ok | value |", "|---|---|---|",
             *[f"| {n} | {'yes' if ok else 'NO'} | {v} |" for n, ok, v in checks], ""]
    text = "\n".join(lines)
    out = Path(a.out) if a.out else (work / "gpu_fsdp.md" if a.device == "cpu"
                                     else ROOT / "benchmarks" / "results" / "gpu_fsdp.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps({"checks": checks, "seconds": seconds, "peak_mib": peak,
                                                    "rows": rows}, indent=1, default=str))
    print(text)
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
