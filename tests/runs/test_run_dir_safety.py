"""Issue 37, items 3, 7, 9, 10, 12 and 13: a run directory is never written over someone else's files, never
written by two processes, never left with a torn config.yaml; a damaged or unwritable checkpoint is said
plainly, with the intact one to resume from; a LoRA base's interrupted copy is cleaned up; the ranks of a
SIGKILLed torchrun die with it.

Fast tier: the library functions directly, and `rlvr train` in-process (CliRunner) where it refuses before any
model is loaded (a test that would otherwise train on today's code stops at `session.start`)."""

from __future__ import annotations

import builtins
import errno
import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.runs import checkpoint as ckpt_mod
from rlvr.runs.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from rlvr.runs.rundir import RunDir

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2", "sampling.group_size=2",
        "sampling.max_tokens=4", "run.progress=false", "run.num_threads=1", "run.report_to=none"]
USER_CONFIG = "# my experiment: keep this comment\nalgo:\n  loss: grpo_clip  # the paper's\n"


def _invoke(*args: str, cwd: Path | None = None):
    if cwd is None:
        return CliRunner().invoke(app, list(args))
    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(app, list(args))
    finally:
        os.chdir(old)


class _NoTraining(Exception):
    """Raised instead of loading a model: the command got past every check it should have failed."""


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*_a, **_k):
        raise _NoTraining("the command went on to load the model")

    monkeypatch.setattr("rlvr.train.session.start", refuse)


def _linear():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


# ------------------------------------------------------------------------------------------ item 3


def test_a_users_config_yaml_is_never_replaced_by_a_run(tmp_path, no_training):
    """`rlvr train config.yaml run.out_dir=.` in a folder of the user's: refused, naming the folder, what it holds
    and what to do; the hand-written file keeps its comments."""
    (tmp_path / "config.yaml").write_text(USER_CONFIG)
    (tmp_path / "notes.txt").write_text("mine\n")
    r = _invoke("train", "config.yaml", *TINY, "run.out_dir=.", cwd=tmp_path)
    assert r.exit_code == 2, r.output
    assert not isinstance(r.exception, _NoTraining)
    assert "not an rlvr run directory" in r.output and "config.yaml" in r.output and "notes.txt" in r.output
    assert "new or empty folder" in r.output
    assert (tmp_path / "config.yaml").read_text() == USER_CONFIG
    # run.overwrite=true is not a licence to write among someone else's files either
    r = _invoke("train", "config.yaml", *TINY, "run.out_dir=.", "run.overwrite=true", cwd=tmp_path)
    assert r.exit_code == 2 and "not an rlvr run directory" in r.output
    assert (tmp_path / "config.yaml").read_text() == USER_CONFIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "notes.txt"]


def test_run_dir_create_refuses_a_folder_of_other_files_and_takes_an_empty_or_new_one(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text(USER_CONFIG)
    for exist_ok in (False, True):
        with pytest.raises(FileExistsError, match=r"not an rlvr run directory \(it holds config.yaml\)"):
            RunDir.create(mine, config={"a": 1}, tensorboard=False, exist_ok=exist_ok)
    assert (mine / "config.yaml").read_text() == USER_CONFIG
    empty = tmp_path / "empty"
    empty.mkdir()
    RunDir.create(empty, config={"a": 1}, tensorboard=False).close()
    RunDir.create(tmp_path / "new" / "deeper", config={"a": 1}, tensorboard=False).close()
    # a run directory written before the lock file existed (metrics.jsonl, checkpoints/) is still a run
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "metrics.jsonl").write_text('{"step": 1, "time": 0.1}\n')
    (legacy / "config.yaml").write_text("a: 1\n")
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunDir.create(legacy, tensorboard=False)
    RunDir.create(legacy, config={"a": 2}, tensorboard=False, exist_ok=True).close()
    assert (legacy / "metrics.jsonl").read_text() == ""


def test_overwrite_knows_every_figure_plot_run_writes():
    import re

    from rlvr.runs.plots import FIGURES
    from rlvr.runs.rundir import RUN_FOLDERS

    for name in [*(f for f, _, _ in FIGURES), "other.png"]:
        assert any(re.fullmatch(p, name) for p in RUN_FOLDERS["plots"]), name


