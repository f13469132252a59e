"""The format rate, studies, plots and dataset columns (issue 25, "the first hour, round two", items 8, 11,
14, 15 and 16), run as a user runs them (the installed `rlvr` script in a subprocess): one definition of the
format rate (8), studies that write to runs/ unless published (11), plots without constant or duplicate panels
(14), an HF dataset and column mapping from the config (15), and the per-run noise quieted (16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REPO
from helpers.cli import TINY, cli_env, run_rlvr

# subprocess CLI runs of issue 25 (about 5 minutes together on 2 cores): `make test-cli`, run by .ci/run
pytestmark = pytest.mark.cli


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


# --- item 8: one format rate -------------------------------------------------------------------------


def _grade_rows(res) -> dict[str, str]:
    rows = {}
    for line in res.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) == 2:
            rows[cells[0]] = cells[1]
    return rows


def test_format_rate_is_one_thing_in_grade(tmp_path):
    """`rlvr grade` counted "an answer was extracted" as formatted for a reward without a format part
    (0.6667 below) where `rlvr eval` and the demo table print n/a."""
    f = tmp_path / "g.jsonl"
    f.write_text('{"response": "Answer: 4", "reference": "4"}\n{"response": "Answer: 5", "reference": "4"}\n'
                 '{"response": "no idea", "reference": "4"}\n'
                 '{"response": "</think> <answer>4</answer>", "reference": "4"}\n')
    res = run_rlvr("grade", str(f), "--reward", "arithmetic")
    assert res.returncode == 0, res.stderr
    rows = _grade_rows(res)
    assert rows["format rate"].startswith("n/a"), rows
    assert rows["status unparsable"] == "1"  # the "answer found" count is still there, under its own name
    res = run_rlvr("grade", str(f), "--reward", "r1_zero")  # a reward with a format part: 1 of 4 follows it
    assert res.returncode == 0, res.stderr
    assert _grade_rows(res)["format rate"] == "0.2500"


def test_format_rate_is_one_thing_in_training(tmp_path):
    """The training metric (and so the plot) logged format_rate 1.0 for the arithmetic reward, which has no
    format part, while the held-out eval of the same run printed "format rate n/a"."""
    run = tmp_path / "run"
    res = run_rlvr("train", *TINY, "run.steps=2", "run.eval_every=0", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    steps = [r for r in _rows(run) if "reward/mean" in r]
    assert steps and not any("format_rate" in r for r in steps), steps[0]
    assert "format rate n/a" in res.stdout + res.stderr
    res = run_rlvr("train", *TINY, "data.reward=r1_zero", "run.steps=1", "run.eval_every=0",
                f"run.out_dir={tmp_path / 'r1'}")
    assert res.returncode == 0, res.stderr
    steps = [r for r in _rows(tmp_path / "r1") if "reward/mean" in r]
    assert steps[0]["format_rate"] == steps[0]["reward/format"]  # r1_zero's format part is 0 or 1


# --- item 11: studies write to runs/ unless published ----------------------------------------------------


def _study_tree(tmp_path: Path) -> Path:
    """A copy of benchmarks/studies with a 'published' results file: the scripts find the repository root
    from their own path, so a copy writes under tmp_path and the published file can be watched."""
    import shutil

    repo = REPO
    shutil.copytree(repo / "benchmarks" / "studies", tmp_path / "benchmarks" / "studies",
                    ignore=shutil.ignore_patterns("__pycache__"))
    published = tmp_path / "benchmarks" / "results" / "studies"
    published.mkdir(parents=True)
    (published / "std_normalization.json").write_text('{"learning": "the committed, complete result"}')
    return tmp_path


def _study(tree: Path, name: str, *args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, str(tree / "benchmarks" / "studies" / f"{name}.py"), *args],
                          capture_output=True, text=True, env=cli_env(), timeout=120)


def test_a_study_writes_to_runs_unless_published(tmp_path):
    """Running a study overwrote the committed benchmarks/results/studies, and --no-learning replaced the
    published std_normalization.json (with its 3-seed learning result) by a partial one."""
    tree = _study_tree(tmp_path)
    published = tree / "benchmarks" / "results" / "studies"
    before = (published / "std_normalization.json").read_text()
    res = _study(tree, "std_normalization", "--no-learning")
    assert res.returncode == 0, res.stderr
    assert (published / "std_normalization.json").read_text() == before
    local = json.loads((tree / "runs" / "studies" / "results" / "std_normalization.json").read_text())
    assert "learning" not in local and local["weights"]  # the partial result, where it belongs
    assert f"wrote {tree / 'runs' / 'studies' / 'results' / 'std_normalization.json'}" in res.stdout

    res = _study(tree, "std_normalization", "--no-learning", "--publish")  # a partial result is never published
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "error: --no-learning makes a partial result, which is never published over benchmarks/results/studies/ "
        "(drop --publish; it writes to runs/)"]
    assert (published / "std_normalization.json").read_text() == before

    res = _study(tree, "one_minus_1_over_g", "--groups", "2000", "--sizes", "2", "--publish")  # explicit: published
    assert res.returncode == 0, res.stderr
    assert json.loads((published / "one_minus_1_over_g.json").read_text())["command"].endswith("--publish")
    assert (published / "one_minus_1_over_g.png").is_file()
    assert not (tree / "runs" / "studies" / "results" / "one_minus_1_over_g.json").exists()


# --- item 14: plots without constant panels, duplicates or a dump -----------------------------------------


def _plot_listing(stdout: str) -> dict[str, list[str]]:
    """`rlvr plot` output: {figure file name: [its panel / footnote lines]}."""
    figs: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line.endswith(".png") and not line.startswith(" "):
            cur = figs.setdefault(Path(line).name, [])
        elif line.startswith("  "):
            cur.append(line.strip())
    return figs


def test_plots_of_a_real_run_have_no_constant_panel_duplicate_or_dump(tmp_path):
    """other.png held a policy version rising with the step, staleness 0 and three RSS panels; flat series
    (clip fraction 0, ratio 1, verifier failures 0, a constant lr) were drawn as panels."""
    run = tmp_path / "run"
    res = run_rlvr("train", *TINY, "run.steps=3", "run.eval_every=0", "optim.schedule=constant", "optim.warmup_steps=0",
                f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert not (run / "plots" / "other.png").exists()  # every key the trainer logs has its figure
    res = run_rlvr("plot", str(run))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    figs = _plot_listing(res.stdout)
    assert "other.png" not in figs and {"reward.png", "optimization.png", "system.png"} <= set(figs)
    panels = {ln.split(":")[0]: ln.split(": ", 1)[1] for lines in figs.values() for ln in lines
              if not ln.startswith("constant")}
    constants = " ".join(ln for lines in figs.values() for ln in lines if ln.startswith("constant"))
    for flat in ("clip_frac/low = 0", "ratio/mean = 1", "verifier/errors = 0", "lr = 0.0001", "rollout/staleness = 0"):
        assert flat in constants, (flat, constants)
    for gone in ("Clip fraction", "Importance ratio", "Learning rate", "Verifier failures", "Rollout staleness"):
        assert gone not in panels, (gone, panels)
    # one memory panel; equal series drawn once, the legend naming both
    assert not [k for k, v in panels.items() if "mem/" in v and k != "Memory"]  # was three RSS panels
    for key in ("mem/rss_gb", "mem/rss_peak_gb", "mem/rss_step_peak_gb"):  # drawn (named as twins) or constant
        assert key in panels["Memory"].replace(",", " ").split() or f"{key} = " in constants, (key, panels["Memory"], constants)
    # a one-part reward: mean = its part, drawn once; drawn even when flat (no reward in 3 steps: a line at 0)
    assert panels["Reward"].startswith("reward/mean = reward/answer"), panels["Reward"]
    assert "reward/mean = " not in constants, constants
    # nothing the trainer logged was lost: each numeric key is drawn, named as a twin or as a constant
    logged = {k for r in _rows(run) for k, v in r.items() if isinstance(v, int | float) and k not in ("step", "time")}
    shown = " ".join(panels.values()) + " " + constants
    missing = [k for k in logged if k not in shown.replace(",", " ").split() and k != "rollout/policy_version"]
    assert not missing, missing


def test_sft_reward_plot_has_no_twin_panels(tmp_path):
    """SFT's reward.png drew eval/reward and eval/accuracy, equal for a 0/1 reward, as two identical panels."""
    from rlvr.runs import RunDir

    with RunDir.create(tmp_path / "sft", tensorboard=False) as run:
        for step, acc in ((25, 0.05), (50, 0.125), (75, 0.28)):  # as the demo's SFT logs its periodic check
            run.log_metrics(step, {"loss": 1.0 / step, "lr": 3e-3, "eval/accuracy": acc, "eval/reward": acc,
                                   "eval/format_rate": None, "eval/len/mean": 3.0}, time_s=step / 10)
    res = run_rlvr("plot", str(tmp_path / "sft"))
    assert res.returncode == 0, res.stderr
    figs = _plot_listing(res.stdout)
    assert figs["reward.png"] == ["Reward: eval/reward = eval/accuracy"], figs["reward.png"]
    assert figs["optimization.png"] == ["Loss: loss", "constant, not drawn: lr = 0.003"]
    assert "length.png" not in figs  # its one series is flat: no figure of empty panels


