"""LoRA through `rlvr train` (model.lora_rank): a run killed right after a checkpoint and resumed equals the
uninterrupted run bit for bit (metrics and adapter), its checkpoints hold only the adapter (+ the base once
per run), `rlvr eval` of the run evaluates base + adapter merged, and PPO's separate critic trains with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from rlvr.config import load_config  # noqa: E402
from rlvr.models import load_policy, lora  # noqa: E402
from rlvr.rollout import HFGenerator, SamplingSpec  # noqa: E402
from rlvr.train.config import EvalConfig, TrainConfig  # noqa: E402
from rlvr.train.evaluation import evaluate_policy  # noqa: E402
from rlvr.train.pg.loop import train  # noqa: E402

TINY = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
    "model.lora_rank=4", "model.lora_alpha=8",
    "data.num_train=80", "data.num_eval=8", "data.digits=1",
    "data.reward=language",  # dense reward: a random tiny model gets signal, so the adapter and Adam state move
    "sampling.n_prompts=4", "sampling.group_size=4", "sampling.max_tokens=4",
    "algo.train_batch_size=8",  # 2 optimizer steps per rollout batch
    "algo.kl_coef=0.05",  # the reference (adapter off) in play
    "optim.lr=2e-2", "optim.warmup_steps=1", "optim.schedule=cosine",
    "run.steps=4", "run.checkpoint_every=2", "run.progress=false", "run.num_threads=1",
]
TIMING = ("time", "time/", "tokens_per_s", "mem/", "perf/")


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _adapter(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return load_file(str(run / "checkpoints" / latest / "model" / lora.ADAPTER_WEIGHTS))


def _greedy(model, tok, prompt: str) -> str:
    gen = HFGenerator(model, tok)
    return gen.generate([prompt], SamplingSpec(n=1, temperature=0.0, max_tokens=4, seed=0))[0].text


def test_lora_run_killed_and_resumed_matches_the_uninterrupted_run(tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    train(load_config(TrainConfig, None, [*TINY, f"run.out_dir={full}"]))

    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off", "RLVR_DEBUG_KILL_AT_STEP": "2"}
    killed = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", *TINY, f"run.out_dir={cut}"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (cut / "checkpoints" / "latest").read_text().strip() == "step_000002"
    train(load_config(TrainConfig, str(cut / "config.yaml"), []), resume=True)

    a, b = _metrics(full), _metrics(cut)
    assert [r["step"] for r in a] == [1, 2, 3, 4]
    assert a == b  # rewards, losses, grad norms, KL, lr, eval: all identical
    assert a[-1]["kl"] > 0  # the policy (adapter on) moved away from the reference (adapter off)
    wa, wb = _adapter(full), _adapter(cut)
    assert wa.keys() == wb.keys() and any(".lora_B." in k for k in wa)
    assert any(float(t.abs().max()) > 0 for k, t in wa.items() if ".lora_B." in k)  # the adapter trained
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    for run in (full, cut):  # adapter only in the checkpoints; the base once, in RUN/base_model
        ckpt = run / "checkpoints" / "step_000004"
        assert not list((ckpt / "model").glob("model*.safetensors"))
        assert (run / "base_model" / "model.safetensors").exists()

    # rlvr eval of the run: base + adapter merged, greedy, the run's task; its responses are those of the base
    # with W + (alpha / r) * B @ A added by hand from the checkpoint's files
    ev = evaluate_policy(load_config(EvalConfig, None, [f"model.init_from={full}", "data.digits=1", "data.num_eval=8",
                                                        "sampling.max_tokens=4", f"run.out={tmp_path / 'ev.json'}"]))
    assert ev.metrics()["accuracy"] == pytest.approx(a[-1]["eval/accuracy"])  # what the run measured at its end
    samples = [json.loads(x) for x in ev.samples_path.read_text().splitlines()]
    base, tok = load_policy(full / "base_model")
    assert [_greedy(base, tok, s["prompt"]) for s in samples] != [s["response"] for s in samples]
    params = dict(base.named_parameters())
    with torch.no_grad():
        for k, a_mat in wa.items():
            if ".lora_A." in k:
                name = k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")
                params[name] += (8 / 4) * wa[k.replace(".lora_A.", ".lora_B.")] @ a_mat
    assert [_greedy(base, tok, s["prompt"]) for s in samples] == [s["response"] for s in samples]


def test_ppo_separate_critic_trains_with_a_lora_policy(tmp_path):
    cfg = load_config(TrainConfig, None, [*TINY, "run.steps=2", f"run.out_dir={tmp_path / 'ppo'}",
                                          "algo.advantage=gae", "algo.critic=separate", "algo.kl_coef=0"])
    res = train(cfg)
    rows = _metrics(res.run_dir)
    assert rows[-1]["critic/grad_norm"] > 0 and rows[-1]["critic/value_loss"] > 0
    critic = torch.load(res.run_dir / "checkpoints" / "step_000002" / "critic.pt", weights_only=True)
    assert any(".lora_B." in k for k in critic["trunk"])  # the critic's trunk: its own adapter on the frozen base