def test_overwrite_removes_what_the_run_wrote_and_keeps_everything_else(tmp_path):
    run = tmp_path / "r"
    model, opt = _linear()
    with RunDir.create(run, config={"a": 1}, tensorboard=True) as rd:
        rd.log_metrics(1, {"loss": 1.0})
        save_checkpoint(rd, 1, model=model, optimizer=opt, trainer_state={"s": 1})
    (run / "plots").mkdir()
    (run / "plots" / "reward.png").write_bytes(b"png")
    for d in ("wandb/offline-run-20260101_000000-abc", "trackio", "mlartifacts/1/xyz", "base_model"):
        (run / d).mkdir(parents=True, exist_ok=True)
    (run / "trackio" / "rlvr.db").write_bytes(b"db")
    (run / "base_model" / "config.json").write_text("{}")
    (run / "trackers.json").write_text("{}")
    (run / "mlflow.db").write_bytes(b"db")
    ours = ["notes.md", "checkpoints/best/weights.bin", "checkpoints/README", "tb/my_events.txt",
            "plots/my_figure.png", "wandb/settings", "trackio/README", "mlartifacts/notes.txt"]
    for name in ours:
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text("the user's\n")
    run2 = RunDir.create(run, config={"a": 2}, tensorboard=False, exist_ok=True)
    run2.close()
    for name in ours:
        assert (run / name).read_text() == "the user's\n", name
    assert not (run / "checkpoints" / "step_000001").exists() and not (run / "checkpoints" / "latest").exists()
    assert not list((run / "tb").glob("events.out.tfevents.*"))
    for gone in ("plots/reward.png", "wandb/offline-run-20260101_000000-abc", "trackio/rlvr.db", "mlartifacts/1",
                 "base_model", "trackers.json", "mlflow.db"):
        assert not (run / gone).exists(), gone
    assert (run / "metrics.jsonl").read_text() == ""
    assert "a: 2" in (run / "config.yaml").read_text()


# ------------------------------------------------------------------------------------------ item 7


def test_config_yaml_is_rewritten_atomically(tmp_path, monkeypatch):
    """A crash while config.yaml is rewritten (a resume records its config) leaves the old file, never a torn
    or empty one: the write dies after the file is opened, as a SIGKILL there would."""
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig

    cfg = load_config(TrainConfig, None, ["optim.lr=0.003", "run.steps=7"])
    run = RunDir.create(tmp_path / "r", config=cfg, tensorboard=False)
    before = (run.path / "config.yaml").read_text()
    real_open = builtins.open

    class Torn(io.StringIO):
        def write(self, _text):
            raise OSError(errno.EIO, "the process died here")

    def dying_open(file, mode="r", *a, **k):
        f = real_open(file, mode, *a, **k)
        if "w" in mode and Path(str(file)).parent == run.path:
            f.close()  # opened for writing (truncated), then the crash: nothing written
            return Torn()
        return f

    monkeypatch.setattr(builtins, "open", dying_open)
    monkeypatch.setattr(io, "open", dying_open)
    with pytest.raises(OSError, match="died here"):
        run.write_config(load_config(TrainConfig, None, ["optim.lr=0.003", "run.steps=9"]))
    monkeypatch.undo()
    run.close()
    assert (run.path / "config.yaml").read_text() == before
    assert load_config(TrainConfig, run.path / "config.yaml").optim.lr == 0.003


@pytest.mark.parametrize("content", [b"", b"\n  \n", b"# nothing but a comment\n", b"\xff\xfe\x00garbage", b"- a\n- b\n"])
def test_resume_of_an_empty_or_unreadable_config_yaml_is_an_error_not_every_default(tmp_path, no_training, content):
    run = tmp_path / "r"
    model, opt = _linear()
    with RunDir.create(run, config={"optim": {"lr": 0.003}}, tensorboard=False) as rd:
        save_checkpoint(rd, 2, model=model, optimizer=opt, trainer_state={"s": 2})
    (run / "config.yaml").write_bytes(content)
    r = _invoke("train", "--resume", str(run))
    assert not isinstance(r.exception, _NoTraining), "resumed with every default"
    assert r.exit_code == 2, r.output
    if content.startswith(b"\xff"):  # rlvr.config.read_yaml's own error, naming the file
        assert "config.yaml: cannot read run config: it is not UTF-8 text" in r.output, r.output
        return
    assert "config.yaml" in r.output and ("empty" in r.output or "no config keys" in r.output
                                          or "YAML" in r.output)


# ------------------------------------------------------------------------------------------ item 9


def _tiny_policy():
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.policy import policy_from_config

    cfg = load_config(TrainConfig, None, TINY)
    return policy_from_config(cfg.model, seed=0)


