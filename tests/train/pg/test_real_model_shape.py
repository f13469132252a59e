"""A real model's shape through the real trainer, and the memory figures logged each step.

The slow test builds a random-init model with the Qwen2.5-0.5B shape (494M parameters, vocabulary
151,936, tied embeddings) and a small byte-level BPE tokenizer trained in-process, saves them as a
Hugging Face folder, and runs ONE RL step of `rlvr.train.pg.loop.train` with model.name=<folder> in
bfloat16 with float32 master weights, gradient checkpointing and a token budget per micro-batch.
On the 2-core AVX2 development machine it takes about 5 minutes at one thread (4 of them in the
learner: CPU bf16 matmuls are slow, the LM-head backward above all) and peaks at 8.7 GiB of
resident memory (bf16 weights and gradients 0.9 + 0.9, float32 masters 1.8, AdamW moments 3.7).
"""

import math
import random

import pytest
import torch

from rlvr.runtime import memory_stats, reset_peak_memory

QWEN25_05B = "qwen2.5-0.5b"


def arithmetic_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Lines like "426+164=590": what the arithmetic task's prompts and answers look like."""
    rng = random.Random(seed)
    return [f"{a}+{b}={a + b}" for a, b in ((rng.randrange(1000), rng.randrange(1000)) for _ in range(n))]


def save_shaped_policy(path, shape: str = QWEN25_05B, vocab_size: int = 512):
    """A random-init model of `shape` in bf16 + a BPE tokenizer, saved with save_policy; returns path."""
    from rlvr.models import save_policy
    from rlvr.models.tiny import build_bpe_tokenizer, build_shaped_model

    tok = build_bpe_tokenizer(arithmetic_corpus(), vocab_size=vocab_size)
    model = build_shaped_model(shape, tok, dtype="bfloat16")
    save_policy(model, tok, path)
    del model
    return path


def test_memory_stats_and_per_step_peak():
    reset_peak_memory("cpu")
    before = memory_stats("cpu")
    assert {"mem/rss_peak_gb", "mem/rss_gb"} <= set(before)
    assert "mem/cuda_peak_gb" not in before  # CPU: no CUDA figures
    blob = b"x" * (300 << 20)  # 300 MiB, resident (every byte written)
    during = memory_stats("cpu")
    assert during["mem/rss_gb"] - before["mem/rss_gb"] > 0.25
    assert during["mem/rss_peak_gb"] >= during["mem/rss_gb"] - 1e-3
    del blob
    if "mem/rss_step_peak_gb" in during:  # Linux
        assert during["mem/rss_step_peak_gb"] >= during["mem/rss_gb"] - 1e-3
        reset_peak_memory("cpu")
        after = memory_stats("cpu")
        # the step peak restarts from the current RSS; the lifetime peak remembers the 300 MiB
        assert after["mem/rss_step_peak_gb"] < during["mem/rss_gb"] - 0.2
        assert after["mem/rss_peak_gb"] >= during["mem/rss_gb"] - 1e-3


def test_shaped_model_has_the_real_parameter_count():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.models.tiny import REAL_SHAPES

    # Counted on the meta device: no memory, no init time.
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**REAL_SHAPES[QWEN25_05B]))
    n = sum(p.numel() for p in model.parameters())
    # Qwen2.5-0.5B: 494,032,768 parameters (136M of them the tied 151,936 x 896 embedding)
    assert n == 494_032_768


@pytest.mark.slow
def test_one_rl_step_of_a_qwen2_5_0_5b_shaped_model_bf16_masters_checkpointing(tmp_path):
    from rlvr.train.config import AlgoConfig, DataConfig, ModelConfig, RunConfig, SamplingConfig, TrainConfig
    from rlvr.train.pg.loop import train

    folder = save_shaped_policy(tmp_path / "model")
    cfg = TrainConfig(
        model=ModelConfig(
            name=str(folder),
            dtype="bfloat16",
            master_weights="float32",
            gradient_checkpointing=True,
        ),
        data=DataConfig(task="arithmetic", num_train=8, num_eval=2),
        sampling=SamplingConfig(n_prompts=2, group_size=2, max_tokens=8),
        # rows are ~6 prompt + 8 response tokens: a 32-token budget makes 2 micro-batches of 2 rows
        algo=AlgoConfig(micro_batch_tokens=32),
        run=RunConfig(out_dir=str(tmp_path / "run"), steps=1, progress=False, log_samples_every=0),
    )
    res = train(cfg)
    m = res.last_metrics
    assert res.steps == 1
    assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert m["mem/rss_peak_gb"] > 1.0  # at least the bf16 weights (0.92 GiB) were resident
    print({k: round(v, 3) for k, v in m.items() if k.startswith(("mem/", "time/"))})

    # The optimizer really kept float32 masters (read with mmap: the file is ~5.5 GiB).
    ckpt = res.run_dir / "checkpoints" / "step_000001" / "optimizer.pt"
    state = torch.load(ckpt, mmap=True, weights_only=True, map_location="cpu")["state"]
    first = state[min(state)]
    assert first["master"].dtype == torch.float32 and first["exp_avg"].dtype == torch.float32
