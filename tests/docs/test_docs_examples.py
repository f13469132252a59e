"""Every `rlvr ...` command in a fenced code block of the docs (docs/*.md, README.md, examples/**/*.md)
is executed, so the docs and the behaviour cannot drift apart (issue 16, "the first hour").

- A usage synopsis (`rlvr train [run.yaml] [key=value ...] [--threads N]`: brackets or CAPITAL
  placeholders) is checked against `rlvr <command> --help`: the command exists and knows every
  option the synopsis names.
- Any other command runs as a user would run it (the installed `rlvr` script, in a subprocess), in a
  fresh working directory per page and in page order, because a page is a tutorial: `rlvr eval
  model.init_from=runs/sft` reads what the page's `rlvr sft ... run.out_dir=runs/sft` wrote. It must
  exit 0. Small-size overrides are appended (a tiny model, a few problems, short responses; only keys
  the command's config has). Step counts are divided by STEP_SCALE (rounded up), and so are the step
  numbers of checkpoint paths (`checkpoints/step_000050`) and every step-valued key (run.steps,
  run.checkpoint_every, ...): `--resume ... run.steps=200` still trains further, and a checkpoint the
  page names exists exactly when the documented run would have written it. A config file the command
  names is taken from the repository (examples/x.yaml) or, if it is not there, is the page's own
  ```yaml block (docs/config.md's `run.yaml`).
- A command that needs a GPU, vLLM or a hub model is skipped by SKIP_RULES below, each with its reason;
  the skip is reported, and so are later commands of the page that read what a skipped one would have
  written.

New pages are picked up automatically: one test per page with runnable commands.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO
from helpers.docs import DocCommand, doc_commands, fenced_blocks, run_documented

ROOT = REPO
PAGES = sorted({*ROOT.glob("docs/*.md"), *ROOT.glob("examples/**/*.md"), ROOT / "README.md"})

# Reviewed reasons a documented command cannot run in the test suite (CPU only, no network, no data).
# (pattern on the command text, reason). Keep each narrow: everything else must run.
SKIP_RULES: list[tuple[str, str]] = [
    (r"model\.device=cuda|rollout\.backend=vllm", "needs a CUDA GPU or vllm (the CPU engine: tests marked vllm)"),
    (r"data\.env=verifiers:", "needs the verifiers extra and an installed environment (make test-verifiers runs "
     "`rlvr train data.env=verifiers:...` on tests/fixtures/vf_echo_env.py)"),
    (r"model\.name=(?!tiny\b)[\w.-]+/[\w.-]+", "loads a hub model (tests never download)"),
    (r"data\.hf_dataset=(?![./])[\w.-]+/[\w.-]+", "loads a hub dataset (tests never download; the local path is "
     "tested in tests/cli/test_cli_metrics_plots_datasets.py)"),
]

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]
# Appended to each command (keys the command's config lacks are dropped); never run.steps: see above.
SMALL = {
    "train": [*TINY_MODEL, "data.num_train=64", "data.num_eval=2", "sampling.n_prompts=2", "sampling.group_size=2",
              "sampling.max_tokens=4", "run.progress=false", "run.log_samples_every=0"],
    "sft": [*TINY_MODEL, "data.num_train=64", "data.num_eval=2", "algo.batch_size=2", "sampling.max_tokens=4",
            "run.progress=false"],
    "eval": [*TINY_MODEL, "data.num_train=8", "data.num_eval=2", "sampling.max_tokens=4"],
    "demo": ["hidden_size=16", "num_layers=1", "num_train=200", "sft_examples=50", "num_eval=4", "sft_steps=2",
             "sft_eval_every=2", "sft_batch_size=4", "rl_steps=1", "n_prompts=2", "group_size=2", "progress=false"],
}
# Documented step counts are divided by this (rounded up): 400 SFT steps -> 8, 100 RL steps -> 2.
STEP_SCALE = 50
STEP_KEYS = ("run.steps", "run.eval_every", "run.checkpoint_every", "run.log_samples_every", "optim.warmup_steps",
             "algo.ref_refresh_every")
def _yaml_blocks(page: Path) -> list[str]:
    return ["\n".join(lines) for info, _, lines in fenced_blocks(page.read_text(encoding="utf-8"))
            if info.split()[:1] in (["yaml"], ["yml"])]


def _skip_reason(cmd: DocCommand) -> str | None:
    for pattern, reason in SKIP_RULES:
        if re.search(pattern, cmd.text):
            return reason
    for arg in cmd.argv:  # a config file from the repository that asks for a GPU / hub model
        path = ROOT / arg
        if arg.endswith((".yaml", ".yml")) and path.is_file():
            flat = shlex.join(f"{k}={v}" for k, v in _flatten(yaml.safe_load(path.read_text()) or {}).items())
            for pattern, reason in SKIP_RULES:
                if re.search(pattern, flat):
                    return f"{arg}: {reason}"
    return None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _config_keys(sub: str) -> set[str]:
    from rlvr.config import config_rows
    from rlvr.train.config import EvalConfig, SFTConfig, TrainConfig
    from rlvr.train.demo import DemoConfig

    cls = {"train": TrainConfig, "sft": SFTConfig, "eval": EvalConfig, "demo": DemoConfig}[sub]
    return {row[0] for row in config_rows(cls)}


def _small_overrides(cmd: DocCommand) -> list[str]:
    sub = cmd.argv[0]
    if sub not in SMALL or any(a in ("--help", "--help-config") for a in cmd.argv):
        return []
    keys = _config_keys(sub)
    return [o for o in SMALL[sub] if o.partition("=")[0] in keys]


def _scaled(n: int) -> int:
    return -(-n // STEP_SCALE)


def _scale_steps(cmd: DocCommand, config_text: str | None = None) -> list[str]:
    """The command's arguments with step counts and checkpoint step numbers scaled (see module doc);
    a training command that leaves run.steps to its config file (`config_text`) or its default gets
    that number scaled."""
    out = []
    for arg in cmd.argv:
        key, eq, value = arg.partition("=")
        if eq and key in STEP_KEYS and value.isdigit():
            arg = f"{key}={_scaled(int(value))}"
        out.append(re.sub(r"step_(\d{6})", lambda m: f"step_{_scaled(int(m.group(1))):06d}", arg))
    sub = cmd.argv[0]
    if sub in ("train", "sft") and "--resume" not in cmd.argv and not any(a.startswith("run.steps=") for a in out) \
            and not any(a in ("--help", "--help-config") for a in cmd.argv):
        from rlvr.train.config import SFTConfig, TrainConfig

        steps = _flatten(yaml.safe_load(config_text) or {}).get("run.steps") if config_text else None
        if steps is None:
            steps = (TrainConfig if sub == "train" else SFTConfig)().run.steps
        out.append(f"run.steps={_scaled(int(steps))}")
    return out


ALL = {page: doc_commands(page) for page in PAGES}
RUNNABLE_PAGES = [p for p, cmds in ALL.items() if any(not c.synopsis for c in cmds)]
SYNOPSES = [c for cmds in ALL.values() for c in cmds if c.synopsis]
# Pages whose commands train (a demo or several training runs): over ~20 s on one thread.
_SLOW_COMMANDS = ("demo", "train", "sft", "pipeline")


# Commands that already ran (and passed) on an earlier page, by (text, env): a second `rlvr demo` costs
# ~12 s and shows nothing new, so a command that reads no file of its page (demo, recipes, --help) is not
# repeated unless a later command of its page reads its output.
_ALREADY_RAN: dict[tuple[str, str], str] = {}
_DEFAULT_OUT = {"demo": "runs/demo", "train": "runs/train", "sft": "runs/sft"}


def _output_dir(cmd: DocCommand) -> str | None:
    for arg in cmd.argv:
        if arg.startswith(("run.out_dir=", "out_dir=")):
            return arg.partition("=")[2]
    return _DEFAULT_OUT.get(cmd.argv[0])


def _page_param(page: Path):
    runs = [c for c in ALL[page] if not c.synopsis and _skip_reason(c) is None]
    slow = any(c.argv[0] == "demo" for c in runs) or sum(c.argv[0] in _SLOW_COMMANDS for c in runs) > 2
    return pytest.param(page, id=str(page.relative_to(ROOT)), marks=[pytest.mark.slow] if slow else [])


def test_the_docs_have_commands_to_check():
    assert SYNOPSES and RUNNABLE_PAGES
    assert ROOT / "docs" / "training.md" in RUNNABLE_PAGES


@pytest.mark.parametrize("cmd", SYNOPSES, ids=lambda c: c.where)
def test_usage_synopsis_matches_the_cli(cmd, tmp_path):
    """The command exists and every --option the synopsis shows is one it accepts."""
    res = run_documented([cmd.argv[0], "--help"], tmp_path)
    assert res.returncode == 0, f"{cmd.where}: `rlvr {cmd.argv[0]} --help` failed:\n{res.stderr}"
    options = {m for a in cmd.argv for m in re.findall(r"--[a-z][a-z0-9-]*", a)}
    # rich may fold a long option over two lines of the help table: compare without whitespace
    flat = re.sub(r"\s+", "", res.stdout)
    missing = sorted(o for o in options if o not in flat)
    assert not missing, f"{cmd.where}: `{cmd.text}` shows {missing}, which `rlvr {cmd.argv[0]}` does not accept"


@pytest.mark.parametrize("page", [_page_param(p) for p in RUNNABLE_PAGES])
def test_documented_commands_run(page, tmp_path):
    """Run the page's commands in order in one working directory; each must exit 0."""
    skipped: list[str] = []
    produced_by_skipped: list[str] = []  # run directories a skipped command would have written
    ran = 0
    commands = [c for c in ALL[page] if not c.synopsis]
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # a page's `python examples/...` (external.command)
    for i, cmd in enumerate(commands):
        key = (cmd.text, repr(sorted(cmd.env.items())))
        out_dir = _output_dir(cmd)
        read_later = out_dir is not None and any(out_dir in later.text for later in commands[i + 1:])
        context_free = cmd.argv[0] in ("demo", "recipes") or any(a.startswith("--help") for a in cmd.argv)
        if context_free and key in _ALREADY_RAN and not read_later:
            print(f"   --    {cmd.where}: {cmd.text}  [passed on {_ALREADY_RAN[key]}]")
            ran += 1
            continue
        reason = _skip_reason(cmd)
        if reason is None and any(p and p in cmd.text for p in produced_by_skipped):
            reason = "reads what a skipped command would have written"
        if reason is not None:
            skipped.append(f"{cmd.where}: {cmd.text}  [{reason}]")
            if out_dir:
                produced_by_skipped.append(out_dir)
            continue
        argv, config_text = [], None
        for arg in cmd.argv:
            if arg.endswith((".yaml", ".yml")) and "=" not in arg and (ROOT / arg).is_file():
                config_text = (ROOT / arg).read_text()
                arg = str(ROOT / arg)
            elif arg.endswith((".yaml", ".yml")) and "=" not in arg and not (tmp_path / arg).exists():
                blocks = _yaml_blocks(page)
                assert blocks, f"{cmd.where}: {arg} is neither in the repository nor a ```yaml block of the page"
                config_text = blocks[0]
                (tmp_path / arg).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / arg).write_text(config_text)
            argv.append(arg)
        scaled = _scale_steps(DocCommand(cmd.page, cmd.line, cmd.text, argv, cmd.env), config_text)
        t0 = time.perf_counter()
        res = run_documented([*scaled, *_small_overrides(cmd)], tmp_path, cmd.env)
        print(f"{time.perf_counter() - t0:6.1f} s  {cmd.where}: {cmd.text}")
        assert res.returncode == 0, (
            f"{cmd.where}: `{cmd.text}` exited {res.returncode}\n(ran, scaled and small: rlvr {shlex.join(res.args[1:])})"
            f"\nstdout:\n{res.stdout[-3000:]}\nstderr:\n{res.stderr[-3000:]}"
        )
        _ALREADY_RAN[key] = cmd.where
        ran += 1
    if skipped:
        print("skipped documented commands:\n  " + "\n  ".join(skipped))
    if not ran:
        pytest.skip("every command of this page needs a GPU or a hub model: " + "; ".join(skipped))


# Keys the docs spell wrong on purpose (to show the error message); none today.
INTENTIONALLY_UNKNOWN_KEYS: set[str] = set()


def test_every_documented_override_names_a_real_key():
    """`section.key=value` anywhere in the docs (prose code spans and code blocks) is a key of the
    trainer configs: docs/config.md once showed `run.name=007` and `algo.weights={...}`, neither a key."""
    from rlvr.config import config_rows
    from rlvr.train.config import EIConfig, EvalConfig, SFTConfig, TrainConfig

    keys = {row[0] for cls in (TrainConfig, SFTConfig, EvalConfig, EIConfig) for row in config_rows(cls)}
    sections = {k.split(".")[0] for k in keys}
    bad = []
    for page in PAGES:
        for lineno, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
            # (?<![\w.]) skips attribute paths such as cfg.run.steps=... in Python examples
            for key in re.findall(r"(?<![\w.])([a-z_]+(?:\.[a-z_0-9]+)+)=", line):
                if key.split(".")[0] in sections and key not in keys and key not in INTENTIONALLY_UNKNOWN_KEYS:
                    bad.append(f"{page.relative_to(ROOT)}:{lineno}: {key}")
    assert not bad, "documented overrides that are not config keys:\n" + "\n".join(bad)
