"""The sharded learner (distributed.learner=fsdp2, rlvr.train.pg.sharded) against the one-process learner.

Default tier: a group of one (no launcher, in this process) trains exactly like the one-process learner,
its checkpoint holds the sharded state and the consolidated model, the one-process learner resumes from it,
and the combinations fsdp2 refuses name their keys.

Tier `scale` (`make test-scale`, in .ci/run): `torchrun --nproc_per_node 2 -m rlvr train` through the CLI,
2 gloo processes on CPU: GRPO with uneven shares (a rank runs zero-loss micro-batches) and PPO with a critic
equal one process after 3 steps; a run killed after its step-2 checkpoint and resumed on 2 shards equals the
straight run; one process resumes the 2-shard checkpoint (as a group of one, and as the plain learner);
`rlvr eval` loads the consolidated export; LoRA (model.lora_rank) on 2 shards equals 1 process and resumes.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import REPO
from safetensors.torch import load_file

from rlvr.config import ConfigError, load_config
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train

TINY = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "data.num_train=80",
    "data.num_eval=8",
    "data.digits=1",
    "data.reward=helpers.dense_reward:letter_share",  # tests/helpers/dense_reward.py: groups differ, every step moves the weights
    "sampling.max_tokens=6",
    "algo.kl_coef=0.05",
    "optim.lr=1e-3",
    "run.steps=3",
    "run.checkpoint_every=1",
    "run.eval_every=0",
    "run.progress=false",
    "run.num_threads=1",
]
# 3 prompts x 3 = 9 rows, micro-batches of 1 row: shares of 5 and 4 rows, so rank 1 runs a zero-loss
# micro-batch to pair FSDP's collectives; temperature 0.7: the loss reads the logits through a division
GRPO = ["sampling.n_prompts=3", "sampling.group_size=3", "algo.micro_batch_size=1", "sampling.temperature=0.7"]
PPO = ["sampling.n_prompts=4", "sampling.group_size=4", "algo.micro_batch_size=4", "algo.advantage=gae",
       "algo.critic=shared", "algo.kl_coef=0", "algo.epochs_per_rollout_batch=2", "algo.num_minibatches=2"]
LORA = [*GRPO, "model.lora_rank=4", "optim.lr=1e-2"]  # only the adapters train (model/ holds them: _adapter)
VOLATILE = ("time", "time/", "tokens_per_s", "mem/", "perf/")


def _weights(run: Path, step: int = 3) -> dict[str, torch.Tensor]:
    sd: dict[str, torch.Tensor] = {}
    for f in glob.glob(str(run / "checkpoints" / f"step_{step:06d}" / "model" / "*.safetensors")):
        sd.update(load_file(f))
    assert sd, f"no weights in {run}"
    return sd


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _same_metrics(a: list[dict], b: list[dict], rel: float = 1e-4) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        keys = {k for k in ra if not k.startswith(VOLATILE)}
        assert keys == {k for k in rb if not k.startswith(VOLATILE)}
        for k in keys:
            if isinstance(ra[k], float):
                assert rb[k] == pytest.approx(ra[k], rel=rel, abs=1e-6), (ra["step"], k)
            else:
                assert rb[k] == ra[k], (ra["step"], k)


# ------------------------------------------------------------------------------------ default tier


def _train_inprocess(out: Path, *extra: str):
    cfg = load_config(TrainConfig, None, [*TINY, *GRPO, f"run.out_dir={out}", *extra])
    return train(cfg)


def test_group_of_one_trains_like_the_one_process_learner_and_its_checkpoint_resumes_unsharded(tmp_path):
    _train_inprocess(tmp_path / "local")
    _train_inprocess(tmp_path / "fsdp", "distributed.learner=fsdp2")
    assert not torch.distributed.is_initialized()  # the group of one is closed with the run ...
    # ... and its rendezvous variables with it: a command this process starts next must not take rank 0 of a
    # group that is gone, nor the port its store still holds (EADDRINUSE)
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"} & set(os.environ)
    w_local, w_fsdp = _weights(tmp_path / "local"), _weights(tmp_path / "fsdp")
    assert _gap(w_local, w_fsdp) < 1e-6
    assert _gap(w_local, _weights(tmp_path / "local", 2)) > 1e-4  # the steps did move the weights
    _same_metrics(_metrics(tmp_path / "local"), _metrics(tmp_path / "fsdp"), rel=1e-5)
    ckpt = tmp_path / "fsdp" / "checkpoints" / "step_000003"
    meta = json.loads((ckpt / "meta.json").read_text())
    assert meta["shards"] == 1 and "sharded" in meta["files"] and not (ckpt / "optimizer.pt").exists()
    assert list((ckpt / "sharded").glob("*.distcp"))

    # the one-process learner resumes a sharded checkpoint: weights from model/, AdamW state from sharded/
    cut = tmp_path / "cut"
    shutil.copytree(tmp_path / "fsdp", cut)
    shutil.rmtree(cut / "checkpoints" / "step_000003")
    (cut / "checkpoints" / "latest").write_text("step_000002\n")
    cfg = load_config(TrainConfig, cut / "config.yaml", ["distributed.learner=local", f"run.out_dir={cut}"])
    train(cfg, resume=True)
    assert _gap(_weights(cut), w_fsdp) < 1e-6


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc (Linux)")
def test_a_sharded_command_never_tears_the_interpreter_down_with_the_process_group_alive(tmp_path):
    """`rlvr train ... distributed.learner=fsdp2` through the console entry (rlvr.cli.main), as a group of one:
    gloo's threads outlive destroy_process_group (torch's DTensor caches hold the group) and the interpreter's
    teardown aborted a finished rank with them alive (CI, the two-node resume: "terminate called without an
    active exception"). The probe (tests/helpers/teardown_probe.py) writes the threads alive when the teardown
    begins: on the old exit it listed gloo_tcp_loop and pt_gloo_runloop; rlvr.train.pg.sharded.exit_process ends
    the process before any teardown, having run the atexit handlers and flushed the output."""
    probe = tmp_path / "threads.txt"
    code = "import helpers.teardown_probe; from rlvr.cli import main; main()"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1",
           "RLVR_TEARDOWN_PROBE": str(probe)}
    r = subprocess.run([sys.executable, "-c", code, "train", *TINY, *GRPO, "run.steps=1", "distributed.learner=fsdp2",
                        f"run.out_dir={tmp_path / 'run'}"], env=env, capture_output=True, text=True, timeout=600,
                       cwd=ROOT)
    _ok(r)
    assert f"run directory: {tmp_path / 'run'}" in r.stdout  # the last line, flushed before the process ended
    gloo = [t for t in (probe.read_text().split() if probe.exists() else []) if "gloo" in t]
    assert not gloo, f"the interpreter's teardown began with the process group's threads alive: {gloo}"
    assert (tmp_path / "run" / "checkpoints" / "step_000001" / "meta.json").is_file()


@pytest.mark.parametrize("exc, status, says", [
    ("SystemExit(0)", 0, ""), ("SystemExit(None)", 0, ""), ("SystemExit(3)", 3, ""),
    ("SystemExit('bad key')", 1, "bad key"), ("RuntimeError('boom')", 1, "RuntimeError: boom"),
    ("KeyboardInterrupt()", 130, "KeyboardInterrupt"),
])
def test_exit_process_keeps_the_status_and_runs_the_atexit_handlers(exc, status, says):
    code = ("import atexit, sys; from rlvr.train.pg import sharded; "
            "atexit.register(lambda: print('atexit ran', flush=True)); "
            f"print('before', end=''); sharded.exit_process({exc})")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == status, r.stderr[-2000:]
    assert r.stdout == "beforeatexit ran\n"  # the unflushed print and the handler's
    assert says in r.stderr


@pytest.mark.parametrize("extra, key", [
    (["distributed.placement=ray", "distributed.num_learners=2"], "distributed.num_learners"),
    (["distributed.placement=ray", "distributed.max_staleness=1"], "distributed.max_staleness"),
    (["algo.advantage=gae", "algo.critic=separate"], "algo.critic"),
    (["algo.ref_refresh_every=2"], "algo.ref_refresh_every"),
    (["teacher.model=somewhere", "algo.kl_coef=0.1"], "teacher.model"),
])
def test_what_fsdp2_does_not_combine_with_is_refused_naming_the_key(extra, key):
    pytest.importorskip("ray") if "distributed.placement=ray" in extra else None
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(TrainConfig, None, [*TINY, "distributed.learner=fsdp2", *extra])


def test_lora_with_the_vllm_engine_is_refused_under_fsdp2():
    """Checked on the config object (this venv has no vllm, whose own check would speak first)."""
    from rlvr.train.config.pg import check_sharded

    cfg = load_config(TrainConfig, None, [*TINY, "distributed.learner=fsdp2", "model.lora_rank=4"])
    check_sharded(cfg)  # hf: fine
    cfg.rollout.backend = "vllm"
    with pytest.raises(ConfigError, match="adapter-only push"):
        check_sharded(cfg)


def test_unknown_learner_is_refused():
    with pytest.raises(ConfigError, match="distributed.learner"):
        load_config(TrainConfig, None, [*TINY, "distributed.learner=fsdp"])


# -------------------------------------------------------------------------------- 2 processes, CLI

ROOT = REPO


def _rlvr(n: int, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """`rlvr ...` as a user runs it: under torchrun with n processes (n > 1), else one process."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1",
           **(env_extra or {})}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n), "-m", "rlvr"] if n > 1 \
        else [sys.executable, "-m", "rlvr"]
    return subprocess.run([*launcher, *args], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The straight runs: GRPO and PPO on 1 process and on 2 shards."""
    root = tmp_path_factory.mktemp("sharded")
    for name, recipe in (("grpo", GRPO), ("ppo", PPO), ("lora", LORA)):
        _ok(_rlvr(1, "train", *TINY, *recipe, f"run.out_dir={root / name}_1"))
        _ok(_rlvr(2, "train", *TINY, *recipe, "distributed.learner=fsdp2", f"run.out_dir={root / name}_2"))
    return root


def _adapter(run: Path, step: int = 3) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{step:06d}" / "model" / "adapter_model.safetensors"))


@pytest.mark.scale
def test_lora_shards_train_like_one_process_and_resume(runs, tmp_path):
    """LoRA under fsdp2: only the adapters train (float32), merged pushes are gathered from the shards (the
    sampler-vs-learner logprob metrics equal one process's), the checkpoint holds the adapter and the base."""
    one, two = runs / "lora_1", runs / "lora_2"
    a1 = _adapter(one)
    assert _gap(a1, _adapter(one, 2)) > 1e-3  # the adapter moved ...
    assert _gap(a1, _adapter(two)) < 1e-5  # ... the same way on 2 shards
    assert all(v.dtype == torch.float32 for v in _adapter(two).values())
    _same_metrics(_metrics(one), _metrics(two))
    assert (two / "base_model" / "config.json").exists()
    run = tmp_path / "killed"
    r = _rlvr(2, "train", *TINY, *LORA, "distributed.learner=fsdp2", f"run.out_dir={run}",
              env_extra={"RLVR_DEBUG_KILL_AT_STEP": "2"})
    assert r.returncode != 0 and not (run / "checkpoints" / "step_000003").exists()
    _ok(_rlvr(2, "train", "--resume", str(run)))
    assert _gap(_adapter(run), _adapter(two)) < 1e-7


@pytest.mark.scale
@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_two_shards_train_like_one_process(runs, name):
    one, two = runs / f"{name}_1", runs / f"{name}_2"
    assert json.loads((two / "checkpoints" / "step_000003" / "meta.json").read_text())["shards"] == 2
    assert len(list((two / "checkpoints" / "step_000003" / "sharded").glob("*.distcp"))) == 2
    w1 = _weights(one)
    assert _gap(w1, _weights(one, 2)) > 1e-4  # the last step moved the weights ...
    assert _gap(w1, _weights(two)) < 1e-5  # ... and 2 shards moved them the same way (summation order only)
    _same_metrics(_metrics(one), _metrics(two))
    if name == "ppo":
        assert all(r["critic/value_loss"] > 0 for r in _metrics(two))
        c1 = torch.load(one / "checkpoints" / "step_000003" / "critic.pt", weights_only=True)
        c2 = torch.load(two / "checkpoints" / "step_000003" / "critic.pt", weights_only=True)
        for k, v in c1["head"].items():
            assert torch.allclose(v, c2["head"][k], atol=1e-5), k


@pytest.mark.scale
def test_killed_sharded_run_resumes_on_two_shards_and_on_one(runs, tmp_path):
    straight = runs / "grpo_2"
    run = tmp_path / "killed"
    r = _rlvr(2, "train", *TINY, *GRPO, "distributed.learner=fsdp2", f"run.out_dir={run}",
              env_extra={"RLVR_DEBUG_KILL_AT_STEP": "2"})
    assert r.returncode != 0 and (run / "checkpoints" / "step_000002" / "meta.json").exists()
    assert not (run / "checkpoints" / "step_000003").exists()
    copies = {k: tmp_path / k for k in ("one_sharded", "one_plain")}
    for path in copies.values():
        shutil.copytree(run, path)
    _ok(_rlvr(2, "train", "--resume", str(run)))
    assert _gap(_weights(run), _weights(straight)) < 1e-7
    _same_metrics(_metrics(straight), _metrics(run), rel=1e-6)
    # one process: a group of one (the config's learner), and the one-process learner
    _ok(_rlvr(1, "train", "--resume", str(copies["one_sharded"])))
    _ok(_rlvr(1, "train", "--resume", str(copies["one_plain"]), "distributed.learner=local"))
    for path in copies.values():
        assert _gap(_weights(path), _weights(straight)) < 1e-5
        _same_metrics(_metrics(straight), _metrics(path))


@pytest.mark.scale
def test_rlvr_eval_loads_the_consolidated_export(runs, tmp_path):
    outs = {}
    for name in ("grpo_1", "grpo_2"):
        out = tmp_path / f"{name}.json"
        _ok(_rlvr(1, "eval", str(runs / name), f"run.out={out}"))
        outs[name] = json.loads(out.read_text())
    for k in ("accuracy", "reward", "len/mean"):
        assert outs["grpo_2"][k] == pytest.approx(outs["grpo_1"][k], abs=1e-9), k
    assert outs["grpo_2"]["problems"] == 8
