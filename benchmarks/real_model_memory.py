"""Peak memory of one RL step with a real model's shape, with and without gradient checkpointing.

    .venv/bin/python benchmarks/real_model_memory.py                  # both parts, ~40 min on 2 cores
    .venv/bin/python benchmarks/real_model_memory.py --part step      # only the RL step
    .venv/bin/python benchmarks/real_model_memory.py --part activations --seq 1024  # adds a size
    .venv/bin/python benchmarks/real_model_memory.py --render benchmarks/results/real_model_memory.json

The model: random weights with the Qwen2.5-0.5B shape (494M parameters, vocabulary 151,936, tied
embeddings; rlvr.models.tiny.REAL_SHAPES) and a 512-token byte-level BPE tokenizer trained
in-process on arithmetic lines, saved once as a Hugging Face folder (nothing is downloaded). Shape,
not weights, decides memory.

Part "step": ONE step of `rlvr.train.pg.loop.train` with model.name=<that folder>, model.dtype=bfloat16,
model.master_weights=float32, the arithmetic task, 2 prompts x 2 samples x 8 new tokens,
algo.micro_batch_tokens=32, with model.gradient_checkpointing false / true. Part "activations": one
forward + backward of rlvr.models.score_tokens on B x T random tokens in float32 (CPU bf16 matmuls
are ~100x slower than fp32 on AVX2 machines, so longer sequences are only affordable in fp32), with
checkpointing false / true; gradients are allocated before the measurement, so "extra" is the
activation memory of the forward + backward.

How memory is measured: each variant runs in a FRESH subprocess. Linux keeps a resident-memory
high-water mark (VmHWM) that writing 5 to /proc/self/clear_refs resets; rlvr.runtime.reset_peak_memory
does that at the start of every step, so the step's mem/rss_step_peak_gb is the step's own peak
(generation, scoring, training, evaluation; the checkpoint written after the metrics is not in it).
The child also resets it right before the learner's update (`learn`) and reads it right after:
"learn peak". mem/rss_peak_gb is the lifetime peak (model loading included). Results: a table on
stdout, benchmarks/results/real_model_memory.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "real_model_memory.json"
GIB = float(1 << 30)
SHAPE = "qwen2.5-0.5b"
STEP_VARIANTS = {
    "bf16 + fp32 masters, no checkpointing": dict(gradient_checkpointing=False, master_weights="float32"),
    "bf16 + fp32 masters, checkpointing": dict(gradient_checkpointing=True, master_weights="float32"),
}
EXTRA_STEP_VARIANTS = {  # --with-pure-bf16
    "pure bf16 AdamW, no checkpointing": dict(gradient_checkpointing=False, master_weights="same"),
}


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _gib_now() -> float:
    return _status_kib("VmRSS") * 1024 / GIB


def _gib_hwm() -> float:
    return _status_kib("VmHWM") * 1024 / GIB


# ------------------------------------------------------------------------------------ the model


def build_model_dir(path: Path) -> Path:
    """Random-init REAL_SHAPES[SHAPE] model (bf16) + BPE tokenizer, saved with save_policy."""
    import random

    from rlvr.models import save_policy
    from rlvr.models.tiny import build_bpe_tokenizer, build_shaped_model

    rng = random.Random(0)
    corpus = [f"{a}+{b}={a + b}" for a, b in ((rng.randrange(1000), rng.randrange(1000)) for _ in range(4000))]
    tok = build_bpe_tokenizer(corpus, vocab_size=512)
    model = build_shaped_model(SHAPE, tok, dtype="bfloat16")
    save_policy(model, tok, path)
    return path


# ----------------------------------------------------------------------------------- children


def child_step(model_dir: str, out_dir: str, variant: str) -> dict:
    """One RL step through pg.train; returns its memory and time metrics."""
    import rlvr.train.pg.loop as pg
    from rlvr.train.config import AlgoConfig, DataConfig, ModelConfig, RunConfig, SamplingConfig, TrainConfig

    opts = {**STEP_VARIANTS, **EXTRA_STEP_VARIANTS}[variant]
    seen: dict[str, float] = {}
    learn = pg.learn

    def measured_learn(*args, **kwargs):
        seen["rss_before_learn_gb"] = _gib_now()
        seen["gen_peak_gb"] = _gib_hwm()  # since the step's reset: generation + scoring
        _reset_hwm()
        t0 = time.perf_counter()
        out = learn(*args, **kwargs)
        seen["learn_s"] = time.perf_counter() - t0
        seen["learn_peak_gb"] = _gib_hwm()
        return out

    pg.learn = measured_learn
    cfg = TrainConfig(
        model=ModelConfig(name=model_dir, dtype="bfloat16", **opts),
        data=DataConfig(task="arithmetic", num_train=8, num_eval=2),
        sampling=SamplingConfig(n_prompts=2, group_size=2, max_tokens=8),
        algo=AlgoConfig(micro_batch_tokens=32),
        run=RunConfig(out_dir=out_dir, steps=1, progress=False, log_samples_every=0),
    )
    t0 = time.perf_counter()
    res = pg.train(cfg)
    wall = time.perf_counter() - t0
    m = res.last_metrics
    keep = {k: v for k, v in m.items() if k.startswith(("mem/", "time/")) and isinstance(v, (int, float))}
    return {"variant": variant, **keep, **seen, "loss": m.get("loss"), "wall_s": wall}


def child_activations(model_dir: str, variant: str, batch: int, seq: int) -> dict:
    """One forward + backward of score_tokens in float32 on batch x seq random tokens."""
    import torch

    from rlvr.models import score_tokens
    from rlvr.train.policy import build_policy

    gc = variant == "checkpointing"
    model, _ = build_policy(model_dir, dtype="float32", gradient_checkpointing=gc)
    for p in model.parameters():  # allocate gradients now: "extra" is then activations only
        p.grad = torch.zeros_like(p)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (batch, seq + 1), generator=g)
    before = _gib_now()
    _reset_hwm()
    t0 = time.perf_counter()
    out = score_tokens(model, ids[:, :-1], ids[:, 1:])
    out.logprobs.sum().backward()
    secs = time.perf_counter() - t0
    peak = _gib_hwm()
    return {"variant": variant, "tokens": f"{batch}x{seq}", "before_gb": before, "peak_gb": peak,
            "extra_gb": peak - before, "seconds": secs}


def _run_child(args: list[str]) -> dict:
    env = dict(os.environ)
    env.setdefault("RLVR_NUM_THREADS", "2")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------- report


def render(payload: dict) -> str:
    """The results as markdown (also: `--render results.json`)."""
    lines = ["# One RL step of a Qwen2.5-0.5B-shaped model: peak memory", ""]
    lines.append(
        f"{payload['model']}; {payload['machine']}; {payload['threads']} torch thread(s); "
        f"load average {payload.get('loadavg', '?')}. Memory in GiB, from Linux VmHWM/VmRSS in a fresh process "
        "per variant (see benchmarks/real_model_memory.py)."
    )
    if payload.get("step"):
        lines += ["", "## RL step (pg.train, bf16 weights)", "",
                  "2 prompts x 2 samples x 8 new tokens, algo.micro_batch_tokens=32, arithmetic task.", "",
                  "| variant | step peak RSS | learn peak RSS | RSS before learn | lifetime peak RSS | "
                  "train s | generate s | step s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in payload["step"]:
            if "error" in r:
                lines.append(f"| {r.get('variant', '?')} | error: {r['error']} | | | | | | |")
                continue
            lines.append(
                f"| {r['variant']} | {r.get('mem/rss_step_peak_gb', float('nan')):.2f} | {r['learn_peak_gb']:.2f} | "
                f"{r['rss_before_learn_gb']:.2f} | {r['mem/rss_peak_gb']:.2f} | {r.get('time/train', float('nan')):.0f} | "
                f"{r.get('time/generate', float('nan')):.0f} | {r.get('time/step', float('nan')):.0f} |"
            )
    if payload.get("activations"):
        lines += ["", "## Forward + backward only (score_tokens, float32 weights)", "",
                  "| tokens | variant | RSS before | peak RSS | extra (activations) | seconds |",
                  "|---|---|---:|---:|---:|---:|"]
        for r in payload["activations"]:
            if "error" in r:
                lines.append(f"| | {r.get('variant', '?')} | error: {r['error']} | | | |")
                continue
            lines.append(f"| {r['tokens']} | {r['variant']} | {r['before_gb']:.2f} | {r['peak_gb']:.2f} | "
                         f"{r['extra_gb']:.2f} | {r['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--part", choices=["step", "activations", "all"], default="all")
    p.add_argument("--model-dir", type=Path, help="reuse a folder built by an earlier run (else a temp one)")
    p.add_argument("--batch", type=int, default=2, help="activations part: rows")
    p.add_argument("--seq", type=int, default=256, help="activations part: tokens per row")
    p.add_argument("--with-pure-bf16", action="store_true", help="step part: also master_weights=same")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--render", type=Path, help="only re-render an existing results JSON as markdown")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.child:  # inside a fresh subprocess
        from rlvr.runtime import set_num_threads

        set_num_threads(None)
        kind, _, variant = args.child.partition(":")
        if kind == "step":
            row = child_step(str(args.model_dir), args.child_out, variant)
        else:
            row = child_activations(str(args.model_dir), variant, args.batch, args.seq)
        print(json.dumps(row))
        return
    if args.render:
        print(render(json.loads(args.render.read_text())))
        return

    tmp = Path(tempfile.mkdtemp(prefix="rlvr-real-model-"))
    try:
        model_dir = args.model_dir
        if model_dir is None or not (model_dir / "config.json").exists():
            model_dir = model_dir or tmp / "model"
            t0 = time.perf_counter()
            build_model_dir(model_dir)
            print(f"built {SHAPE} in {time.perf_counter() - t0:.0f} s at {model_dir}", flush=True)
        # Rows of parts (and activation sizes) not run now are kept from an earlier results file.
        old = json.loads(args.out.read_text()) if args.out.exists() else {}
        tokens = f"{args.batch}x{args.seq}"
        payload = {
            "model": f"random-init {SHAPE} shape (494,032,768 parameters, vocab 151,936, tied embeddings), "
                     "512-token BPE tokenizer",
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "threads": int(os.environ.get("RLVR_NUM_THREADS", "2")),
            "step": [] if args.part in ("step", "all") else old.get("step", []),
            "activations": [r for r in old.get("activations", []) if r.get("tokens") != tokens]
            if args.part in ("activations", "all") else old.get("activations", []),
        }
        if args.part in ("step", "all"):
            variants = dict(STEP_VARIANTS, **(EXTRA_STEP_VARIANTS if args.with_pure_bf16 else {}))
            for name in variants:
                run_dir = tmp / "run"
                row = _run_child(["--child", f"step:{name}", "--model-dir", str(model_dir), "--child-out", str(run_dir)])
                shutil.rmtree(run_dir, ignore_errors=True)  # its checkpoint is ~6.5 GB
                print(json.dumps(row), flush=True)
                payload["step"].append(row)
        if args.part in ("activations", "all"):
            for name in ("no checkpointing", "checkpointing"):
                row = _run_child(["--child", f"act:{name}", "--model-dir", str(model_dir),
                                  "--batch", str(args.batch), "--seq", str(args.seq)])
                print(json.dumps(row), flush=True)
                payload["activations"].append(row)
        payload["loadavg"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        md = render(payload)
        args.out.with_suffix(".md").write_text(md)
        print(md)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # a --model-dir lives outside it and is kept


if __name__ == "__main__":
    main()
