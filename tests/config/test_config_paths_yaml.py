"""Issue 37, items 4, 6 and 15, at the config loader (in-process, no model): a path from a flag is a typed
value, never YAML (4); an override value YAML would cut at ` #` is refused, not truncated (4); a YAML alias
bomb in a config or pipeline file is refused at once, naming the file, and a harmless anchor still works (6);
`--resume RUN` reads the relative paths of the run's config.yaml from the folder the run was started in, and
the command line's overrides apply before the stored config is validated (15). The commands themselves run
in tests/cli/test_cli_paths_rewards.py."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import typer
import yaml

from rlvr.commands.config_cli import load_run_config, policy_positionals
from rlvr.config import ConfigError, YamlDumper, load_config, parse_override, read_yaml, to_dict
from rlvr.train.config import EvalConfig, TrainConfig

# --- item 4: paths are paths ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["run.out_dir=runs/exp2 #b", "run.name=x #comment", "run.name= #only"])
def test_an_override_cut_at_a_yaml_comment_is_refused_not_truncated(text):
    with pytest.raises(ConfigError) as err:
        parse_override(text)
    msg = str(err.value)
    assert "comment" in msg and "quote the value" in msg and text in msg, msg


@pytest.mark.parametrize("text, value", [("run.out_dir='runs/exp2 #b'", "runs/exp2 #b"),
                                         ("run.name=a#b", "a#b"), ("run.name=\"#1\"", "#1"),
                                         ("sampling.stop=['#', x]", ["#", "x"])])
def test_a_hash_that_yaml_keeps_is_kept(text, value):
    assert parse_override(text)[2] == value


def test_a_typed_override_is_taken_as_it_is():
    cfg = load_config(TrainConfig, None, [("run.out_dir", "runs/exp2 #b: x"), ("run.num_threads", 3, "--threads 3")])
    assert (cfg.run.out_dir, cfg.run.num_threads) == ("runs/exp2 #b: x", 3)
    with pytest.raises(ConfigError, match=r"--threads x: config key 'run.num_threads' expects int"):
        load_config(TrainConfig, None, [("run.num_threads", "x", "--threads x")])


def _fake_run(run: Path, **keys) -> Path:
    """A run directory as far as the config loader looks: a config.yaml as a trainer writes it, with `keys`
    (run__steps=5 is run.steps: 5) set (a checkpoint is not read here)."""
    data = to_dict(TrainConfig())
    for key, value in keys.items():
        section, name = key.split("__")
        data[section][name] = value
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(yaml.dump(data, Dumper=YamlDumper, sort_keys=False))
    return run


@pytest.mark.parametrize("name", ["exp2 #b", "a: b", "x #y: z"])
def test_resume_of_a_path_yaml_would_misread_continues_that_run(tmp_path, monkeypatch, name):
    """`--resume 'runs/exp2 #b'` became the override run.out_dir=runs/exp2 #b, read as YAML: runs/exp2 (a
    different run, resumed and overwritten); `runs/a: b` was a mapping and could not be resumed at all."""
    monkeypatch.chdir(tmp_path)
    _fake_run(tmp_path / "runs" / "exp2", run__out_dir="runs/exp2", run__steps=5)
    run = _fake_run(tmp_path / "runs" / name, run__out_dir=f"runs/{name}", run__steps=5)
    cfg = load_run_config(TrainConfig, ["run.steps=9"], resume=Path("runs") / name, threads=2)
    assert cfg.run.out_dir == str(Path("runs") / name) and Path(cfg.run.out_dir).resolve() == run.resolve()
    assert (cfg.run.steps, cfg.run.num_threads) == (9, 2)


def test_a_run_directory_given_as_a_positional_is_a_typed_path(tmp_path, monkeypatch):
    """`rlvr eval 'runs/sft #2'` was the override model.init_from=runs/sft #2: runs/sft, another run."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "sft").mkdir(parents=True)
    _fake_run(tmp_path / "runs" / "sft #2", run__out_dir="runs/sft #2")
    args = policy_positionals(["runs/sft #2", "sampling.max_tokens=2"])
    cfg = load_config(EvalConfig, None, args)
    assert cfg.model.init_from == "runs/sft #2" and cfg.sampling.max_tokens == 2