# --- item 15: your own columns and a Hugging Face dataset from the config -----------------------------------

MODEL = [x for x in TINY if x.startswith("model.")] + ["sampling.max_tokens=4", "sampling.n_prompts=2",
                                                       "sampling.group_size=2"]
ROWS = [("What is 2+3?", "5"), ("What is 4+4?", "8"), ("What is 1+6?", "7"), ("What is 3+3?", "6")]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_trl_style_prompt_answer_file_with_column_mapping(tmp_path):
    """A TRL-style {"prompt", "answer"} file was refused ("missing key") with no way to map its columns."""
    f = _jsonl(tmp_path / "trl.jsonl", [{"prompt": q, "answer": a} for q, a in ROWS])
    run = tmp_path / "run"
    base = ["train", *MODEL, "data.task=math", f"data.train_path={f}", f"data.eval_path={f}", "run.steps=1",
            "run.log_samples_every=1", f"run.out_dir={run}"]
    res = run_rlvr(*base)  # unmapped: one line naming the file, the line and the keys to set
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    err = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and f"{f}: " in err[0] and "line 1: missing key" in err[0] and "data.question_key" in err[0], \
        res.stderr
    res = run_rlvr(*base, "data.question_key=prompt")
    assert res.returncode == 0, res.stderr
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert any("What is" in s["prompt"] for s in samples) and {s["reference"] for s in samples} <= {a for _, a in ROWS}
    # a mapped column that a row lacks: file and line named
    bad = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "What is 1+1?", "answer": "2"}, {"question": "x", "answer": "1"}])
    res = run_rlvr("train", *MODEL, "data.task=math", f"data.train_path={bad}", f"data.eval_path={f}",
                "data.question_key=prompt", "run.steps=1", f"run.out_dir={tmp_path / 'bad'}")
    assert res.returncode == 2 and f"data.train_path={bad}: " in res.stderr, res.stderr
    assert 'line 2: missing key "prompt"' in res.stderr, res.stderr


