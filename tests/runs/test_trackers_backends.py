"""run.report_to with the real backends, offline (marker `trackers`, `make test-trackers`: it installs
.[wandb,trackio,mlflow]; about 2 min on 2 cores). A tiny `rlvr train` run goes to TensorBoard, wandb,
trackio and MLflow at once, then each backend's own local files are read back with the backend's own
reader and compared with metrics.jsonl exactly (names, steps, values), and the config and run name too;
a resume continues the same tracker runs (steps 4-5 after 1-3); a backend that fails warns and the run
completes. No network: wandb offline, trackio's local SQLite, MLflow's SQLite store, all in the run dir.

Readers: wandb has no offline reader API (wandb.Api is online only), so its transaction log
RUN/wandb/offline-run-*/run-<id>.wandb is read as wandb writes it (LevelDB log records, each a protobuf
`wandb.proto.wandb_internal_pb2.Record`); MLflow through MlflowClient; trackio through
trackio.sqlite_storage.SQLiteStorage (in a subprocess: trackio fixes its directory when imported).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.trackers import ALL, TINY, tracker_env

from rlvr.config import load_config, to_dict
from rlvr.runs.rundir import read_jsonl
from rlvr.runs.trackers import flatten, numeric_metrics
from rlvr.train.config import TrainConfig

pytestmark = pytest.mark.trackers


def _rlvr(env: dict, *args: str) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-m", "rlvr.cli", "train", *TINY, "--threads", "1", *args],
                         capture_output=True, text=True, env=env, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


# ------------------------------------------------------------------------------------------- readers
def _wandb_records(path: Path):
    """The protobuf Records of a .wandb transaction log: a 7-byte header (':W&B', magic 0xBEE1, version),
    then LevelDB log records (crc32, uint16 length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4) in 32 KiB blocks."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, path
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's zero trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_wandb(run_dir: Path) -> list[dict]:
    """Each offline run folder of RUN/wandb, oldest first: its id, name, config and {step: metrics}."""
    out = []
    for folder in sorted((run_dir / "wandb").glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        run = {"id": None, "name": None, "config": {}, "rows": {}}
        for r in _wandb_records(log):
            kind = r.WhichOneof("record_type")
            if kind == "run":
                run["id"], run["name"] = r.run.run_id, r.run.display_name
                run["config"].update({u.key: json.loads(u.value_json) for u in r.run.config.update})
            elif kind == "config":
                run["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
            elif kind == "history":
                items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
                run["rows"][items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
        out.append(run)
    return out


def read_mlflow(run_dir: Path) -> dict:
    from mlflow.tracking import MlflowClient

    state = json.loads((run_dir / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    assert state["tracking_uri"] == f"sqlite:///{run_dir.resolve() / 'mlflow.db'}"
    run = client.get_run(state["run_id"])
    history = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, k),
                                                     key=lambda m: m.step)]
               for k in run.data.metrics}
    runs = client.search_runs([run.info.experiment_id])
    return {"id": run.info.run_id, "name": run.info.run_name, "status": run.info.status, "n_runs": len(runs),
            "params": run.data.params, "tags": run.data.tags, "history": history}


def read_trackio(run_dir: Path, name: str) -> list[dict]:
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage; "
            f"print(json.dumps({{'logs': SQLiteStorage.get_logs('rlvr', {name!r}), "
            "'runs': SQLiteStorage.get_runs('rlvr')}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACKIO_")} | {"TRACKIO_DIR": str(run_dir / "trackio")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def _read_all(run_dir: Path) -> dict:
    return {"jsonl": read_jsonl(run_dir / "metrics.jsonl"), "wandb": read_wandb(run_dir),
            "mlflow": read_mlflow(run_dir), "trackio": read_trackio(run_dir, run_dir.name),
            "state": json.loads((run_dir / "trackers.json").read_text()),
            "config": to_dict(load_config(TrainConfig, run_dir / "config.yaml"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """3 steps to all four backends, read back; then --resume to 5 steps, read back."""
    tmp = tmp_path_factory.mktemp("trackers")
    run_dir = tmp / "tiny-run"
    env = tracker_env(tmp)
    first = _rlvr(env, "run.steps=3", f"run.out_dir={run_dir}", f"run.report_to={ALL}")
    after_first = _read_all(run_dir)
    _rlvr(env, "--resume", str(run_dir), "run.steps=5")
    return {"dir": run_dir, "first": after_first, "stderr": first.stderr, "resumed": _read_all(run_dir)}


def _expected(rows: list[dict]) -> dict[int, dict]:
    return {r["step"]: numeric_metrics(r) for r in rows}


def test_every_backend_holds_every_row_of_metrics_jsonl_exactly(runs):
    got, run_dir = runs["first"], runs["dir"]
    want = _expected(got["jsonl"])
    assert sorted(want) == [1, 2, 3] and {"loss", "reward/mean", "eval/accuracy"} <= set(want[2])
    assert "time" not in want[1] and "step" not in want[1]
    # wandb: one offline run, named after the run dir, its history = metrics.jsonl, its config = config.yaml
    (wb,) = got["wandb"]
    assert wb["id"] == got["state"]["wandb"]["id"] and wb["name"] == "tiny-run"
    assert wb["rows"] == want
    assert {k: wb["config"][k] for k in got["config"]} == json.loads(json.dumps(got["config"]))
    # mlflow: per metric, (step, value) of every row that has it
    ml = got["mlflow"]
    assert ml["name"] == "tiny-run" and ml["status"] == "FINISHED" and ml["n_runs"] == 1
    names = {k for m in want.values() for k in m}
    assert set(ml["history"]) == names  # no name here needs MLflow's renaming (mlflow_name)
    for k in names:
        assert ml["history"][k] == [(s, float(m[k])) for s, m in sorted(want.items()) if k in m], k
    assert ml["params"] == {k: str(v) for k, v in flatten(json.loads(json.dumps(got["config"]))).items()}
    # trackio: its rows carry step and timestamp besides the metrics
    tk = got["trackio"]
    assert tk["runs"] == ["tiny-run"]
    assert {r["step"]: {k: v for k, v in r.items() if k not in ("step", "timestamp")} for r in tk["logs"]} == want
    # tensorboard as before, and the files stay in the run dir
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert f"wandb sync {run_dir / 'wandb'}" in runs["stderr"]


def test_resume_continues_the_same_tracker_runs(runs):
    first, got = runs["first"], runs["resumed"]
    want = _expected(got["jsonl"])
    assert sorted(want) == [1, 2, 3, 4, 5]
    assert got["state"] == first["state"]  # the same wandb id, mlflow run id, trackio run
    # mlflow: one run, steps 1..5, the changed run.steps kept as a tag (params cannot change)
    ml = got["mlflow"]
    assert ml["id"] == first["mlflow"]["id"] and ml["n_runs"] == 1 and ml["status"] == "FINISHED"
    assert [s for s, _ in ml["history"]["loss"]] == [1, 2, 3, 4, 5]
    assert ml["history"]["loss"] == [(s, float(m["loss"])) for s, m in sorted(want.items())]
    assert ml["params"]["run.steps"] == "3" and ml["tags"]["resumed.run.steps"] == "5"
    # wandb: a second offline folder of the same id with steps 4, 5 (wandb sync puts both into one run)
    wb = got["wandb"]
    assert [w["id"] for w in wb] == [first["wandb"][0]["id"]] * 2
    assert wb[0]["rows"] == {s: want[s] for s in (1, 2, 3)} and wb[1]["rows"] == {s: want[s] for s in (4, 5)}
    assert wb[1]["config"]["run"]["steps"] == 5
    # trackio: the run of the same name continued
    tk = got["trackio"]
    assert tk["runs"] == ["tiny-run"] and [r["step"] for r in tk["logs"]] == [1, 2, 3, 4, 5]
    assert {r["step"]: {k: v for k, v in r.items() if k not in ("step", "timestamp")} for r in tk["logs"]} == want


def test_a_backend_that_fails_warns_and_the_run_completes(tmp_path):
    """MLflow pointed at a store it cannot create (under a file): the run warns naming run.report_to=mlflow,
    completes, and wandb (listed after it) still gets every row."""
    run_dir = tmp_path / "r"
    (tmp_path / "a-file").write_text("not a folder")
    env = tracker_env(tmp_path, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'a-file' / 'mlflow.db'}")
    res = _rlvr(env, "run.steps=2", f"run.out_dir={run_dir}", "run.report_to=mlflow,wandb")
    assert res.stderr.count("run.report_to=mlflow: opening the run failed") == 1, res.stderr[-3000:]
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    (wb,) = read_wandb(run_dir)
    assert wb["rows"] == _expected(rows)