# --- item 6: alias bombs -----------------------------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
MERGE_BOMB = "a0: &a0 {k0: 1, k1: 2}\n" + "".join(
    f"a{i + 1}: &a{i + 1} {{<<: [{', '.join([f'*a{i}'] * 9)}]}}\n" for i in range(8))
DEEP = "x: " + "[" * 3000 + "]" * 3000 + "\n"

# Read in a child process with a memory cap and a deadline: on a loader that follows the aliases the bomb
# takes gigabytes and minutes; this way it fails the test instead of the machine.
_CHILD = textwrap.dedent("""
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from rlvr.config import ConfigError, load_config, read_yaml
    from rlvr.train.config import TrainConfig
    kind, path = sys.argv[1], sys.argv[2]
    if kind == "pipeline":
        from rlvr.train.pipeline import load_pipeline
    t0 = time.perf_counter()
    try:
        if kind == "config":
            load_config(TrainConfig, path)
        elif kind == "override":
            load_config(TrainConfig, None, ["run.name=" + open(path).read()])
        else:
            load_pipeline(path)
    except ConfigError as exc:
        print(f"{time.perf_counter() - t0:.3f}")
        print(exc)
        sys.exit(0)
    print("loaded")
    sys.exit(1)
""")


def _refused_in_child(kind: str, path: Path) -> tuple[float, str]:
    res = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True,
                         timeout=60, cwd=path.parent)
    assert res.returncode == 0, f"exit {res.returncode}\nstdout:\n{res.stdout}\nstderr:\n{res.stderr[-3000:]}"
    seconds, message = res.stdout.split("\n", 1)
    return float(seconds), message.strip()


@pytest.mark.parametrize("text", [BOMB, MERGE_BOMB], ids=["aliases", "merge_keys"])
def test_a_yaml_alias_bomb_config_is_refused_at_once_naming_the_file(tmp_path, text):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    seconds, message = _refused_in_child("config", path)
    assert seconds < 0.5, seconds
    assert message.startswith(f"{path}:") and "alias" in message, message


def test_a_yaml_alias_bomb_pipeline_file_is_refused(tmp_path):
    path = tmp_path / "stages.yaml"
    path.write_text("out_dir: runs/p\nstages: []\n" + BOMB)
    seconds, message = _refused_in_child("pipeline", path)
    assert seconds < 0.5 and str(path) in message and "alias" in message, message


def test_a_yaml_alias_bomb_in_an_override_is_refused(tmp_path):
    path = tmp_path / "override.txt"
    path.write_text("{" + BOMB.strip().replace("\n", ", ") + "}")
    seconds, message = _refused_in_child("override", path)
    assert seconds < 0.5 and "override 'run.name=" in message and "alias" in message, message


def test_a_deeply_nested_yaml_file_is_refused_quickly(tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text(DEEP)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"deep\.yaml:1: YAML nested too deeply"):
        read_yaml(path)
    assert time.perf_counter() - t0 < 2


def test_a_harmless_anchor_still_works(tmp_path):
    """Anchors and aliases are allowed (as Docker Compose, GitLab CI and Kubernetes allow them); only their
    expansion is bounded."""
    path = tmp_path / "run.yaml"
    path.write_text("sampling:\n  temperature: &t 0.7\n  stop: &stops ['</answer>']\n"
                    "run:\n  eval_temperature: *t\n  steps: 3\n")
    cfg = load_config(TrainConfig, path)
    assert (cfg.sampling.temperature, cfg.run.eval_temperature, cfg.run.steps) == (0.7, 0.7, 3)


