"""Generation throughput of HFGenerator on the tiny CPU model: 256 sequences x 32 new tokens,
with and without the KV cache, next to transformers' own `generate` for reference.

    RLVR_NUM_THREADS=1 .venv/bin/python benchmarks/generation.py [--repeats 5] [--sequences 256]

Every response is exactly `new_tokens` long (min_tokens = max_tokens, so EOS cannot end one
early); tokens/s counts generated tokens only. Reported time is the best of `repeats` interleaved
rounds (after one warm-up), to reduce the noise of a shared machine. Writes
benchmarks/results/generation.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from rlvr.data import get_task
from rlvr.models import build_tiny_model
from rlvr.rollout import HFGenerator, SamplingSpec
from rlvr.runtime import set_num_threads

RESULTS = Path(__file__).parent / "results"


def _hf_generate(model, tok, prompts, new_tokens, batch_size):
    """transformers' generate with sampling and its KV cache, left-padded batches."""
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s : s + batch_size]
        ids = [tok.encode(p) for p in chunk]
        L = max(len(x) for x in ids)
        input_ids = torch.tensor([[tok.pad_token_id] * (L - len(x)) + x for x in ids])
        attn = (torch.arange(L).unsqueeze(0) >= torch.tensor([L - len(x) for x in ids]).unsqueeze(1)).long()
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attn,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tok.pad_token_id,
            )
        assert out.shape[1] == L + new_tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default RLVR_NUM_THREADS)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS, help="where generation.{json,md} go")
    args = ap.parse_args(argv)
    threads = set_num_threads(args.threads)

    model, tok = build_tiny_model(seed=0)  # hidden 64, 2 layers, 4 heads, char vocab
    n_params = sum(p.numel() for p in model.parameters())
    prompts = [
        e.question for e in get_task("arithmetic").generate(args.sequences, "train", seed=0, digits=(1, 3))
    ]
    spec = SamplingSpec(max_tokens=args.new_tokens, min_tokens=args.new_tokens, seed=0)
    total_tokens = args.sequences * args.new_tokens

    methods = []  # (label, batch size, callable)
    for label, batch_size, use_cache in [
        ("HFGenerator, KV cache", 256, True),
        ("HFGenerator, KV cache", 64, True),
        ("HFGenerator, no cache", 256, False),
        ("HFGenerator, no cache", 64, False),
    ]:
        gen = HFGenerator(model, tok, batch_size=batch_size, use_cache=use_cache)
        check = gen.generate(prompts[:2], spec)
        assert all(len(r.response_ids) == args.new_tokens for r in check)
        methods.append((label, batch_size, lambda gen=gen: gen.generate(prompts, spec)))
    for batch_size in (256, 64):
        methods.append(
            (
                "transformers generate (reference)",
                batch_size,
                lambda b=batch_size: _hf_generate(model, tok, prompts, args.new_tokens, b),
            )
        )
    # Interleaved repeats (every method once per round, best round kept): a shared machine's
    # load drifts over a minute, and interleaving spreads that drift over all methods alike.
    best = [float("inf")] * len(methods)
    for _, _, fn in methods:
        fn()  # warm-up
    for _ in range(args.repeats):
        for k, (_, _, fn) in enumerate(methods):
            t0 = time.perf_counter()
            fn()
            best[k] = min(best[k], time.perf_counter() - t0)
    rows = []
    for (label, batch_size, _), secs in zip(methods, best, strict=True):
        rows.append(
            {"method": label, "batch_size": batch_size, "seconds": secs, "tokens_per_s": total_tokens / secs}
        )
        print(
            f"{label:34s} batch {batch_size:4d}: {secs:7.3f} s  {total_tokens / secs:9.0f} tok/s", flush=True
        )

    # Variable lengths: EOS made likely (+1.5 on its logit, about 4% per step), up to 64 tokens,
    # so responses end at scattered steps. Same seeds -> same tokens with and without dropping
    # finished rows; only the time differs.
    var_rows = []
    eos = tok.eos_token_id
    hook = model.lm_head.register_forward_hook(
        lambda _m, _i, out: out + 1.5 * (torch.arange(out.shape[-1], device=out.device) == eos)
    )
    try:
        var_spec = SamplingSpec(max_tokens=64, seed=0)
        gens = {
            "drop finished rows (default)": HFGenerator(model, tok, batch_size=256, drop_finished=True),
            "keep finished rows": HFGenerator(model, tok, batch_size=256, drop_finished=False),
        }
        outs = {k: g.generate(prompts, var_spec) for k, g in gens.items()}  # also the warm-up
        a, b = outs.values()
        assert [r.response_ids for r in a] == [r.response_ids for r in b]
        lengths = sorted(len(r.response_ids) for r in a)
        var_tokens = sum(lengths)
        var_best = {k: float("inf") for k in gens}
        for _ in range(args.repeats):
            for k, g in gens.items():
                t0 = time.perf_counter()
                g.generate(prompts, var_spec)
                var_best[k] = min(var_best[k], time.perf_counter() - t0)
    finally:
        hook.remove()
    for k, secs in var_best.items():
        var_rows.append({"method": k, "seconds": secs, "tokens_per_s": var_tokens / secs})
        print(f"variable lengths, {k:28s}: {secs:7.3f} s  {var_tokens / secs:9.0f} tok/s")
    var_info = {
        "generated_tokens": var_tokens,
        "median_length": lengths[len(lengths) // 2],
        "max_length": lengths[-1],
    }

    meta = {
        "sequences": args.sequences,
        "new_tokens": args.new_tokens,
        "generated_tokens": total_tokens,
        "repeats": args.repeats,
        "torch_threads": threads,
        "model": f"tiny qwen2, hidden 64, 2 layers, {n_params} parameters, vocab {len(tok)}",
        "torch": torch.__version__,
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "generation.json").write_text(
        json.dumps({"meta": meta, "rows": rows, "variable_lengths": {**var_info, "rows": var_rows}}, indent=2)
        + "\n"
    )
    lines = [
        "# Generation throughput (benchmarks/generation.py)",
        "",
        f"{args.sequences} sequences x {args.new_tokens} new tokens, tiny char-level Qwen2 ({n_params} parameters), "
        f"CPU, {threads} torch thread(s), best of {args.repeats} interleaved rounds after a warm-up. {meta['date_utc']} UTC.",
        "",
        "| method | batch size | seconds | tokens/s |",
        "|---|---:|---:|---:|",
        *[
            f"| {r['method']} | {r['batch_size']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} |"
            for r in rows
        ],
        "",
        f"Variable lengths: EOS logit +1.5 (about 4% per step), max 64 tokens, batch 256, KV cache; "
        f"{var_tokens} tokens generated, median length {var_info['median_length']}, "
        f"max {var_info['max_length']}; identical tokens in both rows.",
        "",
        "| finished rows | seconds | tokens/s |",
        "|---|---:|---:|",
        *[f"| {r['method']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} |" for r in var_rows],
        "",
    ]
    (args.results_dir / "generation.md").write_text("\n".join(lines))
    print(f"wrote {args.results_dir / 'generation.md'} and generation.json")


if __name__ == "__main__":
    main()
