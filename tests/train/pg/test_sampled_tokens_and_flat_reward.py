"""Metrics that must not mislead: lengths count the sampled tokens, a flat reward is said (issue 36, item 5,
"metrics that mislead").

- A thinking budget's forced "stop thinking" text is in the response but was not sampled (loss_mask False,
  logprob 0.0): samples.jsonl's `length` and `mean_logprob` and eval's len/* count the sampled tokens only
  (the forced ones are reported apart, `unsampled` / `unsampled_tokens`).
- A run whose every group has equal rewards (no learning signal) warns once, naming the cause and what to
  check, instead of calling its ~0 loss "not a bug"; its flat reward is drawn, not dropped from reward.png.
"""

from __future__ import annotations

import json

import pytest

from rlvr.config import load_config
from rlvr.data.example import Example
from rlvr.rewards.types import Reward, Status
from rlvr.rollout.types import Rollout
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import _Notes, _samples, train

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.digits=1", "data.num_train=40", "data.num_eval=2", "sampling.n_prompts=2", "sampling.group_size=2",
        "sampling.max_tokens=3", "run.eval_every=0", "run.num_threads=1", "run.progress=false"]


def zero_reward(response: str, example) -> Reward:
    """data.reward=test_sampled_tokens_and_flat_reward:zero_reward: a reward that never scores anything."""
    return Reward(0.0, {"answer": 0.0}, Status.INCORRECT)


# ------------------------------------------------------------------ (a) forced tokens are not the policy's


def _rollout(ids, logprobs, loss_mask) -> Rollout:
    return Rollout(prompt="1+1=", prompt_ids=[1, 2], response_ids=ids, text="x" * len(ids), logprobs=logprobs,
                   finish_reason="stop", group=0, loss_mask=loss_mask)


def test_samples_count_and_average_only_the_sampled_tokens():
    # 2 reasoning tokens, 3 forced ("stop thinking": logprob 0.0, loss_mask False), 1 answer token
    forced = _rollout([5, 6, 7, 8, 9, 10], [-1.0, -2.0, 0.0, 0.0, 0.0, -3.0], [True, True, False, False, False, True])
    plain = _rollout([5, 6], [-0.5, -1.5], None)  # loss_mask None: every token sampled
    no_lps = _rollout([5, 6, 7], None, [True, False, True])
    ros = [forced, plain, no_lps]
    ex = Example("arithmetic:1", "1+1=", "2")
    rw = Reward(0.0, {"answer": 0.0}, Status.INCORRECT)
    rows = _samples(ros, [ex] * 3, [rw] * 3, k=3, group_size=1, row_entropy={})
    assert [r["length"] for r in rows] == [3, 2, 2]  # was 6, 2, 3: forced text counted as the policy's
    assert [r["unsampled"] for r in rows] == [3, 0, 1]
    assert rows[0]["mean_logprob"] == pytest.approx(-2.0)  # (-1 - 2 - 3) / 3; was -1.0, diluted by the 0.0s
    assert rows[1]["mean_logprob"] == pytest.approx(-1.0)
    assert rows[2]["mean_logprob"] is None


def test_train_len_metrics_count_only_the_sampled_tokens():
    from rlvr.train.session import sample_metrics

    forced = _rollout([5, 6, 7, 8, 9, 10], [-1.0, -2.0, 0.0, 0.0, 0.0, -3.0], [True, True, False, False, False, True])
    m = sample_metrics([Reward(0.0, {"answer": 0.0}, Status.INCORRECT)], [forced])
    assert m["len/mean"] == 3 and m["len/incorrect"] == 3  # len/* of rlvr train and rlvr ei, as eval's