def test_duplicate_keys_are_still_named_with_their_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  steps: 3\n  steps: 4\n")
    with pytest.raises(ConfigError, match=r"run\.yaml:3: duplicate key 'run.steps'"):
        read_yaml(path)


# --- item 15: resume from any folder ----------------------------------------------------------------------


def _project(root: Path) -> Path:
    """A project folder as a user leaves it: an init run (a model folder is enough here), a data file and a
    run started in the project folder with relative paths; returns the run directory."""
    (root / "runs" / "sft" / "model").mkdir(parents=True)
    (root / "runs" / "sft" / "model" / "config.json").write_text("{}")
    (root / "data").mkdir()
    (root / "data" / "train.jsonl").write_text('{"question": "1+1=", "answer": "2"}\n')
    return _fake_run(root / "runs" / "grpo", model__init_from="runs/sft", data__train_path="data/train.jsonl",
                     run__out_dir="runs/grpo", run__steps=4)


def test_started_in_is_told_by_the_recorded_out_dir(tmp_path):
    from rlvr.commands.config_cli import started_in

    run = tmp_path / "proj" / "runs" / "grpo"
    run.mkdir(parents=True)
    assert started_in(run, "runs/grpo") == (tmp_path / "proj").resolve()
    assert started_in(run, "./runs/grpo/") == (tmp_path / "proj").resolve()
    assert started_in(run, ".") == run.resolve()
    assert started_in(run, "runs/other") is None  # renamed or moved: cannot be told
    assert started_in(run, str(run)) is None and started_in(run, "../runs/grpo") is None


def test_resume_from_another_folder_reads_relative_paths_from_where_the_run_started(tmp_path, monkeypatch,
                                                                                     capsys):
    """A relative model.init_from / data.train_path made `--resume` fail from any other folder."""
    run = _project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_run_config(TrainConfig, ["run.steps=8"], resume=Path("../proj/runs/grpo"), threads=0)
    proj = (tmp_path / "proj").resolve()
    assert Path(cfg.model.init_from) == proj / "runs" / "sft"
    assert Path(cfg.data.train_path) == proj / "data" / "train.jsonl"
    assert Path(cfg.run.out_dir).resolve() == run.resolve() and cfg.run.steps == 8
    assert f"the run was started in {proj}" in capsys.readouterr().err


def test_resume_from_the_folder_it_started_in_changes_nothing(tmp_path, monkeypatch, capsys):
    _project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path / "proj")
    cfg = load_run_config(TrainConfig, [], resume=Path("runs/grpo"), threads=0)
    assert (cfg.model.init_from, cfg.data.train_path) == ("runs/sft", "data/train.jsonl")
    assert "started in" not in capsys.readouterr().err


def test_an_override_repairs_a_stored_path_that_no_longer_exists(tmp_path, monkeypatch):
    """The stored config was validated before the overrides applied, so no override could repair it."""
    import shutil

    run = _project(tmp_path / "proj")
    shutil.rmtree(tmp_path / "proj" / "runs" / "sft")
    (tmp_path / "moved" / "model").mkdir(parents=True)
    (tmp_path / "moved" / "model" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "proj")
    cfg = load_run_config(TrainConfig, [f"model.init_from={tmp_path / 'moved'}"], resume=run, threads=0)
    assert cfg.model.init_from == str(tmp_path / "moved")


def test_a_moved_run_whose_paths_are_gone_says_how_to_give_them(tmp_path, monkeypatch, capsys):
    _project(tmp_path / "proj")
    (tmp_path / "proj" / "runs" / "grpo").rename(tmp_path / "proj" / "runs" / "renamed")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(typer.Exit):
        load_run_config(TrainConfig, [], resume=Path("proj/runs/renamed"), threads=0)
    err = capsys.readouterr().err
    assert "model.init_from=runs/sft" in err and "give the path again as an override" in err, err
