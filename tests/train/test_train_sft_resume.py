"""SFT resume in-process: 4 steps in one go == 2 steps, then resume to 4 (metrics and weights)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from rlvr.config import load_config
from rlvr.train.config import SFTConfig
from rlvr.train.sft import train_sft

BASE = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=80", "data.num_eval=8", "data.digits=1", "algo.batch_size=8", "algo.micro_batch_size=4",
        "optim.lr=3e-3", "optim.warmup_steps=2", "optim.schedule=cosine", "run.checkpoint_every=2",
        "run.eval_every=2", "run.progress=false", "run.num_threads=1", "sampling.max_tokens=3"]


def _state(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [{k: v for k, v in r.items() if not k.startswith(("time", "tokens_per_s", "mem/", "perf/"))} for r in rows]
    ckpt = (run / "checkpoints" / "latest").read_text().strip()
    weights = load_file(str(next((run / "checkpoints" / ckpt / "model").glob("*.safetensors"))))
    return rows, weights


def test_sft_resume_matches_uninterrupted(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    train_sft(load_config(SFTConfig, None, BASE + ["run.steps=4", f"run.out_dir={full}"]))
    # same config (steps=4: same cosine schedule), stopped after step 2 like a preempted job
    first = train_sft(load_config(SFTConfig, None, BASE + ["run.steps=4", f"run.out_dir={cut}"]), stop_after=2)
    assert first.steps == 2 and (cut / "checkpoints" / "latest").read_text().strip() == "step_000002"
    train_sft(load_config(SFTConfig, None, BASE + ["run.steps=4", f"run.out_dir={cut}"]), resume=True)
    (ra, wa), (rb, wb) = _state(full), _state(cut)
    assert [r["step"] for r in ra] == [1, 2, 3, 4] and ra == rb
    assert ra[0]["loss"] > ra[-1]["loss"]
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_sft_on_prompt_response_jsonl_lowers_its_loss(tmp_path):
    path = tmp_path / "pairs.jsonl"
    # one fixed mapping to learn: the loss must fall well below its start
    path.write_text("".join(json.dumps({"prompt": f"{i}>", "response": str(9 - i)}) + "\n" for i in range(10)))
    out = tmp_path / "run"
    train_sft(load_config(SFTConfig, None, BASE + ["run.steps=30", f"run.out_dir={out}", f"data.sft_path={path}",
                                                   "run.eval_every=0", "optim.schedule=constant"]))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and rows[-1]["loss"] < 0.5 * rows[0]["loss"]
