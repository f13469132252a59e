"""GPU check of the Ray placement with vLLM generator actors (run by `gpu_check.sh --ray`).

    python scripts/gpu_check_ray.py                 # GPU: Qwen2.5-0.5B shape, vLLM generator actor
    python scripts/gpu_check_ray.py --dry-run       # CPU: tiny shape, hf backend, the same pipeline

Builds the model, tokenizer and data of scripts/gpu_check.py, then runs `rlvr train` twice with
`distributed.placement=ray` (one generator actor holding a vLLM engine with
distributed.generator_gpus=0.5 on a GPU, the learner in the driver on the same GPU):
  1. synchronous: the weights reach the engine through the object store and VLLMGenerator's
     update_weights (vLLM's in-place reload_weights path); checks at every step that the rollouts carry
     version step-1 and that sampler and learner logprobs agree (rollout/logprob_diff_max below the
     profile's tolerance: a failed push would show as a large gap from step 2 on);
  2. distributed.max_staleness=1: checks rollout/staleness <= 1 at every step and the same logprob
     agreement (the learner recomputes old logprobs under each rollout's own version).
Writes benchmarks/results/gpu_ray.md (GPU) or WORK/gpu_ray.md (CPU). Exit status 0 only if every
check passes.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import gpu_check as gc  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    a = gc.parse_args(sys.argv[1:] if argv is None else argv)
    a.steps = min(a.steps, 4)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="rlvr-gpu-check-ray-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else (ROOT / "benchmarks" / "results" / "gpu_ray.md" if a.device != "cpu"
                                     else work / "gpu_ray.md")
    env = gc.child_env(a)
    print(f"[gpu_check_ray] build: {a.shape} in {work}", flush=True)
    built = gc.build(work, a.shape, a.dtype, a.num_train, a.num_eval, a.seed)
    gpus = "0.5" if a.device != "cpu" else "0"
    ray_keys = ["distributed.placement=ray", f"distributed.generator_gpus={gpus}", "distributed.generator_cpus=1",
                "distributed.scorer_cpus=1"]
    lines, ok = [f"# GPU check, Ray placement ({a.backend}, {a.shape}, {a.steps} steps)", ""], True
    for name, extra in (("sync", []), ("max_staleness=1", ["distributed.max_staleness=1"])):
        run_dir = work / f"run_{name.replace('=', '')}"
        cmd = [sys.executable, "-m", "rlvr.cli", "train",
               *gc.trainer_overrides(a, built, run_dir, a.steps, sleep_mode=False), *ray_keys, *extra]
        print(f"[gpu_check_ray] train: {name}", flush=True)
        t0 = time.perf_counter()
        gc.run_logged(cmd, work / f"train_{name.replace('=', '')}.log", env, a.timeout_s, None)
        rows = gc.read_metrics(run_dir)
        lines += [f"## {name} ({time.perf_counter() - t0:.0f} s)", "",
                  "| step | policy version | staleness | logprob diff max | time/generate s | time/train s |",
                  "|---|---|---|---|---|---|"]
        for r in rows:
            step, diff = r["step"], r.get("rollout/logprob_diff_max", 0.0)
            good = diff < a.logprob_tol and (r["rollout/staleness"] <= 1 if extra else
                                             r["rollout/policy_version"] == step - 1)
            ok &= good
            lines.append(f"| {step} | {r['rollout/policy_version']} | {r['rollout/staleness']} | {diff:.3g} | "
                         f"{r.get('time/generate', 0):.2f} | {r.get('time/train', 0):.2f} |"
                         + ("" if good else " FAIL"))
        ok &= len(rows) == a.steps
        lines.append("")
    lines.append(f"all checks: {'PASS' if ok else 'FAIL'} (logprob tolerance {a.logprob_tol})")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
