"""`rlvr train data.task=reasoning_gym:<dataset>` through the installed script (issue 40 item 5), then `rlvr eval` and
`rlvr filter` on the run: two generators (leg_counting, chain_sum), the tiny model, 2 steps; the logged rewards are
reasoning-gym's own score_answer of the responses. Skips without reasoning_gym (pip install 'rlvr[reasoning-gym]')."""

from __future__ import annotations

import json

import pytest
from helpers.cli import TINY, refused, run_rlvr

rg = pytest.importorskip("reasoning_gym")

pytestmark = pytest.mark.cli

GENERATORS = {"leg_counting": ["data.rg.min_animals=1", "data.rg.max_animals=2", "data.rg.max_instances=3"],
              "chain_sum": ["data.rg={max_terms: 2, max_digits: 1}"]}
SIZES = [o for o in TINY if not o.startswith("data.digits")]  # the arithmetic task's knob; not this task's


def _ok(res) -> None:
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_train_then_eval_and_filter_a_reasoning_gym_task(name, tmp_path):
    run = tmp_path / "run"
    _ok(run_rlvr("train", f"data.task=reasoning_gym:{name}", *GENERATORS[name], *SIZES, "run.steps=2",
                 "run.log_samples_every=1", "run.num_log_samples=2", f"run.out_dir={run}"))
    rows = _rows(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("reward/mean" in r and r["verifier/errors"] == 0 for r in rows)
    assert "eval/accuracy" in rows[-1] and "eval/reward" in rows[-1]  # the final held-out evaluation ran
    # each logged reward is reasoning-gym's score of the response (its default scorer reads the entry's answer)
    own = rg.get_score_answer_fn(name)
    samples = _rows(run / "samples.jsonl")
    assert len(samples) == 4
    for s in samples:
        answer = s["response"].strip()
        expected = own(answer, {"question": s["prompt"], "answer": s["reference"], "metadata": {}}) if answer else 0.0
        assert s["reward"] == pytest.approx(expected), s

    out = tmp_path / "eval.json"
    res = run_rlvr("eval", str(run), f"run.out={out}")
    _ok(res)
    assert f"reasoning_gym:{name}" in res.stdout + res.stderr
    metrics = json.loads(out.read_text())
    assert 0.0 <= metrics["accuracy"] <= 1.0 and "reward" in metrics

    if name == "chain_sum":  # `rlvr filter` takes the task too, and its rows load back for training
        kept = tmp_path / "filtered"
        res = run_rlvr("filter", f"model.init_from={run}", "data.num_train=6", "--k", "2", "--band", "[0,1]",
                       f"run.out_dir={kept}")
        _ok(res)
        rows = _rows(kept / "train.jsonl")
        assert len(rows) == 6 and all(r["meta"]["rg_dataset"] == name for r in rows)
        assert f"data.task=reasoning_gym:{name}" in res.stdout


def test_unknown_dataset_is_refused_before_the_model_loads(tmp_path):
    res = run_rlvr("train", "data.task=reasoning_gym:leg_countng", *SIZES, f"run.out_dir={tmp_path / 'r'}")
    refused(res, "data.task='reasoning_gym:leg_countng'", "reasoning_gym:leg_counting")
    assert not (tmp_path / "r").exists()
