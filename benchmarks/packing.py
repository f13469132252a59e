"""The learner's forward + backward, padded rows vs packed (algo.packing), on the device at hand.

    .venv/bin/python benchmarks/packing.py                       # CPU smoke: a small Qwen2, 8 x 4 rows
    python benchmarks/packing.py --shape qwen0.5b --prompts 64 --group 8 --prompt 117 --resp 256 \\
        --tokens 16384 --dtype bfloat16                          # the GPU check's learner work (issue 27)

The workload is one GRPO minibatch: --prompts prompts of --prompt tokens, each with --group responses of
random lengths in [resp/2, resp], a randomly initialized Qwen2 (--shape tiny: 2 layers, width 64; qwen0.5b:
Qwen2.5-0.5B's shape, vocabulary 151,936), micro-batches of algo.micro_batch_tokens=--tokens.
Variants, each timed on rlvr.train.pg.objective.accumulate_gradients (forward, loss, backward of every
micro-batch) and batch_logprobs (one no-grad forward, as the old-logprob / reference forwards):

  padded         algo.packing=false algo.shared_prefix=false: every row whole, right-padded (sdpa)
  padded_shared  algo.packing=false algo.shared_prefix=true: the cascade (each prompt once per micro-batch)
  packed         algo.packing=true algo.shared_prefix=false: rows concatenated, flex_attention document
                 mask, LM head on responses
  packed_shared  algo.packing=true algo.shared_prefix=true (the GPU default): each prompt once in the
                 packed sequence, its responses attending to it

The last column is the largest |logprob| difference to the padded variant's on the response tokens
(float rounding: ~1e-5 in float32, ~1e-2 in bfloat16). time = median of --reps calls after one warm-up call (the warm-up's time is printed too: on CUDA it holds
flex_attention's compile probe, once per process); tokens/s counts real (unpadded) tokens; peak memory is
torch.cuda.max_memory_allocated on CUDA. Writes benchmarks/results/packing.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
VARIANTS = {"padded": (False, False), "padded_shared": (False, True), "packed": (True, False),
            "packed_shared": (True, True)}


def build(shape: str, dtype, device):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if shape == "qwen0.5b":
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                          tie_word_embeddings=True, rope_theta=1e6)
    else:
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).train()


def batch_of(prompts: int, group: int, prompt: int, resp: int, vocab: int):
    from rlvr.models.tokenize import build_training_batch

    rng = random.Random(0)
    P, R = [], []
    for _ in range(prompts):
        p = [rng.randrange(4, vocab) for _ in range(prompt)]
        for _ in range(group):
            P.append(p)
            R.append([rng.randrange(4, vocab) for _ in range(rng.randint(max(1, resp // 2), resp))])
    return build_training_batch(P, R, 0)


def run(args) -> dict:
    import torch

    sys.path.insert(0, str(ROOT))
    from rlvr.config import load_config
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients, batch_logprobs
    from rlvr.train.pg.recipes import get_recipe

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    model = build(args.shape, dtype, device)
    batch = batch_of(args.prompts, args.group, args.prompt, args.resp, model.config.vocab_size)
    n = batch.input_ids.shape[0]
    adv = torch.randn(n, generator=torch.Generator().manual_seed(1))
    real = int(batch.attention_mask.sum())
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows, logps = [], {}
    for name, (packing, shared) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        algo = load_config(TrainConfig, None, [f"algo.packing={str(packing).lower()}",
                                               f"algo.shared_prefix={str(shared).lower()}", "algo.kl_coef=0"],
                           base=get_recipe("grpo")).algo

        def train_step(algo=algo):
            model.zero_grad(set_to_none=True)
            accumulate_gradients(model, Minibatch(batch, adv), LossParts.from_algo(algo),
                                 ForwardSpec.of(algo, 0, micro_batch_tokens=args.tokens), norm_length=0)

        def score(packing=packing, shared=shared, name=name):
            logps[name] = batch_logprobs(model, batch, 0, micro_batch_tokens=args.tokens, shared_prefix=shared,
                                         packing=packing)

        out = {"variant": name}
        for what, fn in (("learner", train_step), ("logprobs", score)):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t = time.perf_counter()
            fn()
            sync()
            out[f"{what}_first_s"] = time.perf_counter() - t
            times = []
            for _ in range(args.reps):
                t = time.perf_counter()
                fn()
                sync()
                times.append(time.perf_counter() - t)
            out[f"{what}_s"] = statistics.median(times)
            out[f"{what}_tok_s"] = real / out[f"{what}_s"]
            if device.type == "cuda":
                out[f"{what}_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        if "padded" in logps:  # the same numbers as the padded rows (response tokens: all the loss reads)
            m = batch.response_mask
            out["max_logprob_diff"] = float(((logps[name] - logps["padded"]) * m).abs().max())
        rows.append(out)
        print(json.dumps(out), flush=True)
    return {"device": str(device), "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
            "host": platform.node(), "torch": torch.__version__, "args": vars(args), "rows": n,
            "real_tokens": real, "padded_tokens": int(batch.input_ids.numel()), "results": rows}


def table(res: dict) -> str:
    cuda = res["device"].startswith("cuda")
    head = ("| variant | learner s | learner tok/s | logprobs s | logprobs tok/s | first call s (learner, logprobs) "
            "| max logprob diff vs padded |")
    head += " peak GiB |" if cuda else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in res["results"]:
        line = (f"| {r['variant']} | {r['learner_s']:.3f} | {r['learner_tok_s']:,.0f} | {r['logprobs_s']:.3f} | "
                f"{r['logprobs_tok_s']:,.0f} | {r['learner_first_s']:.1f}, {r['logprobs_first_s']:.1f} | "
                f"{r.get('max_logprob_diff', float('nan')):.2g} |")
        lines.append(line + (f" {r['learner_peak_gib']:.1f} |" if cuda else ""))
    a = res["args"]
    return (f"{res['device']} {res['gpu']} torch {res['torch']}: {a['shape']} {a['dtype']}, {res['rows']} rows "
            f"({a['prompts']} x {a['group']}), prompt {a['prompt']}, responses {a['resp'] // 2}..{a['resp']}, "
            f"micro_batch_tokens={a['tokens']}; {res['real_tokens']:,} real tokens "
            f"({res['padded_tokens']:,} padded); median of {a['reps']}\n\n" + "\n".join(lines) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=("tiny", "qwen0.5b"), default="tiny")
    ap.add_argument("--device", default="", help="'' = cuda when available, else cpu")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=40)
    ap.add_argument("--resp", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024, help="algo.micro_batch_tokens")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", nargs="*", choices=tuple(VARIANTS), help="run these variants only")
    ap.add_argument("--out", default=str(RESULTS / "packing"), help="results path without suffix")
    args = ap.parse_args(argv)
    res = run(args)
    md = table(res)
    print(md)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    out.with_suffix(".md").write_text(md)


if __name__ == "__main__":
    main()