def test_eval_lengths_count_only_the_sampled_tokens():
    from rlvr.eval import evaluate
    from rlvr.models import build_tiny_model
    from rlvr.rollout import HFGenerator, SamplingSpec, with_thinking_budget
    from rlvr.rollout.thinking import QWEN3_STOP_THINKING

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=0)
    budget, max_tokens = 3, 4
    gen = with_thinking_budget(HFGenerator(model, tok, batch_size=8), budget)
    outs = gen.generate(["Q: 1+2=? <think>", "Q: 3+4=? <think>"], SamplingSpec(n=2, max_tokens=max_tokens, seed=1))
    n_forced = len(tok.encode(QWEN3_STOP_THINKING, add_special_tokens=False))

    class Replay:  # the same rollouts through evaluate()
        def generate(self, prompts, spec, prompt_ids=None):
            return outs

    exs = [Example(f"e{i}", q, "3") for i, q in enumerate(["1+2=", "3+4="])]
    res = evaluate(Replay(), exs, ["Q: 1+2=? <think>", "Q: 3+4=? <think>"], lambda r, e: Reward(0.0),
                   SamplingSpec(n=2, max_tokens=max_tokens, seed=1))
    assert any(not all(ro.loss_mask) for ro in outs)  # the budget ran out somewhere: forced text is in there
    assert [s.num_tokens for s in res.samples] == [sum(ro.loss_mask) for ro in outs]
    assert [s.unsampled_tokens for s in res.samples] == [len(ro.loss_mask) - sum(ro.loss_mask) for ro in outs]
    assert max(s.unsampled_tokens for s in res.samples) == n_forced
    m = res.metrics("eval/")
    assert m["eval/len/max"] <= budget + max_tokens < n_forced  # was budget + the forced text + the answer
    assert m["eval/len/mean"] == pytest.approx(sum(sum(ro.loss_mask) for ro in outs) / len(outs))


def test_train_samples_with_a_thinking_budget_count_the_sampled_tokens(tmp_path):
    cfg = load_config(TrainConfig, None, [*TINY, "run.steps=1", "sampling.thinking_budget=2", "run.log_samples_every=1",
                                          "run.num_log_samples=2", f"run.out_dir={tmp_path / 'run'}"])
    res = train(cfg)
    rows = [json.loads(x) for x in (res.run_dir / "samples.jsonl").read_text().splitlines()]
    assert rows and all(r["length"] <= 2 + 3 for r in rows), rows  # budget + max_tokens
    assert any(r["unsampled"] > 0 for r in rows)  # the forced text, counted apart
    assert all(r["length"] + r["unsampled"] >= len(r["response"]) for r in rows)  # 1 char per token at most


# ----------------------------------------------------------------------- (b) a run with no learning signal


def _notes(*extra: str) -> _Notes:
    return _Notes(load_config(TrainConfig, None, [*TINY, *extra]), on_policy=True)


def _step(zero_var: float, loss: float = 3e-9, **more) -> dict:
    return {"zero_var_groups": zero_var, "loss": loss, "reward/mean": 0.0, **more}


def test_the_warning_comes_once_after_the_first_flat_steps(capsys):
    notes = _notes("run.steps=10", "run.progress=true")  # (the notes follow run.progress; the warning does not)
    for step in (1, 2):
        notes.loss(step, _step(1.0))
    assert capsys.readouterr().err == ""  # not yet: two steps without a spread can be chance
    notes.loss(3, _step(1.0))
    err = capsys.readouterr().err
    assert err.count("warning: no learning signal in steps 1-3") == 1, err
    for needle in ("every group all responses got the same reward", "every advantage is 0", "reward function",
                   "sampling.temperature", "sampling.group_size", "difficulty"):
        assert needle in err, needle
    assert "not a bug" not in err  # the ~0 loss of a run without signal is no "by construction"
    for step in (4, 5):
        notes.loss(step, _step(1.0))
    assert capsys.readouterr().err == ""  # once
    notes.loss(6, _step(0.5))  # a spread at last: the ~0 loss is now the on-policy identity
    assert "not a bug" in capsys.readouterr().err


