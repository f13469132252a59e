"""run.report_to without any backend installed (default tier): the config check names the key and the pip
command, names are parsed strictly, and a tracker that fails (to import, to open, to log) warns once
while the run completes and the other trackers get every row. The real backends, offline, are in
tests/runs/test_trackers_backends.py (marker trackers, `make test-trackers`)."""

from __future__ import annotations

import importlib.util
import json
import sys
import warnings

import pytest

from rlvr.config import ConfigError, load_config, to_dict
from rlvr.runs import trackers as trackers_mod
from rlvr.runs.rundir import RunDir, read_jsonl
from rlvr.runs.trackers import Tracker, mlflow_name, numeric_metrics, parse_report_to
from rlvr.train.config import SFTConfig, TrainConfig

TINY = [
    "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
    "data.num_train=40", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2", "sampling.group_size=2",
    "sampling.max_tokens=3", "run.steps=3", "run.progress=false", "run.num_threads=1", "run.log_samples_every=0",
]


def _hide(monkeypatch, *missing: str, present: tuple[str, ...] = ()) -> None:
    """importlib.util.find_spec reports `missing` as not installed and `present` as installed."""
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in missing:
            return None
        if name in present:
            return real("json")  # any spec: "installed"
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig])
def test_a_missing_backend_is_a_config_error_naming_the_key_and_the_pip_command(monkeypatch, cls):
    _hide(monkeypatch, "wandb", "mlflow")
    with pytest.raises(ConfigError) as err:
        load_config(cls, None, ["run.report_to=tensorboard, wandb,mlflow"])
    assert len(err.value.errors) == 2  # one line per missing backend
    assert "run.report_to='wandb'" in err.value.errors[0] and "pip install 'rlvr[wandb]'" in err.value.errors[0]
    assert "run.report_to='mlflow'" in err.value.errors[1] and "pip install 'rlvr[mlflow]'" in err.value.errors[1]
    _hide(monkeypatch, present=("wandb", "mlflow"))
    assert load_config(cls, None, ["run.report_to=wandb,mlflow"]).run.report_to == "wandb,mlflow"


def test_report_to_names_are_parsed_strictly():
    assert parse_report_to("tensorboard") == ["tensorboard"]
    assert parse_report_to(" WandB , mlflow,wandb,") == ["wandb", "mlflow"]  # order kept, repeats dropped
    assert parse_report_to("none") == [] and parse_report_to("") == [] and parse_report_to(None) == []
    for bad, why in (("tensorbord", "unknown"), ("none,wandb", "cannot be combined")):
        with pytest.raises(ConfigError, match=f"run.report_to.*{why}"):
            load_config(TrainConfig, None, [f"run.report_to={bad}"])


def test_metric_names_and_config_as_trackers_get_them():
    row = {"step": 4, "time": 1.5, "loss": 0.25, "accuracy": 1, "flag": True, "entropy": None, "note": "x"}
    assert numeric_metrics(row) == {"loss": 0.25, "accuracy": 1}
    assert mlflow_name("reward/mean") == "reward/mean" and mlflow_name("clip_frac/low") == "clip_frac/low"
    assert mlflow_name("eval/pass@8") == "eval/pass_at_8" and mlflow_name("a[b]=c") == "a_b__c"
    assert trackers_mod.flatten({"algo": {"loss": "grpo", "eps": [0.2, 0.3]}, "seed": 1}) == {
        "algo.loss": "grpo", "algo.eps": [0.2, 0.3], "seed": 1}


class Recorder(Tracker):
    """A fake backend that keeps what it is given (class-level, so the test reads it after the run)."""

    name = "mlflow"
    opened: list[tuple] = []
    rows: list[tuple[int, dict]] = []
    configs: list[dict] = []
    closed: list[bool] = []

    def __init__(self, run_dir, config, resume):
        super().__init__(run_dir, config, resume)
        Recorder.opened.append((run_dir, resume))
        Recorder.configs.append(config)

    def log(self, step, metrics):
        Recorder.rows.append((step, dict(metrics)))

    def log_config(self, config):
        Recorder.configs.append(config)

    def close(self, failed=False):
        Recorder.closed.append(failed)


class Broken(Tracker):
    """A fake backend whose second log raises, as a backend's network or disk error would."""

    name = "wandb"
    calls = 0

    def __init__(self, run_dir, config, resume):
        super().__init__(run_dir, config, resume)

    def log(self, step, metrics):
        Broken.calls += 1
        if Broken.calls == 2:
            raise OSError("disk full")

    def log_config(self, config):
        pass

    def close(self, failed=False):
        pass


