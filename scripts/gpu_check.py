"""GPU check of the real trainer with vLLM rollouts, end to end, with no network (run by gpu_check.sh).

    python scripts/gpu_check.py                                  # H200: Qwen2.5-0.5B shape, vLLM, ~6 min (est.)
    python scripts/gpu_check.py --backend hf                     # H200 without vLLM: ~3-4 min (est.)
    python scripts/gpu_check.py --dry-run                        # CPU: tiny shape, hf backend, same pipeline

Stages (each one's wall time is printed):
  1. build: a random-init Qwen2 model of the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads, 2 KV
     heads, MLP 4864, vocab 151936, tied embeddings) and a byte-level BPE tokenizer trained here with
     `tokenizers` on the check's own text, its vocabulary padded to the model's 151936 rows with
     filler tokens that decode to Greek letters (so every id a random model samples decodes); a
     GSM8K-like JSONL of generated arithmetic word problems. All saved under --work.
  2. train: `rlvr train rollout.backend=vllm rollout.sleep_mode=true ...` for --steps steps (a real
     subprocess, the command a user runs), then 3. the same with rollout.sleep_mode=false for
     --steps-nosleep steps (vLLM only: the hf sampler has no sleep mode, so --backend hf skips it), and 3b. with algo.shared_prefix=false (every row whole: what the shared-prefix
     forward and its cascade attention gain on this GPU, in learner tokens/s and effective MFU) for
     --steps-plain steps, each with its device memory sampled by nvidia-smi every 0.25 s.
     The reward is `language` (share of Latin-script words): a random model's outputs differ in it
     (the Greek fillers), so advantages are non-zero, the learner's weights move, and a failed weight
     push would show in rollout/logprob_diff_*. The task's own r1_zero reward would be 0 for every
     random output: no gradient, nothing to push. No run ends with a held-out eval unless --eval (no
     check reads it; it cost ~30 s per run on an H200).
     With --backend hf on a GPU the defaults are 3 steps + 2 plain steps (about 4 minutes in all on an
     H200, from issue 27's 17 s per step: build ~15 s, two trainer processes ~60 + ~50 s, bare ~50 s).
  4. bare: a fresh process (with --backend hf: this process, one start less) drives the generator directly (VLLMGenerator, or HFGenerator with
     --backend hf) on the same prompts and sampling spec: bare tokens/s; the counterfactual of a
     failed push (rollouts of the initial weights scored by the final policy); the engine after
     update_weights(final policy); sleep/wake keeps greedy outputs.
  5. report: the tables below -> --out (default benchmarks/results/gpu.md, and .json beside it).

MFU = 6 * N * trained tokens / time/train / peak, with N the parameter count (tied embedding counted
once: it is the LM head's matmul; the embedding lookup costs nothing) and trained tokens the prompt +
response tokens of the rollouts the learner trained on (6N per token: forward 2N + backward 4N; the
attention's quadratic term is left out). Peak: H200 bf16 dense, 989 TFLOP/s (NVIDIA's datasheet gives
1,979 with 2:4 sparsity); --peak-tflops for another GPU.

Exit status 0 only if every check passes (sampler/trainer logprobs agree at every step, the push is
visible, every stage ran).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's rlvr, also when the venv holds another install
H200_BF16_DENSE_TFLOPS = 989.0
EOS = "<|endoftext|>"

# Qwen2.5-0.5B's architecture (its config.json), random weights; "tiny" keeps the same structure.
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=4096, rope_theta=1_000_000.0, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=1024, tie_word_embeddings=True, max_position_embeddings=1024,
                 rope_theta=10_000.0, rms_norm_eps=1e-6),
}
BPE_VOCAB = {"qwen2.5-0.5b": 4096, "tiny": 400}

# Defaults per device: the GPU profile fills an H200 for a few seconds per step; the CPU profile only
# proves the plumbing (tests/scripts/test_gpu_check_script.py runs it).
PROFILES: dict[str, dict] = {
    "cuda": dict(shape="qwen2.5-0.5b", dtype="bfloat16", n_prompts=64, group_size=8, max_tokens=256, steps=5,
                 steps_nosleep=2, steps_plain=3, lr=1e-4, num_train=2048, num_eval=64, micro_batch_tokens=16384,
                 gpu_memory_utilization=0.3, max_model_len=1024, logprob_tol=0.1),
    "cpu": dict(shape="tiny", dtype="float32", n_prompts=4, group_size=4, max_tokens=24, steps=3, steps_nosleep=2,
                steps_plain=2,
                lr=3e-3, num_train=256, num_eval=8, micro_batch_tokens=0, gpu_memory_utilization=0.3,
                max_model_len=512, logprob_tol=1e-3),
}


HF_PROFILE: dict[str, dict] = {"cuda": dict(steps=3, steps_nosleep=0, steps_plain=2), "cpu": dict(steps_nosleep=0)}


# ------------------------------------------------------------------------------------------ build


def word_problems(n: int, seed: int) -> list[dict]:
    """GSM8K-shaped rows {"question", "answer"}: the rationale, then "#### <final answer>"."""
    rng = random.Random(seed)
    names = ["Ava", "Ben", "Chloe", "Dan", "Eva", "Finn", "Gita", "Hugo", "Iris", "Jon", "Kai", "Lena"]
    items = ["apples", "books", "coins", "marbles", "pencils", "stickers", "cookies", "shells"]
    rows = []
    for _ in range(n):
        who, other = rng.sample(names, 2)
        item = rng.choice(items)
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        kind = rng.randrange(4)
        if kind == 0:
            q = f"{who} has {a} {item}. {other} gives {who} {b} more. How many {item} does {who} have now?"
            c, why = a + b, f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b}"
        elif kind == 1:
            a += b
            q = f"{who} had {a} {item} and gave {b} of them to {other}. How many {item} are left?"
            c, why = a - b, f"{a} - {b} = <<{a}-{b}={a - b}>>{a - b}"
        elif kind == 2:
            a, b = rng.randint(2, 12), rng.randint(2, 12)
            q = f"{who} buys {a} bags with {b} {item} in each bag. How many {item} does {who} buy?"
            c, why = a * b, f"{a} * {b} = <<{a}*{b}={a * b}>>{a * b}"
        else:
            b = rng.randint(2, 9)
            a = b * rng.randint(2, 15)
            q = f"{who} shares {a} {item} equally among {b} friends. How many {item} does each friend get?"
            c, why = a // b, f"{a} / {b} = <<{a}/{b}={a // b}>>{a // b}"
        rows.append({"question": q, "answer": f"{who} works it out: {why}.\n#### {c}"})
    return rows


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def greek_filler(k: int) -> str:
    """The k-th filler token's text: four Greek small letters (24**4 = 331,776 distinct)."""
    letters = [chr(c) for c in range(0x3B1, 0x3CA) if c != 0x3C2]  # alpha..omega without final sigma
    out = []
    for _ in range(4):
        k, r = divmod(k, len(letters))
        out.append(letters[r])
    return "".join(out)


