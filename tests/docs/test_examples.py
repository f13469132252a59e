"""Every config in examples/ loads and validates with the real loader, as `rlvr train examples/X.yaml`
would before any work starts: `rlvr.config.load_config(TrainConfig, path)` then
`rlvr.train.pg.loop.validate_train_config`. No GPU and no data: the loader's checks of the machine (CUDA
devices, an importable vllm, data files present) are answered as on a GPU user's machine with two GPUs,
vllm installed and the data fetched, where the data files are empty placeholders: the config is
valid without reading a row of them.

Also pinned: the header a GPU user reads first (what it trains, memory arithmetic, curves, the command),
the CS336 assignment 5 values of the two R1-Zero examples, and the recipe examples' agreement with the
recipe table (`rlvr recipes`), so the examples cannot drift from the presets they claim to write out.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest
import torch
import yaml
from helpers import REPO

from rlvr.config import load_config
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import validate_train_config
from rlvr.train.pg.recipes import RECIPE_KEYS, RECIPES

EXAMPLES_DIR = REPO / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
EXPECTED = {
    "grpo_gsm8k_r1_zero.yaml",
    "grpo_math_r1_zero.yaml",
    "dr_grpo_math.yaml",
    "dapo_math.yaml",
    "countdown_grpo.yaml",
    "code_grpo.yaml",
}


@pytest.fixture(autouse=True)
def gpu_user_machine(tmp_path, monkeypatch):
    """This test's machine as a GPU user's: 2 CUDA devices, vllm importable, the examples' data files
    fetched (empty placeholders under a fresh working directory; relative paths resolve there)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: (
        importlib.machinery.ModuleSpec(name, None) if name == "vllm" else real_find_spec(name, *a, **k)))
    monkeypatch.chdir(tmp_path)
    for path in EXAMPLES:
        data = (yaml.safe_load(path.read_text()) or {}).get("data") or {}
        for key in ("train_path", "eval_path"):
            if data.get(key):
                (tmp_path / data[key]).parent.mkdir(parents=True, exist_ok=True)
                (tmp_path / data[key]).touch()


def _header(path: Path) -> str:
    """The leading comment block (every line up to the first non-comment line)."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line)
    return "\n".join(lines)


def _get(cfg, dotted: str):
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_the_promised_examples_exist():
    assert EXPECTED <= {p.name for p in EXAMPLES}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_loads_and_validates_without_gpu_or_data(path):
    cfg = load_config(TrainConfig, path)
    plan = validate_train_config(cfg)
    assert plan.rollout_batch == cfg.sampling.n_prompts * cfg.sampling.group_size
    # a real model on a GPU with vLLM rollouts, in bf16 with fp32 master weights
    assert cfg.model.name != "tiny"
    assert cfg.model.device.startswith("cuda")
    assert cfg.rollout.backend == "vllm"
    assert (cfg.model.dtype, cfg.model.master_weights) == ("bfloat16", "float32")
    # rows per forward are capped explicitly: the no-grad old/reference forwards split by rows only
    # (not by algo.micro_batch_tokens), and a whole 128-row minibatch of 3k-token rows would not fit
    assert 0 < plan.micro_batch <= 8
    # vLLM's context must hold the longest prompt + response it is asked for
    longest = cfg.sampling.max_tokens + max(cfg.sampling.thinking_budget, 0)
    assert cfg.rollout.max_model_len > longest
    for key in ("train_path", "eval_path"):
        p = getattr(cfg.data, key)
        assert not p or not Path(p).is_absolute(), f"{key}={p!r}: examples use paths relative to the checkout"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_header_says_what_a_gpu_user_needs(path):
    head = _header(path)
    assert head, f"{path.name} has no leading comment block"
    assert "What it trains" in head
    assert f"rlvr train examples/{path.name}" in head  # the command, with this file's own name
    assert "GPU memory" in head and "B/param" in head and "estimate" in head  # arithmetic, labelled
    assert "Expected curves" in head
    assert "Data" in head
    cfg = load_config(TrainConfig, path)
    if cfg.data.train_path:
        # a file the user must fetch: the header (or the example it points to) says where from
        assert "curl" in head or "hf download" in head or "load_dataset" in head or "examples/" in head


@pytest.mark.parametrize("name", ["grpo_gsm8k_r1_zero.yaml", "grpo_math_r1_zero.yaml"])
def test_r1_zero_examples_use_the_cs336_assignment_values(name):
    cfg = load_config(TrainConfig, EXAMPLES_DIR / name)
    plan = validate_train_config(cfg)
    s, a, o = cfg.sampling, cfg.algo, cfg.optim
    assert cfg.model.name == "Qwen/Qwen2.5-Math-1.5B" and cfg.data.template == "r1_zero"
    assert cfg.run.steps == 200  # n_grpo_steps
    assert o.lr == 1e-5 and o.weight_decay == 0.0 and (o.beta1, o.beta2) == (0.9, 0.95)
    assert plan.rollout_batch == 256 and s.group_size == 8  # rollout_batch_size, group_size
    assert s.temperature == 1.0 and s.max_tokens == 1024
    assert plan.epochs == 1 and plan.train_batch == 256  # epochs_per_rollout_batch, train_batch_size
    assert plan.accumulation_steps == 128 and plan.micro_batch == 2  # gradient_accumulation_steps
    assert plan.on_policy
    assert cfg.rollout.gpu_memory_utilization == 0.85
    assert cfg.rollout.device == "cuda:1" and cfg.model.device == "cuda:0"  # the assignment's two GPUs
    assert a.loss == "reinforce_with_baseline"
    # use_std_normalization with torch.std (sample std) and advantage_eps 1e-6; masked_mean per response
    assert (a.advantage, a.adv_std, a.adv_eps) == ("grpo", "sample", 1e-6)
    assert a.aggregation == "seq_mean_token_mean" and a.kl_coef == 0.0


@pytest.mark.parametrize("name,recipe", [("dr_grpo_math.yaml", "dr_grpo"), ("dapo_math.yaml", "dapo")])
def test_recipe_examples_write_out_the_recipe(name, recipe):
    cfg = load_config(TrainConfig, EXAMPLES_DIR / name)
    want = RECIPES[recipe]
    got = {k: _get(cfg, k) for k in RECIPE_KEYS}
    assert got == {k: want[k] for k in RECIPE_KEYS}
    # and loading the file on top of `--recipe NAME` changes none of the recipe's knobs
    with_recipe = load_config(TrainConfig, EXAMPLES_DIR / name, base=want)
    assert {k: _get(with_recipe, k) for k in RECIPE_KEYS} == got


def test_code_example_uses_a_thinking_budget_and_the_chat_template():
    cfg = load_config(TrainConfig, EXAMPLES_DIR / "code_grpo.yaml")
    assert cfg.data.task == "code" and cfg.data.template == "chat"
    assert cfg.sampling.thinking_budget > 0


def test_the_bring_your_own_agent_example_is_the_file_it_names():
    """docs/agents.md shows examples/agents/tool_agent.py's code (from its imports on) verbatim: the example a user
    copies is the one the tests run (tests/envs/test_external_runner.py)."""
    from helpers.docs import fenced_blocks

    page = (REPO / "docs" / "agents.md").read_text(encoding="utf-8")
    code = (EXAMPLES_DIR / "agents" / "tool_agent.py").read_text(encoding="utf-8")
    body = code[code.index("import json"):].strip()
    shown = ["\n".join(lines).strip() for info, _, lines in fenced_blocks(page) if info.split()[:1] == ["python"]]
    assert body in shown