@pytest.fixture
def fakes(monkeypatch):
    for attr, value in (("opened", []), ("rows", []), ("configs", []), ("closed", [])):
        monkeypatch.setattr(Recorder, attr, value)
    monkeypatch.setattr(Broken, "calls", 0)
    monkeypatch.setitem(trackers_mod.TRACKERS, "mlflow", Recorder)
    monkeypatch.setitem(trackers_mod.TRACKERS, "wandb", Broken)
    _hide(monkeypatch, present=("wandb", "mlflow", "trackio"))


def test_a_failing_tracker_warns_once_and_the_training_run_completes(tmp_path, fakes, monkeypatch):
    """`rlvr train` with run.report_to=wandb,mlflow,trackio where wandb's backend raises at its second row and
    trackio cannot be imported (found at validation, gone at run time): two warnings naming the key, the
    run finishes with every row in metrics.jsonl, and the healthy tracker got every row, at its step, and
    the resolved config."""
    from rlvr.train.pg.loop import train

    monkeypatch.setitem(sys.modules, "trackio", None)  # `import trackio` raises ImportError
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))  # the tracker sets it before its import
    out = tmp_path / "run"
    cfg = load_config(TrainConfig, None, [*TINY, f"run.out_dir={out}", "run.report_to=wandb,mlflow,trackio"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(cfg)
    ours = [str(w.message) for w in caught if "run.report_to=" in str(w.message)]
    assert len(ours) == 2, ours
    assert ours[0].startswith("run.report_to=trackio: opening the run failed") and "ModuleNotFoundError" in ours[0]
    assert ours[1].startswith("run.report_to=wandb: logging metrics failed at step 2") and "disk full" in ours[1]
    assert all("training goes on" in m for m in ours)
    assert Broken.calls == 2  # dropped after its failure: never called again

    rows = read_jsonl(out / "metrics.jsonl")
    assert result.steps == 3 and [r["step"] for r in rows] == [1, 2, 3]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000003"
    assert Recorder.opened == [(out, False)]
    assert Recorder.rows == [(r["step"], numeric_metrics(r)) for r in rows]
    assert {"loss", "reward/mean", "accuracy", "eval/accuracy"} <= set(Recorder.rows[-1][1])
    assert Recorder.configs[0] == json.loads(json.dumps(to_dict(cfg)))  # the resolved config, at open
    assert Recorder.configs[0]["run"]["report_to"] == "wandb,mlflow,trackio"
    assert Recorder.closed == [False]


def test_resume_reopens_the_trackers_as_a_resume_and_a_raising_loop_closes_them_failed(tmp_path, fakes):
    with RunDir.create(tmp_path / "r", config={"a": 1}, report_to="mlflow") as run:
        run.log_metrics(1, {"loss": 1.0})
    assert not (tmp_path / "r" / "tb").exists()  # tensorboard not in report_to: no events
    with pytest.raises(RuntimeError), RunDir.resume(tmp_path / "r", 1, report_to="mlflow,tensorboard") as run:
        run.write_config({"a": 2})
        run.log_metrics(2, {"loss": 0.5})
        raise RuntimeError("the trainer failed")
    assert (tmp_path / "r" / "tb").is_dir()
    assert [o[1] for o in Recorder.opened] == [False, True]
    assert Recorder.configs == [{"a": 1}, {"a": 2}]
    assert Recorder.rows == [(1, {"loss": 1.0}), (2, {"loss": 0.5})]
    assert Recorder.closed == [False, True]


def test_sft_reports_through_the_same_key(tmp_path, fakes):
    """`rlvr sft` shares the run loop: run.report_to reaches its trackers with every row and the config."""
    from rlvr.train.sft import train_sft

    out = tmp_path / "sft"
    cfg = load_config(SFTConfig, None, [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=16", "data.num_eval=4", "data.digits=1", "algo.batch_size=4", "run.steps=2",
        "run.progress=false", "run.num_threads=1", "sampling.max_tokens=3", f"run.out_dir={out}",
        "run.report_to=mlflow"])
    train_sft(cfg)
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert Recorder.rows == [(r["step"], numeric_metrics(r)) for r in rows] and "loss" in Recorder.rows[0][1]
    assert Recorder.configs[0]["run"]["report_to"] == "mlflow" and Recorder.closed == [False]
    assert not (out / "tb").exists()
