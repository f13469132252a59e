"""Issue 37, item 17: a custom training file can be paired with a held-out file of another layout (MATH-500's
"problem" / "answer"): data.eval_question_key / data.eval_answer_key map the held-out rows' columns, the
training rows keep data.question_key / data.answer_key; both files are checked before any model loads."""

from __future__ import annotations

import json

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.train.config import TrainConfig
from rlvr.train.tasks import TaskDataError, check_data_files, load_task_data


def _files(tmp_path):
    train = tmp_path / "mine.jsonl"
    train.write_text("\n".join(json.dumps({"prompt": f"What is {i} + 1?", "final": str(i + 1)}) for i in range(3)))
    held = tmp_path / "math500.jsonl"
    held.write_text("\n".join(json.dumps({"problem": f"Compute {i} * 2.", "answer": str(2 * i)}) for i in range(2)))
    return train, held


def test_train_and_eval_files_with_their_own_columns(tmp_path):
    train, held = _files(tmp_path)
    cfg = load_config(TrainConfig, None, ["data.task=math", f"data.train_path={train}", f"data.eval_path={held}",
                                          "data.question_key=prompt", "data.answer_key=final",
                                          "data.eval_question_key=problem", "data.eval_answer_key=answer"])
    check_data_files(cfg.data)
    task = load_task_data(cfg.data)
    assert [e.question for e in task.train] == [f"What is {i} + 1?" for i in range(3)]
    assert [e.reference for e in task.train] == ["1", "2", "3"]
    assert [e.question for e in task.eval] == ["Compute 0 * 2.", "Compute 1 * 2."]
    assert [e.reference for e in task.eval] == ["0", "2"]


def test_one_mapping_for_both_files_names_the_missing_column(tmp_path):
    # without the eval keys the training mapping is applied to the held-out file too, which has no "prompt"
    train, held = _files(tmp_path)
    cfg = load_config(TrainConfig, None, ["data.task=math", f"data.train_path={train}", f"data.eval_path={held}",
                                          "data.question_key=prompt", "data.answer_key=final"])
    with pytest.raises(TaskDataError, match=r"data.eval_path=.*math500.jsonl.*prompt"):
        check_data_files(cfg.data)


def test_eval_keys_without_held_out_rows_are_refused():
    with pytest.raises(ConfigError, match="data.eval_question_key='problem'.*held-out rows"):
        load_config(TrainConfig, None, ["data.task=math", "data.train_path=x.jsonl",
                                        "data.eval_question_key=problem"]).validate()
