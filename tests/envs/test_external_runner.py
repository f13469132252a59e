"""data.env=external through the gateway (rlvr.envs.external.GatewayRunner): agent programs run as commands, with
the official openai client and no rlvr import. The rows the trainer gets hold exactly the ids the engine sampled
(checked against a spy on the generator), the tool turns are out of the loss, a multi-turn tool-calling episode is
one sequence, and an episode that crashes, hangs, prints a bad reward line or never calls the policy is an
unscored error, while the others of the batch are scored."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest
from helpers import REPO, TESTS
from helpers.gateway import Scripted, Spy, chatml_tokenizer, episodes_through, tiny_chat_policy

from rlvr.data.example import Example
from rlvr.envs.external import CommandEpisodes, GatewayRunner
from rlvr.models.tiny import build_char_tokenizer
from rlvr.rewards.types import Reward, Status
from rlvr.rollout import HFGenerator, SamplingSpec

pytest.importorskip("openai")
PY = shlex.quote(sys.executable)
DIGITS_AGENT = f"{PY} {TESTS / 'fixtures' / 'agents' / 'digits_agent.py'}"
MIXED_AGENT = f"{PY} {TESTS / 'fixtures' / 'agents' / 'mixed_agent.py'}"
TOOL_AGENT = f"{PY} {REPO / 'examples' / 'agents' / 'tool_agent.py'}"


def _runner(tok, command, **kw):
    kw = {"max_parallel": 4, "timeout_s": 60.0, "max_tokens_total": 64, "max_calls": 4} | kw
    return GatewayRunner("external.command", tok, CommandEpisodes(command), **kw)


def _model_runs(ro) -> list[tuple[int, int]]:
    """(start, end) of each run of loss_mask True in a rollout's response: one per call."""
    runs, start = [], None
    for k, m in enumerate([*ro.loss_mask, False]):
        if m and start is None:
            start = k
        elif not m and start is not None:
            runs.append((start, k))
            start = None
    return runs


def test_trained_ids_are_exactly_the_sampled_ones_and_tool_turns_are_out_of_the_loss():
    model, tok = tiny_chat_policy(seed=1)
    spy = Spy(HFGenerator(model, tok, batch_size=16))
    runner = _runner(tok, DIGITS_AGENT)
    examples = [Example(id=f"p{i}", question=f"{i}+{i}=", reference=str(2 * i)) for i in range(3)]
    ros, rewards, m = episodes_through(runner, spy, examples,
                                       SamplingSpec(n=2, temperature=1.0, max_tokens=6, seed=5, stop=("@@",)))
    assert all("@@" in sp.stop for sp in spy.specs)  # sampling.stop reaches every call
    assert len(ros) == 6 and [ro.group for ro in ros] == [0, 0, 1, 1, 2, 2]
    assert [ro.sample_index for ro in ros] == [0, 1] * 3
    assert m["gateway/calls_per_episode"] == 2.0 and m["gateway/split_episodes"] == 0.0
    # what the engine sampled: (context, ids) -> logprobs (the two samples of a problem share their first context)
    sampled = {(tuple(r.prompt_ids), tuple(r.response_ids)): r.logprobs for r in spy.rollouts}
    assert len(spy.rollouts) == 12  # 6 episodes x 2 calls
    for ro, reward in zip(ros, rewards, strict=True):
        runs = _model_runs(ro)
        assert len(runs) == 2  # the two replies; between them the template glue and the tool message, masked
        for start, end in runs:
            # the engine sampled exactly these ids from exactly this context, with these logprobs
            key = (tuple(ro.prompt_ids + ro.response_ids[:start]), tuple(ro.response_ids[start:end]))
            assert key in sampled
            assert ro.logprobs[start:end] == sampled[key]
        between = tok.decode(ro.response_ids[runs[0][1]:runs[1][0]], skip_special_tokens=False)
        assert "<|im_start|>tool\nok<|im_end|>" in between and not any(ro.loss_mask[runs[0][1]:runs[1][0]])
        assert all(lp == 0.0 for lp in ro.logprobs[runs[0][1]:runs[1][0]])
        text = tok.decode([i for i, keep in zip(ro.response_ids, ro.loss_mask, strict=True) if keep],
                          skip_special_tokens=True)
        assert reward.status is not Status.ERROR
        assert reward.total == pytest.approx(sum(c.isdigit() for c in text) / max(1, len(text)))


def test_a_tool_calling_agent_is_one_sequence_with_the_tool_output_masked():
    tok = chatml_tokenizer(build_char_tokenizer(special_tokens=("<|im_end|>",)))
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}\n</tool_call>'
    gen = Scripted(tok, [call, "12"])
    runner = _runner(tok, TOOL_AGENT, max_parallel=1, max_tokens_total=400)
    ex = Example(id="q", question="What is 3 times 4?", reference="12")
    ros, rewards, m = episodes_through(runner, gen, [ex], SamplingSpec(n=1, temperature=1.0, max_tokens=100,
                                                                        seed=0))
    (ro,), (reward,) = ros, rewards
    assert reward.total == 1.0 and reward.status is Status.CORRECT and m["gateway/split_episodes"] == 0.0
    runs = _model_runs(ro)
    assert [tok.decode(ro.response_ids[a:b], skip_special_tokens=False) for a, b in runs] == [
        call + "<|im_end|>", "12<|im_end|>"]
    between = tok.decode(ro.response_ids[runs[0][1]:runs[1][0]], skip_special_tokens=False)
    assert between == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"  # the calculator's output


