"""Peak memory and time of chunked vs naive token logprobs (+ entropy) from logits.

    .venv/bin/python benchmarks/logprobs.py                      # 8 x 1024 tokens, V = 151,936
    .venv/bin/python benchmarks/logprobs.py --batch 2 --seq 256  # quick
    .venv/bin/python benchmarks/logprobs.py --device cuda        # on a GPU

How memory is measured: every variant runs in a FRESH subprocess (so one variant's allocator
high-water mark cannot leak into the next). On CPU, tracemalloc does not see torch's allocations,
so the child reads its peak resident set size with resource.getrusage(RUSAGE_SELF).ru_maxrss
right after building the logits (baseline) and again after the operation; "extra peak" is the
difference, i.e. the working memory the operation needed beyond the logits (and, with backward,
beyond nothing: the logits' gradient is counted, since every implementation must produce it).
On CUDA it uses torch.cuda.max_memory_allocated the same way.

Variants:
  naive        torch.log_softmax(logits.float(), -1).gather(labels)  (what most code does)
  naive+ent    the same plus entropy = -(p * logp).sum(-1)
  chunked      rlvr.algo.token_logprobs_from_logits (chunk_size rows at a time)
  chunked+ent  rlvr.algo.logprobs_and_entropy(with_entropy=True)
each for fp32 and bf16 logits, under no_grad, and (with --backward) forward + backward with the
logits as a leaf requiring grad. Results: a table on stdout and benchmarks/results/logprobs.json.
Times are wall seconds of one call after one untimed warm-up is skipped (the sizes make a
warm-up as expensive as the call), with RLVR_NUM_THREADS threads (default 1: shared machine).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "logprobs.json"
VARIANTS = ("naive", "naive+ent", "chunked", "chunked+ent")


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _available_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def _estimate_mb(variant: str, dtype: str, backward: bool, batch: int, seq: int, vocab: int, chunk: int) -> float:
    """Rough upper bound of a child's peak (to skip variants this machine cannot hold)."""
    elt = 4 if dtype == "fp32" else 2
    logits = batch * seq * vocab * elt / 2**20
    full32 = batch * seq * vocab * 4 / 2**20
    if variant.startswith("naive"):
        extra = full32 * (1 if dtype == "fp32" else 2) + (2 * full32 if variant.endswith("+ent") else 0)
        if backward:
            extra += 3 * full32
    else:
        extra = 4 * min(chunk, batch * seq) * vocab * 4 / 2**20 + (logits if backward else 0)
    return logits + extra + 600  # + interpreter and torch


