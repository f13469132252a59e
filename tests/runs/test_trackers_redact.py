"""No credential in a run file or a console line from run.report_to (issue 37, item 2), default tier: MLflow's
client is a fake module here (the real backends are in tests/runs/test_trackers_backends.py, marker trackers, which
also greps a whole run directory and its console output for secrets). An MLFLOW_TRACKING_URI with a password
(`http://user:PASSWORD@host`, `postgresql://user:pass@host/db`) or a token in its query is kept in
RUN/trackers.json and printed redacted, a resume still continues the same MLflow run, and a tracker's failure
warning names no secret of the URI or of the environment."""

from __future__ import annotations

import json
import sys
import types
import warnings

import pytest

from rlvr.runs import trackers as trackers_mod
from rlvr.runs.trackers import Trackers

SECRET = "PASSWORD-ml-7731"


class FakeMlflowClient:
    """The calls MlflowTracker makes, recorded; `fail` makes the first call raise as MLflow's REST client does,
    with the URL (credentials included) in its message."""

    calls: list[tuple] = []
    fail = False

    def __init__(self, tracking_uri):
        self.uri = tracking_uri
        FakeMlflowClient.calls.append(("init", tracking_uri))

    def _call(self, name, *args):
        if FakeMlflowClient.fail:
            raise RuntimeError(f"API request to {self.uri}/api/2.0/mlflow/experiments/get-by-name failed with "
                               "exception ConnectionError")
        FakeMlflowClient.calls.append((name, *args))

    def get_experiment_by_name(self, name):
        self._call("get_experiment_by_name", name)

    def create_experiment(self, name, artifact_location=None):
        self._call("create_experiment", name)
        return "1"

    def create_run(self, exp_id, run_name):
        self._call("create_run", exp_id, run_name)
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id="run-1"))

    def get_run(self, run_id):
        self._call("get_run", run_id)
        return types.SimpleNamespace(data=types.SimpleNamespace(params={}))

    def update_run(self, run_id, status):
        self._call("update_run", run_id, status)

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self._call("log_batch", run_id)

    def set_terminated(self, run_id, status):
        self._call("set_terminated", run_id, status)


@pytest.fixture
def fake_mlflow(monkeypatch):
    mlflow = types.ModuleType("mlflow")
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = FakeMlflowClient
    entities = types.ModuleType("mlflow.entities")
    for name in ("Metric", "Param", "RunTag"):
        setattr(entities, name, lambda *args: args)
    mlflow.tracking, mlflow.entities = tracking, entities
    for name, mod in (("mlflow", mlflow), ("mlflow.tracking", tracking), ("mlflow.entities", entities)):
        monkeypatch.setitem(sys.modules, name, mod)
    FakeMlflowClient.calls, FakeMlflowClient.fail = [], False
    return FakeMlflowClient


def _files_text(run_dir) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in run_dir.rglob("*") if p.is_file())


@pytest.mark.parametrize("uri, shown", [
    (f"http://user:{SECRET}@mlflow.example:5000", "http://user:***@mlflow.example:5000"),
    (f"postgresql://user:{SECRET}@db.example/mlflow", "postgresql://user:***@db.example/mlflow"),
    (f"https://mlflow.example/?token={SECRET}&x=1", "https://mlflow.example/?token=***&x=1"),
])
def test_a_tracking_uri_with_credentials_is_kept_and_printed_redacted(tmp_path, monkeypatch, capsys, fake_mlflow,
                                                                      uri, shown):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for resume in (False, True):  # the run, then --resume: each prints the location
        t = Trackers(run_dir, ["mlflow"], resume=resume)
        t.log_config({"algo": {"loss": "grpo"}})
        t.log(1, {"loss": 1.0})
        t.close()
        assert not t.failed, t.failed
    err = capsys.readouterr().err
    assert err.count("run.report_to: mlflow run run-1 in ") == 2, err
    assert SECRET not in err and shown in err
    state = json.loads((run_dir / "trackers.json").read_text())
    assert state["mlflow"] == {"run_id": "run-1", "tracking_uri": shown}
    assert SECRET not in _files_text(run_dir)
    # the client itself got the real URI, and the resume continued the same run (no second create_run)
    assert ("init", uri) in fake_mlflow.calls
    assert [c for c in fake_mlflow.calls if c[0] == "create_run"] == [("create_run", "1", "run")]
    assert ("update_run", "run-1", "RUNNING") in fake_mlflow.calls


def test_a_failing_tracker_warns_without_the_secrets(tmp_path, monkeypatch, capsys, fake_mlflow):
    """MLflow's REST errors name the URL, credentials included; a wandb failure might name the key: the one
    warning line says which tracker failed and why, with *** in their place."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://user:{SECRET}@127.0.0.1:9")
    monkeypatch.setenv("WANDB_API_KEY", "SECRET-W-0123456789")

    class BrokenWandb(trackers_mod.Tracker):
        name = "wandb"

        def __init__(self, run_dir, config, resume):
            raise PermissionError("api_key SECRET-W-0123456789 was refused")

    monkeypatch.setitem(trackers_mod.TRACKERS, "wandb", BrokenWandb)
    fake_mlflow.fail = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Trackers(tmp_path, ["mlflow", "wandb"])
        t.log_config({"a": 1})
    text = "\n".join(str(w.message) for w in caught) + capsys.readouterr().err
    assert "run.report_to=mlflow: opening the run failed" in text and "run.report_to=wandb" in text
    assert "http://user:***@127.0.0.1:9/api/2.0" in text
    assert SECRET not in text and "SECRET-W-0123456789" not in text
    assert SECRET not in json.dumps(t.failed) and "SECRET-W" not in json.dumps(t.failed)


def test_redact_uri_and_text():
    redact_uri, redact_text = trackers_mod.redact_uri, trackers_mod.redact_text
    assert redact_uri("http://user:pw@host:5000/x") == "http://user:***@host:5000/x"
    assert redact_uri("postgresql://user:p@ss@db/mlflow?sslmode=require&password=x") == \
        "postgresql://user:***@db/mlflow?sslmode=require&password=***"
    assert redact_uri("https://ghp_token123@host/p?api_key=1&Signature=2&user=me#f") == \
        "https://***@host/p?api_key=***&Signature=***&user=me#f"
    for unchanged in ("sqlite:////abs/run/mlflow.db", "databricks", "file:./mlruns", "/a/path", "http://[::1]:80/p"):
        assert redact_uri(unchanged) == unchanged
    assert redact_text("see http://u:pw@h/api and 'mysql://a:b@c/d'") == "see http://u:***@h/api and 'mysql://a:***@c/d'"
