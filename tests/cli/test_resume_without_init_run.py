"""Issue 37, item 15: a resume needs only the run directory. A run started from another run (model.init_from)
whose start run was deleted resumes from its own checkpoint, its KL reference (the start policy) restored from
the copy the run keeps (RUN/ref_policy/step_000000.pt), and ends equal to the uninterrupted run; a run that
kept no copy of its reference says what to give instead of training against the wrong one."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import TESTS
from safetensors.torch import load_file

from rlvr.config import ConfigError, load_config
from rlvr.train.config import SFTConfig, TrainConfig, resuming
from rlvr.train.pg.loop import train
from rlvr.train.sft import train_sft

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "run.progress=false", "run.num_threads=1",
        "run.eval_every=0"]
RL = ["data.reward=helpers.dense_reward:letter_share", "sampling.n_prompts=2", "sampling.group_size=4", "sampling.max_tokens=4",
      "algo.kl_coef=0.1", "optim.lr=1e-2", "run.checkpoint_every=2"]
TIMING = ("time", "time/", "tokens_per_s", "mem/", "perf/", "eval/")  # (eval/: after a run's last step)


def _metrics(run):
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def _weights(run):
    return load_file(str(sorted((run / "checkpoints").glob("step_*"))[-1] / "model" / "model.safetensors"))


@pytest.fixture(scope="module")
def start_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "start"
    train_sft(load_config(SFTConfig, None, [*TINY, "run.steps=3", f"run.out_dir={out}"]))
    return out


def _rl(out, init, steps, resume=False):
    args = [*TINY, *RL, f"model.init_from={init}", f"run.steps={steps}", f"run.out_dir={out}"]
    if not resume:
        return load_config(TrainConfig, None, args)
    with resuming(out):  # what `rlvr train --resume OUT` loads its config under
        return load_config(TrainConfig, None, args)


def test_resume_after_the_start_run_was_deleted_equals_the_straight_run(start_run, tmp_path):
    init = tmp_path / "init"
    shutil.copytree(start_run, init)
    train(_rl(tmp_path / "straight", init, 4))
    train(_rl(tmp_path / "halves", init, 2))
    assert (tmp_path / "halves" / "ref_policy" / "step_000000.pt").is_file()
    shutil.rmtree(init)  # the start run is gone: only the run directory is left
    with pytest.raises(ConfigError, match="init: no such run"):  # a new run still needs its start run
        _rl(tmp_path / "new", init, 4)
    train(_rl(tmp_path / "halves", init, 4, resume=True), resume=True)
    assert _metrics(tmp_path / "halves") == _metrics(tmp_path / "straight")
    a, b = _weights(tmp_path / "halves"), _weights(tmp_path / "straight")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(r["kl"] > 0 and r["grad_norm"] > 0 for r in _metrics(tmp_path / "straight")[1:])  # it learned


def test_a_run_without_its_reference_copy_names_what_to_give(start_run, tmp_path):
    init = tmp_path / "init"
    shutil.copytree(start_run, init)
    train(_rl(tmp_path / "run", init, 2))
    (tmp_path / "run" / "ref_policy" / "step_000000.pt").unlink()  # a run made before the copy was kept
    shutil.rmtree(init)
    with pytest.raises(ConfigError, match=r"model.init_from=.*init is gone.*start policy.*model.init_from="):
        train(_rl(tmp_path / "run", init, 4, resume=True), resume=True)


@pytest.mark.cli
def test_rlvr_train_resume_needs_only_the_run_directory(start_run, tmp_path):
    import os
    import subprocess
    import sys

    init = tmp_path / "init"
    shutil.copytree(start_run, init)
    train(_rl(tmp_path / "run", init, 2))
    shutil.rmtree(init)
    env = {**os.environ, "RLVR_NUM_THREADS": "1", "RLVR_PROGRESS": "off",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    res = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", "--resume", str(tmp_path / "run"),
                          "run.steps=3"], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "is gone; the policy is loaded from the run's checkpoint step_000002" in res.stderr
    assert len(_metrics(tmp_path / "run")) == 3