def test_failed_episodes_are_unscored_errors_and_the_rest_is_scored():
    model, tok = tiny_chat_policy(seed=2)
    modes = ["ok", "crash", "garbage", "nocall", "silent", "badreq"]
    examples = [Example(id=m, question="2+2=", reference="4", meta={"mode": m}) for m in modes]
    checked = []

    def checker(text, example):  # the task's checker: scores an episode that prints no reward
        checked.append((text, example.id))
        return Reward(0.25, {"checker": 0.25}, Status.INCORRECT)

    # a limit no working agent meets on a loaded machine; the hang has its own call below, with a short one
    runner = _runner(tok, MIXED_AGENT, reward_fn=checker, timeout_s=120.0, max_parallel=6)
    gen = HFGenerator(model, tok)
    ros, rewards, m = episodes_through(runner, gen, examples,
                                       SamplingSpec(n=1, temperature=1.0, max_tokens=5, seed=0))
    by = dict(zip(modes, rewards, strict=True))
    assert by["ok"].total == 0.5 and by["ok"].status is Status.CORRECT
    # refused requests (an unknown key, one over the context) are answered in OpenAI's shape; the episode goes on
    assert by["badreq"].total == 0.5 and m["gateway/refused_requests"] == 1.0  # the unknown key names no episode
    assert by["silent"].total == 0.25 and [e for _, e in checked] == ["silent"]
    assert checked[0][0] == ros[modes.index("silent")].text != ""  # the checker read the policy's last reply
    for mode, words in [("crash", "exited with status 2: Traceback: KeyError: 'tools'"),
                        ("garbage", "last stdout line is not valid JSON"),
                        ("nocall", "made no call to the gateway")]:
        assert by[mode].status is Status.ERROR and words in by[mode].info, (mode, by[mode].info)
    assert m["gateway/error_frac"] == pytest.approx(3 / 6)
    assert [m[f"gateway/errors/{k}"] for k in ("exited", "timeout", "bad_json", "no_call")] == [1.0, 0.0, 1.0, 1.0]
    nocall = ros[modes.index("nocall")]
    assert nocall.loss_mask == [False] and nocall.prompt == "2+2="  # a row of nothing to learn

    hang = _runner(tok, MIXED_AGENT, reward_fn=checker, timeout_s=2.0)
    t0 = time.perf_counter()
    hanging = Example(id="hang", question="2+2=", reference="4", meta={"mode": "hang"})
    _, (reward,), m = episodes_through(hang, gen, [hanging], SamplingSpec(n=1, temperature=1.0, max_tokens=5, seed=0))
    assert time.perf_counter() - t0 < 30  # cut at its 2 s (the agent sleeps 600)
    assert reward.status is Status.ERROR and "ran past external.timeout_s=2 s" in reward.info
    assert m["gateway/errors/timeout"] == 1.0 and m["gateway/error_frac"] == 1.0


REWRITE_AGENT = f"{PY} {TESTS / 'fixtures' / 'agents' / 'rewrite_agent.py'}"


def test_a_rewritten_history_is_trained_in_every_segment(tmp_path):
    """An agent that replaces its history between calls: the episode's row is its last segment, the earlier one
    rides along and is trained as a row of its own with the episode's advantage (tokens/trained counts every row's
    tokens; the minibatches grow so the step keeps its optimizer steps: tests/train/test_batching_tokens.py)."""
    from rlvr.config import load_config
    from rlvr.data.task_data import TaskData
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train

    model, tok = tiny_chat_policy(seed=3)
    runner = _runner(tok, REWRITE_AGENT)
    examples = [Example(id=f"p{i}", question=f"{i}+{i}=", reference=str(2 * i)) for i in range(4)]
    ros, _, m = episodes_through(runner, HFGenerator(model, tok), examples[:1],
                                 SamplingSpec(n=2, temperature=1.0, max_tokens=5, seed=0))
    assert m["gateway/split_episodes"] == 2.0
    for ro in ros:
        (early,) = ro.earlier_segments
        assert tok.decode(early.prompt_ids).endswith("0+0=<|im_end|>\n<|im_start|>assistant\n")
        assert "earlier: 0+0= ->" in ro.prompt and all(early.loss_mask) and all(ro.loss_mask)
        assert early.group == ro.group and early.sample_index == ro.sample_index
        assert m["gateway/earlier_segment_tokens"] >= len(early.response_ids)

    # through the trainer: 2 problems x 2 episodes, each 2 segments -> 8 rows in one optimizer step
    model_dir = tmp_path / "policy"
    from rlvr.models import save_policy

    save_policy(model, tok, model_dir)
    trained_runner = _runner(tok, REWRITE_AGENT)
    seen = []
    rollouts = trained_runner.rollouts

    def spy(*args, **kw):
        ros, rewards = rollouts(*args, **kw)
        seen.extend(ros)
        return ros, rewards

    trained_runner.rollouts = spy
    task = TaskData("rewrite", examples, [], lambda ex: ex.question, lambda text, ex: None, lambda ex: "",
                    env=trained_runner)
    cfg = load_config(TrainConfig, None, [f"model.init_from={model_dir}", "sampling.n_prompts=2",
                                          "sampling.group_size=2", "sampling.max_tokens=5", "run.steps=1",
                                          "data.num_eval=0", f"run.out_dir={tmp_path / 'run'}", "run.progress=false",
                                          "optim.lr=1e-3"])
    train(cfg, data=task)
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["gateway/split_episodes"] == 4.0 and len(seen) == 4
    # every row trained: 4 episodes x (the last segment + the earlier one), their real tokens
    from rlvr.rollout import rollouts_to_batch

    rows = [r for ro in seen for r in (ro, *ro.earlier_segments)]
    assert len(rows) == 8 and row["tokens/trained"] == int(rollouts_to_batch(rows, 0).attention_mask.sum())
    assert row["tokens/trained"] > int(rollouts_to_batch(seen, 0).attention_mask.sum())