def _two_checkpoints(run: Path) -> dict[int, dict[str, torch.Tensor]]:
    """A run directory with complete checkpoints at steps 1 and 2 of a tiny HF policy; their weights."""
    model, tok = _tiny_policy()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    weights = {}
    with RunDir.create(run, config={"a": 1}, tensorboard=False) as rd:
        for step in (1, 2):
            model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            save_checkpoint(rd, step, model=model, tokenizer=tok, optimizer=opt, scheduler=sched,
                            trainer_state={"data_pos": step * 10})
            weights[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return weights


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


DAMAGE = {
    "model/model.safetensors": _truncate,
    "optimizer.pt": _truncate,
    "trainer_state.json": lambda p: p.write_text("{garbage"),
    "meta.json": lambda p: p.write_text("\x00\x01 not json"),
    "rng.pt": lambda p: p.write_bytes(b""),
    "scheduler.pt": lambda p: p.unlink(),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_damaged_checkpoint_is_named_and_the_previous_one_taken(tmp_path, name):
    run = tmp_path / "r"
    weights = _two_checkpoints(run)
    DAMAGE[name](run / "checkpoints" / "step_000002" / name)
    model, _ = _tiny_policy()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    said = []
    state = ckpt_mod.resume_checkpoint(run, say=said.append, model=model, optimizer=opt, scheduler=sched)
    assert state["step"] == 1 and state["data_pos"] == 10
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[1][k]), k
    assert len(said) == 1 and name.split("/")[-1] in said[0] and "step_000002 is damaged" in said[0]
    assert "previous complete checkpoint, step_000001" in said[0]
    assert (run / "checkpoints" / "step_000002.damaged").is_dir()  # kept for inspection, out of the way
    assert latest_checkpoint(run).name == "step_000001"
    # without the fallback (a sharded run), the error names the file and says how to take the previous one
    weights = _two_checkpoints(tmp_path / "r2")
    DAMAGE[name](tmp_path / "r2" / "checkpoints" / "step_000002" / name)
    with pytest.raises(FileNotFoundError, match=r"step_000002 is damaged: .*" + name.split("/")[-1]) as exc:
        ckpt_mod.resume_checkpoint(tmp_path / "r2", fallback=False, model=model, optimizer=opt, scheduler=sched)
    assert "mv " in str(exc.value) and "step_000001" in str(exc.value)


def test_a_damaged_only_checkpoint_is_a_clear_error_in_rlvr_train(tmp_path):
    """`rlvr train --resume` of a run whose one checkpoint has an empty rng.pt: `error: ...` naming the file, exit
    2 (was: `Aborted.`, from click catching torch.load's EOFError)."""
    run = tmp_path / "r"
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig

    cfg = load_config(TrainConfig, None, [*TINY, f"run.out_dir={run}", "run.steps=3"])
    model, tok = _tiny_policy()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with RunDir.create(run, config=cfg, tensorboard=False) as rd:
        save_checkpoint(rd, 1, model=model, tokenizer=tok, optimizer=opt, scheduler=sched,
                        trainer_state={"data_pos": 2})
    (run / "checkpoints" / "step_000001" / "rng.pt").write_bytes(b"")
    r = _invoke("train", "--resume", str(run))
    assert r.exit_code == 2, r.output
    assert "rng.pt is empty" in r.output and "no earlier complete checkpoint" in r.output
    assert "Aborted" not in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------------------ item 10


def test_disk_full_while_checkpointing_says_what_was_lost_and_how_to_resume(tmp_path, monkeypatch):
    run = tmp_path / "r"
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        if "step_000004" in str(f):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", full_disk)
    r = _invoke("train", "--recipe", "grpo", *TINY, f"run.out_dir={run}", "run.steps=4", "run.checkpoint_every=2")
    assert r.exit_code == 1, r.output
    out = r.output
    assert "Traceback" not in out and "Errno 28" in out and "disk is full" in out
    assert "step 4 is lost" in out and "step_000002 (step 2)" in out
    assert f"resume with: rlvr train --resume {run}" in out
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_000002"], ckpts  # nothing half-written left behind
    assert load_checkpoint(run)["step"] == 2


def test_torch_write_failure_is_a_checkpoint_save_error(tmp_path, monkeypatch):
    model, opt = _linear()
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, trainer_state={"s": 1})

    def enforce_fail(*_a, **_k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter failed writing file "
                           "data/0: file write failed")

    monkeypatch.setattr(torch, "save", enforce_fail)
    with pytest.raises(ckpt_mod.CheckpointSaveError) as exc:
        save_checkpoint(tmp_path, 2, model=model, optimizer=opt, trainer_state={"s": 2})
    assert exc.value.step == 2 and exc.value.intact.name == "step_000001"
    assert "step 2 is lost" in str(exc.value) and "last intact checkpoint is step_000001" in str(exc.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]


