"""Thinking-budget answers that score, length terms, the lr schedule and truncated responses out of the gradient
(issue 24, "correctness a careful RL engineer would demand").

Item 1: a thinking budget's forced text and budget 0's empty block follow the task's template, so under
r1_zero (gsm8k's and math's default) a forced or budget-0 answer that holds the right answer scores.
Item 4: the length terms (DAPO's overlong penalty, Dr. GRPO's constant) count what sampling.max_tokens bounds.
Item 7: the learning-rate schedule follows the RL step, so it reaches optim.min_lr_ratio at the last step
even when steps make no update.
Item 8: sampling.mask_truncated keeps responses cut at max_tokens out of the gradient.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rlvr.rollout.types import Rollout

TINY_MODEL = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64"]


class ScriptedSolver:
    """A stand-in generator that solves arithmetic prompts: in a reasoning phase (stop "</think>") it writes
    "x" up to max_tokens (so the budget runs out), in an answer phase it writes "<ref></answer>" and stops."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.weight_version = 0

    def generate(self, prompts, spec, *, prompt_ids=None):
        out = []
        for g, p in enumerate(prompts):
            q = re.findall(r"([0-9+\-*]+)=", p)[-1]
            thinking = "</think>" in spec.stop
            for j in range(spec.n):
                text = "x" * spec.max_tokens if thinking else f"{eval(q)}</answer>"  # noqa: S307 - digits, + -
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                pids = list(prompt_ids[g]) if prompt_ids is not None else self.tokenizer.encode(p)
                out.append(Rollout(prompt=p, prompt_ids=pids, response_ids=ids, text=text, logprobs=[-0.5] * len(ids),
                                   finish_reason="length" if thinking else "stop", group=g, sample_index=j,
                                   stop_reason=None if thinking else "</answer>"))
        return out

    def update_weights(self, *a, **k):
        pass

    def sleep(self):
        pass


def test_r1_zero_forced_and_budget_zero_answers_score_through_rlvr_eval(tmp_path, monkeypatch):
    import rlvr.rollout as rollout_mod
    from rlvr.cli import app

    monkeypatch.setattr(rollout_mod, "build_generator", lambda cfg, model, tok, **kw: ScriptedSolver(tok))
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(app, ["eval", *TINY_MODEL, "data.task=arithmetic", "data.template=r1_zero",
                                   "data.digits=1", "data.num_eval=3", "sampling.max_tokens=8",
                                   "--thinking-budget", "0,4", f"run.out={out}"])
    assert res.exit_code == 0, res.output
    metrics = json.loads(out.read_text())
    samples = [json.loads(x) for x in out.with_suffix(".samples.jsonl").read_text().splitlines()]
    for b in (0, 4):  # the model wrote the right answer: it scores (it scored 0 when the close was Qwen3's)
        assert metrics[f"thinking_budget={b}"]["accuracy"] == 1.0, (b, metrics)
        assert metrics[f"thinking_budget={b}"]["format_rate"] == 1.0
    by_budget = {b: [s for s in samples if s["thinking_budget"] == b] for b in (0, 4)}
    # budget 0: the r1 close is forced as the response's start; budget 4: 4 reasoning tokens, the forced text
    assert all(s["response"].startswith(" </think> <answer>") for s in by_budget[0]), by_budget[0]
    assert all(s["response"].startswith("xxxx\n\nConsidering the limited time") and
               "directly now. </think> <answer>" in s["response"] for s in by_budget[4]), by_budget[4]


def test_one_definition_of_the_close_serves_thinking_and_filter():
    from rlvr.data.filters import no_reasoning_prompt
    from rlvr.data.templates import empty_think_block, stop_thinking_text, think_style
    from rlvr.rewards.extract import R1_SEPARATOR
    from rlvr.rollout.thinking import QWEN3_STOP_THINKING

    assert think_style("r1_zero") == "r1" and think_style("chat") == "qwen3" and think_style("question_only") == "qwen3"
    assert stop_thinking_text("qwen3") == QWEN3_STOP_THINKING  # Qwen3's own text, unchanged
    assert stop_thinking_text("r1").endswith(R1_SEPARATOR) and (" " + R1_SEPARATOR) in stop_thinking_text("r1")
    r1_prompt = "... <answer> </answer>.\nUser: 1+1=\nAssistant: <think>"
    assert empty_think_block(r1_prompt, "r1") == " </think> <answer>"
    render = no_reasoning_prompt(lambda ex: r1_prompt)
    assert render(None) == (r1_prompt + " </think> <answer>", " </think> <answer>")


# ------------------------------------------------------------------------------- item 7: lr schedule