def train_tokenizer(texts: list[str], bpe_vocab: int, model_vocab: int):
    """A byte-level BPE trained on `texts`, its vocabulary padded with filler tokens to exactly
    `model_vocab` ids, as a transformers PreTrainedTokenizerFast with EOS = pad = "<|endoftext|>".

    Why pad: a random model samples all `model_vocab` ids alike, and an id the tokenizer does not
    know cannot be decoded (by us or by vLLM's detokenizer). Fillers are vocabulary entries that no
    merge produces, so encoding never emits them; they decode to Greek letters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=bpe_vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    if len(vocab) > model_vocab:
        raise ValueError(f"BPE vocabulary {len(vocab)} exceeds the model's {model_vocab}")
    table = bytes_to_unicode()
    k = 0
    while len(vocab) < model_vocab:
        piece = "".join(table[b] for b in greek_filler(k).encode("utf-8"))
        k += 1
        if piece not in vocab:
            vocab[piece] = len(vocab)
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
                                   clean_up_tokenization_spaces=False, model_max_length=1 << 30)


def build(work: Path, shape: str, dtype: str, num_train: int, num_eval: int, seed: int = 0) -> dict:
    """Model folder, tokenizer and data under `work`; returns their paths and the parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.data.templates import template_text
    from rlvr.models import save_policy

    train = word_problems(num_train, seed)
    test = word_problems(num_eval, seed + 1)
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(data / f"{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    r1 = template_text("r1_zero")
    texts = [r1.replace("{question}", r["question"]) + " " + r["answer"].split("####")[0]
             + f" </think> <answer> {r['answer'].split('####')[1].strip()} </answer>" for r in train]
    shp = SHAPES[shape]
    tok = train_tokenizer(texts, BPE_VOCAB[shape], shp["vocab_size"])
    torch.manual_seed(seed)
    cfg = Qwen2Config(**shp, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                      use_sliding_window=False)
    model = Qwen2ForCausalLM(cfg).to({"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype])
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model_dir = work / "model"
    save_policy(model, tok, model_dir)
    n_params = sum(p.numel() for p in model.parameters())  # a tied weight is listed once
    prompt_lens = [len(tok.encode(r1.replace("{question}", r["question"]))) for r in train]
    return {"model_dir": str(model_dir), "train": str(data / "train.jsonl"), "test": str(data / "test.jsonl"),
            "n_params": n_params, "prompt_tokens_mean": statistics.fmean(prompt_lens),
            "bpe_vocab": BPE_VOCAB[shape], "vocab": shp["vocab_size"]}


# ------------------------------------------------------------------------------------------ train


class GpuMemorySampler:
    """Peak device memory (MiB, as nvidia-smi reports it: every process on the GPU) while it runs."""

    def __init__(self, index: str, period_s: float = 0.25):
        self.index, self.period_s = index, period_s
        self.peak_mib: float | None = None
        self.baseline_mib = self._read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> float | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", self.index], capture_output=True, text=True, timeout=10)
            return float(out.stdout.strip().splitlines()[0])
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def _loop(self):
        while not self._stop.is_set():
            v = self._read()
            if v is not None:
                self.peak_mib = v if self.peak_mib is None else max(self.peak_mib, v)
            self._stop.wait(self.period_s)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=15)


def trainer_overrides(a, built: dict, out_dir: Path, steps: int, sleep_mode: bool) -> list[str]:
    """The `rlvr train` command line of one run (everything a user would type)."""
    device = "cpu" if a.device == "cpu" else "cuda"
    return [
        f"model.name={built['model_dir']}", f"model.dtype={a.dtype}", f"model.device={device}",
        "model.master_weights=float32",
        # the held-out eval at the end of a run only with --eval (the checks do not read it); without it an
        # empty held-out file (data.num_eval=0 would mean every problem)
        "data.task=gsm8k", f"data.train_path={built['train']}",
        f"data.eval_path={built['test'] if a.eval else no_eval_file(built)}",
        "data.template=r1_zero", "data.reward=language", "data.num_train=0", f"data.num_eval={a.num_eval}",
        f"sampling.n_prompts={a.n_prompts}", f"sampling.group_size={a.group_size}",
        f"sampling.max_tokens={a.max_tokens}", "sampling.temperature=1.0",
        f"rollout.backend={a.backend}", f"rollout.gpu_memory_utilization={a.gpu_memory_utilization}",
        f"rollout.max_model_len={a.max_model_len}", f"rollout.sleep_mode={'true' if sleep_mode else 'false'}",
        "algo.advantage=grpo", "algo.loss=grpo_clip", "algo.aggregation=seq_mean_token_mean", "algo.kl_coef=0",
        f"algo.micro_batch_tokens={a.micro_batch_tokens}",
        f"optim.lr={a.lr}", "optim.warmup_steps=0",
        f"run.out_dir={out_dir}", f"run.steps={steps}", "run.overwrite=true", "run.progress=false",
        "run.eval_every=0", "run.log_samples_every=0", "run.checkpoint_every=0", "run.keep_checkpoints=1",
        f"run.seed={a.seed}",
    ]


def no_eval_file(built: dict) -> Path:
    """An empty held-out file beside the training data: a run ends without an evaluation."""
    path = Path(built["train"]).parent / "no_eval.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return path


def child_env(a) -> dict[str, str]:
    """No network for any child: hubs offline, vLLM usage stats off."""
    env = dict(os.environ)
    env.update({"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "RLVR_PROGRESS": "off"})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if a.device == "cpu":
        env.setdefault("RLVR_NUM_THREADS", "1")
    return env


def run_logged(cmd: list[str], log: Path, env: dict, timeout_s: float, mem: GpuMemorySampler | None) -> float:
    """Run `cmd` with its output in `log`; returns wall seconds; raises with the log's tail on failure."""
    t0 = time.perf_counter()
    with open(log, "w", encoding="utf-8") as f:
        if mem is not None:
            with mem:
                proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=ROOT)
        else:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s, cwd=ROOT)
    if proc.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)[-40:])
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed with status {proc.returncode}; log {log}:\n{tail}")
    return time.perf_counter() - t0


