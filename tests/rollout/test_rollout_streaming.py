"""Scoring while the sampler decodes (issue 38 item 3, data.score_while_generating): HFGenerator.generate hands each
rollout on as soon as it is final (on_finished), the plain loop at the step its row ends and the static-cache decode
at the host check that finds it ended, while the other rows decode on; rlvr.train.pg.rollout_source's
ScoreWhileGenerating scores them on a background thread and gives the rewards of one call."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch
from helpers.training import shared_prefix_run

from rlvr.config import ConfigError, load_config
from rlvr.models import build_tiny_model
from rlvr.rewards.types import Reward
from rlvr.rollout import static_decode
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.types import SamplingSpec
from rlvr.train.config import TrainConfig
from rlvr.train.pg.rollout_source import ScoreWhileGenerating, score_while_generating

PROMPTS = ["1+1=", "12*3=", "hello world, ", "7"]
SPEC = SamplingSpec(n=4, max_tokens=24, seed=11)


@pytest.fixture(scope="module")
def eos_likely():
    """Rows end at different steps (EOS made likely), the forward calls counted."""
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=0)
    eos = tok.eos_token_id
    calls = [0]
    h1 = model.lm_head.register_forward_hook(lambda _m, _i, out: out + 3.0 * (torch.arange(out.shape[-1]) == eos))
    h2 = model.register_forward_pre_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))
    yield model, tok, calls
    h1.remove()
    h2.remove()


def _streamed(gen, calls, spec=SPEC, prompts=PROMPTS):
    got = []  # (index, rollout, forwards run so far)
    out = gen.generate(prompts, spec, on_finished=lambda i, ro: got.append((i, ro, calls[0])))
    return out, got, calls[0]


@pytest.mark.parametrize("path", ["plain", "static"])
@pytest.mark.parametrize("batch_size", [16, 6])  # one chunk; three chunks (indices offset by the chunk's start)
def test_every_rollout_is_handed_on_once_as_it_finishes(eos_likely, path, batch_size):
    model, tok, calls = eos_likely
    kw = {"static_cache": True, "sync_every": 2} if path == "static" else {}
    ref = HFGenerator(model, tok, batch_size=batch_size, **kw).generate(PROMPTS, SPEC)
    gen = HFGenerator(model, tok, batch_size=batch_size, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        out, got, total = _streamed(gen, calls)
    assert sorted(i for i, _, _ in got) == list(range(len(out)))  # each index once
    assert all(out[i] is ro for i, ro, _ in got)  # the returned list holds the objects handed on
    assert [r.response_ids for r in out] == [r.response_ids for r in ref]  # streaming changes no sample
    assert [(r.text, r.finish_reason, r.logprobs) for r in out] == [(r.text, r.finish_reason, r.logprobs) for r in ref]
    # rows that ended early were handed on while later rows still decoded (forwards ran after them)
    early = [n for i, ro, n in got if len(ro.response_ids) <= 4]
    assert early and min(early) < total
    assert len({n for _, _, n in got}) > 2  # handed on at several points, not all at the end


def test_a_failed_static_decode_keeps_the_rollouts_it_handed_on(eos_likely, monkeypatch):
    """The static-cache decode fails after handing rows on (at its first compaction): the chunk is redone by the
    plain loop, each index is still handed on once, and the rows handed on keep their rollouts."""
    model, tok, calls = eos_likely

    def broken(self, keep, written):
        raise RuntimeError("compaction failed")

    monkeypatch.setattr(static_decode.StaticDecoder, "compact", broken)
    gen = HFGenerator(model, tok, batch_size=16, static_cache=True, sync_every=2)
    with pytest.warns(UserWarning, match="static-cache decode failed.*compaction failed"):
        out, got, _ = _streamed(gen, calls)
    assert not gen._static
    assert sorted(i for i, _, _ in got) == list(range(16))
    assert all(out[i] is ro for i, ro, _ in got)
    ref = HFGenerator(model, tok, batch_size=16).generate(PROMPTS, SPEC)
    assert [r.response_ids for r in out] == [r.response_ids for r in ref]


class _Ro:
    def __init__(self, group, text):
        self.group, self.text = group, text


def test_scoring_while_generating_gives_the_rewards_of_one_call_in_order():
    gate = threading.Event()

    def score(rollouts, examples):
        gate.wait(5)  # busy: what arrives meanwhile waits for the next call
        return [Reward(float(len(r.text) + ex), {}) for r, ex in zip(rollouts, examples, strict=True)]

    batch = [100, 200]
    ros = [_Ro(i // 3, "x" * i) for i in range(6)]
    sw = ScoreWhileGenerating(score, batch)
    sw.add(4, ros[4])  # handed on out of order
    time.sleep(0.1)  # the thread takes it alone and is busy
    for i in (0, 5, 1):
        sw.add(i, ros[i])
    gate.set()  # then takes the three that arrived meanwhile as one call
    time.sleep(0.1)
    sw.add(3, ros[3])
    sw.add(2, ros[2])
    rewards = sw.result(ros)
    assert [rw.total for rw in rewards] == [len(r.text) + batch[r.group] for r in ros]
    assert sw.calls[:2] == [[4], [0, 5, 1]] and sorted(i for c in sw.calls for i in c) == list(range(6))
    assert sw.overlapped_s > 0.05  # the first call's wait ran before result()
    sw = ScoreWhileGenerating(score, batch)
    sw.add(1, ros[1])
    with pytest.raises(RuntimeError, match="5 rollouts were never handed on"):
        sw.result(ros)


def test_a_failed_generation_leaves_no_scoring_thread_behind():
    started = threading.Event()

    def score(rollouts, examples):
        started.set()
        time.sleep(0.1)
        return [Reward(1.0, {}) for _ in rollouts]

    sw = ScoreWhileGenerating(score, [0])
    sw.add(0, _Ro(0, "a"))
    started.wait(5)
    sw.add(1, _Ro(0, "b"))  # waiting when generation fails
    sw.abandon()
    sw.thread.join(5)
    assert not sw.thread.is_alive() and sw.calls == [[0]]  # the call it was in finished; nothing after it


def test_a_scorer_that_raises_raises_in_result():
    def score(rollouts, examples):
        raise RuntimeError("scorer down")

    sw = ScoreWhileGenerating(score, [0])
    sw.add(0, _Ro(0, "a"))
    with pytest.raises(RuntimeError, match="scorer down"):
        sw.result([_Ro(0, "a")])


def test_the_setting_resolves_by_sampler(eos_likely):
    model, tok, _ = eos_likely
    gen = HFGenerator(model, tok)
    assert score_while_generating(True, gen) is True and score_while_generating(False, gen) is False
    assert load_config(TrainConfig, None, []).data.score_while_generating is False  # off until measured on a GPU

    class Batch:  # a sampler that returns every rollout at once (vllm, a thinking budget, Ray actors)
        device = torch.device("cuda")

    assert score_while_generating(True, Batch()) is False


def test_train_scores_while_generating_with_the_same_numbers(tmp_path, monkeypatch):
    """rlvr train, 3 steps on the CPU: data.score_while_generating=true gives false's rewards, losses and samples,
    and reports the scoring it hid."""
    on, on_s = shared_prefix_run(tmp_path / "on", "true", "data.score_while_generating=true", monkeypatch=monkeypatch)
    off, off_s = shared_prefix_run(tmp_path / "off", "true", "data.score_while_generating=false",
                                   monkeypatch=monkeypatch)
    assert [s["response"] for s in on_s] == [s["response"] for s in off_s]
    assert [s["reward"] for s in on_s] == [s["reward"] for s in off_s]
    for a, b in zip(on, off, strict=True):
        assert a["reward/mean"] == b["reward/mean"] and a["loss"] == pytest.approx(b["loss"], rel=1e-6, abs=1e-9)
        assert "time/score_while_generating" in a and "time/score_while_generating" not in b
        assert a["time/score_while_generating"] >= 0


@pytest.mark.parametrize(("keys", "why"), [
    (["sampling.thinking_budget=8"], "a thinking budget"),
    (["distributed.segment_tokens=4"], "partial rollouts"),
])
def test_true_is_refused_where_the_sampler_returns_everything_at_once(keys, why):
    with pytest.raises(ConfigError, match=f"data.score_while_generating=true: {why}.*would do nothing"):
        load_config(TrainConfig, None, ["data.score_while_generating=true", *keys])
    load_config(TrainConfig, None, keys)  # (the same keys with the default)


@pytest.mark.parametrize(("section", "key", "value", "why"), [
    ("rollout", "backend", "vllm", "rollout.backend=vllm returns"),  # (checked alone: vllm is not installed here)
    ("distributed", "placement", "ray", "the Ray placement"),
])
def test_true_is_refused_with_vllm_and_ray(section, key, value, why):
    import dataclasses

    from rlvr.train.config.pg import check_score_while_generating

    cfg = load_config(TrainConfig, None, ["data.score_while_generating=true"])
    cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{key: value})})
    with pytest.raises(ConfigError, match=f"data.score_while_generating=true: {why}.*would do nothing"):
        check_score_while_generating(cfg)


def test_other_commands_refuse_it():
    from rlvr.train.config import DistillConfig, EIConfig

    with pytest.raises(ConfigError, match="data.score_while_generating=true applies to rlvr train only; rlvr ei"):
        load_config(EIConfig, None, ["data.score_while_generating=true"])
    load_config(EIConfig, None, ["data.score_while_generating=false"])
    with pytest.raises(ConfigError, match="applies to rlvr train only; rlvr distill"):
        load_config(DistillConfig, None, ["data.score_while_generating=true", "teacher.model=x"])