def child(args: argparse.Namespace) -> dict:
    import torch

    from rlvr.algo import logprobs_and_entropy

    torch.set_num_threads(int(os.environ.get("RLVR_NUM_THREADS", "1") or 1))
    dev = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator(device=dev).manual_seed(0)
    logits = torch.empty(args.batch, args.seq, args.vocab, dtype=dtype, device=dev)
    logits.uniform_(-8.0, 8.0, generator=g)
    labels = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=g)
    if args.backward:
        logits.requires_grad_()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.max_memory_allocated() / 2**20
    else:
        base = _rss_mb()

    def naive(with_ent):
        ls = torch.log_softmax(logits.float(), dim=-1)
        lp = ls.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        ent = -(ls.exp() * ls).sum(-1) if with_ent else None
        return lp, ent

    def chunked(with_ent):
        return logprobs_and_entropy(logits, labels, chunk_size=args.chunk_size, with_entropy=with_ent)

    fn = naive if args.variant.startswith("naive") else chunked
    with_ent = args.variant.endswith("+ent")
    t0 = time.perf_counter()
    if args.backward:
        lp, ent = fn(with_ent)
        loss = lp.sum() + (ent.sum() if ent is not None else 0.0)
        loss.backward()
    else:
        with torch.no_grad():
            lp, ent = fn(with_ent)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _rss_mb()
    checksum = float(lp.double().sum())
    return {
        "variant": args.variant,
        "dtype": args.dtype,
        "backward": args.backward,
        "logits_mb": logits.numel() * logits.element_size() / 2**20,
        "baseline_mb": base,
        "peak_mb": peak,
        "extra_peak_mb": peak - base,
        "seconds": seconds,
        "checksum": checksum,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--backward", action="store_true", help="also run forward+backward variants")
    p.add_argument("--backward-seq", type=int, default=None, help="sequence length for backward runs")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--keep-free-mb", type=float, default=6144, help="skip a CPU variant that would leave less")
    # internal: run one variant in this process
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    p.add_argument("--render", type=Path, help="only re-render an existing results JSON as markdown")
    args = p.parse_args()
    if args.render:
        payload = json.loads(args.render.read_text())
        out = args.render.with_suffix(".md")
        out.write_text(render_markdown(payload))
        print(out.read_text())
        return
    if args.child:
        print(json.dumps(child(args)))
        return

    runs = []
    modes = [False, True] if args.backward else [False]
    for backward in modes:
        seq = args.backward_seq if (backward and args.backward_seq) else args.seq
        for dtype in args.dtypes.split(","):
            for variant in args.variants.split(","):
                cmd = [sys.executable, __file__, "--child", "--variant", variant, "--dtype", dtype,
                       "--batch", str(args.batch), "--seq", str(seq), "--vocab", str(args.vocab),
                       "--chunk-size", str(args.chunk_size), "--device", args.device]
                if backward:
                    cmd.append("--backward")
                need = _estimate_mb(variant, dtype, backward, args.batch, seq, args.vocab, args.chunk_size)
                avail = _available_mb()
                if args.device == "cpu" and avail is not None and need > avail - args.keep_free_mb:
                    row = {"variant": variant, "dtype": dtype, "backward": backward,
                           "error": f"skipped: needs ~{need / 1024:.1f} GB, {avail / 1024:.1f} GB available "
                                    f"(keeping {args.keep_free_mb / 1024:.0f} GB free for others)"}
                    row["batch"], row["seq"] = args.batch, seq
                    runs.append(row)
                    _print_row(row)
                    continue
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    row = {"variant": variant, "dtype": dtype, "backward": backward,
                           "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else
                           f"exit {proc.returncode}"}
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                row["batch"], row["seq"] = args.batch, seq
                runs.append(row)
                _print_row(row)
    meta = {
        "vocab": args.vocab, "chunk_size": args.chunk_size, "device": args.device,
        "threads": int(os.environ.get("RLVR_NUM_THREADS", "1") or 1),
        "measure": "peak RSS via getrusage in a fresh subprocess per variant (cuda: max_memory_allocated)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "runs": runs}
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    md = args.out.with_suffix(".md")
    md.write_text(render_markdown(payload))
    print(f"wrote {args.out} and {md}")


def render_markdown(payload: dict) -> str:
    """The results table as markdown (also: `python benchmarks/logprobs.py --render results.json`)."""
    m = payload["meta"]
    lines = [
        "# Token logprobs: chunked vs naive",
        "",
        f"vocab {m['vocab']}, chunk_size {m['chunk_size']} rows, device {m['device']}, "
        f"{m['threads']} thread(s). Memory: {m['measure']}. 'extra' = peak minus the peak right "
        "after the logits were built (with backward this includes the logits' gradient, which every "
        "implementation must produce).",
        "",
        "| tokens | logits | mode | variant | logits MB | extra peak MB | total peak MB | seconds |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in payload["runs"]:
        mode = "fwd+bwd" if r["backward"] else "no_grad"
        head = f"| {r['batch']}x{r['seq']} | {r['dtype']} | {mode} | {r['variant']} |"
        if "error" in r:
            lines.append(f"{head} | | | {r['error']} |")
        else:
            lines.append(
                f"{head} {r['logits_mb']:.0f} | {r['extra_peak_mb']:.0f} | {r['peak_mb']:.0f} | {r['seconds']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def _print_row(r: dict) -> None:
    mode = "fwd+bwd" if r["backward"] else "no_grad"
    head = f"{r['batch']}x{r['seq']:<5} {r['dtype']:<4} {mode:<7} {r['variant']:<12}"
    if "error" in r:
        print(f"{head} ERROR {r['error']}", flush=True)
        return
    print(
        f"{head} logits {r['logits_mb']:8.0f} MB  extra peak {r['extra_peak_mb']:8.0f} MB  "
        f"total peak {r['peak_mb']:8.0f} MB  {r['seconds']:7.2f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