def read_metrics(run_dir: Path) -> list[dict]:
    """Training rows of a run's metrics.jsonl (one per step; rows of other writers are skipped)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [r for r in rows if "reward/mean" in r]


# ------------------------------------------------------------------------------------------- bare


def bare_stage(cfg: dict) -> dict:
    """Drive the generator directly (no trainer). cfg: backend, device, dtype, model_dir, final_dir,
    prompts, n, max_tokens, gpu_memory_utilization, max_model_len, seed. Returns numbers (JSON)."""
    import torch

    from rlvr.models import load_policy, load_tokenizer, score_tokens
    from rlvr.rollout import HFGenerator, SamplingSpec, rollouts_to_batch
    from rlvr.runtime import set_num_threads

    set_num_threads(None)  # RLVR_NUM_THREADS, as the trainer does: CPU figures stay comparable
    tok = load_tokenizer(cfg["model_dir"])
    device = "cpu" if cfg["device"] == "cpu" else "cuda"
    prompts = cfg["prompts"]
    t0 = time.perf_counter()
    if cfg["backend"] == "vllm":
        from rlvr.rollout.vllm_generator import VLLMGenerator

        engine = VLLMGenerator(cfg["model_dir"], tokenizer=tok, dtype=cfg["dtype"],
                               gpu_memory_utilization=cfg["gpu_memory_utilization"],
                               max_model_len=cfg["max_model_len"], enable_sleep_mode=True, seed=cfg["seed"])
    else:
        m0, _ = load_policy(cfg["model_dir"], dtype=cfg["dtype"], device=device)
        engine = HFGenerator(m0, tok, batch_size=max(64, len(prompts) * cfg["n"]))
    out: dict = {"engine_start_s": time.perf_counter() - t0, "engine": cfg["backend"]}
    if cfg["backend"] == "vllm":
        out["vllm"] = engine.vllm_version
        out["logprobs_mode"] = engine.logprobs_mode
    spec = SamplingSpec(n=cfg["n"], temperature=1.0, max_tokens=cfg["max_tokens"], stop=("</answer>",),
                        include_stop_str_in_output=True, seed=cfg["seed"] + 7)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    engine.generate(prompts[:2], SamplingSpec(n=2, max_tokens=8, seed=1))  # warm-up (graphs, caches)
    sync()
    t0 = time.perf_counter()
    rollouts = engine.generate(prompts, spec)
    sync()
    secs = time.perf_counter() - t0
    tokens = sum(len(r.response_ids) for r in rollouts)
    out.update({"generate_s": secs, "generated_tokens": tokens, "tokens_per_s": tokens / max(secs, 1e-9),
                "rollouts": len(rollouts)})

    def diff(model, rs, temperature: float = 1.0) -> tuple[float, float]:
        batch = rollouts_to_batch(rs, tok.pad_token_id)
        with torch.no_grad():
            s = score_tokens(model, batch.input_ids.to(device), batch.labels.to(device),
                             batch.attention_mask.to(device), micro_batch_size=16, temperature=temperature)
        m = batch.response_mask.bool()
        d = (s.logprobs.float().cpu() - batch.sampler_logprobs)[m].abs()
        return float(d.mean()), float(d.max())

    init_model, _ = load_policy(cfg["model_dir"], dtype=cfg["dtype"], device=device)
    final_model, _ = load_policy(cfg["final_dir"], dtype=cfg["dtype"], device=device)
    out["initial_engine_vs_initial_policy"] = diff(init_model, rollouts)
    # what rollout/logprob_diff would read if every push had been dropped: the sampler still on the
    # initial weights, the learner at its final ones
    out["initial_engine_vs_final_policy"] = diff(final_model, rollouts)
    del init_model
    engine.update_weights(final_model.named_parameters(), version=1)
    pushed = engine.generate(prompts, spec)
    out["pushed_engine_vs_final_policy"] = diff(final_model, pushed)
    out["pushed_weight_version"] = sorted({r.weight_version for r in pushed})
    # away from T = 1 the sampler must return the logprobs of the tempered distribution it sampled
    # (vLLM's processed_logprobs), which the trainer reproduces by scoring at the same temperature
    cool = engine.generate(prompts, SamplingSpec(n=cfg["n"], temperature=0.7, max_tokens=cfg["max_tokens"],
                                                 seed=cfg["seed"] + 11))
    out["pushed_engine_vs_final_policy_t0.7"] = diff(final_model, cool, temperature=0.7)
    if cfg["backend"] == "vllm":
        greedy = SamplingSpec(temperature=0.0, max_tokens=min(32, cfg["max_tokens"]))
        before = [r.response_ids for r in engine.generate(prompts, greedy)]
        engine.sleep()
        engine.wake_up()
        after = [r.response_ids for r in engine.generate(prompts, greedy)]
        out["sleep_wake_same_greedy"] = sum(x == y for x, y in zip(before, after, strict=True)) / len(before)
    return out


# ----------------------------------------------------------------------------------------- report


def _median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def _fmt(x, spec: str = ".3g") -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    return format(x, spec)


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _max_metric(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return max(vals) if vals else None


def trained_tokens(row: dict, rollout_batch: int, prompt_tokens_mean: float) -> float:
    """Prompt + response tokens the learner trained on in one step: the trainer's tokens/trained when
    it logs it, else kept share x (generated tokens + rollouts x mean prompt length)."""
    if row.get("tokens/trained") is not None:
        return float(row["tokens/trained"])
    kept = float(row.get("kept_frac", 1.0))
    gen = float(row.get("tokens/generated", row.get("len/mean", 0.0) * rollout_batch))
    return kept * (gen + rollout_batch * prompt_tokens_mean)


def step_table(rows: list[dict], rollout_batch: int, n_params: int, prompt_tokens_mean: float,
               peak_tflops: float | None) -> tuple[list[str], list[dict]]:
    """Markdown rows of the per-step table, and the derived numbers of each step."""
    lines = ["| step | rollouts' policy version | logprob diff mean | logprob diff max | generate s | train s | "
             "sync s | rollout tok/s | learner tok/s | MFU | cuda peak GiB |", "|---" * 11 + "|"]
    derived = []
    for r in rows:
        gen_tok = r.get("tokens/generated", r.get("len/mean", 0) * rollout_batch)
        t_gen, t_train = r.get("time/generate"), r.get("time/train")
        tt = trained_tokens(r, rollout_batch, prompt_tokens_mean)
        d = {"step": r["step"], "rollout_tok_s": gen_tok / t_gen if t_gen else None,
             "learner_tok_s": tt / t_train if t_train else None, "trained_tokens": tt}
        d["mfu"] = (6 * n_params * tt / t_train / (peak_tflops * 1e12)) if (t_train and peak_tflops) else None
        derived.append(d)
        lines.append(
            f"| {r['step']} | {_fmt(r.get('rollout/policy_version'), 'd') if r.get('rollout/policy_version') is not None else 'n/a'} "
            f"| {_fmt(r.get('rollout/logprob_diff_mean'))} | {_fmt(r.get('rollout/logprob_diff_max'))} "
            f"| {_fmt(t_gen, '.2f')} | {_fmt(t_train, '.2f')} | {_fmt(r.get('time/sync'), '.3f')} "
            f"| {_fmt(d['rollout_tok_s'], ',.0f')} | {_fmt(d['learner_tok_s'], ',.0f')} "
            f"| {_pct(d['mfu'])} "
            f"| {_fmt(r.get('mem/cuda_peak_gb'), '.1f')} |")
    return lines, derived


def checks(rows: list[dict], bare: dict, tol: float, steps: int) -> list[tuple[str, bool, str]]:
    """(name, passed, detail) of each verdict."""
    out = []
    diffs = [r.get("rollout/logprob_diff_mean") for r in rows]
    out.append(("every step logged", len(rows) == steps, f"{len(rows)} of {steps} rows"))
    ok = bool(diffs) and all(d is not None and d <= tol for d in diffs)
    out.append(("sampler == trainer logprobs at every step", ok,
                f"rollout/logprob_diff_mean {[_fmt(d) for d in diffs]} <= {tol}"))
    later = [d for d in diffs[1:] if d is not None]
    first = diffs[0] if diffs else None
    if later and first is not None:
        grew = max(later) > max(3 * first, tol / 10)
        out.append(("no drift after pushes", not grew,
                    f"step 1 {_fmt(first)}, later max {_fmt(max(later))} (drift = > 3x step 1 and > tol/10)"))
    versions = [r.get("rollout/policy_version") for r in rows]
    if all(v is not None for v in versions):
        ok = versions == [r["step"] - 1 for r in rows]
        out.append(("rollouts carry the previous step's weights", ok, f"policy versions {versions}"))
    stale = bare.get("initial_engine_vs_final_policy", (None, None))[0]
    pushed = bare.get("pushed_engine_vs_final_policy", (None, None))[0]
    if stale is not None and pushed is not None:
        moved = stale > 2 * tol
        out.append(("the learner's weights moved (else the push is untestable)", moved,
                    f"initial-weight rollouts under the final policy: mean |diff| {_fmt(stale)} > {2 * tol}"))
        out.append(("update_weights reaches the engine", pushed <= tol and pushed < stale / 2,
                    f"after the push {_fmt(pushed)} vs without it {_fmt(stale)}"))
    cool = bare.get("pushed_engine_vs_final_policy_t0.7", (None, None))[0]
    if cool is not None:
        out.append(("sampler == trainer logprobs at temperature 0.7", cool <= tol,
                    f"mean |diff| {_fmt(cool)} <= {tol} (both sides at T = 0.7)"))
    if "sleep_wake_same_greedy" in bare:
        out.append(("sleep/wake keeps greedy outputs", bare["sleep_wake_same_greedy"] == 1.0,
                    f"{bare['sleep_wake_same_greedy']:.0%} identical"))
    return out


def report(a, built: dict, runs: dict, bare: dict, env_info: dict, timings: dict) -> tuple[str, dict, bool]:
    """The markdown report, the raw numbers (JSON) and whether every check passed."""
    rollout_batch = a.n_prompts * a.group_size
    peak = a.peak_tflops if a.device != "cpu" else None
    main_rows = runs["sleep"]["rows"]
    lines = [f"# GPU check: `rlvr train` with {a.backend} rollouts (scripts/gpu_check.sh)", ""]
    lines += [f"- {k}: {v}" for k, v in env_info.items()]
    lines += [
        f"- model: random-init Qwen2, shape `{a.shape}`, {built['n_params']:,} parameters (tied embedding "
        f"counted once), {a.dtype} with fp32 master weights; byte-level BPE of {built['bpe_vocab']} tokens "
        f"trained here, padded to {built['vocab']:,}",
        f"- per step: {a.n_prompts} prompts x {a.group_size} samples = {rollout_batch} rollouts of up to "
        f"{a.max_tokens} tokens (mean prompt {built['prompt_tokens_mean']:.0f} tokens), temperature 1, reward "
        f"`language`, GRPO, lr {a.lr}, micro_batch_tokens {a.micro_batch_tokens}",
        "- stage wall times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()),
        "",
        f"## Per step, rollout.sleep_mode=true ({len(main_rows)} steps)",
        "",
        "Step 1 samples with the weights the engine loaded (version 0); every later step samples with the",
        "weights pushed by `update_weights` after the previous optimizer step. logprob diff = |sampler logprob -",
        "trainer logprob| over the response tokens (`rollout/logprob_diff_*`).",
        "",
    ]
    table, derived = step_table(main_rows, rollout_batch, built["n_params"], built["prompt_tokens_mean"], peak)
    lines += table
    later = derived[1:] or derived
    med = {k: _median([d[k] for d in later]) for k in ("rollout_tok_s", "learner_tok_s", "mfu")}
    lines += ["", "## Push check (bare generator, same prompts and sampling spec)", "",
              "| sampler | scored by | mean abs logprob diff | max |", "|---|---|---|---|"]
    for key, a_, b_ in (("initial_engine_vs_initial_policy", "engine with the initial weights", "initial policy"),
                        ("initial_engine_vs_final_policy", "engine with the initial weights (push dropped)",
                         "final policy"),
                        ("pushed_engine_vs_final_policy", "engine after update_weights(final)", "final policy"),
                        ("pushed_engine_vs_final_policy_t0.7", "the same, sampling at temperature 0.7",
                         "final policy at T = 0.7")):
        v = bare.get(key, (None, None))
        lines.append(f"| {a_} | {b_} | {_fmt(v[0])} | {_fmt(v[1])} |")
    lines += ["", "## Throughput", "", "| what | tokens/s | how |", "|---|---|---|",
              f"| rollout inside the trainer (median of steps 2..) | {_fmt(med['rollout_tok_s'], ',.0f')} | "
              "tokens/generated / time/generate (includes waking and putting the engine to sleep) |",
              f"| bare {a.backend} generate | {_fmt(bare.get('tokens_per_s'), ',.0f')} | "
              f"{bare.get('generated_tokens', 'n/a')} tokens in {_fmt(bare.get('generate_s'), '.2f')} s, engine "
              "already warm |",
              f"| learner (median of steps 2..) | {_fmt(med['learner_tok_s'], ',.0f')} | trained prompt+response "
              "tokens / time/train |",
              f"| learner MFU | {_pct(med['mfu'])} | "
              f"6 x {built['n_params']:,} x tokens / time/train / "
              f"{'n/a (CPU)' if peak is None else f'{peak:g} TFLOP/s'} |"]
    if "plain" in runs:
        _, d_plain = step_table(runs["plain"]["rows"], rollout_batch, built["n_params"], built["prompt_tokens_mean"],
                                peak)
        lp = d_plain[1:] or d_plain
        plain = {k: _median([d[k] for d in lp]) for k in ("learner_tok_s", "mfu")}
        t_shared = _median([r.get("time/train") for r in main_rows[1:] or main_rows])
        t_plain = _median([r.get("time/train") for r in runs["plain"]["rows"][1:] or runs["plain"]["rows"]])
        lines += ["", "## Shared prefix (default) vs every row whole (`algo.shared_prefix=false`)", "",
                  "The same trained tokens counted on both sides (every row's prompt + response), so the shared",
                  "prefix's MFU is an effective one: it does fewer FLOPs for the same tokens.", "",
                  "| learner | time/train s (median of steps 2..) | tokens/s | MFU |", "|---|---|---|---|",
                  f"| shared prefix, cascade attention | {_fmt(t_shared)} | {_fmt(med['learner_tok_s'], ',.0f')} | "
                  f"{_pct(med['mfu'])} |",
                  f"| every row whole | {_fmt(t_plain)} | {_fmt(plain['learner_tok_s'], ',.0f')} | "
                  f"{_pct(plain['mfu'])} |"]
    lines += ["", "## Peak memory", "",
              "| run | steps | device peak GiB (nvidia-smi, all processes) | device before the run GiB | "
              "learner max mem/cuda_peak_gb | max mem/rss_peak_gb |", "|---|---|---|---|---|---|"]
    for name, run in runs.items():
        rows = run["rows"]
        smi, base = run.get("smi_peak_mib"), run.get("smi_baseline_mib")
        label = {"sleep": "rollout.sleep_mode=true", "nosleep": "rollout.sleep_mode=false",
                 "plain": "algo.shared_prefix=false"}[name]
        lines.append(f"| {label} | {len(rows)} | "
                     f"{_fmt(smi / 1024 if smi is not None else None, '.1f')} | "
                     f"{_fmt(base / 1024 if base is not None else None, '.1f')} | "
                     f"{_fmt(_max_metric(rows, 'mem/cuda_peak_gb'), '.1f')} | "
                     f"{_fmt(_max_metric(rows, 'mem/rss_peak_gb'), '.1f')} |")
    verdicts = checks(main_rows, bare, a.logprob_tol, a.steps)
    if "nosleep" in runs:
        verdicts.append(("no-sleep run logged every step", len(runs["nosleep"]["rows"]) == a.steps_nosleep,
                         f"{len(runs['nosleep']['rows'])} of {a.steps_nosleep}"))
    if "plain" in runs:
        prow = runs["plain"]["rows"]
        pdiff = _max_metric(prow, "rollout/logprob_diff_mean")
        verdicts.append(("plain-forward run logged every step", len(prow) == a.steps_plain,
                         f"{len(prow)} of {a.steps_plain}"))
        verdicts.append(("plain forward: sampler vs trainer logprob diff within tolerance, as the shared one",
                         pdiff is not None and pdiff <= a.logprob_tol,
                         f"rollout/logprob_diff_mean at most {_fmt(pdiff)} (tol {a.logprob_tol:g})"))
    lines += ["", "## Checks", ""] + [f"- [{'PASS' if ok else 'FAIL'}] {n}: {d}" for n, ok, d in verdicts]
    ok = all(v for _, v, _ in verdicts)
    raw = {"config": vars(a), "built": built, "env": env_info, "timings_s": timings, "bare": bare,
           "runs": {k: {kk: vv for kk, vv in v.items()} for k, v in runs.items()}, "derived": derived,
           "checks": [{"name": n, "pass": v, "detail": d} for n, v, d in verdicts], "ok": ok}
    return "\n".join(lines) + "\n", raw, ok


# ------------------------------------------------------------------------------------------- main


def env_info(a) -> dict:
    import torch
    import transformers

    info = {"date": time.strftime("%Y-%m-%d %H:%M"), "torch": torch.__version__, "transformers": transformers.__version__}
    if a.device != "cpu":
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CUDA not available"
        try:
            drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip().splitlines()
            info["driver"] = drv[0] if drv else "?"
        except (OSError, subprocess.SubprocessError):
            pass
    if a.backend == "vllm":
        try:
            import importlib.metadata as md

            info["vllm"] = md.version("vllm")
        except Exception:  # noqa: BLE001 - reported, then the engine start fails with the real cause
            info["vllm"] = "not installed"
    return info


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["vllm", "hf"], default="vllm")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="= --backend hf --device cpu (tiny shape)")
    ap.add_argument("--shape", choices=sorted(SHAPES))
    ap.add_argument("--dtype", choices=["bfloat16", "float32"])
    for key in ("n_prompts", "group_size", "max_tokens", "steps", "steps_nosleep", "steps_plain", "num_train", "num_eval",
                "micro_batch_tokens", "max_model_len"):
        ap.add_argument("--" + key.replace("_", "-"), type=int, dest=key)
    for key in ("lr", "gpu_memory_utilization", "logprob_tol"):
        ap.add_argument("--" + key.replace("_", "-"), type=float, dest=key)
    ap.add_argument("--peak-tflops", type=float, default=H200_BF16_DENSE_TFLOPS,
                    help="dense bf16 peak of the GPU for MFU (default: H200, 989)")
    ap.add_argument("--eval", action="store_true",
                    help="end every run with the held-out eval of --num-eval problems (off by default: ~30 s per run "
                         "on an H200, and no check reads it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="working folder (default: a new temp folder, removed unless --keep-work)")
    ap.add_argument("--keep-work", action="store_true")
    ap.add_argument("--out", help="report (markdown; .json beside it). Default: benchmarks/results/gpu.md "
                                  "on a GPU, WORK/gpu.md on CPU")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="limit per stage")
    a = ap.parse_args(argv)
    if a.dry_run:
        a.backend, a.device = "hf", "cpu"
    if a.backend == "vllm" and a.device == "cpu":
        ap.error("--backend vllm needs --device cuda")
    # the hf sampler has no sleep mode (HFGenerator.sleep is a no-op): no second, identical run; and on a GPU
    # fewer steps, so that the check fits about 4 minutes of an H200 (issue 27)
    per_backend = HF_PROFILE[a.device] if a.backend == "hf" else {}
    for key, value in (PROFILES[a.device] | per_backend).items():
        if getattr(a, key, None) is None:
            setattr(a, key, value)
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_bare"]:  # stage 4 in its own process: a fresh engine, the GPU free of the trainer
        cfg = json.loads(Path(argv[1]).read_text())
        Path(argv[2]).write_text(json.dumps(bare_stage(cfg), indent=2))
        return 0
    a = parse_args(argv)
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="rlvr-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(a.out) if a.out else (ROOT / "benchmarks" / "results" / "gpu.md" if a.device != "cpu"
                                     else work / "gpu.md")
    env = child_env(a)
    gpu_index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip()
    use_smi = a.device != "cpu" and shutil.which("nvidia-smi") is not None
    timings: dict[str, float] = {}
    t_all = time.perf_counter()

    def stage(name: str):
        print(f"[gpu_check] {name} ...", flush=True)
        return time.perf_counter()

    t0 = stage(f"build: {a.shape} model, tokenizer, data in {work}")
    built = build(work, a.shape, a.dtype, a.num_train, a.num_eval, a.seed)
    timings["build"] = time.perf_counter() - t0
    print(f"[gpu_check]   {built['n_params']:,} parameters, {timings['build']:.0f} s", flush=True)

    runs: dict[str, dict] = {}
    # "plain": the learner without the shared-prefix forward (every row whole), to measure what the
    # shared prefix and its cascade attention (rlvr.models.prefix, rlvr.models.cascade) do on this GPU
    for name, steps, sleep_mode, extra in (("sleep", a.steps, True, []), ("nosleep", a.steps_nosleep, False, []),
                                           ("plain", a.steps_plain, True, ["algo.shared_prefix=false"])):
        if steps <= 0:
            continue
        t0 = stage(f"train: {steps} steps, rollout.sleep_mode={str(sleep_mode).lower()} {' '.join(extra)}")
        run_dir = work / f"run_{name}"
        cmd = [sys.executable, "-m", "rlvr.cli", "train",
               *trainer_overrides(a, built, run_dir, steps, sleep_mode), *extra]
        mem = GpuMemorySampler(gpu_index) if use_smi else None
        run_logged(cmd, work / f"train_{name}.log", env, a.timeout_s, mem)
        runs[name] = {"rows": read_metrics(run_dir), "run_dir": str(run_dir), "command": " ".join(cmd[2:])}
        if mem is not None:
            runs[name]["smi_peak_mib"] = mem.peak_mib
            runs[name]["smi_baseline_mib"] = mem.baseline_mib
        timings[f"train_{name}"] = time.perf_counter() - t0

    t0 = stage(f"bare: {a.backend} generator without the trainer")
    from rlvr.data import get_task
    from rlvr.train.policy import resolve_model_dir

    task = get_task("gsm8k")
    prompts = [task.prompt(ex, "r1_zero") for ex in task.load(built["train"])[: a.n_prompts]]
    bare_cfg = {"backend": a.backend, "device": a.device, "dtype": a.dtype, "model_dir": built["model_dir"],
                "final_dir": str(resolve_model_dir(work / "run_sleep")), "prompts": prompts, "n": a.group_size,
                "max_tokens": a.max_tokens, "gpu_memory_utilization": a.gpu_memory_utilization,
                "max_model_len": a.max_model_len, "seed": a.seed}
    (work / "bare_in.json").write_text(json.dumps(bare_cfg))
    if a.backend == "hf":  # in this process (no engine to start fresh; one process start less)
        os.environ.update({k: v for k, v in env.items() if k not in ("PYTHONPATH",)})
        bare = bare_stage(bare_cfg)
    else:  # a fresh process: a new vLLM engine, the GPU free of the trainer
        run_logged([sys.executable, str(Path(__file__).resolve()), "_bare", str(work / "bare_in.json"),
                    str(work / "bare_out.json")], work / "bare.log", env, a.timeout_s, None)
        bare = json.loads((work / "bare_out.json").read_text())
    timings["bare"] = time.perf_counter() - t0
    timings["total"] = time.perf_counter() - t_all

    text, raw, ok = report(a, built, runs, bare, env_info(a), timings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
    print(text)
    print(f"[gpu_check] {'ALL CHECKS PASSED' if ok else 'SOME CHECKS FAILED'}; report {out}, "
          f"{timings['total']:.0f} s in all", flush=True)
    if not a.work and not a.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
