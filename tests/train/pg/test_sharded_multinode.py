"""The sharded learner across nodes, on one machine (tier `scale`, `make test-scale`; issue 38, item 4).

docs/multi_gpu.md's two-node commands, read from the page (section "Two nodes"), run as written apart from
the host, the port, the GPU count and the paths: `torchrun --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d
--rdzv-endpoint 127.0.0.1:PORT -m rlvr train CONFIG distributed.learner=fsdp2 run.out_dir=RUN` started twice,
two "nodes" of one gloo process each on the CPU, the tiny model for 3 steps. Asserted: both torchruns exit 0
and no rank was stopped by its parent-death watcher (rlvr.train.pg.sharded.exit_with_parent); the run equals one
process (weights within 1e-5, metrics within 1e-4 relative, as tests/train/pg/test_sharded.py's two-process runs);
the checkpoint holds 2 shards; exactly one node printed the run (global rank 0); and the page's resume
command, on two nodes, resumes the run's step-2 checkpoint to the straight run's step 3. 50-65 s on 2 cores.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO
from safetensors.torch import load_file

pytestmark = pytest.mark.scale

ROOT = REPO
DOC = ROOT / "docs" / "multi_gpu.md"
TIMEOUT_S = 240  # one launch (both nodes); 18-27 s on 2 shared cores

# tests/train/pg/test_sharded.py's GRPO run: 3 prompts x 3 = 9 rows in micro-batches of 1 row, shares of 5 and 4 rows
# (rank 1 runs a zero-loss micro-batch to pair FSDP's collectives); a reward whose groups differ, so every
# step moves the weights
CONFIG = [
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
    "data.num_train=80", "data.num_eval=8", "data.digits=1", "data.reward=helpers.dense_reward:letter_share",
    "sampling.max_tokens=6", "sampling.n_prompts=3", "sampling.group_size=3", "sampling.temperature=0.7",
    "algo.kl_coef=0.05", "algo.micro_batch_size=1", "optim.lr=1e-3",
    "run.steps=3", "run.checkpoint_every=1", "run.eval_every=0", "run.progress=false", "run.num_threads=1",
]
VOLATILE = ("time", "time/", "tokens_per_s", "mem/", "perf/")
WATCHER_SAYS = "this worker stops too"  # exit_with_parent's message when it kills a rank


# ---------------------------------------------------------------- helpers (as tests/train/pg/test_sharded.py's)


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


# ---------------------------------------------------------------- the page's commands, on 127.0.0.1


def _doc_commands() -> dict[str, list[str]]:
    """The two torchrun lines of docs/multi_gpu.md's "Two nodes" section: {"train": argv, "resume": argv}."""
    section = DOC.read_text().split("\n## Two nodes", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "docs/multi_gpu.md's two-node section has no bash block"
    lines = [shlex.split(line) for line in block.group(1).splitlines() if line.startswith("torchrun ")]
    train = [a for a in lines if "config.yaml" in a]
    resume = [a for a in lines if "--resume" in a]
    assert len(lines) == 2 and len(train) == 1 and len(resume) == 1, lines
    for argv in lines:  # the launch issue 38 asks to keep working
        text = " ".join(argv)
        for part in ("--nnodes 2", "--rdzv-backend c10d", "--rdzv-endpoint HOST:29500", "-m rlvr train"):
            assert part in text, (part, text)
    assert "distributed.learner=fsdp2" in train[0]
    return {"train": train[0], "resume": resume[0]}


def _localize(argv: list[str], port: int, config: Path, out: Path) -> list[str]:
    """The page's command for this machine: this python's torchrun, 1 process per node, 127.0.0.1:port, the
    test's config and run directory. Every token replaced must be in the command (the page changing shape
    fails here instead of testing something else)."""
    subs = {"HOST:29500": f"127.0.0.1:{port}", "config.yaml": str(config),
            "run.out_dir=/shared/runs/grpo_7b": f"run.out_dir={out}", "/shared/runs/grpo_7b": str(out)}
    assert argv[0] == "torchrun" and argv[argv.index("--nproc_per_node") + 1] == "8"
    local = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    local[local.index("--nproc_per_node") + 1] = "1"
    hits = [subs.get(a) is not None for a in local]
    assert hits.count(True) == (3 if "config.yaml" in argv else 2), argv
    return [subs.get(a, a) for a in local]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1",
            "RLVR_NUM_THREADS": "1"}


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM a torchrun we started (it stops its workers), SIGKILL after 10 s; a worker whose torchrun is
    gone stops itself (exit_with_parent)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _two_nodes(argv_of, logs: Path) -> list[str]:
    """The same command started twice, as on two nodes; both must exit 0 within TIMEOUT_S. Returns the two
    nodes' output (stdout and stderr)."""
    port = _free_port()
    argv = argv_of(port)
    logs.mkdir(parents=True, exist_ok=True)
    files = [open(logs / f"node{i}.log", "w") for i in range(2)]  # noqa: SIM115 (closed below)
    procs = [subprocess.Popen(argv, env=_env(), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
             for f in files]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):  # a node failed: the other gets 20 s to end
                deadline = min(deadline, time.monotonic() + 20)
            time.sleep(0.5)
    finally:
        for p in procs:
            _stop(p)
        for f in files:
            f.close()
    out = [(logs / f"node{i}.log").read_text() for i in range(2)]
    tails = "\n".join(f"--- node {i} (rc {p.returncode}):\n{o[-3000:]}"
                      for i, (p, o) in enumerate(zip(procs, out, strict=True)))
    assert all(p.returncode == 0 for p in procs), f"{shlex.join(argv)}\n{tails}"
    assert not any(WATCHER_SAYS in o for o in out), tails  # no rank was stopped by its parent-death watcher
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One process (the plain learner) and two nodes (the page's command) on the same config.yaml."""
    root = tmp_path_factory.mktemp("multinode")
    config = root / "config.yaml"
    nested: dict = {}
    for item in CONFIG:
        key, value = item.split("=", 1)
        *sections, leaf = key.split(".")
        node = nested
        for s in sections:
            node = node.setdefault(s, {})
        node[leaf] = yaml.safe_load(value)
    config.write_text(yaml.safe_dump(nested))
    one = subprocess.run([sys.executable, "-m", "rlvr", "train", str(config), f"run.out_dir={root / 'one'}"],
                         env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    cmds = _doc_commands()
    t0 = time.monotonic()
    out = _two_nodes(lambda port: _localize(cmds["train"], port, config, root / "two"), root / "logs_two")
    print(f"two nodes: {time.monotonic() - t0:.1f} s")
    return {"root": root, "cmds": cmds, "config": config, "one": root / "one", "two": root / "two", "out": out}


def test_two_nodes_train_like_one_process(runs):
    one, two = runs["one"], runs["two"]
    ckpt = two / "checkpoints" / "step_000003"
    assert json.loads((ckpt / "meta.json").read_text())["shards"] == 2
    assert len(list((ckpt / "sharded").glob("*.distcp"))) == 2
    w1 = _weights(one)
    assert _gap(w1, _weights(one, 2)) > 1e-4  # the last step moved the weights ...
    assert _gap(w1, _weights(two)) < 1e-5  # ... and two nodes moved them the same way (summation order only)
    _same_metrics(_metrics(one), _metrics(two))
    # global rank 0 speaks for the run, on one node (either: c10d numbers the nodes itself)
    assert sum("run directory:" in o for o in runs["out"]) == 1, runs["out"]


def test_the_two_node_checkpoint_resumes_on_two_nodes(runs):
    """The page's resume command: the run cut back to its step-2 checkpoint ends where the straight run did."""
    two, cut = runs["two"], runs["root"] / "cut"
    shutil.copytree(two, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000003")
    (cut / "checkpoints" / "latest").write_text("step_000002\n")
    _two_nodes(lambda port: _localize(runs["cmds"]["resume"], port, runs["config"], cut), runs["root"] / "logs_cut")
    assert _gap(_weights(cut), _weights(two)) < 1e-7
    _same_metrics(_metrics(two), _metrics(cut), rel=1e-6)
