"""One GPU check: rlvr's GRPO step in its variants (plain, LoRA, fsdp2, fsdp2 + LoRA), TRL, a bare forward+backward
and the correctness checks of the CUDA paths, in one run that fits a 15-minute device slot (issue 38, item 5).

    bash scripts/gpu_check.sh --bench           # the one command (a GPU machine, no network; wheels from .whl/)
    python benchmarks/gpu.py --profile          # the same, by hand: ~7 minutes on one H100 (--budget-s 420)
    python benchmarks/gpu.py --dry-run          # CPU: tiny shape, every stage, under a minute
    python benchmarks/gpu.py --variant packed:algo.packing=true --skip checks,trl --out-dir "$OUT"

No network is needed: the model (random init, the Qwen2.5-0.5B shape), its tokenizer and a GSM8K-like JSONL are
built here by scripts/gpu_check.py's builder. The work (issue 27's): 64 prompts x 8 samples = 512 rollouts of up to
256 new tokens, r1_zero prompts (~117 tokens), bf16 with fp32 master weights, GRPO, algo.micro_batch_tokens=16384,
the hf backend, reward `language` (non-zero advantages on a random model).

Stages, in this order (the acceptance figures first), each under a time budget: the whole run has --budget-s
seconds (full 420, quick 300); a stage starts only when at least its minimum is left (else a `SKIPPED <stage>:
budget ...` line and a table row saying so), and runs under min(its cap, what is left) (a child process is
killed, an in-process stage interrupted, at that limit: `TIMED OUT` in its row). A stage that fails prints its
error and the rest still run. The table and benchmarks/results/gpu_bench.{md,json} (the work folder on CPU; and
--out-dir) are rewritten after every stage, so a run cut short still reports what it measured.
  build       model folder, tokenizer, data (gpu_check.build);
  <variant 1> `rlvr train` (rlvr.train.pg.loop.train) in a child process under the first --variant (default `plain`:
              rlvr's defaults), --steps steps (the first a warm-up) and with --profile one more step whose learner
              runs under torch.profiler (top ops by device and CPU time, host syncs -> gpu_profile.txt). Every
              child shares one compile cache (TORCHINDUCTOR_CACHE_DIR=--compile-cache, default WORK/compile_cache,
              with the FX-graph and AOTAutograd caches on), so this first child compiles cold;
  warm        the first variant again in a second process, --variant-steps steps, over the now warm cache: its
              first step against a steady step (target <= 2x);
  checks      correctness on the device, fp32 (TF32 off): packed vs padded learner logprobs and gradients (each
              prompt once, and every row whole), the padded shared-prefix path too; the same through a LoRA (peft)
              policy; MasterWeightAdamW's foreach step vs its per-parameter loop (within 1 ulp, and both timed on
              the model's parameters); the sampler's CUDA-graph decode vs its plain loop, greedy with a stop string
              and sampled inside the graph; algo.packing=varlen's attention vs flex_attention's at the step's
              layout (one layer, bf16: outputs, gradients, forward+backward time);
  <variants>  the other variants (default `lora`: model.lora_rank=16, `fsdp2`: distributed.learner=fsdp2 as a group
              of one under torchrun, `fsdp2_lora`, `compile`: model.compile_layers=true, the learner's decoder
              layers compiled, `compile_decode`: rollout.compile_decode=true, the sampler's CUDA-graph decode step
              compiled, left out on the CPU; `varlen`: algo.packing=varlen, FlashAttention's variable-length
              kernel for the packed attention), --variant-steps steps each, each in its own process; an fsdp2
              variant is checked against the variant with the same keys but the one-process learner: step-1
              gradient norms within 2e-2 (1e-4 on CPU, float32);
  ceiling     a bare forward+backward (cross-entropy on every token, no optimizer) over rows of the same count and
              lengths in micro-batches of the same token budget: the learner's upper bound;
  trl         TRL's GRPOTrainer on the same prompts, samples and lengths (use_vllm=False, bf16 autocast over fp32
              weights, 64 rows x 8 accumulation = one optimizer step per 512 rollouts), --trl-steps steps, the
              first a warm-up; skipped with a note when TRL is not importable (scripts/gpu_wheels.sh);
  generate    transformers' `model.generate` on the step's prompts (n samples each, T = 1).

Columns: step s (median of the timed steps), sampler s and tok/s (generated tokens / time/generate), learner s (the
rest of the step: old logprobs, the loss's forwards and backwards, the optimizer, the weight sync, scoring), the
learner's FLOPs done and MFU on them, peak CUDA memory, the first step. FLOPs done: rlvr.runtime.FlopCounter over the
learner's forward calls (what the step forwarded per the pack plan: a group's prompt once per micro-batch, no pad
token in a packed forward, the LM head where it ran, attention's query-key pairs, backwards of the forwards with
grad: 2x, less the weight gradients of frozen weights under LoRA); TRL's and the ceiling's forwards are counted
the same way. MFU = FLOPs done / learner s / --peak-tflops (default: the device's bf16 dense peak,
rlvr.runtime.PEAK_BF16_TFLOPS: H100 and H200 989). `6N MFU` is the old estimate (6 x N x trained tokens), kept for
comparison with earlier tables. Then the targets (issue 38) next to the measurements, and the correctness table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib.util
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
SCRIPT = Path(__file__).resolve()
_T0 = time.perf_counter()

# the shapes: full = issue 27's work; quick = the same stages, smaller; cpu = the dry run's plumbing check
PROFILES: dict[str, dict[str, Any]] = {
    "full": dict(shape="qwen2.5-0.5b", dtype="bfloat16", n_prompts=64, group_size=8, max_tokens=256, steps=3,
                 variant_steps=2, trl_steps=2, trl_micro=64, ceiling_reps=2, micro_batch_tokens=16384,
                 num_train=1024, budget_s=420.0, check_prompts=4, check_tokens=48),
    "quick": dict(shape="qwen2.5-0.5b", dtype="bfloat16", n_prompts=16, group_size=8, max_tokens=128, steps=3,
                  variant_steps=2, trl_steps=2, trl_micro=64, ceiling_reps=2, micro_batch_tokens=16384,
                  num_train=256, budget_s=300.0, check_prompts=4, check_tokens=32),
    "cpu": dict(shape="tiny", dtype="float32", n_prompts=4, group_size=4, max_tokens=12, steps=2, variant_steps=2,
                trl_steps=2, trl_micro=8, ceiling_reps=2, micro_batch_tokens=1024, num_train=64, budget_s=600.0,
                check_prompts=2, check_tokens=12),
}
LORA = "model.lora_rank=16,model.lora_alpha=32"
FSDP2 = "distributed.learner=fsdp2"
COMPILE = "model.compile_layers=true"
COMPILE_DECODE = "rollout.compile_decode=true"
VARLEN = "algo.packing=varlen"
# compile: the regional compile of the learner's layers (issue 38, item 3), measured against plain; compile_decode:
# the sampler's CUDA-graph decode step compiled with its sampling (issue 38, S3, S4); varlen last (the first dropped
# when the budget runs short; the checks stage times its attention alone): FlashAttention's variable-length kernel
DEFAULT_VARIANTS = ("plain:", f"lora:{LORA}", f"fsdp2:{FSDP2}", f"fsdp2_lora:{FSDP2},{LORA}", f"compile:{COMPILE}",
                    f"compile_decode:{COMPILE_DECODE}", f"varlen:{VARLEN}")
CUDA_ONLY = (COMPILE_DECODE,)  # variants with these keys are refused on a CPU policy: left out of a CPU run
# On a CPU the compiled layers run packed, the layout algo.packing=auto picks on CUDA (the one a GPU run measures):
# the CPU's default shared-prefix cascade calls a layer four ways (a cache filled or not, its bias built or not),
# four compiles (~95 s of the dry run, vs one compile packed)
CPU_PACKED = (COMPILE,)
STAGES = ("variants", "warm", "checks", "trl", "ceiling", "generate", "profile")
# (minimum seconds left to start, cap) per stage kind; "first": the first variant (cold compile + profile step)
STAGE_TIME: dict[str, dict[str, tuple[float, float]]] = {
    "full": {"first": (60, 160), "warm": (40, 90), "checks": (25, 90), "variant": (45, 110), "trl": (35, 90),
             "ceiling": (10, 40), "generate": (15, 40)},
    "quick": {"first": (45, 120), "warm": (30, 70), "checks": (20, 70), "variant": (35, 90), "trl": (30, 70),
              "ceiling": (8, 30), "generate": (10, 30)},
    "cpu": {k: (1, 300) for k in ("first", "warm", "checks", "variant", "trl", "ceiling", "generate")},
}
# the targets of issue 38 printed next to the measurements
TARGETS = {"step_s": 3.0, "trl_speedup": 4.0, "sampler_tok_s": 80_000.0, "mfu": 0.35, "warm_ratio": 2.0}
FSDP_TOL = {"cpu": 1e-4, "cuda": 2e-2}  # step-1 gradient norm, relative (bf16 on the GPU vs fp32 shards)
LOGPROB_GAP_TOL = {"cpu": 1e-3, "cuda": 0.1}  # sampler vs learner logprobs of a variant's rollouts (bf16)


def log(msg: str) -> None:
    print(f"[gpu.py {time.strftime('%H:%M:%S')} +{time.perf_counter() - _T0:6.1f}s] {msg}", flush=True)


@functools.cache
def _gpu_check():
    """scripts/gpu_check.py as a module (its model/tokenizer/data builder)."""
    spec = importlib.util.spec_from_file_location("rlvr_gpu_check", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------ arguments


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME:key=value,key=value' -> (NAME, ['key=value', ...]); 'NAME' or 'NAME:' = rlvr's defaults."""
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"--variant {text!r}: expected NAME:key=value,key=value (NAME letters, digits, _ or -)")
    overrides = [x.strip() for x in rest.split(",") if x.strip()]
    for o in overrides:
        if "=" not in o:
            raise ValueError(f"--variant {text!r}: {o!r} is not key=value")
    return name, overrides