@pytest.mark.parametrize("keys,steps,warned", [
    (["run.steps=1"], [1.0], True),  # a one-step run: its only step
    (["run.steps=2"], [1.0, 1.0], True),  # a run shorter than three steps: all of them
    (["run.steps=10"], [1.0, 0.5, 1.0, 1.0], False),  # a spread in step 2: there is signal
    (["run.steps=10", "algo.advantage=no_baseline"], [1.0, 1.0, 1.0], False),  # equal rewards are no 0 there
])
def test_the_warning_needs_every_first_step_flat_under_a_group_baseline(capsys, keys, steps, warned):
    notes = _notes(*keys)
    for step, zv in enumerate(steps, start=1):
        notes.loss(step, _step(zv))
    assert ("warning: no learning signal" in capsys.readouterr().err) is warned


def test_a_length_term_that_shapes_equal_rewards_apart_is_a_signal(capsys):
    notes = _notes("run.steps=3")
    for step in (1, 2, 3):
        notes.loss(step, _step(1.0, **{"reward/shaped": -0.1}))
    assert "no learning signal" not in capsys.readouterr().err


def test_a_run_whose_reward_is_always_0_warns_once_and_draws_its_flat_reward(tmp_path, capsys):
    from rlvr.runs.plots import plan_figures
    from rlvr.runs.rundir import read_jsonl

    cfg = load_config(TrainConfig, None, [*TINY, "run.steps=4", "run.log_samples_every=0",
                                          "data.reward=test_sampled_tokens_and_flat_reward:zero_reward", f"run.out_dir={tmp_path / 'run'}"])
    res = train(cfg)
    err = capsys.readouterr().err
    assert err.count("warning: no learning signal") == 1, err
    assert "warning: no learning signal in steps 1-3: in every group all responses got the same reward" in err
    assert "not a bug" not in err
    rows = read_jsonl(res.run_dir / "metrics.jsonl")
    assert [r["reward/mean"] for r in rows] == [0.0] * 4 and all(r["zero_var_groups"] == 1.0 for r in rows)
    assert (res.run_dir / "plots" / "reward.png").exists()  # was not written: every series in it was flat
    reward = {f.name: f for f in plan_figures(rows)}["reward.png"]
    assert reward.panels[0][:1] == ("Reward",) and reward.panels[0][2][0] == "reward/mean"
    assert not [c for c in reward.constants if c.startswith("reward/mean")]


# ------------------------------------------------------------------------------------------------ plots


def test_a_constant_reward_is_drawn_and_other_constants_stay_in_the_footnote(tmp_path, monkeypatch):
    from rlvr.runs import RunDir, plots
    from rlvr.runs.rundir import read_jsonl

    with RunDir.create(tmp_path / "r", tensorboard=False) as run:
        for s in range(1, 6):
            run.log_metrics(s, {"reward/mean": 0.0, "reward/answer": 0.0, "accuracy": 0.0, "loss": 1.0 / s,
                                "lr": 1e-3, "eval/reward": 0.25})
    drawn: dict[str, list] = {}
    real = plots._draw

    def recording(path, rows, x, panels, title, label=lambda k: k, footnote=()):
        drawn[path.name] = [(t, [label(k) for k in keys]) for t, _, keys in panels]
        return real(path, rows, x, panels, title, label, footnote)

    monkeypatch.setattr(plots, "_draw", recording)
    paths = plots.plot_run(tmp_path / "r")
    assert "reward.png" in [p.name for p in paths]  # was absent: its every series was constant
    # the flat reward drawn once, its equal flat twins named in its legend; the flat eval/reward drawn too
    assert drawn["reward.png"] == [("Reward", ["reward/mean = reward/answer = accuracy", "eval/reward"])]
    figs = {f.name: f for f in plots.plan_figures(read_jsonl(tmp_path / "r" / "metrics.jsonl"))}
    assert figs["reward.png"].constants == []
    assert figs["optimization.png"].constants == ["lr = 0.001"]  # any other flat series: the footnote, as before
