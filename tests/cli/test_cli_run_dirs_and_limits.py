"""Runs as inputs, and the limits checked before any work (issue 25, "the first hour, round two", items 2, 6,
7, 12 and 13), run as a user runs them (the installed `rlvr` script in a subprocess): a run given as
model.init_from lends its task to train and sft as it does to eval, and every trainer says what it evaluates
on (2); prompt + max_tokens checked against the model's positions before any work (6); the final evaluation
announced, its CPU batch sized by tokens (7); the natural spellings of a run, a stop string and a directory
(12); the defaults that tripped (13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TESTS
from helpers.cli import refused, run_rlvr
from helpers.shared_data import needs_shared, shared_path

# subprocess CLI runs of issue 25 (about 5 minutes together on 2 cores): `make test-cli`, run by .ci/run
pytestmark = pytest.mark.cli

# A tiny model on one-digit additions of four terms: the demo's own task (9006 distinct training problems).
MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]
TASK = ["data.digits=1", "data.operands=4", "data.num_eval=4"]
FAST = ["sampling.max_tokens=4", "run.eval_every=0", "run.log_samples_every=0"]
RL = ["sampling.n_prompts=2", "sampling.group_size=2"]


def _no_traceback(res) -> None:
    assert "Traceback" not in res.stdout + res.stderr, res.stderr


def _header(res, prefix: str) -> str:
    """The one line of the output that starts with `prefix`."""
    lines = [x for x in (res.stdout + res.stderr).splitlines() if x.startswith(prefix)]
    assert len(lines) == 1, f"{prefix!r}:\nstdout:\n{res.stdout}\nstderr:\n{res.stderr}"
    return lines[0]


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory) -> Path:
    """A finished SFT run of two steps on the demo's task with its own response settings (max_tokens 6, an
    extra stop string): what `rlvr sft` leaves for eval, filter and train to start from."""
    run = tmp_path_factory.mktemp("runs") / "sft"
    res = run_rlvr("sft", *MODEL, *TASK, "data.num_train=64", "sampling.max_tokens=6", "sampling.stop=[\"#\"]",
                "run.steps=2", "run.eval_every=0", "run.log_samples_every=0", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    return run


# --- item 12: natural spellings ------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["{run}", "{run}/config.yaml",
                                      pytest.param("model.init_from={run}", marks=pytest.mark.slow)])  # the control
def test_eval_takes_a_run_directory_or_its_config_yaml(sft_run, spelling):
    """`rlvr eval runs/sft` was "neither a config file nor an override", `rlvr eval runs/sft/config.yaml` 18
    config errors (the trainer's dump read as an eval config); both now mean model.init_from=runs/sft."""
    res = run_rlvr("eval", spelling.format(run=sft_run), "sampling.max_tokens=2")
    assert res.returncode == 0, res.stderr
    _no_traceback(res)
    head = _header(res, "evaluating ")
    assert f"(run {sft_run})" in head and f"from {sft_run / 'config.yaml'}" in head, head
    assert "4 held-out problems" in head and "stop='#'" in head, head  # the run's data.num_eval and stop string


def test_eval_refuses_a_directory_that_is_no_run(tmp_path):
    (tmp_path / "notes").mkdir()
    refused(run_rlvr("eval", str(tmp_path / "notes")), str(tmp_path / "notes"), "neither a run directory")


def test_stop_override_without_brackets_is_a_one_item_list(sft_run):
    """`sampling.stop=</answer>` was refused (expects list[str]); it is the list of that one string."""
    res = run_rlvr("eval", str(sft_run), "sampling.max_tokens=2", "sampling.stop=</answer>")
    assert res.returncode == 0, res.stderr
    assert "stop='</answer>'" in _header(res, "evaluating "), res.stdout


def test_grade_on_a_directory_is_one_clear_line(sft_run):
    line = refused(run_rlvr("grade", str(sft_run), "--reward", "arithmetic"), str(sft_run), "is a directory",
                    "one JSONL file")
    assert str(sft_run / "metrics.jsonl") in line  # the files it could have meant


# --- item 2: a run given as model.init_from lends its task; every trainer says what it evaluates on ----


def _config(run: Path) -> dict:
    import yaml

    return yaml.safe_load((run / "config.yaml").read_text())


@pytest.mark.parametrize("command", ["train", pytest.param("sft", marks=pytest.mark.slow),
                                     pytest.param("ei", marks=pytest.mark.slow)])  # one shared loader: train by default
def test_init_from_a_run_trains_and_evaluates_on_its_task(sft_run, tmp_path, command):
    """`rlvr train model.init_from=runs/sft` trained and evaluated on the defaults (3-digit sums, 200 problems,
    16 tokens: 0.0% in filtering.md's "then train on it" step) and said nothing about it."""
    run = tmp_path / command
    rl = [] if command == "sft" else RL
    res = run_rlvr(command, f"model.init_from={sft_run}", *rl, "run.steps=1", "run.log_samples_every=0",
                f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    _no_traceback(res)
    assert f"the run's task (data.*) and response settings (sampling.*) from {sft_run / 'config.yaml'}" in res.stderr
    plan = _header(res, "evaluates on ")
    assert plan.startswith("evaluates on arithmetic (template question_only, reward arithmetic): 4 held-out problems")
    assert "greedy, max_tokens=6, stop='#', after the last step" in plan, plan
    assert "evaluating 4 held-out problems ..." in res.stderr  # the final evaluation is announced
    cfg = _config(run)
    assert (cfg["data"]["digits"], cfg["data"]["operands"], cfg["data"]["num_eval"], cfg["data"]["num_train"]) == \
        (1, 4, 4, 64)
    assert (cfg["sampling"]["max_tokens"], cfg["sampling"]["stop"]) == (6, ["#"])


def test_an_override_still_wins_and_another_task_drops_the_runs_data(sft_run, tmp_path):
    res = run_rlvr("train", f"model.init_from={sft_run}", *RL, "run.steps=1", "data.num_eval=2", "sampling.max_tokens=3",
                "run.log_samples_every=0", f"run.out_dir={tmp_path / 'a'}")
    assert res.returncode == 0, res.stderr
    assert "2 held-out problems" in _header(res, "evaluates on ") and "max_tokens=3" in _header(res, "evaluates on ")
    res = run_rlvr("train", f"model.init_from={sft_run}", *RL, "run.steps=1", "data.task=countdown", "data.num_eval=2",
                "data.num_train=8", "run.log_samples_every=0", f"run.out_dir={tmp_path / 'b'}")
    assert res.returncode == 0, res.stderr
    assert "the run's response settings (sampling.*) from" in res.stderr
    assert _header(res, "evaluates on ").startswith("evaluates on countdown")
    assert _config(tmp_path / "b")["data"]["digits"] == 3  # the run's arithmetic knobs did not come along


# --- item 6: prompt + max_tokens against the model's positions, before any work ------------------------


@pytest.mark.parametrize("command", ["train", pytest.param("sft", marks=pytest.mark.slow), "eval"])
def test_max_tokens_past_the_positions_of_a_rope_model_is_refused(tmp_path, command):
    """The tiny model (RoPE; 512 positions then, 4096 now) generated past its positions silently (5000 tokens
    for two minutes after the bar said 100%); now one line naming the keys, and no run directory."""
    run = tmp_path / "run"
    rl = RL if command == "train" else []
    run_keys = [] if command == "eval" else ["data.num_train=64", "run.steps=1", f"run.out_dir={run}"]
    res = run_rlvr(command, *MODEL, *TASK, *rl, "sampling.max_tokens=5000", *run_keys)
    line = refused(res, "sampling.max_tokens=5000 + the longest prompt (", "but the model has 4096",
                    "max_position_embeddings of model.name=tiny", "lower it to at most")
    room = int(line.split("lower it to at most ")[1].split(",")[0])
    assert 4070 < room < 4096  # 4096 minus a one-line addition prompt of a few characters
    assert not run.exists()


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory) -> Path:
    """A tiny GPT-2 (absolute positions, 64 of them) with the tiny model's character tokenizer."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlvr.models import build_tiny_model

    _, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    folder = tmp_path_factory.mktemp("gpt2") / "model"
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2,
                     bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_absolute_position_model_is_refused_not_an_index_error(gpt2_folder, tmp_path):
    """GPT-2 with 64 positions asked for 80 response tokens: a 100-line IndexError from the embedding lookup
    (and a stub run directory) before; now one line."""
    run = tmp_path / "run"
    res = run_rlvr("train", f"model.name={gpt2_folder}", *TASK, "data.num_train=64", *RL, "sampling.max_tokens=80",
                "run.steps=1", f"run.out_dir={run}")
    refused(res, "sampling.max_tokens=80", "but the model has 64", f"model.name={gpt2_folder}")
    assert not run.exists()
    res = run_rlvr("eval", f"model.name={gpt2_folder}", *TASK, "sampling.max_tokens=40")  # fits: it runs
    assert res.returncode == 0, res.stderr


# --- item 7: CPU evaluation sized by tokens --------------------------------------------------------------

MATH500 = shared_path("data", "math500", "test.jsonl")  # development data (../shared): skipped in a clone
needs_math500 = needs_shared("data", "math500", "test.jsonl")


def _math_prompt_tokens(n: int) -> list[int]:
    """Token counts of the first n MATH-500 prompts under r1_zero with the tiny model's tokenizer."""
    from rlvr.config import load_config
    from rlvr.models import build_tiny_model
    from rlvr.train.config import EvalConfig
    from rlvr.train.tasks import eval_examples, load_task_data

    _, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cfg = load_config(EvalConfig, None, ["data.task=math", f"data.eval_path={MATH500}", f"data.num_eval={n}"])
    task = load_task_data(cfg.data, tok, train=False)
    return [len(tok(task.prompt(ex))["input_ids"]) for ex in eval_examples(task, n)]


@needs_math500
def test_cpu_eval_of_long_prompts_is_cut_by_tokens():
    """MATH-500 under r1_zero (400-1200 tokens a prompt with the character tokenizer) went to the model 256
    prompts at a time on CPU: 183 s for what takes 26 s in calls of 32. Now each generate call holds at most
    16384 tokens (rows x (longest prompt + max_tokens)); the progress lines show where the calls end."""
    res = run_rlvr("eval", *MODEL, "data.task=math", f"data.eval_path={MATH500}", "data.num_eval=40",
                "sampling.max_tokens=8")
    assert res.returncode == 0, res.stderr
    _no_traceback(res)
    lines = [x for x in res.stderr.splitlines() if x.startswith("loaded in")]
    assert len(lines) == 1 and "generating 40 x 1 responses, " in lines[0], res.stderr
    calls = int(lines[0].split("responses, ")[1].split(" generate calls")[0])
    assert "of at most 16384 tokens (CPU)" in lines[0]
    ends = [int(x.split("/")[0]) for x in res.stderr.splitlines() if x.startswith("  ") and "/40 problems" in x]
    assert len(ends) == calls >= 2 and ends[-1] == 40, res.stderr
    lengths = _math_prompt_tokens(40)
    for start, end in zip([0, *ends[:-1]], ends, strict=True):
        rows = end - start
        assert rows * (max(lengths[start:end]) + 8) <= 16384 or rows == 1  # within the budget
        if end < 40:  # and as full as the budget allows: the next prompt would not have fitted
            assert (rows + 1) * (max(lengths[start:end + 1]) + 8) > 16384


@needs_math500
def test_filter_on_cpu_is_cut_by_tokens_too(tmp_path):
    out = tmp_path / "filtered"
    res = run_rlvr("filter", *MODEL, "data.task=math", f"data.train_path={MATH500}", "data.num_train=24",
                "sampling.max_tokens=4", f"run.out_dir={out}", "--k", "2")
    assert res.returncode == 0, res.stderr
    line = _header(res, "pass rates: 24 problems x 2 samples in ")
    assert line.endswith("generate calls of at most 16384 tokens (CPU)"), line
    assert (out / "train.jsonl").exists()


# --- item 13: defaults that tripped -------------------------------------------------------------------


def test_the_demos_task_trains_with_the_default_num_train(tmp_path):
    """data.num_train=20000 (the default) was refused on the demo's own task (9006 distinct problems), so every
    recipe command needed data.num_train=8000. The default is now as many as there are, up to 20000."""
    run = tmp_path / "run"
    res = run_rlvr("train", "--recipe", "grpo", *MODEL, *TASK, *RL, *FAST, "run.steps=1", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    _no_traceback(res)
    assert _config(run)["data"]["num_train"] == 0


def test_more_prompts_per_step_than_problems_is_said(tmp_path):
    res = run_rlvr("train", *MODEL, *TASK, "data.num_train=3", "sampling.n_prompts=4", "sampling.group_size=2", *FAST,
                "run.steps=1", f"run.out_dir={tmp_path / 'run'}")
    assert res.returncode == 0, res.stderr
    line = _header(res, "warning: sampling.n_prompts=4 ")
    assert "more than the 3 training problems (task arithmetic)" in line and "at most 3" in line


GOOD = json.dumps({"question": "Tom has 2 apples and buys 3. How many?", "answer": "2+3=5\n#### 5"})


@pytest.mark.parametrize("lines,needles", [
    ([], ["no training problems (the file has no non-blank lines)"]),
    ([GOOD, "{not json", GOOD, '{"question": "q"}', "[1]", GOOD, '{"question": "q", "answer": "no marker"}', "x"],
     ["5 bad lines of 8: line 2: invalid JSON", "line 4: missing key \"answer\"", "line 5: expected a JSON object",
      "(and 2 more)"]),
])
def test_a_bad_data_file_is_named_with_every_bad_line_before_the_model_loads(tmp_path, lines, needles):
    """An empty train file said "task 'gsm8k' has no training examples" (no file named); a file with bad lines
    reported only the first, after the model had loaded."""
    path = tmp_path / "train.jsonl"
    path.write_text("".join(x + "\n" for x in lines))
    run = tmp_path / "run"
    res = run_rlvr("train", *MODEL, "data.task=gsm8k", f"data.train_path={path}", "data.template=question_only", *RL,
                *FAST, "run.steps=1", f"run.out_dir={run}")
    refused(res, f"data.train_path={path}: ", *needles)
    assert "loading model" not in res.stderr  # found before any model work
    assert not run.exists()


def test_config_yaml_records_the_shape_that_was_trained(sft_run, tmp_path):
    """model.hidden_size=48 with model.init_from is ignored (a warning says so), and config.yaml recorded 48
    anyway; it now records the loaded model's shape."""
    run = tmp_path / "run"
    res = run_rlvr("train", f"model.init_from={sft_run}", "model.hidden_size=48", "model.num_layers=3", *RL, *FAST,
                "run.steps=1", f"run.out_dir={run}")
    assert res.returncode == 0, res.stderr
    assert "ignored with model.init_from" in res.stderr
    m = _config(run)["model"]
    assert (m["hidden_size"], m["num_layers"], m["num_heads"], m["intermediate_size"]) == (32, 1, 2, 64)
    res = run_rlvr("train", "--resume", str(run), "run.steps=2")  # the recorded shape resumes without a warning
    assert res.returncode == 0, res.stderr
    assert "ignored with" not in res.stderr and _config(run)["model"]["hidden_size"] == 32


DENSE = ["data.reward=helpers.dense_reward:letter_share"]  # tests/helpers/dense_reward.py: a random tiny model's groups differ


@pytest.mark.parametrize("recipe,reward,needle,shown", [
    ("dapo", [], "note: step 1 made no update (loss shows 'skipped'): every group's responses scored alike",
     "loss=skipped"),
    ("grpo", DENSE, "is ~0 by construction, not a bug", "loss=0"),
    # a fresh model solves nothing: every group's rewards are equal, the ~0 loss is no "by construction" (issue 36)
    ("grpo", [], "warning: no learning signal in step 1: in every group all responses got the same reward", "loss=0"),
])
def test_the_progress_lines_loss_is_explained(tmp_path, recipe, reward, needle, shown):
    """`--recipe dapo` showed loss=None with no hint (a fresh model solves nothing: every group is dropped);
    GRPO's on-policy loss of ~1e-9 on the demo's progress line read like a bug; a GRPO run without any reward
    spread was told its ~0 loss was "not a bug" and never warned."""
    res = run_rlvr("train", "--recipe", recipe, *MODEL, *TASK, *RL, *FAST, *reward, "algo.refill_rounds=0", "run.steps=1",
                f"run.out_dir={tmp_path / 'run'}", RLVR_PROGRESS="plain", PYTHONPATH=str(TESTS))
    assert res.returncode == 0, res.stderr
    assert needle in res.stderr, res.stderr
    if needle.startswith("warning"):
        assert "not a bug" not in res.stderr, res.stderr
    assert [x for x in res.stdout.splitlines() if x.startswith("rl 1/1")][0].split()[-1].startswith(shown), res.stdout
