"""rlvr's GRPO step on a GPU, side by side with TRL, transformers' generate and a bare forward+backward, in one run.

    python benchmarks/gpu.py                    # one H200: Qwen2.5-0.5B shape, 64 prompts x 8, 256 new tokens (~4 min)
    python benchmarks/gpu.py --quick            # the same stages on a smaller batch (16 prompts x 8, 128 tokens)
    python benchmarks/gpu.py --dry-run          # CPU: tiny shape, every stage, well under a minute
    python benchmarks/gpu.py --variant packed:algo.packing=true --profile --out-dir "$OUT"

No network is needed: the model (random init, the Qwen2.5-0.5B shape), its tokenizer and a GSM8K-like JSONL
are built here by scripts/gpu_check.py's builder. The work (issue 27's): 64 prompts x 8 samples = 512 rollouts
of up to 256 new tokens, r1_zero prompts (~117 tokens), bf16 with fp32 master weights, GRPO,
algo.micro_batch_tokens=16384, the hf backend, reward `language` (non-zero advantages on a random model).

Stages, one process, each timed and its peak CUDA memory (torch.cuda.max_memory_allocated) kept; a stage that
fails prints its error and the rest still run (exit status 1 at the end):
  build     model folder, tokenizer, data (gpu_check.build);
  generate  transformers' `model.generate` on the step's prompts (n samples each, sampling at T = 1);
  graphs    the hf sampler's CUDA-graph decode (rollout.cuda_graphs, rlvr.rollout.static_decode) against its plain
            loop, greedy on 16 of the step's prompts x 4 (64 rows, 32 tokens): whether the graph was captured
            and replayed (or the path fell back, with its warning), the share of rows whose first 8 tokens agree,
            the max |logprob gap| over each row's tokens before the two first differ (bf16: ~1e-2 expected;
            greedy ties may part ways later) and both paths' time after a warm-up call (on CPU: the static path without capture);
  ceiling   a bare forward+backward (cross-entropy on every token, no optimizer step) over the same number of
            rows and lengths, in micro-batches of the same token budget: the learner's upper bound;
  rlvr      `rlvr train` in this process (rlvr.train.pg.train), one run per --variant (default: `rlvr` =
            the defaults, `rlvr_plain` = algo.shared_prefix=false), --steps steps, the first a warm-up:
            step = time/step, sampler = time/generate, learner = everything else (old logprobs, the loss's
            forwards and backwards, the optimizer, the weight sync, scoring); no held-out eval, and the final
            checkpoint and plots are skipped (not what is measured; ~6 GB of optimizer state at this shape);
  profile   (--profile) torch.profiler over one more learner step (rlvr.train.pg.learn) of the first
            variant: the top ops by device time and by CPU time and the count of host syncs
            (cudaStreamSynchronize, cudaDeviceSynchronize, aten::item / _local_scalar_dense, D2H copies) ->
            OUT/gpu_profile.txt;
  trl       TRL's GRPOTrainer on the same prompts, samples and lengths (use_vllm=False, bf16 autocast over fp32
            weights, 64 rows x 8 accumulation = one optimizer step per 512 rollouts, gradient checkpointing
            off), --trl-steps steps, the first a warm-up; skipped with a note when TRL is not importable
            (bash scripts/gpu_wheels.sh makes the wheels it needs).

tokens/s: generated tokens / sampler seconds; learner tokens/s: trained tokens (prompt + response of every row,
as rlvr's tokens/trained) / learner seconds. MFU = 6 N tokens / seconds / peak, N the parameter count (a tied
embedding once), against --peak-tflops (default: the device's bf16 dense peak from rlvr.runtime's table, H200
989). rlvr's shared-prefix forward does fewer FLOPs than 6 N per token: its MFU is an effective one.

Writes benchmarks/results/gpu_bench.{md,json} on a GPU (the work folder on CPU) and into --out-dir when given.
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
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
_T0 = time.perf_counter()

# the shapes: full = issue 27's work; quick = the same stages, smaller; cpu = the dry run's plumbing check
PROFILES: dict[str, dict[str, Any]] = {
    "full": dict(shape="qwen2.5-0.5b", dtype="bfloat16", n_prompts=64, group_size=8, max_tokens=256, steps=3,
                 trl_steps=3, trl_micro=64, ceiling_reps=3, micro_batch_tokens=16384, num_train=1024),
    "quick": dict(shape="qwen2.5-0.5b", dtype="bfloat16", n_prompts=16, group_size=8, max_tokens=128, steps=3,
                  trl_steps=3, trl_micro=64, ceiling_reps=3, micro_batch_tokens=16384, num_train=256),
    "cpu": dict(shape="tiny", dtype="float32", n_prompts=4, group_size=4, max_tokens=12, steps=2, trl_steps=2,
                trl_micro=8, ceiling_reps=2, micro_batch_tokens=256, num_train=64),
}
DEFAULT_VARIANTS = ("rlvr:", "rlvr_plain:algo.shared_prefix=false")
STAGES = ("generate", "graphs", "ceiling", "rlvr", "profile", "trl")


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shape, every stage (the pipeline check)")
    ap.add_argument("--quick", action="store_true", help="GPU, smaller batch: " + json.dumps(PROFILES["quick"]))
    ap.add_argument("--device", choices=["cuda", "cpu"], help="default cuda (cpu with --dry-run)")
    ap.add_argument("--shape", choices=["qwen2.5-0.5b", "tiny"])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"])
    for key in ("n_prompts", "group_size", "max_tokens", "steps", "trl_steps", "trl_micro", "ceiling_reps",
                "micro_batch_tokens", "num_train"):
        ap.add_argument("--" + key.replace("_", "-"), type=int, dest=key)
    ap.add_argument("--variant", action="append", default=None, metavar="NAME:key=value,...",
                    help="an rlvr run under these config overrides (repeatable; default: "
                         + " and ".join(repr(v) for v in DEFAULT_VARIANTS) + ")")
    ap.add_argument("--skip", default="", help=f"comma-separated stages to leave out, of {', '.join(STAGES)}")
    ap.add_argument("--profile", action="store_true", help="torch.profiler over one learner step of the first variant")
    ap.add_argument("--peak-tflops", type=float, default=None,
                    help="dense bf16 peak for MFU (default: the device's, rlvr.runtime.peak_tflops; H200 989)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="working folder (default: a temp folder, removed at the end)")
    ap.add_argument("--out-dir", help="also write gpu_bench.{md,json} (and gpu_profile.txt) here, e.g. $OUT")
    a = ap.parse_args(argv)
    if a.dry_run:
        a.device = "cpu"
    a.device = a.device or "cuda"
    prof = PROFILES["cpu" if a.device == "cpu" else "quick" if a.quick else "full"]
    for k, v in prof.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    try:
        a.variants = [parse_variant(v) for v in (a.variant or DEFAULT_VARIANTS)]
    except ValueError as e:
        ap.error(str(e))
    names = [n for n, _ in a.variants]
    if len(set(names)) != len(names):
        ap.error(f"--variant: a name is used twice: {names}")
    a.skip = {x.strip() for x in a.skip.split(",") if x.strip()}
    if bad := sorted(a.skip - set(STAGES)):
        ap.error(f"--skip: unknown stage(s) {bad}; known: {', '.join(STAGES)}")
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


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(statistics.median(xs)) if xs else None


def mfu(n_params: int, tokens: float | None, seconds: float | None, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: 6 N tokens / seconds / peak (forward 2N + backward 4N per token)."""
    if not tokens or not seconds or not peak_tflops:
        return None
    return 6.0 * n_params * tokens / seconds / (peak_tflops * 1e12)


