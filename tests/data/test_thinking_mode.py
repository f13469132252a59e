"""Qwen3's thinking-mode switch: data.thinking_mode (the /think and /no_think tags on each question; no_think
starts the answer with a closed, empty think block) and `rlvr eval --thinking-mode think,no_think` (one row per
mode, side by side)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError, load_config
from rlvr.data.templates import mode_tagged
from rlvr.train.config import EvalConfig, SFTConfig, TrainConfig
from rlvr.train.tasks import load_task_data

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]


def test_the_tag_is_appended_to_the_question_the_template_renders():
    assert mode_tagged("2+3=", "think") == "2+3= /think"
    assert mode_tagged("2+3=", "no_think") == "2+3= /no_think"
    assert mode_tagged("2+3=", "") == "2+3="
    with pytest.raises(ValueError, match="unknown thinking mode"):
        mode_tagged("2+3=", "fast")
    cfg = load_config(TrainConfig, None, [*TINY, "data.template=r1_zero", "data.reward=r1_zero",
                                          "data.thinking_mode=think"])
    task = load_task_data(cfg.data)
    ex = task.train[0]
    prompt = task.prompt(ex)
    assert f"User: {ex.question} /think\nAssistant: <think>" in prompt  # inside the user turn, not after it
    assert ex.question.endswith("=")  # the example itself is not changed (its checker reads the reference)


def test_the_keys_are_checked_naming_what_to_set():
    with pytest.raises(ConfigError, match=r"data\.thinking_mode"):
        load_config(TrainConfig, None, [*TINY, "data.thinking_mode=fast"])
    with pytest.raises(ConfigError, match=r"sampling\.thinking_budget=0"):
        load_config(TrainConfig, None, [*TINY, "data.thinking_mode=no_think"])
    load_config(TrainConfig, None, [*TINY, "data.thinking_mode=no_think", "sampling.thinking_budget=0"])
    with pytest.raises(ConfigError, match="rlvr sft"):
        load_config(SFTConfig, None, [*TINY, "data.thinking_mode=think"])
    with pytest.raises(ConfigError, match=r"sampling\.thinking_budget=0"):
        load_config(EvalConfig, None, [*TINY, "data.thinking_mode=no_think"])


@pytest.fixture
def recorded(monkeypatch):
    """The hf engine as built, with every generate call's prompt token ids recorded (decoded)."""
    from rlvr.rollout import builder

    calls: list[list[str]] = []
    real = builder.GENERATOR_BACKENDS["hf"]

    def build(*args, **kwargs):
        gen = real(*args, **kwargs)
        generate = gen.generate

        def recording(prompts, spec, *, prompt_ids=None):
            ids = prompt_ids or [gen.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
            calls.append([gen.tokenizer.decode(x) for x in ids])
            return generate(prompts, spec, prompt_ids=prompt_ids)

        gen.generate = recording
        return gen

    monkeypatch.setitem(builder.GENERATOR_BACKENDS, "hf", build)
    return calls


def test_rlvr_eval_puts_the_modes_side_by_side(recorded, tmp_path):
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["eval", *TINY, "data.num_eval=4", "sampling.max_tokens=4", f"run.out={out}",
                                 "--thinking-mode", "think,no_think"])
    assert r.exit_code == 0, r.output
    assert "thinking mode" in r.output and "│ think " in r.output and "│ no_think " in r.output
    payload = json.loads(out.read_text())
    assert list(payload) == ["thinking_mode=think", "thinking_mode=no_think"]
    rows = [json.loads(x) for x in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    assert [r["thinking_mode"] for r in rows] == ["think"] * 4 + ["no_think"] * 4
    assert all(r["prompt"].endswith(f" /{r['thinking_mode']}") for r in rows)
    # what the engine conditioned on: the think row the tagged prompt only, the no_think row the tagged prompt
    # followed by the closed, empty think block (Qwen3's enable_thinking=False)
    think, no_think = recorded
    assert all(p.endswith(" /think") for p in think)
    assert all(p.endswith(" /no_think<think>\n\n</think>\n\n") for p in no_think), no_think[0][-40:]
    r = CliRunner().invoke(app, ["eval", *TINY, "--thinking-mode", "think", "--thinking-budget", "4"])
    assert r.exit_code == 2 and "give one of them" in r.output
    r = CliRunner().invoke(app, ["eval", *TINY, "--thinking-mode", "fast"])
    assert r.exit_code == 2 and "known modes are think, no_think" in r.output


def test_rlvr_train_samples_in_the_configured_mode(recorded, tmp_path):
    r = CliRunner().invoke(app, ["train", *TINY, "data.digits=1", "data.num_eval=4", "sampling.max_tokens=4",
                                 "sampling.n_prompts=2", "sampling.group_size=2", "run.steps=1", "run.eval_every=0",
                                 "data.thinking_mode=no_think", "sampling.thinking_budget=0",
                                 f"run.out_dir={tmp_path / 'run'}"])
    assert r.exit_code == 0, r.output
    assert recorded and all(p.endswith(" /no_think<think>\n\n</think>\n\n") for call in recorded for p in call)
