"""Issue 37, item 11: data.hf_dataset problems (a missing column, an absent split, a corrupt file, a row the task
cannot read) are reported before the model loads, like the JSONL files, naming data.hf_dataset and the split."""

from __future__ import annotations

import pytest

from rlvr.config import load_config
from rlvr.train import session
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.tasks import TaskDataError, check_data_files, load_task_data

datasets = pytest.importorskip("datasets")

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.task=math", "sampling.n_prompts=1", "sampling.group_size=2", "run.steps=1", "run.progress=false"]


def _saved(tmp_path, rows_by_split):
    folder = tmp_path / "ds"
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in rows_by_split.items()}).save_to_disk(
        str(folder))
    return folder


def _cfg(tmp_path, folder, *extra):
    return load_config(TrainConfig, None, [*TINY, f"data.hf_dataset={folder}", f"run.out_dir={tmp_path / 'run'}",
                                           *extra])


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(session, "policy_from_config", refuse)


GOOD = [{"problem": f"p{i}", "answer": str(i)} for i in range(3)]


@pytest.mark.parametrize(("rows", "extra", "needle"), [
    ({"train": [{"text": "p", "answer": "1"}]}, (), "missing key"),  # math reads "problem" (or "question")
    ({"train": GOOD}, ("data.hf_split=validation",), "no split 'validation'"),
    ({"train": GOOD}, ("data.hf_eval_split=test",), "no split 'test'"),
    ({"train": GOOD + [{"problem": "q", "answer": ""}]}, (), "[train]:3: 'answer'"),
    ({"train": GOOD, "test": [{"problem": "q", "answer": float("nan")}]}, ("data.hf_eval_split=test",),
     "[test]:0: 'answer' is nan"),
])
def test_hf_dataset_problems_are_refused_before_the_model_loads(tmp_path, no_model, rows, extra, needle):
    cfg = _cfg(tmp_path, _saved(tmp_path, rows), *extra)
    with pytest.raises(TaskDataError, match="data.hf_dataset=") as err:
        check_data_files(cfg.data)
    assert needle in str(err.value)
    with pytest.raises(TaskDataError) as err2:
        train(cfg)
    assert needle in str(err2.value)
    assert not (tmp_path / "run").exists()


def test_a_corrupt_saved_dataset_is_refused_before_the_model_loads(tmp_path, no_model):
    folder = _saved(tmp_path, {"train": GOOD})
    for f in folder.rglob("*.arrow"):
        f.write_bytes(b"not an arrow file")
    with pytest.raises(TaskDataError, match=r"data.hf_dataset=.*split 'train'"):
        check_data_files(_cfg(tmp_path, folder).data)


def test_checked_rows_are_the_ones_the_run_trains_on(tmp_path):
    folder = _saved(tmp_path, {"train": GOOD, "test": GOOD[:2]})
    cfg = _cfg(tmp_path, folder, "data.hf_eval_split=test")
    check_data_files(cfg.data)
    task = load_task_data(cfg.data)
    assert [e.question for e in task.train] == ["p0", "p1", "p2"] and [e.reference for e in task.eval] == ["0", "1"]