# ------------------------------------------------------------------------------------------ item 12


def test_a_lora_base_models_interrupted_copy_is_removed_by_the_next_save_or_resume(tmp_path):
    model, opt = _linear()
    stale = tmp_path / ".tmp-base_model-999999"  # another (dead) process's copy of the base
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"x" * 1000)
    save_checkpoint(tmp_path, 1, model=model, optimizer=opt, trainer_state={})
    assert not stale.exists()
    stale.mkdir()
    (tmp_path / "checkpoints" / ".tmp-step_000002-999999").mkdir()
    RunDir.resume(tmp_path, 1, tensorboard=False).close()
    assert not stale.exists() and not (tmp_path / "checkpoints" / ".tmp-step_000002-999999").exists()


# ------------------------------------------------------------------------------------------ item 13

HOLDER = """
import sys, time
from rlvr.runs.rundir import RunDir
run = RunDir(sys.argv[1], tensorboard=False)  # a run being written (its config.yaml untouched)
print("ready", flush=True)
time.sleep(120)
"""


def _holder(path: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_live_run_is_locked_and_a_dead_ones_lock_never_blocks(tmp_path):
    run = tmp_path / "r"
    proc = _holder(run)
    try:
        for attempt in (lambda: RunDir.resume(run, 0, tensorboard=False),
                        lambda: RunDir.create(run, tensorboard=False, exist_ok=True)):
            with pytest.raises(FileExistsError, match=rf"{run} is in use: process {proc.pid} is writing this run"):
                attempt()
    finally:
        proc.kill()
        proc.wait()
    RunDir.resume(run, 0, tensorboard=False).close()  # SIGKILLed: the kernel dropped its lock


def test_rlvr_train_resume_of_a_live_run_is_refused(tmp_path, no_training):
    run = tmp_path / "r"
    model, opt = _linear()
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig

    with RunDir.create(run, config=load_config(TrainConfig, None, TINY), tensorboard=False) as rd:
        save_checkpoint(rd, 1, model=model, optimizer=opt, trainer_state={})
    proc = _holder(run)
    try:
        r = _invoke("train", "--resume", str(run))
        assert not isinstance(r.exception, _NoTraining), "a second writer was let in"
        assert r.exit_code == 2 and f"{run} is in use: process {proc.pid}" in r.output, r.output
        r = _invoke("train", *TINY, f"run.out_dir={run}", "run.overwrite=true")
        assert r.exit_code == 2 and "is in use" in r.output, r.output
    finally:
        proc.kill()
        proc.wait()


LAUNCHER = """
import os, subprocess, sys, time
worker = '''
import os, sys, time, types
from rlvr.train.pg import sharded
cfg = types.SimpleNamespace(distributed=types.SimpleNamespace(learner="fsdp2"), model=types.SimpleNamespace(device="cpu"))
shards = sharded.start(cfg)
print("worker", os.getpid(), flush=True)
time.sleep(120)
'''
env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
       "MASTER_PORT": sys.argv[1]}
# torchrun starts each worker in a session of its own (start_new_session): no signal of the launcher's reaches it
proc = subprocess.Popen([sys.executable, "-c", worker], env=env, start_new_session=True, stdout=sys.stdout)
time.sleep(120)
"""


def test_fsdp2_ranks_die_with_their_sigkilled_launcher(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    launcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LAUNCHER), str(port)], stdout=subprocess.PIPE,
                                text=True, env=env)
    line = launcher.stdout.readline().split()
    assert line and line[0] == "worker", line
    worker = int(line[1])
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(worker):
            time.sleep(0.2)
        assert not _alive(worker), "the rank trains on after its launcher was SIGKILLed"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"  # a zombie (exited, not reaped by its new parent) is dead
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def test_docs_describe_the_run_directory_rules():
    doc = (REPO / "docs" / "runs.md").read_text()
    for phrase in (".rlvr-lock", "not an rlvr run directory", "step_000060.damaged", "disk is full"):
        assert phrase in doc, phrase