def step_prompts(a, built: dict) -> list[str]:
    """The prompts rlvr's trainer draws for its first step (its data stream: rlvr.train.common.take)."""
    from rlvr.config import load_config
    from rlvr.train.common import take
    from rlvr.train.config import TrainConfig
    from rlvr.train.tasks import load_task_data

    cfg = load_config(TrainConfig, None, rlvr_overrides(a, built, Path(a.work) / "unused", 1))
    task = load_task_data(cfg.data)
    return [task.prompt(ex) for ex in take(task.train, 0, a.n_prompts, cfg.data.seed)]


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
    from rlvr.train.pg import validate_train_config

    for name, extra in a.variants:
        try:
            validate_train_config(load_config(TrainConfig, None,
                                              rlvr_overrides(a, built, Path(a.work) / name, a.steps) + extra))
        except Exception as e:  # noqa: BLE001 - reported as one line naming the variant
            raise ValueError(f"--variant {name}: {type(e).__name__}: {str(e).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------ stages


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


def stage_graphs(a, built: dict, prompts: list[str]) -> dict:
    """The sampler's static-cache + CUDA-graph decode against its plain loop at temperature 0 (see the docstring)."""
    import warnings

    from rlvr.models import load_policy
    from rlvr.rollout.hf_generator import HFGenerator
    from rlvr.rollout.types import SamplingSpec

    model, tok = load_policy(built["model_dir"], dtype=a.dtype, device=a.device)
    model.eval()
    spec = SamplingSpec(n=4, temperature=0.0, max_tokens=32)
    few = prompts[:16]
    res: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        on_cpu = a.device == "cpu"  # the dry run: the static path without capture
        fast = HFGenerator(model, tok, batch_size=len(few) * spec.n, cuda_graphs="auto" if on_cpu else True,
                           static_cache=True if on_cpu else None)
        chosen = fast._static
        runs = {}
        for name, gen in (("plain", HFGenerator(model, tok, batch_size=len(few) * spec.n, cuda_graphs=False)),
                          ("graphs", fast)):
            gen.generate(few, spec)  # warm-up: kernels, and the graph captured for this shape
            _sync(a.device)
            t0 = time.perf_counter()
            runs[name] = gen.generate(few, spec)
            _sync(a.device)
            res[f"{name}_s"] = time.perf_counter() - t0
    msgs = [str(w.message) for w in caught if "cuda_graphs" in str(w.message)]
    dec = fast._decoder
    res.update(path_chosen=chosen, path_used=bool(fast._static), warnings=msgs,
               graph_captured=bool(dec is not None and dec.graph is not None), rows=len(runs["plain"]))
    agree8, gaps, common = 0, [], []
    for p, g in zip(runs["plain"], runs["graphs"], strict=True):
        n = next((k for k, (x, y) in enumerate(zip(p.response_ids, g.response_ids, strict=False)) if x != y),
                 min(len(p.response_ids), len(g.response_ids)))
        common.append(n)
        agree8 += n >= min(8, len(p.response_ids))
        gaps += [abs(x - y) for x, y in zip(p.logprobs[:n], g.logprobs[:n], strict=True)]
    res.update(first8_agree=agree8 / len(common), common_prefix_mean=statistics.fmean(common),
               logprob_gap_max=max(gaps) if gaps else None)
    log(f"  graphs: chosen {chosen}, used {res['path_used']}, graph captured {res['graph_captured']}; first 8 tokens "
        f"agree in {100 * res['first8_agree']:.0f}% of rows, max |logprob gap| {_f(res['logprob_gap_max'], '.2e')}; "
        f"plain {res['plain_s']:.2f} s, graphs {res['graphs_s']:.2f} s" + (f"; warnings: {msgs}" if msgs else ""))
    del model
    return res


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
    times = []
    for _ in range(a.ceiling_reps):
        t0 = time.perf_counter()
        one_pass(batches)
        _sync(a.device)
        times.append(time.perf_counter() - t0)
    tokens = sum(len(r) for r in rows)
    secs = _median(times)
    return {"learner_s": secs, "learner_tokens": tokens, "learner_tok_s": tokens / secs, "reps_s": times,
            "micro_batches": len(token_budget_batches([len(r) for r in rows], a.micro_batch_tokens))}


def stage_rlvr(a, built: dict, name: str, extra: list[str], profile_out: Path | None = None) -> dict:
    """`rlvr train` in this process under one variant; per-step times from its metrics (steps 2.. timed).
    profile_out: one more step whose learner (rlvr.train.pg.learn) runs under torch.profiler (not timed)."""
    from rlvr.config import load_config
    from rlvr.runs import checkpoint as ckpt_mod
    from rlvr.train import pg, session
    from rlvr.train.config import TrainConfig

    steps = a.steps + (1 if profile_out is not None else 0)
    cfg = load_config(TrainConfig, None, rlvr_overrides(a, built, Path(a.work) / f"run_{name}", steps) + extra)
    rows: list[dict] = []
    orig_learn = pg.learn

    def learn(*args, **kw):
        if profile_out is None or len(rows) < a.steps:
            return orig_learn(*args, **kw)
        return profiled(lambda: orig_learn(*args, **kw), a.device, profile_out, f"rlvr learner step, variant {name}")

    def on_step(step: int, m: dict) -> None:
        rows.append(dict(m, step=step))
        log(f"  {name} step {step}: {m.get('time/step', 0):.2f} s (generate {m.get('time/generate', 0):.2f}, "
            f"train {m.get('time/train', 0):.2f}), {m.get('tokens/generated', 0)} generated, "
            f"{m.get('tokens/trained', 0)} trained tokens, sampler-trainer logprob gap mean "
            f"{m.get('rollout/logprob_diff_mean', float('nan')):.2e} max {m.get('rollout/logprob_diff_max', float('nan')):.2e}")

    # what is measured is the step: the run's final checkpoint (weights + fp32 master + AdamW states, ~6 GB at
    # this shape) and its plots are left out of the benchmark's wall time
    orig_save, orig_finish = ckpt_mod.save_checkpoint, session.finish_run
    pg.learn, ckpt_mod.save_checkpoint, session.finish_run = learn, lambda *a_, **k_: None, lambda *a_, **k_: {}
    import warnings

    try:
        with warnings.catch_warnings(record=True) as caught:  # a CUDA-graph fallback must show in the table
            warnings.simplefilter("always")
            pg.train(cfg, on_step=on_step)
    finally:
        pg.learn, ckpt_mod.save_checkpoint, session.finish_run = orig_learn, orig_save, orig_finish
    graph_warnings = sorted({str(w.message) for w in caught if "cuda_graphs" in str(w.message)})
    for m in sorted({str(w.message).splitlines()[0][:200] for w in caught}):  # recorded, so shown here
        log(f"  {name} warned: {m}")
    timed = rows[1 : a.steps] or rows[:1]  # the warm-up step out; the profiled step out
    step_s = _median([r["time/step"] - r.get("time/eval", 0.0) for r in timed])
    gen_s = _median([r.get("time/generate") for r in timed])
    learner_s = _median([r["time/step"] - r.get("time/eval", 0.0) - r.get("time/generate", 0.0) for r in timed])
    gen_tok = _median([r.get("tokens/generated") for r in timed])
    trained = _median([r.get("tokens/trained") for r in timed])
    peaks = [r["mem/cuda_peak_gb"] for r in rows if r.get("mem/cuda_peak_gb") is not None]
    return {"step_s": step_s, "sampler_s": gen_s, "learner_s": learner_s, "train_s": _median([r.get("time/train") for r in timed]),
            "generated_tokens": gen_tok, "learner_tokens": trained,
            "sampler_tok_s": gen_tok / gen_s if gen_tok and gen_s else None,
            "learner_tok_s": trained / learner_s if trained and learner_s else None,
            "peak_gib": max(peaks) if peaks else None, "overrides": extra, "steps": rows,
            "perf_mfu_logged": _median([r.get("perf/mfu") for r in timed]), "cuda_graphs_warnings": graph_warnings,
            # the learner's logprobs against the sampler's on the same tokens: a check of the learner's forward
            "logprob_diff_mean": _median([r.get("rollout/logprob_diff_mean") for r in timed]),
            "logprob_diff_max": _median([r.get("rollout/logprob_diff_max") for r in timed])}


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
    """TRL's GRPOTrainer on the same prompts (rlvr's stream), samples, lengths and reward."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.rewards import get_reward_fn

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
    cur: dict[str, float] = {}
    gen_tokens: list[int] = []
    orig_generate = trainer._generate

    def timed_generate(*args_, **kw):
        _sync(a.device)
        t = time.perf_counter()
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
            starts.append(time.perf_counter())

        def on_step_end(self, args_, state, control, **kw):
            _sync(a.device)
            total = time.perf_counter() - starts[-1]
            steps.append({"step": state.global_step, "s": total, "generate": cur.get("generate", 0.0),
                          "generated_tokens": gen_tokens[-1] if gen_tokens else None})
            log(f"  trl step {state.global_step}: {total:.2f} s (generate {cur.get('generate', 0.0):.2f})")

    trainer.add_callback(Clock())
    trainer.train()
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
            "trl": trl.__version__, "per_device_train_batch_size": micro, "gradient_accumulation_steps": n // micro,
            "bf16": bf16}


# ------------------------------------------------------------------------------------------ report


def _f(x, spec: str = ".2f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def table(a, built: dict, results: dict[str, dict], errors: dict[str, str], env: dict) -> str:
    peak = env.get("peak_tflops")
    n = built.get("n_params", 0)
    lines = [f"# benchmarks/gpu.py: rlvr vs TRL vs bare PyTorch on {env.get('device_name', a.device)}", "",
             f"- command: `{env['command']}`",
             "- " + ", ".join(f"{k} {v}" for k, v in env.items() if k not in ("command", "device_name", "graphs_check")),
             f"- model: random-init Qwen2, shape `{a.shape}`, {n:,} parameters, {a.dtype} (fp32 master weights "
             f"for rlvr; TRL: bf16 autocast over fp32 weights); {a.n_prompts} prompts x {a.group_size} samples, up "
             f"to {a.max_tokens} new tokens, mean prompt {built.get('prompt_tokens_mean', 0):.0f} tokens; GRPO, "
             f"micro_batch_tokens {a.micro_batch_tokens}, hf backend; medians of steps 2..{a.steps} (TRL: 2.."
             f"{a.trl_steps})",
             f"- MFU = 6 x N x tokens / seconds / {_f(peak, 'g')} TFLOP/s (learner: trained prompt+response tokens "
             "of every row; rlvr's shared prefix does fewer FLOPs, so its MFU is an effective one)", "",
             "| run | step s | sampler s | sampler tok/s | learner s | learner tokens | learner tok/s | learner MFU "
             "| peak CUDA GiB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {_f(r.get('step_s'))} | {_f(r.get('sampler_s'))} | {_f(r.get('sampler_tok_s'), ',.0f')} "
                     f"| {_f(r.get('learner_s'))} | {_f(r.get('learner_tokens'), ',.0f')} "
                     f"| {_f(r.get('learner_tok_s'), ',.0f')} "
                     f"| {_pct(mfu(n, r.get('learner_tokens'), r.get('learner_s'), peak))} "
                     f"| {_f(r.get('peak_gib'), '.1f')} |")
    for name, e in errors.items():
        lines.append(f"| {name} | FAILED: {e[:150].replace('|', '/')} | | | | | | | |")
    g = env.get("graphs_check")
    if g:
        lines += ["", f"- sampler CUDA-graph check (rollout.cuda_graphs, greedy, {g.get('rows')} rows x 32 tokens vs the "
                  f"plain loop): path chosen {g.get('path_chosen')}, used to the end {g.get('path_used')}, graph captured "
                  f"{g.get('graph_captured')}; first 8 tokens agree in {_pct(g.get('first8_agree'))} of rows; max "
                  f"|logprob gap| before the first differing token {_f(g.get('logprob_gap_max'), '.2e')} (bf16: ~1e-2 "
                  f"expected); plain {_f(g.get('plain_s'))} s, graphs {_f(g.get('graphs_s'))} s"
                  + (f"; warnings: {'; '.join(g['warnings'])}" if g.get("warnings") else "")]
    for name, r in results.items():
        if r.get("cuda_graphs_warnings"):
            lines.append(f"- {name}: the sampler warned: {'; '.join(r['cuda_graphs_warnings'])}")
    lines += [""] + comparisons(results)
    lines += ["", "rlvr rows: sampler = time/generate; learner = the rest of the step (old logprobs, loss forwards "
              "and backwards, optimizer, weight sync, scoring). generate: transformers' model.generate alone. "
              "ceiling: forward+backward (cross-entropy, no optimizer) over rows of the same count and lengths "
              "in the same token budget."]
    return "\n".join(lines) + "\n"


def comparisons(results: dict[str, dict]) -> list[str]:
    """Issue 27's acceptance ratios for each rlvr variant: step vs TRL's, learner vs the ceiling, sampler vs
    TRL's generation (each only when both sides ran)."""
    trl = next((r for k, r in results.items() if k.startswith("TRL")), None)
    ceiling = results.get("forward+backward ceiling")
    out = []
    for name, r in results.items():
        if not isinstance(r.get("overrides"), list):  # rlvr variants only
            continue
        parts = []
        if trl and r.get("step_s") and trl.get("step_s"):
            parts.append(f"step {r['step_s'] / trl['step_s']:.2f}x TRL's (goal <= 1)")
        if ceiling and r.get("learner_tok_s") and ceiling.get("learner_tok_s"):
            parts.append(f"learner at {r['learner_tok_s'] / ceiling['learner_tok_s']:.0%} of the forward+backward "
                         "ceiling's tokens/s (goal >= 80%)")
        if trl and r.get("sampler_tok_s") and trl.get("sampler_tok_s"):
            parts.append(f"sampler {r['sampler_tok_s'] / trl['sampler_tok_s']:.2f}x TRL's generation tokens/s "
                         "(goal >= 1)")
        if r.get("logprob_diff_max") is not None:
            parts.append(f"sampler vs learner logprob gap mean {r['logprob_diff_mean']:.1e}, max {r['logprob_diff_max']:.1e}")
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
    with contextlib.suppress(ImportError):
        import trl

        env["trl"] = trl.__version__
    return env


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                       "HF_DATASETS_OFFLINE": "1", "RLVR_PROGRESS": "off", "PYTHONUNBUFFERED": "1"})
    import torch

    from rlvr.runtime import set_num_threads
    from rlvr.train.common import quiet_transformers

    if a.device == "cuda" and not torch.cuda.is_available():
        print("gpu.py: no CUDA device visible; use --dry-run to check the pipeline on CPU", file=sys.stderr)
        return 2
    set_num_threads(None)
    quiet_transformers()
    keep = bool(a.work)
    a.work = a.work or tempfile.mkdtemp(prefix="rlvr-gpu-bench-")
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    env = environment(a, argv)
    log(f"device {env.get('device_name', a.device)}, peak {env['peak_tflops']} TFLOP/s, work {work}; stages: "
        f"build, {', '.join(s for s in STAGES if s not in a.skip and (s != 'profile' or a.profile))}; "
        f"variants {[n for n, _ in a.variants]}")
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    timings: dict[str, float] = {}

    def run(name: str, fn, key: str | None = None):
        log(f"{name} ...")
        _reset_memory(a.device)
        t0 = time.perf_counter()
        try:
            r = fn()
        except Exception as e:  # noqa: BLE001 - one stage's failure must not stop the others
            errors[name] = f"{type(e).__name__}: {e}".splitlines()[0]
            traceback.print_exc()
            log(f"{name} FAILED: {errors[name]}")
            r = None
        else:
            if isinstance(r, dict) and r.get("peak_gib") is None:
                r["peak_gib"] = _peak_gib(a.device)
            if key is not None and r:
                results[key] = r
            log(f"{name} done in {time.perf_counter() - t0:.1f} s")
        timings[name] = time.perf_counter() - t0
        _reset_memory(a.device)
        if built_box:  # the report so far, after every stage: a run cut short still leaves its figures
            write_report()
        return r

    out_dirs = [Path(a.out_dir)] if a.out_dir else []
    targets = ([RESULTS] if a.device != "cpu" else [work]) + out_dirs
    profile_path = work / "gpu_profile.txt"
    built_box: list[dict] = []

    def write_report() -> tuple[str, list[Path]]:
        built = built_box[0]
        env["stage_s"] = {k: round(v, 1) for k, v in timings.items()}
        env["total_s"] = round(time.perf_counter() - _T0, 1)
        md = table(a, built, results, errors, env)
        raw = {"config": {k: v for k, v in vars(a).items() if k != "skip"} | {"skip": sorted(a.skip)},
               "built": built, "env": env, "results": results, "errors": errors,
               "mfu": {k: mfu(built["n_params"], r.get("learner_tokens"), r.get("learner_s"), env.get("peak_tflops"))
                       for k, r in results.items()}}
        for d in targets:
            d.mkdir(parents=True, exist_ok=True)
            (d / "gpu_bench.md").write_text(md)
            (d / "gpu_bench.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
            if profile_path.exists() and d != work:
                shutil.copy(profile_path, d / "gpu_profile.txt")
        return md, targets

    # every variant's configuration validated first, with the paths the build writes: a typo fails in seconds
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    planned = {"model_dir": str(work / "model"), "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl")}
    for key in ("train", "test"):
        Path(planned[key]).touch()
    try:
        check_variants(a, planned)
    except ValueError as e:
        print(f"gpu.py: {e}", file=sys.stderr)
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        return 2
    gc_mod = _gpu_check()
    built = run("build", lambda: gc_mod.build(work, a.shape, a.dtype, a.num_train, 8, a.seed))
    if built is None:
        return 1
    built_box.append(built)
    log(f"  {built['n_params']:,} parameters, mean prompt {built['prompt_tokens_mean']:.0f} tokens")
    prompts = run("prompts", lambda: step_prompts(a, built)) or []
    if "generate" not in a.skip:
        run("generate", lambda: stage_generate(a, built, prompts), key="transformers generate")
    if "graphs" not in a.skip:
        graphs_check = run("graphs", lambda: stage_graphs(a, built, prompts))
        if graphs_check:
            env["graphs_check"] = {k: v for k, v in graphs_check.items() if k != "peak_gib"}
    if "ceiling" not in a.skip:
        run("ceiling", lambda: stage_ceiling(a, built, prompts), key="forward+backward ceiling")
    if "rlvr" not in a.skip:
        for i, (name, extra) in enumerate(a.variants):
            prof = profile_path if (a.profile and i == 0 and "profile" not in a.skip) else None
            run(name, lambda name=name, extra=extra, prof=prof: stage_rlvr(a, built, name, extra, prof), key=name)
    if "trl" not in a.skip:
        if importlib.util.find_spec("trl") is None or importlib.util.find_spec("datasets") is None:
            log("trl skipped: TRL (or datasets) is not importable here; bash scripts/gpu_wheels.sh makes the wheels")
            env["trl"] = "not installed (stage skipped)"
        else:
            prompts_all = run("trl prompts", lambda: trl_prompts(a, built))
            import importlib.metadata as md_

            run("trl", lambda: stage_trl(a, built, prompts_all), key=f"TRL {md_.version('trl')} GRPOTrainer")
    md, targets = write_report()
    print(md, flush=True)
    log(f"{'all stages ran' if not errors else 'FAILED stages: ' + ', '.join(errors)}; wrote "
        f"{', '.join(str(d / 'gpu_bench.md') for d in targets)}; {env['total_s']:.0f} s in all")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if errors else 0


def trl_prompts(a, built: dict) -> list[str]:
    """Every TRL step's prompts: rlvr's data stream for steps 1..trl_steps (the same prompts rlvr saw)."""
    from rlvr.config import load_config
    from rlvr.train.common import take
    from rlvr.train.config import TrainConfig
    from rlvr.train.tasks import load_task_data

    cfg = load_config(TrainConfig, None, rlvr_overrides(a, built, Path(a.work) / "unused", 1))
    task = load_task_data(cfg.data)
    return [task.prompt(ex) for ex in take(task.train, 0, a.trl_steps * a.n_prompts, cfg.data.seed)]


if __name__ == "__main__":
    sys.exit(main())