SMALL = TINY_MODEL + ["data.task=arithmetic", "data.digits=1", "data.num_train=80", "data.num_eval=4",
                      "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=3", "run.progress=false",
                      "run.num_threads=1", "run.eval_every=0"]


def flat_reward(response: str, example):
    """data.reward=test_lengths_schedule_truncation:flat_reward: 0 for every response, so every group is zero-variance."""
    from rlvr.rewards.types import Reward, Status

    return Reward(0.0, {}, Status.INCORRECT)


def _lrs(tmp_path, name, extra):
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train

    seen = {}
    train(load_config(TrainConfig, None, SMALL + [f"run.out_dir={tmp_path / name}"] + extra),
          on_step=lambda step, m: seen.__setitem__(step, (m["lr"], m.get("loss"))))
    return seen


def test_lr_schedule_follows_the_rl_step_and_ends_at_min_lr_when_steps_make_no_update(tmp_path):
    from rlvr.train.schedules import lr_multiplier

    sched = ["run.steps=4", "optim.lr=1e-2", "optim.schedule=cosine", "optim.min_lr_ratio=0.1",
             "algo.epochs_per_rollout_batch=2"]  # K = 2 optimizer steps per RL step
    # every group has equal rewards and algo.filter_zero_variance drops it: no step makes an update
    skipped = _lrs(tmp_path, "skipped", sched + ["algo.filter_zero_variance=true",
                                                  "data.reward=test_lengths_schedule_truncation:flat_reward"])
    assert all(loss is None for _, loss in skipped.values())
    # a dense reward: every step updates
    updated = _lrs(tmp_path, "updated", sched + ["data.reward=helpers.dense_reward:letter_share"])
    assert all(loss is not None for _, loss in updated.values())
    # the lr after step t (what step t + 1 starts from) sits at position t * K of a T * K schedule, both runs
    want = {t: 1e-2 * lr_multiplier(2 * t, warmup_steps=0, total_steps=8, schedule="cosine", min_lr_ratio=0.1)
            for t in range(1, 5)}
    assert {t: lr for t, (lr, _) in updated.items()} == pytest.approx(want, rel=1e-9)
    assert {t: lr for t, (lr, _) in skipped.items()} == pytest.approx(want, rel=1e-9)
    assert skipped[4][0] == pytest.approx(1e-3)  # optim.min_lr_ratio * optim.lr at the last step


# ------------------------------------------------------------- scripted responses through `rlvr train`

class ScriptedResponses:
    """A stand-in generator: sample j of each prompt is answers[j] (truncated when it is max_tokens long);
    in a thinking budget's reasoning phase (stop "</think>") it writes "x" up to the budget."""

    def __init__(self, tokenizer, answers):
        self.tokenizer, self.answers, self.weight_version = tokenizer, answers, 0

    def generate(self, prompts, spec, *, prompt_ids=None):
        out = []
        for g, p in enumerate(prompts):
            thinking = "</think>" in spec.stop
            for j in range(spec.n):
                # g * n + j: the sample's place in the call (a thinking budget's answer phase asks n=1 per trace)
                text = "x" * spec.max_tokens if thinking else self.answers[(g * spec.n + j) % len(self.answers)][
                    : spec.max_tokens]
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                cut = len(ids) >= spec.max_tokens
                pids = list(prompt_ids[g]) if prompt_ids is not None else self.tokenizer.encode(p)
                out.append(Rollout(prompt=p, prompt_ids=pids, response_ids=ids, text=text, logprobs=[-1.0] * len(ids),
                                   finish_reason="length" if cut else "stop", group=g, sample_index=j,
                                   stop_reason=None if cut else "<eos>", weight_version=self.weight_version))
        return out

    def update_weights(self, params, version=0):
        self.weight_version = version

    def sleep(self):
        pass


def ends_in_ab(response: str, example):
    """data.reward=test_lengths_schedule_truncation:ends_in_ab: 1 when the response ends with "ab"."""
    from rlvr.rewards.types import Reward, Status

    ok = response.endswith("ab")
    return Reward(float(ok), {}, Status.CORRECT if ok else Status.INCORRECT)


def _scripted_run(tmp_path, monkeypatch, name, answers, extra, recipe=None):
    import rlvr.rollout as rollout_mod
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train
    from rlvr.train.pg.recipes import get_recipe

    monkeypatch.setattr(rollout_mod, "build_generator", lambda cfg, model, tok, **kw: ScriptedResponses(tok, answers))
    rows = {}
    cfg = load_config(TrainConfig, None, SMALL + ["run.steps=1", "sampling.group_size=4", "sampling.n_prompts=2",
                                                  "data.reward=test_lengths_schedule_truncation:ends_in_ab",
                                                  f"run.out_dir={tmp_path / name}"] + extra,
                      base=get_recipe(recipe) if recipe else None)
    res = train(cfg, on_step=lambda step, m: rows.__setitem__(step, m))
    import safetensors.torch

    weights = safetensors.torch.load_file(str(next((res.run_dir / "checkpoints").rglob("*.safetensors"))))
    return rows[1], weights