def sharded(extra: list[str]) -> bool:
    """Whether a variant runs the sharded learner (launched under torchrun as a group of one)."""
    return FSDP2 in [x.replace(" ", "") for x in extra]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, every stage (the pipeline check)")
    ap.add_argument("--quick", action="store_true", help="GPU, smaller batch: " + json.dumps(PROFILES["quick"]))
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default cuda (cpu with --dry-run)")
    ap.add_argument("--shape", choices=["qwen2.5-0.5b", "tiny"])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"])
    for key in ("n_prompts", "group_size", "max_tokens", "steps", "variant_steps", "trl_steps", "trl_micro",
                "ceiling_reps", "micro_batch_tokens", "num_train", "check_prompts", "check_tokens"):
        ap.add_argument("--" + key.replace("_", "-"), type=int, dest=key)
    ap.add_argument("--budget-s", type=float, dest="budget_s",
                    help="seconds for the whole run (full 420, quick 300; 0 = no limit): later stages are skipped "
                         "when it runs out")
    ap.add_argument("--variant", action="append", default=None, metavar="NAME:key=value,...",
                    help="an rlvr run under these config overrides (repeatable; default: "
                         + " and ".join(repr(v) for v in DEFAULT_VARIANTS) + "); the first is also rerun by `warm`")
    ap.add_argument("--skip", default="", help=f"comma-separated stages ({', '.join(STAGES)}) or variant names")
    ap.add_argument("--profile", action="store_true", help="torch.profiler over one learner step of the first variant")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense bf16 peak for MFU (default: the device's, rlvr.runtime.peak_tflops; H100/H200 989)")
    ap.add_argument("--compile-cache", help="the compile cache every child shares (default WORK/compile_cache)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="working folder (default: a temp folder, removed at the end)")
    ap.add_argument("--out-dir", help="also write gpu_bench.{md,json} (and gpu_profile.txt) here, e.g. $OUT")
    a = ap.parse_args(argv)
    if a.dry_run:
        a.device = "cpu"
    a.device = a.device or "cuda"
    a.profile_name = "cpu" if a.device == "cpu" else "quick" if a.quick else "full"
    for k, v in PROFILES[a.profile_name].items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    try:
        a.variants = [parse_variant(v) for v in (a.variant or DEFAULT_VARIANTS)]
    except ValueError as e:
        ap.error(str(e))
    if a.device == "cpu":
        for name, extra in [v for v in a.variants if set(v[1]) & set(CUDA_ONLY)]:
            log(f"variant {name} ({','.join(extra)}) needs a GPU: left out on the CPU")
            a.variants.remove((name, extra))
        for i, (name, extra) in enumerate(a.variants):
            if set(extra) & set(CPU_PACKED) and not any(x.startswith("algo.packing=") for x in extra):
                log(f"variant {name} ({','.join(extra)}) runs packed on the CPU, as on CUDA: algo.packing=true added")
                a.variants[i] = (name, [*extra, "algo.packing=true"])
    names = [n for n, _ in a.variants]
    if len(set(names)) != len(names):
        ap.error(f"--variant: a name is used twice: {names}")
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    if bad := sorted(a.skip - set(STAGES) - set(names)):
        ap.error(f"--skip: unknown stage(s) {bad}; known: {', '.join(STAGES)} and the variants {', '.join(names)}")
    return a


# ------------------------------------------------------------------------------------------ helpers


def _sync(device: str) -> None:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()


def _reset_memory(device: str) -> None:
    import torch

    gc.collect()
    if device != "cpu" and torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float | None:
    import torch

    if device != "cpu" and torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    return None


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(statistics.median(xs)) if xs else None


def mfu_6n(n_params: int, tokens: float | None, seconds: float | None, peak_tflops: float | None) -> float | None:
    """The old estimate: 6 N tokens / seconds / peak (forward 2N + backward 4N per token, attention left out)."""
    if not tokens or not seconds or not peak_tflops:
        return None
    return 6.0 * n_params * tokens / seconds / (peak_tflops * 1e12)


def mfu(flops: float | None, seconds: float | None, peak_tflops: float | None) -> float | None:
    """MFU on the FLOPs done (rlvr.runtime.mfu)."""
    from rlvr.runtime import mfu as runtime_mfu

    return runtime_mfu(flops, seconds, peak_tflops)


def ulps(a, b) -> int:
    """The largest distance in units in the last place between two float tensors of one shape and dtype (float32,
    bfloat16 or float16: in that dtype's own ulps; 0 = equal bits, +0 and -0 one apart)."""
    import torch

    if a.dtype != b.dtype:
        raise ValueError(f"ulps: {a.dtype} vs {b.dtype}")
    ints, sign = (torch.int32, 0x7FFFFFFF) if a.dtype == torch.float32 else (torch.int16, 0x7FFF)

    def ordered(t):  # the float's bits -> integers ordered like the floats
        i = t.detach().contiguous().view(ints).to(torch.int64)
        return torch.where(i < 0, -(i & sign) - 1, i)

    if a.numel() == 0:
        return 0
    return int((ordered(a) - ordered(b)).abs().max())


class StageTimeout(Exception):
    """A stage ran past its share of the budget."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise StageTimeout in this (main) thread after `seconds` (SIGALRM; no limit off the main thread or when
    seconds is infinite)."""
    if not math.isfinite(seconds) or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise StageTimeout(f"timed out after {seconds:.0f} s (its share of --budget-s)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def step_prompts(a, built: dict) -> list[str]:
    """The prompts rlvr's trainer draws for its first step (its data stream: rlvr.train.session.take)."""
    return _stream_prompts(a, built, a.n_prompts)


def trl_prompts(a, built: dict) -> list[str]:
    """Every TRL step's prompts: rlvr's data stream for steps 1..trl_steps (the same prompts rlvr saw)."""
    return _stream_prompts(a, built, a.trl_steps * a.n_prompts)


def _stream_prompts(a, built: dict, count: int) -> list[str]:
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.session import take
    from rlvr.train.tasks import load_task_data

    cfg = load_config(TrainConfig, None, rlvr_overrides(a, built, Path(a.work) / "unused", 1))
    task = load_task_data(cfg.data)
    return [task.prompt(ex) for ex in take(task.train, 0, count, cfg.data.seed)]


def rlvr_overrides(a, built: dict, out_dir: Path, steps: int) -> list[str]:
    """The `rlvr train` configuration of every variant (the variant's own keys come after these)."""
    return [
        f"model.name={built['model_dir']}", f"model.dtype={a.dtype}", f"model.device={a.device}",
        "model.master_weights=float32",
        # no held-out eval: an empty eval file (data.num_eval=0 would mean all of them)
        "data.task=gsm8k", f"data.train_path={built['train']}", f"data.eval_path={_gpu_check().no_eval_file(built)}",
        "data.template=r1_zero", "data.reward=language", "data.num_train=0",
        f"sampling.n_prompts={a.n_prompts}", f"sampling.group_size={a.group_size}",
        f"sampling.max_tokens={a.max_tokens}", "sampling.temperature=1.0",
        "rollout.backend=hf",
        "algo.advantage=grpo", "algo.loss=grpo_clip", "algo.aggregation=seq_mean_token_mean", "algo.kl_coef=0",
        f"algo.micro_batch_tokens={a.micro_batch_tokens}", "optim.lr=1e-5", "optim.warmup_steps=0",
        f"run.out_dir={out_dir}", f"run.steps={steps}", "run.overwrite=true", "run.progress=false",
        "run.eval_every=0", "run.log_samples_every=0", "run.checkpoint_every=0", "run.keep_checkpoints=1",
        f"run.seed={a.seed}",
    ]


def check_variants(a, built: dict) -> None:
    """Every variant's configuration loads and validates (a typo fails here, before minutes of work)."""
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import validate_train_config

    for name, extra in a.variants:
        try:
            validate_train_config(load_config(TrainConfig, None,
                                              rlvr_overrides(a, built, Path(a.work) / name, a.steps) + extra))
        except Exception as e:  # noqa: BLE001 - reported as one line naming the variant
            raise ValueError(f"--variant {name}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------ rlvr variants


def summarize(rows: list[dict], timed_from: int, timed_to: int, extra: list[str]) -> dict:
    """A variant's row from its per-step metrics: medians over steps timed_from..timed_to (1-based; the warm-up
    and a profiled step left out), the first step, peak memory, FLOPs done."""
    timed = [r for r in rows if timed_from <= r["step"] <= timed_to] or rows[:1]
    step_s = _median([r["time/step"] - r.get("time/eval", 0.0) for r in timed])
    gen_s = _median([r.get("time/generate") for r in timed])
    learner_s = _median([r["time/step"] - r.get("time/eval", 0.0) - r.get("time/generate", 0.0) for r in timed])
    gen_tok = _median([r.get("tokens/generated") for r in timed])
    trained = _median([r.get("tokens/trained") for r in timed])
    peaks = [r["mem/cuda_peak_gb"] for r in rows if r.get("mem/cuda_peak_gb") is not None]
    first = rows[0] if rows else {}
    return {"step_s": step_s, "sampler_s": gen_s, "learner_s": learner_s,
            "train_s": _median([r.get("time/train") for r in timed]),
            "generated_tokens": gen_tok, "learner_tokens": trained,
            "sampler_tok_s": gen_tok / gen_s if gen_tok and gen_s else None,
            "learner_tok_s": trained / learner_s if trained and learner_s else None,
            "learner_flops": _median([r.get("perf/flops_done") for r in timed]),
            "peak_gib": max(peaks) if peaks else None, "overrides": extra, "steps": rows,
            "first_step_s": first.get("time/step"), "grad_norm_step1": first.get("grad_norm"),
            "perf_mfu_logged": _median([r.get("perf/mfu") for r in timed]),
            "timed_steps": [r["step"] for r in timed],
            # the learner's logprobs against the sampler's on the same tokens: a check of the learner's forward
            "logprob_diff_mean": _median([r.get("rollout/logprob_diff_mean") for r in timed]),
            "logprob_diff_max": max((r["rollout/logprob_diff_max"] for r in rows
                                     if r.get("rollout/logprob_diff_max") is not None), default=None)}


def stage_rlvr(a, built: dict, name: str, extra: list[str], steps: int, profile_out: Path | None = None,
               on_rows=None) -> dict:
    """`rlvr train` in this process under one variant; per-step times from its metrics (steps 2.. timed), the
    learner's FLOPs done per step (rlvr.runtime.FlopCounter on the learner's model around rlvr.train.pg.loop.learn:
    `perf/flops_done`). profile_out: one more step whose learner runs under torch.profiler (not timed).
    on_rows(rows): after every step (the child saves its partial result)."""
    from rlvr.config import load_config
    from rlvr.runs import checkpoint as ckpt_mod
    from rlvr.runtime import FlopCounter
    from rlvr.train import session
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg import loop as pg

    total = steps + (1 if profile_out is not None else 0)
    cfg = load_config(TrainConfig, None, rlvr_overrides(a, built, Path(a.work) / f"run_{name}", total) + extra)
    rows: list[dict] = []
    flops: list[float] = []
    counter: list[FlopCounter] = []
    orig_learn = pg.learn

    def learn(learner, *args, **kw):
        if not counter:
            ref = getattr(learner.reference, "model", None)
            counter.append(FlopCounter(learner.model, ref if ref is not learner.model else None))
        with counter[0].counting():
            if profile_out is None or len(rows) < steps:
                out = orig_learn(learner, *args, **kw)
            else:
                out = profiled(lambda: orig_learn(learner, *args, **kw), a.device, profile_out,
                               f"rlvr learner step, variant {name}")
        flops.append(counter[0].flops())
        return out

    def on_step(step: int, m: dict) -> None:
        rows.append(dict(m, step=step) | ({"perf/flops_done": flops[-1]} if flops else {}))
        log(f"  {name} step {step}: {m.get('time/step', 0):.2f} s (generate {m.get('time/generate', 0):.2f}, "
            f"score {m.get('time/score', 0):.2f} after it, {m.get('time/score_while_generating', 0):.2f} during it, "
            f"train {m.get('time/train', 0):.2f}), {m.get('tokens/generated', 0)} generated, "
            f"{m.get('tokens/trained', 0)} trained tokens, {flops[-1] / 1e12 if flops else 0:.3g} TFLOP done, "
            f"grad_norm {m.get('grad_norm', float('nan')):.4g}, sampler-trainer logprob gap mean "
            f"{m.get('rollout/logprob_diff_mean', float('nan')):.2e} max {m.get('rollout/logprob_diff_max', float('nan')):.2e}")
        if on_rows is not None:
            on_rows(rows)

    # what is measured is the step: the run's final checkpoint (weights + fp32 master + AdamW states, ~6 GB at
    # this shape) and its plots are left out of the benchmark's wall time
    orig_save, orig_finish = ckpt_mod.save_checkpoint, session.finish_run
    pg.learn, ckpt_mod.save_checkpoint, session.finish_run = learn, lambda *a_, **k_: None, lambda *a_, **k_: {}
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:  # a fallback (CUDA graphs, packing) must show
            warnings.simplefilter("always")
            pg.train(cfg, on_step=on_step)
    finally:
        pg.learn, ckpt_mod.save_checkpoint, session.finish_run = orig_learn, orig_save, orig_finish
    warned = sorted({str(w.message).splitlines()[0][:200] for w in caught})
    for m in warned:  # recorded, so shown here
        log(f"  {name} warned: {m}")
    out = summarize(rows, 2, steps, extra)
    out["warnings"] = [m for m in warned if "cuda_graphs" in m or "packing" in m or "flex" in m]
    if counter and counter[0].error:  # a forward the FLOP counter could not read: the count misses it
        out["warnings"].append(f"FLOP count incomplete: {counter[0].error}")
    return out


def child_main(spec_path: str) -> int:
    """`gpu.py --child SPEC.json`: one variant in this process (under torchrun for fsdp2); rank 0 writes the
    result (and after every step a partial one: a child killed at its time limit still reports its steps)."""
    spec = json.loads(Path(spec_path).read_text())
    a = argparse.Namespace(**spec["args"])
    _offline_env()
    from rlvr.runtime import set_num_threads
    from rlvr.train.policy import quiet_transformers

    set_num_threads(None)
    quiet_transformers()
    result = Path(spec["result"])
    rank0 = int(os.environ.get("RANK", "0")) == 0

    def save(obj: dict) -> None:
        if rank0:
            tmp = result.with_suffix(".tmp")
            tmp.write_text(json.dumps(obj, default=str))
            tmp.replace(result)

    steps = int(spec["steps"])
    try:
        r = stage_rlvr(a, spec["built"], spec["name"], spec["extra"], steps,
                       Path(spec["profile"]) if spec.get("profile") else None,
                       on_rows=lambda rows: save({"partial": True, "steps": rows}))
    except Exception as e:  # noqa: BLE001 - the parent reports it
        traceback.print_exc()
        save({"error": f"{type(e).__name__}: {e}".splitlines()[0]})
        return 1
    save(r)
    return 0


def _offline_env() -> None:
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                       "HF_DATASETS_OFFLINE": "1", "RLVR_PROGRESS": "off", "PYTHONUNBUFFERED": "1"})


def compile_cache_env(path: Path) -> dict[str, str]:
    """One persistent compile cache for every process of the run: inductor's FX-graph and AOTAutograd caches and
    Triton's kernels under `path` (a second process of the same shape then starts warm)."""
    return {"TORCHINDUCTOR_CACHE_DIR": str(path), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_CACHE": "1", "TRITON_CACHE_DIR": str(path / "triton")}


_CHILDREN: list[subprocess.Popen] = []


def _kill(proc: subprocess.Popen) -> None:
    """End a child and everything it started (its own session: torchrun's workers too), TERM then KILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_child(a, built: dict, name: str, extra: list[str], steps: int, limit_s: float,
              profile_out: Path | None = None) -> dict:
    """One variant in a child process (torchrun --standalone --nproc_per_node 1 for fsdp2), its output echoed with
    the variant's name and kept in WORK/NAME.log; killed at limit_s. Returns its row (a partial one when it was
    cut short or failed after some steps, with `error` set)."""
    work = Path(a.work)
    spec = {"args": {k: v for k, v in vars(a).items() if k not in ("skip", "variants")}, "built": built,
            "name": name, "extra": extra, "steps": steps, "result": str(work / f"{name}.result.json"),
            "profile": str(profile_out) if profile_out else None}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec, default=str))
    Path(spec["result"]).unlink(missing_ok=True)
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
                if sharded(extra) else [sys.executable])
    env = _gpu_check().child_env(a) | compile_cache_env(Path(a.compile_cache))
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    cmd = [*launcher, str(SCRIPT), "--child", str(spec_path)]
    log(f"  {name}: {' '.join(cmd[1:] if not sharded(extra) else cmd[1:7])} ... (limit {limit_s:.0f} s)")
    t0 = time.perf_counter()
    logf = open(work / f"{name}.log", "w", encoding="utf-8")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT, text=True,
                            start_new_session=True, bufsize=1)
    _CHILDREN.append(proc)
    tail: list[str] = []

    def pump():
        for line in proc.stdout:
            logf.write(line)
            tail.append(line)
            del tail[:-40]
            if line.startswith("[gpu.py") or "Error" in line or "error:" in line:
                print(f"    [{name}] {line.rstrip()}", flush=True)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out, stopped = False, None
    try:
        proc.wait(timeout=limit_s if math.isfinite(limit_s) else None)
    except subprocess.TimeoutExpired:
        timed_out = True
    except StageTimeout:  # the stage's backstop deadline (the wait's own timeout normally comes first)
        timed_out = True
    except KeyboardInterrupt as e:  # this process is being stopped (SIGTERM, ^C): keep the child's steps
        stopped = e
    finally:
        _kill(proc)
        reader.join(timeout=10)
        logf.close()
        _CHILDREN.remove(proc)
    secs = time.perf_counter() - t0
    res_path = Path(spec["result"])
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    why = (f"timed out after {limit_s:.0f} s (its share of --budget-s)" if timed_out
           else f"stopped after {secs:.0f} s ({type(stopped).__name__}: {stopped})" if stopped is not None
           else None if proc.returncode == 0 else
           res.get("error") or f"exit status {proc.returncode}; log {work / f'{name}.log'}: "
           + " / ".join(x.strip() for x in tail[-3:]))
    if res.get("partial") or (why and res.get("steps")):
        res = summarize(res["steps"], 2, steps, extra) | {"partial": True}
    elif not res.get("steps"):
        res = {"overrides": extra, "steps": []}
    res["process_s"] = secs
    res["launcher"] = "torchrun (group of one)" if sharded(extra) else "python"
    if why:
        res["error"] = why
        if a.out_dir:  # the device tool brings $OUT back: the failed child's whole log with it
            with contextlib.suppress(OSError):
                Path(a.out_dir).mkdir(parents=True, exist_ok=True)
                shutil.copy(work / f"{name}.log", Path(a.out_dir) / f"gpu_{name}.log")
        if proc.returncode != 0 and not timed_out and stopped is None:
            sys.stdout.write("".join(f"    [{name}] {x}" for x in tail[-25:]))
    if stopped is not None:
        res["stopped"] = repr(stopped)
    return res


# ------------------------------------------------------------------------------------------ other stages


def stage_generate(a, built: dict, prompts: list[str]) -> dict:
    """transformers' model.generate on the step's prompts, n samples each (sampling, T = 1)."""
    import torch

    from rlvr.models import load_policy

    model, tok = load_policy(built["model_dir"], dtype=a.dtype, device=a.device)
    model.eval()
    tok.padding_side = "left"
    enc = tok(prompts, return_tensors="pt", padding=True).to(a.device)
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, num_return_sequences=a.group_size,
              pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    with torch.no_grad():
        model.generate(**tok(prompts[:2], return_tensors="pt", padding=True).to(a.device), max_new_tokens=4, **kw)
        _sync(a.device)
        torch.manual_seed(a.seed)
        t0 = time.perf_counter()
        out = model.generate(**enc, max_new_tokens=a.max_tokens, **kw)
        _sync(a.device)
        secs = time.perf_counter() - t0
    new = out[:, enc["input_ids"].shape[1]:].cpu()
    # tokens up to and including each row's first EOS (pad = EOS here: what follows is padding)
    is_eos = new == tok.eos_token_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, torch.full((new.shape[0],), new.shape[1]))
    tokens = int(first.sum())
    del model, out
    return {"sampler_s": secs, "generated_tokens": tokens, "sampler_tok_s": tokens / secs, "rows": int(new.shape[0])}


def ceiling_rows(a, built: dict, prompts: list[str], tok) -> list[list[int]]:
    """Rows of the same count and lengths as a step's rollouts: each prompt n times, then max_tokens random ids."""
    import torch

    g = torch.Generator().manual_seed(a.seed)
    rows = []
    for p in prompts:
        ids = tok(p)["input_ids"]
        for _ in range(a.group_size):
            rows.append(ids + torch.randint(0, built["vocab"], (a.max_tokens,), generator=g).tolist())
    return rows


def token_budget_batches(lengths: list[int], budget: int, max_rows: int = 64) -> list[list[int]]:
    """Row indices in micro-batches whose padded size (rows x longest) stays within `budget` tokens (in order;
    budget 0: max_rows rows each)."""
    out, cur, longest = [], [], 0
    for i, n in enumerate(lengths):
        if cur and ((budget and (len(cur) + 1) * max(longest, n) > budget) or (not budget and len(cur) >= max_rows)):
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    return out


def stage_ceiling(a, built: dict, prompts: list[str]) -> dict:
    """A bare forward+backward over the step's rows (no optimizer): the learner's upper bound."""
    import torch
    import torch.nn.functional as F

    from rlvr.models import load_policy
    from rlvr.runtime import FlopCounter

    model, tok = load_policy(built["model_dir"], dtype=a.dtype, device=a.device)
    model.train()
    rows = ceiling_rows(a, built, prompts, tok)
    batches = []
    for idx in token_budget_batches([len(r) for r in rows], a.micro_batch_tokens):
        width = max(len(rows[i]) for i in idx)
        ids = torch.full((len(idx), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for j, i in enumerate(idx):
            ids[j, : len(rows[i])] = torch.tensor(rows[i])
            mask[j, : len(rows[i])] = 1
        labels = ids.masked_fill(mask == 0, -100)
        batches.append((ids.to(a.device), mask.to(a.device), labels.to(a.device)))

    def one_pass(bs):
        for ids, mask, labels in bs:
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
            loss = F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
            loss.backward()
            del logits, loss
        model.zero_grad(set_to_none=True)

    one_pass(batches[:1])  # warm-up: kernels, allocator
    _sync(a.device)
    counter = FlopCounter(model)
    times, flops = [], None
    for _ in range(a.ceiling_reps):
        t0 = time.perf_counter()
        with counter.counting():
            one_pass(batches)
        _sync(a.device)
        times.append(time.perf_counter() - t0)
        flops = counter.flops()
    counter.detach()
    tokens = sum(len(r) for r in rows)
    secs = _median(times)
    return {"learner_s": secs, "learner_tokens": tokens, "learner_tok_s": tokens / secs, "reps_s": times,
            "learner_flops": flops, "micro_batches": len(batches)}


SYNC_OPS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::item",
            "aten::_local_scalar_dense", "Memcpy DtoH")


def profiled(fn, device: str, out: Path, title: str):
    """Run fn() under torch.profiler; write the top ops by device and by CPU time and the host syncs to `out`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device != "cpu" and torch.cuda.is_available() else [])
    with profile(activities=acts, record_shapes=False) as prof:
        result = fn()
        _sync(device)
    ka = prof.key_averages()
    parts = [f"# {title}: torch.profiler, activities {[x.name for x in acts]}", ""]
    if len(acts) > 1:
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                parts += [f"## top 40 ops by {key}", ka.table(sort_by=key, row_limit=40, max_name_column_width=70), ""]
                break
            except Exception:  # noqa: BLE001 - the key's name differs across torch versions
                continue
    parts += ["## top 40 ops by self_cpu_time_total", ka.table(sort_by="self_cpu_time_total", row_limit=40,
                                                                 max_name_column_width=70), ""]
    counts: dict[str, int] = {}
    for ev in ka:
        for s in SYNC_OPS:
            if s in ev.key:
                counts[ev.key] = counts.get(ev.key, 0) + ev.count
    parts += ["## host synchronisations (calls in the profiled step)"]
    parts += [f"{k}: {v}" for k, v in sorted(counts.items())] or ["none recorded"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(parts) + "\n")
    log(f"  profile written: {out} (syncs: {counts or 'none'})")
    return result


def stage_trl(a, built: dict, prompts_all: list[str]) -> dict:
    """TRL's GRPOTrainer on the same prompts (rlvr's stream), samples, lengths and reward; FLOPs done counted on
    its forwards outside generation (rlvr.runtime.FlopCounter), as rlvr's learner's are."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.rewards import get_reward_fn
    from rlvr.runtime import FlopCounter

    reward = get_reward_fn("language")

    def language(completions, **_):
        return [float(reward(c, None).total) for c in completions]

    tok = AutoTokenizer.from_pretrained(built["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(built["model_dir"], dtype=torch.float32)
    n = a.n_prompts * a.group_size
    micro = min(n, a.trl_micro)  # rows per forward+backward; n // micro of them accumulated per optimizer step
    if n % micro:
        raise ValueError(f"--trl-micro {a.trl_micro}: must divide the {n} rollouts of a step")
    bf16 = a.dtype == "bfloat16" and a.device != "cpu"
    args = GRPOConfig(
        output_dir=str(Path(a.work) / "trl"), seed=a.seed, max_steps=a.trl_steps, use_cpu=a.device == "cpu",
        per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro, num_generations=a.group_size,
        max_completion_length=a.max_tokens, shuffle_dataset=False, temperature=1.0, top_p=1.0, top_k=0,
        beta=0.0, epsilon=0.2, loss_type="grpo", scale_rewards="group", num_iterations=1, learning_rate=1e-5,
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, use_vllm=False,
        bf16=bf16, gradient_checkpointing=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
    ds = Dataset.from_dict({"prompt": prompts_all})
    trainer = GRPOTrainer(model=model, reward_funcs=language, args=args, train_dataset=ds, processing_class=tok)
    counter = FlopCounter(trainer.model)
    cur: dict[str, float] = {}
    gen_tokens: list[int] = []
    orig_generate = trainer._generate

    def timed_generate(*args_, **kw):
        _sync(a.device)
        t = time.perf_counter()
        with counter.suspend():
            out = orig_generate(*args_, **kw)
        _sync(a.device)
        cur["generate"] = cur.get("generate", 0.0) + time.perf_counter() - t
        with contextlib.suppress(Exception):  # (prompt ids, completion ids, ...): count the completions' tokens
            comp = out[1]
            gen_tokens.append(sum(len(c) for c in comp))
        return out

    trainer._generate = timed_generate
    steps: list[dict] = []
    starts: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args_, state, control, **kw):
            _sync(a.device)
            cur.clear()
            counter.reset()
            starts.append(time.perf_counter())

        def on_step_end(self, args_, state, control, **kw):
            _sync(a.device)
            total = time.perf_counter() - starts[-1]
            steps.append({"step": state.global_step, "s": total, "generate": cur.get("generate", 0.0),
                          "generated_tokens": gen_tokens[-1] if gen_tokens else None, "flops": counter.flops()})
            log(f"  trl step {state.global_step}: {total:.2f} s (generate {cur.get('generate', 0.0):.2f}), "
                f"{steps[-1]['flops'] / 1e12:.3g} TFLOP done")

    trainer.add_callback(Clock())
    with counter.counting():
        trainer.train()
    counter.detach()
    timed = steps[1:] or steps
    step_s = _median([s["s"] for s in timed])
    gen_s = _median([s["generate"] for s in timed])
    gen_tok = _median([s["generated_tokens"] for s in timed])
    prompt_tok = statistics.fmean(len(tok(p)["input_ids"]) for p in prompts_all) * n  # their mean length, n rows
    learner_tok = (gen_tok + prompt_tok) if gen_tok else None
    learner_s = step_s - gen_s if step_s is not None and gen_s is not None else None
    del trainer, model
    import trl

    return {"step_s": step_s, "sampler_s": gen_s, "learner_s": learner_s, "generated_tokens": gen_tok,
            "learner_tokens": learner_tok, "sampler_tok_s": gen_tok / gen_s if gen_tok and gen_s else None,
            "learner_tok_s": learner_tok / learner_s if learner_tok and learner_s else None, "steps": steps,
            "learner_flops": _median([s["flops"] for s in timed]), "first_step_s": steps[0]["s"] if steps else None,
            "trl": trl.__version__, "per_device_train_batch_size": micro, "gradient_accumulation_steps": n // micro,
            "bf16": bf16}


# ------------------------------------------------------------------------------------------ correctness


def _check(name: str, ok: bool, measured: str, tolerance: str) -> dict:
    log(f"  check {'PASS' if ok else 'FAIL'}: {name}: {measured} (tolerance {tolerance})")
    return {"check": name, "ok": bool(ok), "measured": measured, "tolerance": tolerance}


@contextlib.contextmanager
def _exact_fp32():
    """float32 matmuls in float32 (no TF32) for the comparisons."""
    import torch

    prev = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev[1], prev[2]


def stage_checks(a, built: dict, prompts: list[str]) -> dict:
    """The correctness checks on the device (see the module docstring); each sub-check's failure is its own row."""
    out: list[dict] = []
    for fn in (check_packed, check_packed_lora, check_optimizer, check_sampler, check_varlen):
        try:
            with _exact_fp32():
                out += fn(a, built, prompts)
        except StageTimeout:
            raise
        except Exception as e:  # noqa: BLE001 - one check's crash is its failure, the others still run
            traceback.print_exc()
            out.append(_check(fn.__name__, False, f"raised {type(e).__name__}: {str(e).splitlines()[0][:160]}", "-"))
        _reset_memory(a.device)
    return {"checks": out}


def _check_batch(a, model, tok, prompts: list[str]):
    """A batch of real rollouts: check_prompts prompts x 4 samples at T = 1, up to check_tokens tokens."""
    from rlvr.rollout import HFGenerator, SamplingSpec
    from rlvr.rollout.batch import rollouts_to_batch

    gen = HFGenerator(model, tok, batch_size=4 * a.check_prompts, cuda_graphs=False)
    rollouts = gen.generate(prompts[: a.check_prompts], SamplingSpec(n=4, temperature=1.0, max_tokens=a.check_tokens,
                                                                      seed=a.seed + 1))
    return rollouts_to_batch(rollouts, tok.pad_token_id)


def _compare_paths(a, model, batch, label: str, grads_of) -> list[dict]:
    """Learner logprobs and gradients of `batch` through the packed paths (each prompt once; every row whole) and
    the padded shared-prefix path, against the padded path."""
    import torch

    from rlvr.config import load_config
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs
    from rlvr.train.pg.recipes import get_recipe

    rm = batch.response_mask
    seen_packed: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, args, kw: seen_packed.append(1) if "rlvr_pack" in kw else None,
                                           with_kwargs=True)
    n = batch.input_ids.shape[0]
    budget = max(16, int(batch.attention_mask.sum()) // 3)  # several micro-batches, a group cut across two
    adv = torch.randn(n, generator=torch.Generator().manual_seed(a.seed + 2))
    paths = {"padded": (False, False), "packed, each prompt once": (True, True),
             "packed, every row whole": (True, False), "padded, each prompt once": (False, True)}
    lp, grads, losses, packed_calls = {}, {}, {}, {}
    try:
        for name, (pack, share) in paths.items():
            before = len(seen_packed)
            lp[name] = batch_logprobs(model, batch, n, micro_batch_tokens=budget, shared_prefix=share, packing=pack)
            algo = load_config(TrainConfig, None, ["algo.kl_coef=0", "algo.entropy_coef=0",
                                                   f"algo.packing={str(pack).lower()}",
                                                   f"algo.shared_prefix={str(share).lower()}",
                                                   f"algo.micro_batch_tokens={budget}"], base=get_recipe("grpo")).algo
            model.zero_grad(set_to_none=True)
            losses[name] = accumulate_gradients(model, Minibatch(batch, adv), LossParts.from_algo(algo),
                                                ForwardSpec.of(algo, n))
            grads[name] = grads_of(model)
            packed_calls[name] = len(seen_packed) - before
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
    ref_lp, ref_g = lp["padded"] * rm, grads["padded"]
    out = []
    for name in list(paths)[1:]:
        gap = float(((lp[name] * rm) - ref_lp).abs().max())
        rel = max(float((grads[name][k] - ref_g[k]).abs().max()) / max(float(ref_g[k].abs().max()), 1e-30)
                  for k in ref_g)
        loss_gap = abs(losses[name] - losses["padded"]) / max(abs(losses["padded"]), 1e-30)
        pack = paths[name][0]
        ran = packed_calls[name] > 0 if pack else True
        note = "" if ran else "; the packed forward never ran (packing fell back: see the warnings)"
        out.append(_check(f"{label}: {name} vs padded, fp32: logprobs and gradients", ran and gap <= 1e-3 and
                          rel <= 1e-3 and loss_gap <= 1e-4,
                          f"max |logprob gap| {gap:.1e}, gradient max rel gap {rel:.1e} over {len(ref_g)} tensors, "
                          f"loss rel gap {loss_gap:.1e}, {packed_calls[name]} packed forwards{note}",
                          "1e-3, 1e-3, 1e-4"))
    return out


def _all_grads(m) -> dict:
    return {k: p.grad.detach().clone() for k, p in m.named_parameters() if p.grad is not None}


def check_packed(a, built: dict, prompts: list[str]) -> list[dict]:
    """Packed == padded in fp32 (logprobs, loss, every gradient) for the full model."""
    from rlvr.models import load_policy

    model, tok = load_policy(built["model_dir"], dtype="float32", device=a.device)
    model.train()
    batch = _check_batch(a, model, tok, prompts)
    out = _compare_paths(a, model, batch, "full model", _all_grads)
    del model
    return out


def check_packed_lora(a, built: dict, prompts: list[str]) -> list[dict]:
    """Packed == padded in fp32 through a LoRA (peft) policy: logprobs, loss, the adapters' gradients."""
    import torch

    from rlvr.models import load_policy
    from rlvr.models.lora import wrap_lora

    model, tok = load_policy(built["model_dir"], dtype="float32", device=a.device)
    batch = _check_batch(a, model, tok, prompts)
    model = wrap_lora(model, rank=16, alpha=32)
    g = torch.Generator().manual_seed(a.seed + 3)
    with torch.no_grad():  # B != 0: the adapters change the outputs and both A and B get gradients
        for k, p in model.named_parameters():
            if ".lora_B." in k:
                p.copy_((torch.randn(p.shape, generator=g) * 0.02).to(p.device))
    model.train()
    out = _compare_paths(a, model, batch, "LoRA (peft)", _all_grads)
    del model
    return out


def check_optimizer(a, built: dict, prompts: list[str]) -> list[dict]:
    """MasterWeightAdamW's foreach step vs its per-parameter loop on the model's own bf16 parameters (float32
    masters), 3 steps of random gradients: the masters, moments and parameters within 1 ulp; both steps timed."""
    import torch

    from rlvr.models import load_policy
    from rlvr.train.precision import MasterWeightAdamW

    model, _ = load_policy(built["model_dir"], dtype="bfloat16", device=a.device)
    init = [p.detach().clone() for p in model.parameters()]
    del model
    runs, times = {}, {}
    for foreach in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in init]
        opt = MasterWeightAdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01, foreach=foreach)
        g = torch.Generator(device=a.device).manual_seed(a.seed + 4)
        ts = []
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g, device=a.device, dtype=torch.float32).to(p.dtype)
            _sync(a.device)
            t0 = time.perf_counter()
            opt.step()
            _sync(a.device)
            ts.append(time.perf_counter() - t0)
        times[foreach] = min(ts[1:])
        runs[foreach] = (params, opt)
    (pf, of), (pl, ol) = runs[True], runs[False]
    worst = 0
    for p, q in zip(pf, pl, strict=True):
        sp, sq = of.state[p], ol.state[q]
        for key in ("master", "exp_avg", "exp_avg_sq"):
            if key in sp:
                worst = max(worst, ulps(sp[key], sq[key]))
        worst = max(worst, ulps(p.detach(), q.detach()))  # the parameters in their own dtype's ulps
    n = sum(t.numel() for t in init)
    return [_check("optimizer: MasterWeightAdamW foreach step vs the per-parameter loop (3 steps, bf16 params, fp32 "
                   "masters)", worst <= 1,
                   f"max {worst} ulp over {len(init)} tensors ({n / 1e6:.0f}M elements); step {1e3 * times[True]:.1f} "
                   f"ms foreach vs {1e3 * times[False]:.1f} ms loop", "1 ulp")]


def check_varlen(a, built: dict, prompts: list[str]) -> list[dict]:
    """algo.packing=varlen's attention (FlashAttention's variable-length kernel, each response's key sequence its
    prompt's keys copied then its own) vs flex_attention's (the packed default) at the step's layout: one
    micro-batch of micro_batch_tokens packed tokens in groups of group_size rows, each a prompt of the data's mean
    length and max_tokens-token responses, the model's heads, the compute dtype (bf16 on CUDA). Outputs and q/k/v
    gradients compared, forward+backward timed (median of 5 after a warm-up), one layer."""
    import warnings

    import torch

    from rlvr.models import packed

    cfg = json.loads((Path(built["model_dir"]) / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    P = max(2, round(built.get("prompt_tokens_mean", 16)))
    groups = max(1, a.micro_batch_tokens // (P + a.group_size * a.max_tokens))
    prompts_of = [P + g for g in range(groups) for _ in range(a.group_size)]  # a prompt length per group: its key
    lens = [p + a.max_tokens for p in prompts_of]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ready = packed.varlen_ready(a.device, dtype, d, heads, kv_heads)
        packed.flex_ready(a.device, dtype, d, heads, kv_heads)
    said = [str(w.message).splitlines()[0] for w in caught if "varlen" in str(w.message) or "flex" in str(w.message)]
    plans = {k: packed._probe_plan(lens, a.device, share=True, varlen=k == "varlen", prompts=prompts_of)
             for k in ("flex", "varlen")}
    N = plans["flex"].tokens
    g = torch.Generator().manual_seed(a.seed + 5)
    qkv = [torch.randn((1, n, N, d), generator=g).to(device=a.device, dtype=dtype) for n in (heads, kv_heads, kv_heads)]
    w = torch.randn((N, heads, d), generator=g).to(device=a.device, dtype=dtype)
    results, times = {}, {}
    if not ready:
        return [_check("packing: varlen attention vs flex at the step's layout", False,
                       f"the varlen kernel was refused: {'; '.join(said) or 'no reason given'}", "5e-2 (bf16)")]
    for name, plan in plans.items():
        def run(plan=plan):
            x = [t.detach().requires_grad_() for t in qkv]
            out, _ = packed.packed_attention(None, *x, None, d ** -0.5, rlvr_pack=plan)
            out = out[0]  # (N, h, d)
            grads = torch.autograd.grad((out.float() * w.float()).sum(), x)
            return [out.detach().float(), *(t.float() for t in grads)]

        results[name] = run()
        ts = []
        for _ in range(5):
            _sync(a.device)
            t0 = time.perf_counter()
            run()
            _sync(a.device)
            ts.append(time.perf_counter() - t0)
        times[name] = statistics.median(ts)
    gap = max(float((x - y).abs().max()) / max(float(y.abs().max()), 1e-30)
              for x, y in zip(results["varlen"], results["flex"], strict=True))
    keys = int(plans["varlen"].varlen.cu_k[-1])
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    return [_check("packing: varlen attention (algo.packing=varlen) vs flex at the step's layout, forward+backward",
                   gap <= tol,
                   f"{groups} groups x {a.group_size} rows, {N} packed tokens, {keys} keys after the prompts' copies; "
                   f"max rel gap {gap:.1e} (output and q/k/v gradients, {str(dtype).split('.')[-1]}); one layer "
                   f"forward+backward {1e3 * times['flex']:.2f} ms flex vs {1e3 * times['varlen']:.2f} ms varlen "
                   f"({times['flex'] / max(times['varlen'], 1e-12):.2f}x)", f"{tol:g} relative")]


def check_sampler(a, built: dict, prompts: list[str]) -> list[dict]:
    """The sampler's static-cache + CUDA-graph decode vs its plain loop, fp32, twice: greedy with a stop string taken
    from the plain loop's own output (so some rows stop on it), and sampled at temperature 1 with min_tokens (the
    step samples inside its graph, the rows' uniforms and the EOS ban in the graph's buffers): same tokens, logprobs,
    finish reasons and texts."""
    import warnings

    from rlvr.models import load_policy
    from rlvr.rollout.hf_generator import HFGenerator
    from rlvr.rollout.types import SamplingSpec

    model, tok = load_policy(built["model_dir"], dtype="float32", device=a.device)
    model.eval()
    few = prompts[:16]
    on_cpu = a.device == "cpu"  # the dry run: the static path without capture
    plain = HFGenerator(model, tok, batch_size=len(few) * 4, cuda_graphs=False)
    free = plain.generate(few, SamplingSpec(n=4, temperature=0.0, max_tokens=32))
    text = next((r.text for r in free if len(r.text.strip()) >= 8), "")
    stop = text[len(text) // 3: len(text) // 3 + 3] if text else ""
    specs = {
        f"greedy, stop string {stop!r}": SamplingSpec(n=4, temperature=0.0, max_tokens=32,
                                                      stop=(stop,) if stop.strip() else ()),
        "sampled inside the graph (t=1, min_tokens=4)": SamplingSpec(n=4, temperature=1.0, max_tokens=32, seed=7,
                                                                     min_tokens=4),
    }
    fast = None
    out = []
    for label, spec in specs.items():
        res: dict[str, Any] = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if fast is None:
                fast = HFGenerator(model, tok, batch_size=len(few) * 4, cuda_graphs="auto" if on_cpu else True,
                                   static_cache=True if on_cpu else None)
            chosen = bool(getattr(fast, "_static", False))
            runs = {}
            for name, gen in (("plain", plain), ("graphs", fast)):
                gen.generate(few, spec)  # warm-up: kernels, and the graph captured for this shape
                _sync(a.device)
                t0 = time.perf_counter()
                runs[name] = gen.generate(few, spec)
                _sync(a.device)
                res[f"{name}_s"] = time.perf_counter() - t0
        msgs = [str(w.message).splitlines()[0] for w in caught if "cuda_graphs" in str(w.message)]
        dec = getattr(fast, "_decoder", None)
        captured = bool(dec is not None and getattr(dec, "graph", None) is not None)
        in_graph = bool(dec is not None and any(k[2] is not None for k in getattr(dec, "graphs", {})))
        same, gaps, stops = 0, [], 0
        for p, g in zip(runs["plain"], runs["graphs"], strict=True):
            k = next((i for i, (x, y) in enumerate(zip(p.response_ids, g.response_ids, strict=False)) if x != y),
                     min(len(p.response_ids), len(g.response_ids)))
            gaps += [abs(x - y) for x, y in zip(p.logprobs[:k], g.logprobs[:k], strict=True)]
            if p.response_ids == g.response_ids and p.finish_reason == g.finish_reason and p.text == g.text:
                same += 1
            stops += bool(spec.stop) and p.stop_reason == stop
        rows = len(runs["plain"])
        gap = max(gaps) if gaps else 0.0
        short = min(len(r.response_ids) for r in runs["graphs"])
        ok = (same >= 0.9 * rows and gap <= 1e-3 and (stops > 0 or not spec.stop) and (on_cpu or captured)
              and chosen and not msgs and short >= spec.min_tokens and (on_cpu or in_graph))
        out.append(_check(f"sampler: CUDA-graph decode vs the plain loop, fp32, {label}", ok,
                          f"{same}/{rows} rows identical (tokens, finish reason, text), {stops} stopped on the string, "
                          f"shortest {short} tokens, max |logprob gap| {gap:.1e} before the first differing token; "
                          f"static path {chosen}, graph captured {captured}, sampling in the graph {in_graph}; plain "
                          f"{res['plain_s']:.2f} s, graphs {res['graphs_s']:.2f} s"
                          + (f"; warnings: {'; '.join(msgs)}" if msgs else ""),
                          ">= 90% rows identical, 1e-3, graph captured with its sampling on CUDA"))
    del model
    return out


def agreement_checks(a, results: dict[str, dict]) -> list[dict]:
    """Each fsdp2 variant against the variant with the same keys on the one-process learner (step-1 gradient norm),
    and every variant's sampler-vs-learner logprob gap (a failed weight push shows there)."""
    tol = FSDP_TOL["cpu" if a.device == "cpu" else "cuda"]
    gap_tol = LOGPROB_GAP_TOL["cpu" if a.device == "cpu" else "cuda"]
    out = []
    by_keys = {frozenset(extra): name for name, extra in a.variants if not sharded(extra)}
    for name, extra in a.variants:
        r = results.get(name)
        if not sharded(extra) or r is None:
            continue
        twin = by_keys.get(frozenset(x for x in extra if x.replace(" ", "") != FSDP2))
        t = results.get(twin) if twin else None
        if not t:
            continue
        g1, g0 = r.get("grad_norm_step1"), t.get("grad_norm_step1")
        if g1 is None or g0 is None:
            out.append(_check(f"{name} vs {twin}: step-1 gradient norm", False, "a run has no step 1", f"{tol:g}"))
            continue
        gap = abs(g1 - g0) / max(abs(g0), 1e-30)
        out.append(_check(f"{name} (torchrun, group of one) vs {twin} (one process): step-1 gradient norm", gap <= tol,
                          f"{g1:.6g} vs {g0:.6g}, rel gap {gap:.1e}", f"{tol:g}"))
    for name, _ in a.variants:
        r = results.get(name)
        if r and r.get("logprob_diff_max") is not None:
            v = r["logprob_diff_max"]
            out.append(_check(f"{name}: sampler vs learner logprobs of its rollouts, every step (weight pushes)",
                              v <= gap_tol, f"max {v:.2e}, median of the steps' means "
                              f"{_f(r.get('logprob_diff_mean'), '.1e')}", f"{gap_tol:g}"))
    return out


# ------------------------------------------------------------------------------------------ report


def _f(x, spec: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def targets(a, results: dict[str, dict], checks: list[dict]) -> list[tuple[str, str, str]]:
    """(target, measured, met) rows: issue 38's acceptance, on the first variant (and its warm rerun) and the
    agreement checks."""
    first = a.variants[0][0]
    r = results.get(first) or {}
    w = results.get(f"{first} (2nd process)") or {}
    peak = getattr(a, "peak_tflops_used", None)
    m = mfu(r.get("learner_flops"), r.get("learner_s"), peak)

    def met(ok):
        return "n/a" if ok is None else "yes" if ok else "NO"

    rows = [(f"step <= {TARGETS['step_s']:g} s ({first})", f"{_f(r.get('step_s'))} s".replace("n/a s", "n/a"),
             met(None if r.get("step_s") is None else r["step_s"] <= TARGETS["step_s"])),
            (f"sampler >= {TARGETS['sampler_tok_s'] / 1e3:.0f}k tok/s",
             f"{_f(r.get('sampler_tok_s'), ',.0f')} tok/s".replace("n/a tok/s", "n/a"),
             met(None if r.get("sampler_tok_s") is None else r["sampler_tok_s"] >= TARGETS["sampler_tok_s"])),
            (f"learner MFU >= {TARGETS['mfu']:.0%} on the FLOPs done", _pct(m),
             met(None if m is None else m >= TARGETS["mfu"]))]
    trl = next((v for k, v in results.items() if k.startswith("TRL")), {})
    speedup = trl["step_s"] / r["step_s"] if trl.get("step_s") and r.get("step_s") else None
    rows.append((f"step >= {TARGETS['trl_speedup']:g}x faster than TRL's on this card", f"{_f(speedup)}x (TRL "
                 f"{_f(trl.get('step_s'))} s)", met(None if speedup is None else speedup >= TARGETS["trl_speedup"])))
    steady = r.get("step_s")
    ratio = w["first_step_s"] / steady if w.get("first_step_s") and steady else None
    rows.append((f"first step of a warm second process <= {TARGETS['warm_ratio']:g}x a steady step",
                 f"{_f(ratio)}x (warm first step {_f(w.get('first_step_s'))} s vs steady {_f(steady)} s; cold first "
                 f"step {_f(r.get('first_step_s'))} s)", met(None if ratio is None else ratio <= TARGETS["warm_ratio"])))
    agree = [c for c in checks if " vs " in c["check"] and "step-1" in c["check"]]
    lora_packed = [c for c in checks if c["check"].startswith("LoRA")]
    rows.append(("fsdp2 rows agree with the one-process learner (step 1)",
                 "; ".join(c["measured"] for c in agree) or "not run", met(all(c["ok"] for c in agree) if agree
                                                                           else None)))
    rows.append(("LoRA packed == LoRA padded (fp32)", f"{sum(c['ok'] for c in lora_packed)}/{len(lora_packed)} pass"
                 if lora_packed else "not run", met(all(c["ok"] for c in lora_packed) if lora_packed else None)))
    return rows


def table(a, built: dict, results: dict[str, dict], errors: dict[str, str], skipped: dict[str, str], env: dict,
          checks: list[dict]) -> str:
    peak = env.get("peak_tflops")
    n = built.get("n_params", 0)
    lines = [f"# benchmarks/gpu.py: rlvr's variants, TRL and bare PyTorch on {env.get('device_name', a.device)}", "",
             f"- command: `{env['command']}`",
             "- " + ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("command", "device_name")),
             f"- model: random-init Qwen2, shape `{a.shape}`, {n:,} parameters, {a.dtype} (fp32 master weights "
             f"for rlvr; TRL: bf16 autocast over fp32 weights); {a.n_prompts} prompts x {a.group_size} samples, up "
             f"to {a.max_tokens} new tokens, mean prompt {built.get('prompt_tokens_mean', 0):.0f} tokens; GRPO, "
             f"micro_batch_tokens {a.micro_batch_tokens}, hf backend; medians of steps 2..{a.steps} of the first "
             f"variant, step 2..{a.variant_steps} of the others (TRL: 2..{a.trl_steps})",
             f"- learner TFLOP: the FLOPs the learner did (rlvr.runtime.FlopCounter: the tokens each forward got per "
             f"the pack plan, the LM head where it ran, attention's query-key pairs; backward = 2x forward less frozen "
             f"weights' gradients); MFU = those / learner s / {_f(peak, 'g')} TFLOP/s; 6N MFU = 6 x N x trained "
             "tokens / learner s / peak (the old estimate)", "",
             "| run | step s | sampler s | sampler tok/s | learner s | learner TFLOP | MFU (FLOPs done) | 6N MFU "
             "| peak CUDA GiB | first step s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        fl = r.get("learner_flops")
        lines.append(f"| {name}{' (partial)' if r.get('partial') else ''} | {_f(r.get('step_s'))} "
                     f"| {_f(r.get('sampler_s'))} | {_f(r.get('sampler_tok_s'), ',.0f')} | {_f(r.get('learner_s'))} "
                     f"| {_f(fl / 1e12 if fl else None, '.3g')} | {_pct(mfu(fl, r.get('learner_s'), peak))} "
                     f"| {_pct(mfu_6n(n, r.get('learner_tokens'), r.get('learner_s'), peak))} "
                     f"| {_f(r.get('peak_gib'), '.1f')} | {_f(r.get('first_step_s'))} |")
    for name, e in errors.items():
        if name not in results:
            lines.append(f"| {name} | FAILED: {e[:150].replace('|', '/')} | | | | | | | | |")
    for name, why in skipped.items():
        lines.append(f"| {name} | SKIPPED: {why.replace('|', '/')} | | | | | | | | |")
    for name, e in errors.items():
        if name in results:
            lines.append(f"- {name}: {e[:300]}")
    for name, r in results.items():
        if r.get("warnings"):
            lines.append(f"- {name} warned: {'; '.join(r['warnings'])}")
    lines += ["", "## Targets (issue 38)", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {ok} |" for t, m, ok in targets(a, results, checks)]
    lines += ["", f"## Correctness on {a.device}", ""]
    if checks:
        lines += ["| check | ok | measured | tolerance |", "|---|---|---|---|"]
        lines += [f"| {c['check']} | {'pass' if c['ok'] else 'FAIL'} | {c['measured'].replace('|', '/')} "
                  f"| {c['tolerance']} |" for c in checks]
    else:
        lines.append("none ran")
    lines += [""] + comparisons(results)
    lines += ["", "rlvr rows: sampler = time/generate; learner = the rest of the step (old logprobs, loss forwards "
              "and backwards, optimizer, weight sync, scoring). generate: transformers' model.generate alone. "
              "ceiling: forward+backward (cross-entropy, no optimizer) over rows of the same count and lengths "
              "in the same token budget. (2nd process): the first variant rerun in a new process over the compile "
              "cache the first one filled."]
    return "\n".join(lines) + "\n"


def comparisons(results: dict[str, dict]) -> list[str]:
    """Issue 27's ratios for each rlvr variant: step vs TRL's, learner vs the ceiling, sampler vs TRL's generation
    (each only when both sides ran)."""
    trl = next((r for k, r in results.items() if k.startswith("TRL")), None)
    ceiling = results.get("forward+backward ceiling")
    out = []
    for name, r in results.items():
        if not isinstance(r.get("overrides"), list):  # rlvr variants only
            continue
        parts = []
        if trl and r.get("step_s") and trl.get("step_s"):
            parts.append(f"step {r['step_s'] / trl['step_s']:.2f}x TRL's")
        if ceiling and r.get("learner_tok_s") and ceiling.get("learner_tok_s"):
            parts.append(f"learner at {r['learner_tok_s'] / ceiling['learner_tok_s']:.0%} of the forward+backward "
                         "ceiling's tokens/s")
        if trl and r.get("sampler_tok_s") and trl.get("sampler_tok_s"):
            parts.append(f"sampler {r['sampler_tok_s'] / trl['sampler_tok_s']:.2f}x TRL's generation tokens/s")
        if parts:
            out.append(f"- {name}: " + "; ".join(parts))
    return out


def environment(a, argv: list[str]) -> dict:
    import torch
    import transformers

    from rlvr.runtime import peak_tflops

    env = {"command": "python benchmarks/gpu.py " + " ".join(argv), "date": time.strftime("%Y-%m-%d %H:%M"),
           "torch": torch.__version__, "transformers": transformers.__version__}
    if a.device != "cpu" and torch.cuda.is_available():
        env["device_name"] = torch.cuda.get_device_name(0)
    env["peak_tflops"] = a.peak_tflops if a.peak_tflops is not None else peak_tflops(a.device) or None
    import importlib.metadata as md_

    for mod in ("trl", "peft"):
        with contextlib.suppress(md_.PackageNotFoundError):
            env[mod] = md_.version(mod)
    env["budget_s"] = a.budget_s
    return env


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1])
    a = parse_args(argv)
    _offline_env()
    import torch

    from rlvr.runtime import set_num_threads
    from rlvr.train.policy import quiet_transformers

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu.py: no CUDA device visible; use --dry-run to check the pipeline on CPU", file=sys.stderr)
        return 2
    set_num_threads(None)
    quiet_transformers()
    keep = bool(a.work)
    a.work = a.work or tempfile.mkdtemp(prefix="rlvr-gpu-bench-")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    a.compile_cache = str(Path(a.compile_cache) if a.compile_cache else work / "compile_cache")
    os.environ.update(compile_cache_env(Path(a.compile_cache)))  # this process's own compiles too
    env = environment(a, argv)
    a.peak_tflops_used = env["peak_tflops"]
    budget_s = a.budget_s if a.budget_s and a.budget_s > 0 else math.inf
    times = STAGE_TIME[a.profile_name]
    first, *rest = a.variants
    log(f"device {env.get('device_name', a.device)}, peak {env['peak_tflops']} TFLOP/s, work {work}, budget "
        f"{budget_s:.0f} s; variants {[n for n, _ in a.variants]}; skipping {sorted(a.skip) or 'nothing'}")
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    skipped: dict[str, str] = {}
    checks: list[dict] = []
    timings: dict[str, float] = {}
    out_dirs = [Path(a.out_dir)] if a.out_dir else []
    targets_dirs = ([RESULTS] if a.device != "cpu" else [work]) + out_dirs
    profile_path = work / "gpu_profile.txt"
    built_box: list[dict] = []

    def write_report() -> str:
        built = built_box[0] if built_box else {"n_params": 0}
        env["stage_s"] = {k: round(v, 1) for k, v in timings.items()}
        env["total_s"] = round(time.perf_counter() - _T0, 1)
        md = table(a, built, results, errors, skipped, env, checks)
        cfg = {k: v for k, v in vars(a).items() if k not in ("skip", "variants")}
        raw = {"config": cfg | {"skip": sorted(a.skip), "variants": a.variants}, "built": built, "env": env,
               "results": results, "errors": errors, "skipped": skipped, "checks": checks,
               "targets": targets(a, results, checks),
               "mfu": {k: mfu(r.get("learner_flops"), r.get("learner_s"), env.get("peak_tflops"))
                       for k, r in results.items()},
               "mfu_6n": {k: mfu_6n(built["n_params"], r.get("learner_tokens"), r.get("learner_s"),
                                    env.get("peak_tflops")) for k, r in results.items()}}
        for d in targets_dirs:
            d.mkdir(parents=True, exist_ok=True)
            (d / "gpu_bench.md").write_text(md)
            (d / "gpu_bench.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
            if profile_path.exists() and d != work:
                shutil.copy(profile_path, d / "gpu_profile.txt")
        return md

    def run(name: str, kind: str, fn, key: str | None = None):
        """One stage under the budget: skipped (with a line and a row) when less than its minimum is left, else
        run under min(its cap, what is left)."""
        left = budget_s - (time.perf_counter() - _T0)
        need, cap = times[kind]
        if left < need:
            skipped[name] = f"budget: {max(left, 0):.0f} s of --budget-s {budget_s:.0f} left, < the {need:.0f} s it needs"
            log(f"SKIPPED {name}: {skipped[name]}")
            write_report()
            return None
        limit = min(cap, left)
        log(f"{name} ... (limit {limit:.0f} s)")
        _reset_memory(a.device)
        t0 = time.perf_counter()
        try:
            # a child is killed at `limit` by run_child itself (this deadline is the backstop)
            with deadline(limit + (15 if kind in ("first", "variant", "warm") else 0)):
                r = fn(limit)
        except Exception as e:  # noqa: BLE001 - one stage's failure must not stop the others
            errors[name] = f"{type(e).__name__}: {e}".splitlines()[0]
            if not isinstance(e, StageTimeout):
                traceback.print_exc()
            log(f"{name} FAILED: {errors[name]}")
            r = None
        else:
            if isinstance(r, dict) and r.get("peak_gib") is None and kind not in ("first", "variant", "warm"):
                r["peak_gib"] = _peak_gib(a.device)
            if isinstance(r, dict) and r.get("error"):
                errors[name] = r["error"]
                log(f"{name} FAILED: {r['error']}")
            if key is not None and r and (r.get("steps") or not r.get("error")):
                results[key] = r
            log(f"{name} done in {time.perf_counter() - t0:.1f} s")
            if isinstance(r, dict) and r.get("stopped"):  # the whole run is being stopped: after recording it
                timings[name] = time.perf_counter() - t0
                raise KeyboardInterrupt(r["stopped"])
        timings[name] = time.perf_counter() - t0
        _reset_memory(a.device)
        write_report()
        return r

    def interrupted(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    # every variant's configuration validated first, with the paths the build writes: a typo fails in seconds
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    planned = {"model_dir": str(work / "model"), "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}
    for k in ("train", "test"):
        Path(planned[k]).touch()
    try:
        check_variants(a, planned)
    except ValueError as e:
        print(f"gpu.py: {e}", file=sys.stderr)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        return 2
    gc_mod = _gpu_check()
    status = 0
    try:
        t0 = time.perf_counter()
        log("build ...")
        built = gc_mod.build(work, a.shape, a.dtype, a.num_train, 8, a.seed)
        timings["build"] = time.perf_counter() - t0
        built_box.append(built)
        log(f"  {built['n_params']:,} parameters, mean prompt {built['prompt_tokens_mean']:.0f} tokens; build "
            f"{timings['build']:.1f} s")
        prompts = step_prompts(a, built)
        want_variants = "variants" not in a.skip
        fname, fextra = first
        if want_variants and fname not in a.skip:
            prof = profile_path if a.profile and "profile" not in a.skip else None
            run(fname, "first", lambda lim: run_child(a, built, fname, fextra, a.steps, lim, prof), key=fname)
            if "warm" not in a.skip:
                run("warm", "warm", lambda lim: run_child(a, built, f"{fname}_warm", fextra, a.variant_steps, lim),
                    key=f"{fname} (2nd process)")
        if "checks" not in a.skip:
            r = run("checks", "checks", lambda lim: stage_checks(a, built, prompts))
            checks.extend((r or {}).get("checks", []))
        if want_variants:
            for name, extra in rest:
                if name not in a.skip:
                    run(name, "variant", lambda lim, name=name, extra=extra:
                        run_child(a, built, name, extra, a.variant_steps, lim), key=name)
        checks.extend(agreement_checks(a, results))
        write_report()
        if "ceiling" not in a.skip:
            run("ceiling", "ceiling", lambda lim: stage_ceiling(a, built, prompts), key="forward+backward ceiling")
        if "trl" not in a.skip:
            if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
                log("trl skipped: TRL (or datasets) is not importable here; bash scripts/gpu_wheels.sh makes the wheels")
                env["trl"] = "not installed (stage skipped)"
            else:
                import importlib.metadata as md_

                run("trl", "trl", lambda lim: stage_trl(a, built, trl_prompts(a, built)),
                    key=f"TRL {md_.version('trl')} GRPOTrainer")
        if "generate" not in a.skip:
            run("generate", "generate", lambda lim: stage_generate(a, built, prompts), key="transformers generate")
    except KeyboardInterrupt as e:  # the outer timeout (SIGTERM) or ^C: report what there is
        errors["run"] = f"interrupted ({e or 'SIGINT'}) after {time.perf_counter() - _T0:.0f} s"
        log(errors["run"])
        status = 1
    except Exception as e:  # noqa: BLE001 - the build, or the glue between stages: still report
        traceback.print_exc()
        errors["run"] = f"{type(e).__name__}: {e}".splitlines()[0]
        status = 1
    finally:
        for proc in list(_CHILDREN):
            _kill(proc)
        md = write_report()
    print(md, flush=True)
    failed = [c["check"] for c in checks if not c["ok"]]
    log(f"{'all stages ran' if not errors else 'FAILED stages: ' + ', '.join(errors)}"
        f"{'; skipped: ' + ', '.join(skipped) if skipped else ''}"
        f"{'; failed checks: ' + '; '.join(failed) if failed else ''}; wrote "
        f"{', '.join(str(d / 'gpu_bench.md') for d in targets_dirs)}; {env['total_s']:.0f} s in all")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    # 0 only when every stage ran (none failed, none skipped for the budget) and every check passed
    return 1 if errors or failed or status or any(v.startswith("budget") for v in skipped.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
