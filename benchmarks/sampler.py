"""One sampling step (rlvr.rollout.sampling.sample_step) at a real vocabulary, against the formulas it replaced
(issue 38, S4): a float32 copy of the logits, log_softmax, and a float64 cumulative sum over the whole row; with
top-p, a sort of every whole row for the kept set (now a top-k of the 1,024 largest values first). With --fused, a
third side where nothing is truncated: the step as the CUDA-graph decode samples with rollout.compile_decode
(rlvr.rollout.static_decode.sample_in_graph under torch.compile, dynamic shapes: the log-softmax, the block sums
and the gathers fused), its tokens checked equal to now's and its log-probabilities within 1e-4.

    RLVR_NUM_THREADS=1 .venv/bin/python benchmarks/sampler.py [--rows 8,64] [--vocab 151936] [--repeats 7]
    python benchmarks/sampler.py --device cuda --rows 64,512 --fused  # on a GPU

bf16 logits shaped like an LM's (a few hundred likely tokens, a long tail), temperature 1, nothing truncated (the
GPU benchmark's sampling) and top-p 0.95; uniforms from a fixed seed. Both sides
pick the same tokens (checked here on every call) and give the same log-probabilities. Reported: the median of
`repeats` interleaved rounds after a warm-up, ms per step, and the bytes each side writes and reads per step
(counted from its passes over the (rows, vocab) tensors, untruncated rows). Writes benchmarks/results/sampler.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from rlvr.rollout import SamplingSpec
from rlvr.rollout.sampling import sample_step
from rlvr.runtime import set_num_threads

RESULTS = Path(__file__).parent / "results"


def _kept_by_full_sort(x: torch.Tensor, top_p: float) -> torch.Tensor:
    """rlvr.algo.logprobs.kept_mask's top-p as it was: every row sorted whole."""
    vals = torch.sort(x, dim=-1, descending=True).values
    p = (vals - torch.logsumexp(x, dim=-1, keepdim=True)).exp_()
    before = p.cumsum(-1).sub_(p)
    m = (before < top_p).sum(-1, keepdim=True).clamp_min_(1)
    return x >= vals.gather(-1, m - 1)