# ----------------------------------------------------------------------- item 8: sampling.mask_truncated

def test_mask_truncated_gives_a_truncated_response_no_gradient(tmp_path, monkeypatch):
    import torch

    # max_tokens 6: the 4th response of each group is cut ("length"); the two batches differ only in its tokens
    a = ["ab", "b", "cab", "abcabc"]
    b = ["ab", "b", "cab", "azyxwv"]
    base = ["sampling.max_tokens=6", "optim.lr=1e-2"]
    runs = {(mask, tag): _scripted_run(tmp_path, monkeypatch, f"{mask}-{tag}", ans,
                                       base + [f"sampling.mask_truncated={mask}"])
            for mask in ("true", "false") for tag, ans in (("a", a), ("b", b))}
    (ma, wa), (mb, wb) = runs["true", "a"], runs["true", "b"]
    assert ma["len/truncated_frac"] == 0.25 and ma["masked_truncated_frac"] == 0.25
    # masked: the truncated response contributes nothing, so the loss, the gradient and the update are the same
    assert ma["loss"] == mb["loss"] and ma["grad_norm"] == mb["grad_norm"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    # not masked: it is in the loss, and its tokens change the gradient
    (ua, uwa), (ub, uwb) = runs["false", "a"], runs["false", "b"]
    assert "masked_truncated_frac" not in ua
    assert ua["grad_norm"] != ub["grad_norm"] and not all(torch.equal(uwa[k], uwb[k]) for k in uwa)
    # it still counted in its group's advantages: rewards (1, 0, 1, 0), the cut one's 0 included
    assert ma["reward/mean"] == ua["reward/mean"] == 0.5


# ------------------------------------------------------ item 4: length terms count what max_tokens bounds

def test_dapo_overlong_penalty_counts_the_answer_of_a_thinking_budget(tmp_path, monkeypatch):
    # --recipe dapo with sampling.thinking_budget=2, max_tokens=8, algo.overlong_buffer=4: 2 reasoning tokens,
    # the forced text (~100 tokens), then answers of 2, 5, 7 and 8 (cut) tokens. DAPO's penalty on the answer:
    # 0 up to 4 tokens, (4 - L) / 4 in (4, 8], so 0, -0.25, -0.75, -1
    answers = ["ab", "bcdef", "bcdefgh", "bcdefghi"]
    m, _ = _scripted_run(tmp_path, monkeypatch, "dapo", answers,
                         ["sampling.thinking_budget=2", "sampling.max_tokens=8", "algo.overlong_buffer=4",
                          "algo.refill_rounds=0"], recipe="dapo")
    assert m["reward/mean"] == 0.25  # only "ab" ends in ab
    assert m["reward/shaped"] == pytest.approx(0.25 + (0 - 0.25 - 0.75 - 1) / 4)


def test_dr_grpo_constant_and_overlong_penalty_refuse_or_cover_what_they_cannot_mean():
    from rlvr.config import ConfigError, load_config
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import objective_length_cap, validate_train_config
    from rlvr.train.pg.objective import Objective

    def cfg(*o):
        return load_config(TrainConfig, None, list(o))

    # Dr. GRPO's constant bounds the sampled tokens in the loss: with a thinking budget the reasoning's too
    c = cfg("algo.aggregation=seq_mean_token_sum_norm", "sampling.thinking_budget=16", "sampling.max_tokens=8")
    assert objective_length_cap(c) == 24
    assert Objective(c.algo, 2, 8, None, loss_tokens=objective_length_cap(c)).norm_length == 24
    c = cfg("algo.aggregation=seq_mean_token_sum_norm", "data.env=calculator", "data.env_max_tokens=40")
    assert objective_length_cap(c) == 40  # an episode's model turns fit in its token budget
    assert objective_length_cap(cfg("sampling.max_tokens=8")) == 0  # 0: sampling.max_tokens bounds them
    assert Objective(c.algo, 2, 8, None, loss_tokens=0).norm_length == 8
    assert Objective(c.algo, 2, 8, None, loss_tokens=40).norm_length == 40
    # an episode's model turns are not bounded by sampling.max_tokens (a per-turn cap): refused, keys named
    with pytest.raises(ConfigError, match="data.env.*algo.length_reward='dapo_overlong'"):
        validate_train_config(cfg("data.env=calculator", "algo.length_reward=dapo_overlong", "algo.length_reward_coef=1"))
