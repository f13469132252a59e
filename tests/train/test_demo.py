"""`rlvr demo`: the pipeline end to end at toy size (default suite), and the full demo's acceptance
targets on the median of three seeds (slow; benchmarks/demo.py records the timing)."""

from __future__ import annotations

import json
import statistics

import pytest

from rlvr.config import load_config
from rlvr.train.demo import DemoConfig, result_table, run_demo


def test_demo_pipeline_runs_end_to_end_at_toy_size(tmp_path, capsys):
    cfg = load_config(DemoConfig, None, [
        f"out_dir={tmp_path}", "hidden_size=32", "num_train=600", "sft_examples=300", "num_eval=20",
        "sft_steps=20", "sft_eval_every=10", "rl_steps=2", "n_prompts=4", "group_size=4", "progress=false",
        "num_threads=1"])
    res = run_demo(cfg)
    out = capsys.readouterr().out
    assert "after SFT" in out and "after GRPO" in out and "greedy accuracy" in out and str(res.rl_dir) in out
    summary = json.loads((tmp_path / "demo.json").read_text())
    for side in ("before", "after"):
        for key in ("greedy/accuracy", "sampled/accuracy", "greedy/len/mean"):
            assert 0 <= summary[side][key] <= (1 if "len" not in key else cfg.max_tokens), (side, key)
        # sums are answered with a bare number: no format part, so the rate is not applicable (null)
        assert summary[side]["greedy/format_rate"] is None
    assert "format rate (greedy)" in out and "n/a" in out
    assert summary["delta_greedy_points"] == pytest.approx(100 * res.delta("greedy/accuracy"))
    assert (res.sft_dir / "checkpoints" / "latest").exists() and (res.rl_dir / "checkpoints" / "latest").exists()
    assert list((res.rl_dir / "plots").glob("*.png"))
    # SFT's stopping check runs on a validation slice of the training problems: logged as val/*, so its
    # plot cannot be read as the held-out figure of the table (it was eval/accuracy: 28% vs the table's 34%)
    sft_rows = [json.loads(x) for x in (res.sft_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("val/accuracy" in r for r in sft_rows) and not any("eval/accuracy" in r for r in sft_rows)
    rows = [json.loads(x) for x in (res.rl_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "greedy accuracy" in result_table(res)


@pytest.mark.slow
def test_full_demo_meets_its_targets(tmp_path):
    # The demo's targets (+15 greedy, +8 sampled points on 200 held-out problems) on the median of seeds
    # 0-2, so no single trajectory decides: floats differ between CPUs unless pinned (tests/conftest.py).
    # Measured greedy / sampled points, pinned kernels: +39.5 / +25.0, +20.5 / +19.5, +35.5 / +22.0;
    # native AVX2 (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR unset): +17.0 / +23.0, +28.0 / +17.0, +30.0 / +24.5.
    greedy, sampled = [], []
    for seed in (0, 1, 2):
        res = run_demo(load_config(DemoConfig, None, [f"out_dir={tmp_path / str(seed)}", f"seed={seed}",
                                                      "progress=false", "num_threads=1"]))
        greedy.append(res.delta("greedy/accuracy"))
        sampled.append(res.delta("sampled/accuracy"))
    assert statistics.median(greedy) >= 0.15, greedy
    assert statistics.median(sampled) >= 0.08, sampled
