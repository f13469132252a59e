"""perf/* metrics of the RL trainer (issue 27 item 4): MFU and tokens/s every step, against a peak that is
a setting (run.peak_tflops) with known GPUs' defaults (rlvr.runtime.PEAK_BF16_TFLOPS)."""

from __future__ import annotations

import json

import pytest

from rlvr.config import load_config
from rlvr.runtime import peak_for_name, peak_tflops
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train

TINY = ["model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "model.tie_embeddings=true", "data.num_train=40", "data.num_eval=0", "data.digits=1",
        "sampling.n_prompts=2", "sampling.group_size=4", "sampling.max_tokens=4", "run.steps=2",
        "run.log_samples_every=0", "run.progress=false", "optim.lr=1e-3"]


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def test_perf_metrics_every_step_with_the_hand_counted_flops(tmp_path):
    from rlvr.train.policy import policy_from_config

    cfg = load_config(TrainConfig, None, [*TINY, f"run.out_dir={tmp_path / 'run'}", "run.peak_tflops=0.5"])
    res = train(cfg)
    rows = _rows(res.run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # N by hand from the config: embedding (tied: the LM head is the same matrix) + per layer q/k/v (with
    # biases) / o, the MLP's three matrices, two norms; the final norm
    m = cfg.model
    h, f, layers = m.hidden_size, m.intermediate_size, m.num_layers
    model, _ = policy_from_config(cfg.model, seed=0)
    v = model.config.vocab_size
    kv = model.config.num_key_value_heads * (h // model.config.num_attention_heads)
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * f + 2 * h
    n = v * h + layers * per_layer + h
    assert n == sum(p.numel() for p in model.parameters())  # the tied head counted once, not twice
    for r in rows:
        assert r["tokens/trained"] > 0 and r["time/train"] > 0
        # the FLOPs done (rlvr.runtime.FlopCounter, hand-counted in tests/runtime/test_flops.py): each group's prompt once,
        # attention and the LM head included; below 6 N per trained token here (4-token answers after shared prompts)
        assert 0 < r["perf/flops"] < 6 * n * r["tokens/trained"]
        assert r["perf/mfu"] == pytest.approx(r["perf/flops"] / r["time/train"] / 0.5e12, rel=1e-9)
        assert r["perf/learner_tokens_per_s"] == pytest.approx(r["tokens/trained"] / r["time/train"], rel=1e-9)
        assert r["perf/rollout_tokens_per_s"] == pytest.approx(r["tokens/generated"] / r["time/generate"], rel=1e-9)


def test_no_mfu_on_cpu_without_a_configured_peak(tmp_path):
    cfg = load_config(TrainConfig, None, [*TINY, "run.steps=1", f"run.out_dir={tmp_path / 'run'}"])
    (row,) = _rows(train(cfg).run_dir)
    assert "perf/mfu" not in row  # CPU: no known peak, so no made-up MFU
    assert row["perf/learner_tokens_per_s"] > 0 and row["perf/rollout_tokens_per_s"] > 0


def test_peak_table_matches_device_names():
    assert peak_for_name("NVIDIA H200") == 989.0
    assert peak_for_name("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_for_name("NVIDIA H100 PCIe") == 756.0
    assert peak_for_name("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_for_name("NVIDIA GH200 480GB") == 989.0
    assert peak_for_name("NVIDIA B200") == 2250.0 and peak_for_name("NVIDIA GB200") == 2500.0
    assert peak_for_name("NVIDIA L40S") == 362.0 and peak_for_name("NVIDIA L40") == 181.0
    assert peak_for_name("NVIDIA A10G") == 70.0 and peak_for_name("NVIDIA A10") == 125.0
    assert peak_for_name("Some Future Accelerator") == 0.0
    assert peak_tflops("cpu") == 0.0 and peak_tflops("cpu", configured=123.0) == 123.0


def test_peak_tflops_must_not_be_negative():
    from rlvr.config import ConfigError

    with pytest.raises((ConfigError, ValueError), match="run.peak_tflops"):
        load_config(TrainConfig, None, ["run.peak_tflops=-1"])