def test_hf_dataset_from_the_config_with_column_mapping(tmp_path):
    """data.hf_dataset / hf_split / hf_eval_split from the config (load_hf existed only in Python), on a
    dataset on disk: a folder of data files and the same written by save_to_disk."""
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "files"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", [{"query": q, "final": a} for q, a in ROWS])
    _jsonl(folder / "test.jsonl", [{"query": "What is 2*3?", "final": "6"}, {"query": "What is 2*4?", "final": "8"}])
    saved = tmp_path / "saved"
    datasets.load_dataset(str(folder), cache_dir=str(tmp_path / "cache")).save_to_disk(str(saved))
    keys = ["data.task=math", "data.question_key=query", "data.answer_key=final", "run.steps=1",
            "run.log_samples_every=1", "run.num_log_samples=8"]
    for i, source in enumerate((folder, saved)):
        run = tmp_path / f"run{i}"
        res = run_rlvr("train", *MODEL, *keys, f"data.hf_dataset={source}", f"run.out_dir={run}",
                    HF_DATASETS_CACHE=str(tmp_path / "cache"))
        assert res.returncode == 0, res.stderr
        samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
        assert samples and {s["reference"] for s in samples} <= {a for _, a in ROWS}  # the train split, mapped
        assert any(s["prompt"].count("What is") for s in samples)
    # the held-out split of the same dataset (SFT logs its evaluation samples)
    sft = tmp_path / "sft"
    res = run_rlvr("sft", *[x for x in MODEL if not x.startswith(("sampling.n_", "sampling.g"))], *keys,
                "data.template=question_only", f"data.hf_dataset={saved}", "data.hf_eval_split=test",
                f"run.out_dir={sft}", HF_DATASETS_CACHE=str(tmp_path / "cache"))
    assert res.returncode == 0, res.stderr
    evals = [json.loads(x) for x in (sft / "samples.jsonl").read_text().splitlines()]
    assert sorted((s["source"], s["reference"], s["prompt"]) for s in evals) == [
        ("eval", "6", "What is 2*3?"), ("eval", "8", "What is 2*4?")]
    res = run_rlvr("train", *MODEL, "data.task=math", f"data.hf_dataset={saved}", "data.hf_split=validation",
                "data.question_key=query", "data.answer_key=final", "run.steps=1", f"run.out_dir={tmp_path / 'x'}")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "has no split 'validation'; it has: train, test" in res.stderr or "it has: test, train" in res.stderr