def before(logits: torch.Tensor, u: torch.Tensor, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The step as it was (temperature 1, top-p or nothing truncated): (log-probabilities, tokens)."""
    x = logits.float()
    if top_p < 1.0:
        x = x.masked_fill(~_kept_by_full_sort(x, top_p), float("-inf"))
    logp = torch.log_softmax(x, dim=-1)
    cdf = logp.double().exp().cumsum(-1)
    target = (u.double() * cdf[:, -1]).unsqueeze(-1)
    ids = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    last = logp.shape[-1] - 1 - (logp > float("-inf")).flip(-1).view(torch.uint8).argmax(-1)
    return logp, torch.minimum(ids, last)


def traffic_gb(rows: int, vocab: int) -> tuple[float, float]:
    """Bytes over the (rows, vocab) tensors per step (GB), before and now, from the passes each makes (a pass
    reads its input once and writes its output once; log_softmax reads its input twice)."""
    n = rows * vocab
    b16, f32, f64, u8 = 2 * n, 4 * n, 8 * n, n
    old = (b16 + f32) + (2 * f32 + f32) + (f32 + f64) + (f64 + f64) + (f64 + f64) + (f32 + u8) + (u8 + u8) + u8
    new = (2 * b16 + f32) + (f32 + f32) + f32  # log_softmax from bf16; exp; the block sums' one read
    return old / 1e9, new / 1e9


def _time(sync, fn, *args) -> float:
    sync()
    t = time.perf_counter()
    fn(*args)
    sync()
    return time.perf_counter() - t


def write(table: list[dict], a, dev, threads) -> str:
    """The table so far into sampler{,_cuda}.{md,json} (rewritten after each row: a run cut short keeps its rows)."""
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({platform.machine()}, {threads} thread(s))"
    lines = ["# One sampling step (benchmarks/sampler.py)", "",
             f"bf16 logits, temperature 1, {where}, median of {a.repeats} interleaved rounds. "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
             "| sampling | rows x vocab | before (ms) | now (ms) | speed-up | traffic before / now (GB) "
             "| same tokens and logprobs | fused in-graph (ms) | fused: same tokens, logprobs within 1e-4 |",
             "|---|---|---:|---:|---:|---:|---|---:|---|"]
    for r in table:
        what = "nothing truncated" if r["top_p"] == 1.0 else f"top-p {r['top_p']}"
        gb = "-" if r["before_gb"] is None else f"{r['before_gb']:.2f} / {r['now_gb']:.2f}"
        fz = ("- | -" if "fused_ms" not in r else
              f"{r['fused_ms']:.2f} | {'yes' if r['fused_same'] else 'NO'}")
        lines.append(f"| {what} | {r['rows']} x {r['vocab']} | {r['before_ms']:.2f} | {r['now_ms']:.2f} "
                     f"| {r['speedup']:.2f}x | {gb} | {'yes' if r['same_tokens_and_logprobs'] else 'NO'} | {fz} |")
    text = "\n".join(lines) + "\n"
    a.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if dev.type == "cpu" else "_" + dev.type
    (a.out_dir / f"sampler{suffix}.md").write_text(text)
    (a.out_dir / f"sampler{suffix}.json").write_text(json.dumps({"device": where, "rows": table}, indent=1) + "\n")
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="8,64")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads on CPU (default RLVR_NUM_THREADS or 1)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where sampler.{md,json} go (default results/)")
    ap.add_argument("--fused", action="store_true", help="also time the compiled in-graph sampler (sample_in_graph)")
    a = ap.parse_args(argv)
    threads = set_num_threads(a.threads) if a.device == "cpu" else None
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    eos = torch.tensor([], dtype=torch.long, device=dev)
    fused = None
    if a.fused:
        from rlvr.rollout.static_decode import sample_in_graph

        fused = torch.compile(sample_in_graph, dynamic=True)
    table = []
    for top_p in (1.0, 0.95):
        spec = SamplingSpec(temperature=1.0, top_p=top_p, max_tokens=1)
        for rows in [int(x) for x in a.rows.split(",")]:
            g = torch.Generator().manual_seed(rows)
            # an LM's shape of distribution: a few hundred likely tokens (~99% of the mass), a long tail
            logits = torch.randn(rows, a.vocab, generator=g) * 2
            logits[:, torch.randperm(a.vocab, generator=g)[:300]] += 14
            logits = logits.to(torch.bfloat16).to(dev)
            u = torch.rand(rows, generator=g, dtype=torch.float64).to(dev)
            lp_old, tok_old = before(logits, u, top_p)
            lp_new, tok_new = sample_step(logits, 0, spec, eos, u)
            same = bool(torch.equal(tok_old, tok_new) and torch.equal(lp_old, lp_new))
            sides = [("before", before, (logits, u, top_p)), ("now", sample_step, (logits, 0, spec, eos, u))]
            row = {"top_p": top_p, "rows": rows, "vocab": a.vocab, "same_tokens_and_logprobs": same}
            if fused is not None and top_p == 1.0:
                tok_f, lp_f = fused(logits, u, None, 1.0, 0)  # (the compile, before the timed rounds)
                lp_now = lp_new.gather(-1, tok_new.unsqueeze(-1)).squeeze(-1)
                row["fused_same"] = bool(torch.equal(tok_f, tok_new) and torch.allclose(lp_f, lp_now, atol=1e-4))
                sides.append(("fused", fused, (logits, u, None, 1.0, 0)))
            times = {name: [] for name, _, _ in sides}
            for _ in range(a.repeats):  # interleaved
                for name, fn, args in sides:
                    times[name].append(_time(sync, fn, *args))
            for name in times:
                row[f"{name}_ms"] = 1e3 * statistics.median(times[name])
            row["before_gb"], row["now_gb"] = traffic_gb(rows, a.vocab) if top_p == 1.0 else (None, None)
            row["speedup"] = row["before_ms"] / row["now_ms"]
            table.append(row)
            write(table, a, dev, threads)
    print(write(table, a, dev, threads))
    if not all(r["same_tokens_and_logprobs"] and r.get("fused_same", True) for r in table):
        raise SystemExit("sampler.py: the steps chose different tokens or log-probabilities")


if __name__ == "__main__":
    main()
