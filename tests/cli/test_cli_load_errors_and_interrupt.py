"""Model loading errors, Ctrl-C and the recipes table (issue 25, "the first hour, round two"), run as a user
runs them (the installed `rlvr` script in a subprocess): a model that cannot load is one `error:` line naming it
and the fix (item 4); Ctrl-C saves a checkpoint of the last completed step and says how to resume (item 5);
`rlvr recipes` fits an 80-column terminal (item 10)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers.cli import TINY, cli_env, refused, rlvr_command, run_rlvr

DATA = [x for x in TINY if not x.startswith("model.")]  # with a model folder, its config.json shapes the model
TIMING = ("time", "time/", "tokens_per_s", "mem/", "perf/")


# --- item 4: model loading errors ------------------------------------------------------------------


@pytest.fixture(scope="module")
def saved_policy(tmp_path_factory):
    from rlvr.models import build_tiny_model, save_policy

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    return save_policy(model, tok, tmp_path_factory.mktemp("policy") / "model")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_hub_id_offline_is_one_line_at_once(tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    res = run_rlvr("train", "model.name=Qwen/Qwen2.5-0.5B", "run.steps=1", f"run.out_dir={run}", timeout=120,
                HF_HOME=str(tmp_path / "hf"))
    line = refused(res, "Qwen/Qwen2.5-0.5B", "HF_HUB_OFFLINE=1", "local folder")
    assert "not in the local Hugging Face cache" in line
    assert time.monotonic() - t0 < 60
    assert not run.exists()


def test_folder_without_tokenizer_files(tmp_path, saved_policy):
    folder = _copy(saved_policy, tmp_path / "weights_only")
    for f in folder.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("chat_template.jinja", "special_tokens_map.json"):
            f.unlink()
    run = tmp_path / "run"
    refused(run_rlvr("train", f"model.name={folder}", *DATA, "run.steps=1", f"run.out_dir={run}"),
             str(folder), "no tokenizer files", "tokenizer.json", "tokenizer_config.json")
    assert not run.exists()  # used to train a step on an empty tokenizer and leave a stub run directory


@pytest.mark.parametrize("text,needle", [("", "config.json is empty"), ("{not json", "config.json is not valid JSON"),
                                          ("[1, 2]", "config.json is not a JSON object")])
def test_broken_config_json(tmp_path, saved_policy, text, needle):
    folder = _copy(saved_policy, tmp_path / "broken")
    (folder / "config.json").write_text(text)
    run = tmp_path / "run"
    refused(run_rlvr("train", f"model.name={folder}", *DATA, "run.steps=1", f"run.out_dir={run}"),
             str(folder / "config.json"), needle)
    assert not run.exists()


# --- item 5: Ctrl-C ----------------------------------------------------------------------------------


def _metric_rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


SFT_TINY = [x for x in TINY if not x.startswith(("sampling.n_prompts", "sampling.group_size"))]  # RL-only keys


@pytest.mark.parametrize("command,sig", [("train", signal.SIGINT), ("train", signal.SIGTERM), ("sft", signal.SIGINT),
                                         ("ei", signal.SIGINT)])
def test_interrupt_saves_a_checkpoint_and_says_how_to_resume(tmp_path, command, sig):
    """Item 5: Ctrl-C used to exit 130 silently, and with checkpoint_every=0 the run kept nothing."""
    run = tmp_path / "run"
    args = [command, *(SFT_TINY if command == "sft" else TINY), "run.steps=400", "run.eval_every=0",
            "run.log_samples_every=0", "run.checkpoint_every=0", f"run.out_dir={run}"]
    proc = subprocess.Popen([*rlvr_command(), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        deadline = time.monotonic() + 240
        while len(_metric_rows(run)) < 2:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no metrics after 240 s"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in err + out
    rows = _metric_rows(run)
    last = rows[-1]["step"]
    assert last < 400
    lines = [x for x in err.splitlines() if x.startswith("interrupted at step")]
    assert lines == [f"interrupted at step {last}: checkpoint saved to {run}; resume with: rlvr {command} --resume {run}"], err
    assert (run / "checkpoints" / f"step_{last:06d}" / "meta.json").is_file(), list((run / "checkpoints").iterdir())

    if (command, sig) != ("train", signal.SIGINT):
        return
    # resume to a couple of steps further; the result equals an uninterrupted run of as many steps
    target = last + 2
    res = run_rlvr("train", "--resume", str(run), f"run.steps={target}")
    assert res.returncode == 0, res.stderr
    straight = tmp_path / "straight"
    ref = [a for a in args if not a.startswith(("run.steps=", "run.out_dir="))]
    res = run_rlvr(*ref, f"run.steps={target}", f"run.out_dir={straight}")
    assert res.returncode == 0, res.stderr
    assert _comparable(_metric_rows(run)) == _comparable(_metric_rows(straight))


def test_checkpoint_every_has_a_periodic_default():
    from rlvr.train.config import RunConfig

    assert RunConfig().checkpoint_every > 0


# --- item 10: rlvr recipes at 80 columns -------------------------------------------------------------


def test_recipes_fit_80_columns():
    from rlvr.train.pg.recipes import recipe_rows

    res = run_rlvr("recipes", COLUMNS="80", LINES="50")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    too_long = [x for x in lines if len(x) > 80]
    assert not too_long, "\n".join(too_long)
    for row in recipe_rows():
        assert any(row[0] in x.split() or f" {row[0]} " in f" {x} " for x in lines), row[0]