def test_hf_dataset_without_the_datasets_package_is_one_line(tmp_path):
    fake = tmp_path / "site" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named datasets')\n")
    import os

    path = os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])
    res = run_rlvr("train", *MODEL, "data.task=gsm8k", "data.hf_dataset=openai/gsm8k", "data.hf_config=main",
                "run.steps=1", f"run.out_dir={tmp_path / 'r'}", PYTHONPATH=path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "data.hf_dataset='openai/gsm8k' needs the `datasets` package: pip install datasets" in res.stderr
    assert not (tmp_path / "r").exists()


EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def _smoke_args(example: Path) -> list[str]:
    """The documented CPU smoke line of a GPU example (its header's "# CPU smoke" block), as argv after `rlvr`."""
    lines = example.read_text().splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("# CPU smoke")), None)
    assert start is not None, f"{example.name}: no '# CPU smoke' line in its header"
    cmd = []
    for x in lines[start + 1:]:
        if not x.startswith("#   "):
            if cmd:
                break
            continue
        cmd.append(x[1:].strip().rstrip("\\").strip())
    argv = " ".join(cmd).split()
    assert argv[:3] == ["rlvr", "train", f"examples/{example.name}"], argv
    return argv[1:]


def test_every_gpu_example_documents_a_cpu_smoke_line_that_validates(monkeypatch):
    """Each GPU example's CPU smoke line was found only by two refusals; now its header carries one, and the
    config it makes passes the real loader's checks on this CPU machine (the run itself: the slow test below)."""
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import validate_train_config

    monkeypatch.chdir(REPO)  # the lines' paths are relative to the repository
    assert len(EXAMPLES) == 6
    readme = (EXAMPLES[0].parent / "README.md").read_text()
    for ex in EXAMPLES:
        args = _smoke_args(ex)
        cfg = load_config(TrainConfig, args[1], args[2:])
        validate_train_config(cfg)
        assert cfg.model.device == "cpu" and cfg.rollout.backend == "hf" and cfg.run.steps == 1
        assert f"examples/{ex.name}" in readme.split("## CPU smoke", 1)[-1]


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_gpu_example_cpu_smoke_line_runs(example, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    res = run_rlvr(*_smoke_args(example), f"run.out_dir={tmp_path / 'run'}")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert len(_rows(tmp_path / "run")) >= 1
