"""Learning test (scale tier): `rlvr train data.env=external` with an agent program rlvr does not know
(tests/fixtures/agents/digits_agent.py: two chat turns over the official openai client with a tool message in
between, its reward the share of digits in the policy's two replies) raises the reward of a tiny random policy,
through the CLI. The measure: the mean training reward of the last 3 steps minus that of the first 3 (12 steps of
2 problems x 4 episodes), median over three seeds.

Measured 2026-12-07 at 695d419 (reward, mean of the first 3 steps -> the last 3; CPU kinds: the pinned kernels of
tests/conftest.py, and the native AVX2 path, ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AUTO), about 90 s a seed:

    seed   pinned                  avx2
    0      0.106 -> 0.632 +0.525   0.098 -> 0.288 +0.190
    1      0.129 -> 0.505 +0.377   0.113 -> 0.393 +0.280
    2      0.132 -> 0.545 +0.413   0.090 -> 0.650 +0.560
    median                 +0.413                  +0.280

(Before the gateway's batching and message splice settled, the same test gave medians +0.454 pinned and +0.530
AVX2, weakest seed +0.227.) The margin asserted, median gain >= 0.15, is under the weakest single seed seen
(+0.190). The gateway batches the calls that arrive together, so two runs of one seed can differ in their random
numbers (rlvr.gateway.server's docstring); the median over seeds and the margin hold for that spread.
"""

from __future__ import annotations

import json
import shlex
import statistics
import sys

import pytest
from helpers import TESTS
from helpers.cli import run_rlvr

pytest.importorskip("openai")
SEEDS = (0, 1, 2)
STEPS = 12
MIN_MEDIAN_GAIN = 0.15  # see the docstring's measurements
AGENT = f"{shlex.quote(sys.executable)} {TESTS / 'fixtures' / 'agents' / 'digits_agent.py'}"


def _gain(run_dir) -> tuple[float, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    reward = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert len(reward) == STEPS and all(r.get("gateway/error_frac", 1.0) == 0.0 for r in rows if "reward/mean" in r)
    return statistics.mean(reward[:3]), statistics.mean(reward[-3:])


@pytest.mark.scale
def test_external_agent_reward_rises_through_the_cli(tmp_path):
    gains = []
    for seed in SEEDS:
        out = tmp_path / f"s{seed}"
        res = run_rlvr("train", "data.env=external", f"external.command={AGENT}", "data.task=arithmetic",
                       "sampling.n_prompts=2", "sampling.group_size=4", f"run.steps={STEPS}", "data.num_eval=0",
                       "optim.lr=1e-2", f"run.seed={seed}", f"run.out_dir={out}", "run.progress=false",
                       timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        first, last = _gain(out)
        gains.append(last - first)
        print(f"seed {seed}: reward {first:.3f} -> {last:.3f} ({last - first:+.3f})")
    assert statistics.median(gains) >= MIN_MEDIAN_GAIN, gains
