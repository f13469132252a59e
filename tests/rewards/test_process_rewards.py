"""Process rewards (issue 10, item 7): the step-checked task `sum_steps`, its per-step reward, step
ends as token positions, `algo.advantage=process` through Objective.targets, config errors, and a
learning test through train(). Hand-computed numbers first, arithmetic in the comments."""

from __future__ import annotations

import json
import pickle
import statistics

import pytest
import torch
from helpers.learning import STEPS_LEARN_COMMON, STEPS_LEARN_MODEL, STEPS_RL_FROM_STEP

from rlvr.config import ConfigError, load_config
from rlvr.data import get_task
from rlvr.data.jsonl import DataError
from rlvr.models import build_char_tokenizer
from rlvr.models.tiny import build_bpe_tokenizer
from rlvr.rewards import get_reward_fn
from rlvr.rewards.steps import problem_terms, step_spans, sum_steps
from rlvr.rewards.types import Reward, SimpleExample, Status
from rlvr.rollout import rollouts_to_batch
from rlvr.rollout.types import Rollout
from rlvr.train.config import AlgoConfig, TrainConfig
from rlvr.train.pg.loop import train, validate_train_config
from rlvr.train.pg.objective import Objective, shape_and_advantage
from rlvr.train.pg.process import (
    StepMarks,
    center_by_step,
    merge_shared_ends,
    process_targets,
    step_marks,
    token_ends,
)

TASK = get_task("sum_steps")


def ex(question: str):
    """The Example of a question, as the task builds it (terms and ops in meta, worked solution)."""
    return TASK.from_rows([{"question": question}])[0]


# ------------------------------------------------------------------------------------- the task


def test_task_generates_worked_steps_with_padded_results_and_disjoint_splits():
    train_ex = TASK.generate(300, "train", 0)
    test_ex = TASK.generate(50, "test", 0)
    assert not {e.question for e in train_ex} & {e.question for e in test_ex}
    assert [e.question for e in TASK.generate(300, "train", 0)] == [e.question for e in train_ex]  # deterministic
    e = ex("3+5+7=")
    # results padded to the digits of the largest sum of three one-digit terms (27: two)
    assert e.solution == TASK.target(e) == "3+5=08\n08+7=15" and e.reference == "15"
    assert e.meta["terms"] == [3, 5, 7] and e.meta["ops"] == ["+", "+"]
    for e in train_ex[:50]:
        r = sum_steps(TASK.target(e), e)
        assert r.status is Status.CORRECT and r.steps == (1.0, 1.0) and r.parts["steps_correct"] == 1.0
    # the capacity is the exact count: 10^3 questions, split by the same hash as `arithmetic`
    assert TASK.capacity("train") + TASK.capacity("test") == 1000
    assert TASK.capacity("train") == get_task("arithmetic").capacity("train", digits=1, operands=3)
    minus = TASK.generate(20, "train", 1, ops="+-", operands=4)
    assert any("-" in e.question for e in minus)
    for e in minus:
        assert sum_steps(TASK.target(e), e).steps == (1.0, 1.0, 1.0)
    with pytest.raises(DataError, match="rows:0"):
        TASK.from_rows([{"question": "3*5="}])
    with pytest.raises(DataError, match="not the value"):
        TASK.from_rows([{"question": "3+5+7=", "reference": "16"}])


def test_task_bounds_every_result_with_max_result():
    # four one-digit terms whose running sums stay <= 9: every number one digit, no padding
    probs = TASK.generate(200, "train", 0, operands=4, max_result=9)
    for e in probs:
        lines = TASK.target(e).split("\n")
        assert len(lines) == 3 and all(len(x) == 5 for x in lines), lines
        assert sum_steps(TASK.target(e), e).steps == (1.0, 1.0, 1.0)
    # exact count: 4-term sums <= 9 are C(13, 4) = 715 (stars and bars), split 10% held out by hash
    assert TASK.capacity("train", operands=4, max_result=9) + TASK.capacity("test", operands=4, max_result=9) == 715
    with pytest.raises(ValueError, match="max_result"):
        TASK.generate(5, "train", 0, max_result=-1)


def test_task_is_reachable_from_the_data_config():
    from rlvr.train.tasks import load_task_data

    cfg = load_config(TrainConfig, None, ["data.task=sum_steps", "data.num_train=40", "data.num_eval=10"])
    task = load_task_data(cfg.data, build_char_tokenizer())
    assert len(task.train) == 40 and len(task.eval) == 10
    assert task.reward_fn is sum_steps and task.prompt(task.train[0]) == task.train[0].question
    with pytest.raises(ConfigError, match="data.num_train=2000"):
        load_config(TrainConfig, None, ["data.task=sum_steps", "data.num_train=2000"])
    with pytest.raises(ConfigError, match="data.template='r1_zero'"):
        load_config(TrainConfig, None, ["data.task=sum_steps", "data.template=r1_zero"])


# ----------------------------------------------------------------------------------- the reward


@pytest.mark.parametrize(
    ("question", "response", "steps", "ends", "share", "status"),
    [
        # right: both steps, ends at the last characters "8" (index 4) and "5" (index 11)
        ("3+5+7=", "3+5=8\n8+7=15", (1, 1), (4, 11), 1.0, Status.CORRECT),
        # padded results read as numbers
        ("3+5+7=", "3+5=08\n08+7=15", (1, 1), (5, 13), 1.0, Status.CORRECT),
        # wrong middle step of three: 8+7=16; the third continues from the 16 written and is right
        ("3+5+7+2=", "3+5=8\n8+7=16\n16+2=18", (1, 0, 1), (4, 11, 19), 2 / 3, Status.INCORRECT),
        # an error charged once: 9 is wrong, 9+7=16 continues from it and is right; the answer is wrong
        ("3+5+7=", "3+5=9\n9+7=16", (0, 1), (4, 11), 1 / 2, Status.INCORRECT),
        # right answer, wrong steps: 4+1=4 is wrong, 5+4 does not continue from the 4 written
        ("4+1+4=", "4+1=4\n5+4=9", (0, 0), (4, 10), 0.0, Status.CORRECT),
        # a missing step: one written (right), then stopping early: a 0 step at the end (index len = 5)
        ("3+5+7=", "3+5=8", (1, 0), (4, 5), 1 / 2, Status.INCORRECT),
        # wrong term: 8+6 is not the problem's next step although the sum is right
        ("3+5+7=", "3+5=8\n8+6=14", (1, 0), (4, 11), 1 / 2, Status.INCORRECT),
        # an extra step scores 0 and counts in the share's denominator: 2 of 3
        ("3+5+7=", "3+5=8\n8+7=15\n15+0=15", (1, 1, 0), (4, 11, 19), 2 / 3, Status.CORRECT),
        # garbage: one line that is no step (0), then the missing step at the end (index 3)
        ("3+5+7=", "abc", (0, 0), (2, 3), 0.0, Status.UNPARSABLE),
        # a garbage line breaks the chain: the right-looking "8+7=15" has nothing to continue from
        ("3+5+7=", "3+5=8\nzz\n8+7=15", (1, 0, 0), (4, 7, 14), 1 / 3, Status.CORRECT),
        # blank lines are no steps; surrounding spaces are not part of a step
        ("3+5+7=", "\n 3+5=8 \n\n8+7=15\n", (1, 1), (6, 15), 1.0, Status.CORRECT),
        # nothing at all: only the stop is a (wrong) step, on the end-of-sequence token
        ("3+5+7=", "", (0,), (0,), 0.0, Status.UNPARSABLE),
        # minus, negative intermediate results
        ("3-5+7=", "3-5=-2\n-2+7=5", (1, 1), (5, 12), 1.0, Status.CORRECT),
    ],
)
def test_step_rewards_by_hand(question, response, steps, ends, share, status):
    r = sum_steps(response, ex(question))
    assert r.steps == tuple(float(s) for s in steps)
    assert r.step_ends == ends
    assert r.parts["steps_correct"] == pytest.approx(share)
    assert r.status is status and r.total == (1.0 if status is Status.CORRECT else 0.0)
    assert r.parts["answer"] == r.total
    for e in ends:  # every end is a step's last character (or the end of the response)
        assert e == len(response) or response[e].strip()


def test_reward_works_from_the_question_alone_never_raises_and_pickles():
    # a JSONL row graded by `rlvr grade` has no meta: the terms come from meta["question"] or fail typed
    r = sum_steps("3+5=8\n8+7=15", SimpleExample("15", {"question": "3+5+7="}))
    assert r.steps == (1.0, 1.0) and r.status is Status.CORRECT
    assert problem_terms("12-3+4=") == ([12, 3, 4], ["-", "+"])
    for bad in (None, 5, "9" * 100_000, "1" * 30 + "+5=6", "\n" * 10_000):
        out = sum_steps(bad, ex("3+5+7="))  # type: ignore[arg-type]
        assert isinstance(out, Reward) and out.status is not Status.CORRECT
    assert sum_steps("3+5=8", SimpleExample("1")).status is Status.ERROR  # no terms anywhere
    assert get_reward_fn("sum_steps") is sum_steps
    r = sum_steps("3+5=8\n8+7=16", ex("3+5+7="))
    assert pickle.loads(pickle.dumps(r)) == r
    assert step_spans("a\n\n  b c \n") == [(0, 1), (5, 8)]


def test_reward_record_keeps_old_constructions_and_checks_its_steps():
    assert Reward(1.0).steps == () and Reward(1.0).step_ends == ()
    assert Reward(0.0, {}, Status.ERROR, "x").steps == ()
    assert Reward(1.0, steps=[1, 0], step_ends=[2, 5]).steps == (1.0, 0.0)  # lists become tuples
    with pytest.raises(ValueError, match="2 step rewards but 1 step ends"):
        Reward(1.0, steps=(1.0, 0.0), step_ends=(3,))
    with pytest.raises(ValueError, match="strictly increasing"):
        Reward(1.0, steps=(1.0, 0.0), step_ends=(3, 3))


# ------------------------------------------------------------------------- step ends as tokens


def _rollout(tok, prompt: str, response: str, eos: bool = True) -> Rollout:
    ids = tok(response)["input_ids"] + ([tok.eos_token_id] if eos else [])
    return Rollout(prompt=prompt, prompt_ids=tok(prompt)["input_ids"], response_ids=ids, text=response,
                   logprobs=None, finish_reason="stop" if eos else "length", group=0)


def test_step_ends_map_to_tokens_with_the_char_tokenizer():
    tok = build_char_tokenizer()
    e = ex("3+5+7=")
    cases = [
        # one token per character, then <eos> at index len(response)
        ("3+5=8\n8+7=15", True, (1.0, 1.0), (4, 11)),
        ("3+5=8", True, (1.0, 0.0), (4, 5)),  # the missing step sits on <eos> (token 5)
        ("abc", True, (0.0, 0.0), (2, 3)),
        ("", True, (0.0,), (0,)),  # only <eos>
        # truncated (no <eos>): the stop has no token of its own and merges into the last line's end
        # with the smaller reward: steps (1, 0) at tokens (4, 4) -> one step (0,) at token 4
        ("3+5=8", False, (0.0,), (4,)),
    ]
    for response, eos, rewards, ends in cases:
        ro = _rollout(tok, e.question, response, eos)
        marks = step_marks([ro], [sum_steps(response, e)], tok)
        assert marks.rewards == [rewards] and marks.ends == [ends], response
        assert marks.offsets == [len(e.question) - 1]  # label position of the first response token


def test_step_ends_map_to_tokens_with_a_bpe_tokenizer():
    texts = ["3+5=08\n08+7=15", "12+34=46\n46+5=51", "héllo wörld 3+5=8"] * 50
    tok = build_bpe_tokenizer(texts, vocab_size=300)

    def decode(ids):
        return tok.decode(ids, skip_special_tokens=True)

    for response in ("3+5=08\n08+7=15", "12+34=46\n46+5=51", "é+1=2\n2+ü", "ü"):
        ids = tok(response)["input_ids"]
        assert decode(ids) == response
        chars = list(range(len(response)))
        got = token_ends(ids, chars, decode, response)
        for c, k in zip(chars, got, strict=True):
            # token k completes character c: decoding through k holds it, decoding through k-1 does not
            assert decode(ids[: k + 1]).startswith(response[: c + 1]), (response, c, k)
            assert k == 0 or not decode(ids[:k]).startswith(response[: c + 1]), (response, c, k)
        # the end of the response: the token after the text (an <eos>), or the last one if none
        eos = tok.convert_tokens_to_ids(tok.eos_token)
        assert token_ends([*ids, eos], [len(response)], decode, response) == [len(ids)]
        assert token_ends(ids, [len(response)], decode, response) == [len(ids) - 1]
    # several characters in one token: "08" merged in a BPE token means both map to the same index
    ids = tok("3+5=08\n08+7=15")["input_ids"]
    assert len(ids) < len("3+5=08\n08+7=15")  # merges happened
    marks = step_marks([Rollout("3+5+7=", tok("3+5+7=")["input_ids"], ids, "3+5=08\n08+7=15", None, "length", 0)],
                       [sum_steps("3+5=08\n08+7=15", ex("3+5+7="))], tok)
    assert marks.rewards == [(1.0, 1.0)] and marks.ends[0][-1] == len(ids) - 1


def test_steps_ending_in_one_token_merge_with_the_smallest_reward():
    assert merge_shared_ends([1.0, 0.0, 1.0], [3, 3, 7]) == ((0.0, 1.0), (3, 7))
    assert merge_shared_ends([1.0, 1.0], [3, 4]) == ((1.0, 1.0), (3, 4))
    assert merge_shared_ends([], []) == ((), ())


def test_a_reward_without_steps_is_refused_by_name():
    tok = build_char_tokenizer()
    ro = _rollout(tok, "3+5=", "8")
    with pytest.raises(ValueError, match="algo.advantage='process' needs a reward that judges steps"):
        step_marks([ro, ro], [Reward(1.0), Reward(0.0)], tok)
    # a timeout among step rewards is fine: that row adds no process term ("8" is no step "a+b=c": 0)
    marks = step_marks([ro, ro], [Reward(0.0, {}, Status.TIMEOUT), sum_steps("8", ex("3+5="))], tok)
    assert marks.rewards == [(), (0.0,)] and marks.ends == [(), (0,)]


# -------------------------------------------------------------------------------- the advantage


def test_process_advantages_of_a_small_batch_by_hand():
    """Two groups of two responses to "3+5+7=" (prompt: 6 tokens, so response token k sits at label
    position 5 + k; char tokenizer, <eos> last).

    group 0: A "3+5=8\\n8+7=15" steps (1, 1) at tokens (4, 11), outcome right
             B "3+5=9"          steps (0, 0) at tokens (4, 5)  (9 wrong, then the missing step on <eos>)
      step rewards of the group [1, 1, 0, 0]: mean 0.5, population std 0.5 -> normalized [+1, +1, -1, -1]
      (eps: 0.5 / (0.5 + 1e-6)). A: tokens 0-4 get +1 +1 = 2, tokens 5-11 get +1, <eos> (12) gets 0;
      B: tokens 0-4 get -1 -1 = -2, <eos> (5) gets -1.
    group 1: two copies of A: all step rewards 1, std 0 -> every step 0: all zeros.
    With algo.process_outcome_coef = 0.5 the outcome's GRPO advantage (group 0: +1 / -1, group 1: 0)
    is added to every response token: A +0.5, B -0.5.
    """
    tok = build_char_tokenizer()
    e = ex("3+5+7=")
    texts = ["3+5=8\n8+7=15", "3+5=9", "3+5=8\n8+7=15", "3+5=8\n8+7=15"]
    ros = [_rollout(tok, e.question, t) for t in texts]
    rewards = [sum_steps(t, e) for t in texts]
    batch = rollouts_to_batch(ros, tok.pad_token_id)
    mask = batch.response_mask
    assert mask.shape == (4, 6 + 13 - 1)
    marks = step_marks(ros, rewards, tok)
    assert marks.ends == [(4, 11), (4, 5), (4, 11), (4, 11)]

    want = torch.zeros(4, 18)
    want[0, 5:10], want[0, 10:17], want[0, 17] = 2.0, 1.0, 0.0
    want[1, 5:10], want[1, 10] = -2.0, -1.0

    steps_only = AlgoConfig(advantage="process")
    _, adv, _, _ = shape_and_advantage(rewards, torch.tensor([13.0, 6.0, 13.0, 13.0]), steps_only, 2, 16)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)  # GRPO of the outcome
    got = process_targets(adv, mask, marks, steps_only, group_size=2).advantages
    assert got.shape == (4, 18)
    assert torch.allclose(got, want, atol=1e-5)

    with_outcome = AlgoConfig(advantage="process", process_outcome_coef=0.5)
    got = process_targets(adv, mask, marks, with_outcome, group_size=2).advantages
    want_o = want.clone()
    want_o[0, 5:18] += 0.5
    want_o[1, 5:11] -= 0.5
    assert torch.allclose(got, want_o, atol=1e-5)

    # through the Objective: the same tensor, and the marks it takes from the kept rows only
    obj = Objective(with_outcome, group_size=2, max_tokens=16, plan=None)
    assert obj.needs_steps and not Objective(AlgoConfig(), 2, 16, None).needs_steps
    assert Objective(AlgoConfig(), 2, 16, None).step_marks(ros, rewards, torch.arange(4), tok) is None
    kept = torch.tensor([0, 1])
    sub = obj.step_marks(ros, rewards, kept, tok)
    sub_batch = rollouts_to_batch([ros[0], ros[1]], tok.pad_token_id)
    t = obj.targets(adv[kept], sub_batch.response_mask, steps=sub)
    assert torch.allclose(t.advantages, want_o[:2], atol=1e-5)
    # whitening then applies over the response tokens of the batch
    w = process_targets(adv, mask, marks, AlgoConfig(advantage="process", whiten_advantages=True), 2).advantages
    valid = w[mask.bool()]
    assert abs(float(valid.mean())) < 1e-5 and abs(float(valid.std(unbiased=False)) - 1) < 1e-3
    assert float(w[~mask.bool()].abs().max()) == 0.0


def _p_next(model, tok, context: str, char: str) -> float:
    """Probability the model gives `char` right after `context`."""
    ids = torch.tensor([tok(context)["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    return float(torch.softmax(logits.float(), -1)[tok.convert_tokens_to_ids(char)])


@pytest.mark.parametrize("advantage", ["process", "grpo"])
def test_process_credit_goes_to_the_right_step_where_the_outcome_rewards_a_lucky_answer(advantage):
    """A group of two responses to "4+1+4=" that share the prefix "4+1=0":
    R2 "4+1=04\n05+4=09": steps (0, 0) (4+1 is not 4; 05 does not continue from 04), answer 9 right;
    R3 "4+1=05\n05+4=08": steps (1, 0), answer wrong.
    The outcome (GRPO: R2 +1, R3 -1) pays for R2's lucky answer, so one update raises the probability
    of the wrong "4" after "4+1+4=4+1=0". Process supervision: step rewards [0, 0, 1, 0], mean 1/4,
    std sqrt(3)/4, normalized -1/sqrt(3) (0) and sqrt(3) (1); the first step's tokens of R2 get
    -2/sqrt(3), those of R3 +2/sqrt(3): the update raises the right "5" instead."""
    from rlvr.models import build_tiny_model
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.pg.objective import LossParts, Minibatch, accumulate_gradients

    model, tok = build_tiny_model(seed=0, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    e = ex("4+1+4=")
    texts = ["4+1=04\n05+4=09", "4+1=05\n05+4=08"]
    ros = [_rollout(tok, e.question, t) for t in texts]
    rewards = [sum_steps(t, e) for t in texts]
    assert [r.steps for r in rewards] == [(0.0, 0.0), (1.0, 0.0)] and [r.total for r in rewards] == [1.0, 0.0]
    algo = AlgoConfig(advantage=advantage, loss="reinforce_with_baseline", aggregation="token_mean")
    obj = Objective(algo, group_size=2, max_tokens=16, plan=None)
    _, adv, _, _ = obj.advantages(rewards, torch.tensor([15.0, 15.0]))
    batch = rollouts_to_batch(ros, tok.pad_token_id)
    targets = obj.targets(adv, batch.response_mask, steps=obj.step_marks(ros, rewards, torch.arange(2), tok))
    if advantage == "process":
        k = 5 + 5  # label position of the digit after "4+1=0" (prompt 6 tokens: offset 5, character 5)
        assert targets.advantages[:, k].tolist() == pytest.approx([-2 / 3**0.5, 2 / 3**0.5], abs=1e-4)
    context = e.question + "4+1=0"
    before = {c: _p_next(model, tok, context, c) for c in "45"}
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(3):
        opt.zero_grad()
        accumulate_gradients(model, Minibatch(batch, targets.advantages), LossParts.from_algo(algo),
                             ForwardSpec.of(algo, 2), norm_length=0)
        opt.step()
    after = {c: _p_next(model, tok, context, c) for c in "45"}
    right_up = after["5"] > before["5"] and after["4"] < before["4"]
    assert right_up == (advantage == "process"), (before, after)


def test_step_baseline_centers_each_step_index_over_the_group():
    # group of 3: steps (1, 0), (1, 0, 0), (0, 0): index 0 mean 2/3, index 1 mean 0, index 2 mean 0 (one row)
    got = center_by_step([[1, 0], [1, 0, 0], [0, 0]], 3)
    assert got == [pytest.approx([1 / 3, 0]), pytest.approx([1 / 3, 0, 0]), pytest.approx([-2 / 3, 0])]
    # through process_targets: the step every response fails (index 1) pushes on nothing; the group std
    # of the centered rewards [1/3, 0, 1/3, 0, 0, -2/3, 0] is sqrt(6/63) = 0.3086, so the first steps
    # get (1/3) / 0.3086 = 1.080 and -2.160; the group baseline instead gives the failed steps -0.73 each
    marks = StepMarks(rewards=[(1.0, 0.0), (1.0, 0.0, 0.0), (0.0, 0.0)], ends=[(0, 1), (0, 1, 2), (0, 1)],
                      offsets=[0, 0, 0])
    mask = torch.ones(3, 3)
    step = process_targets(torch.zeros(3), mask, marks, AlgoConfig(advantage="process", process_baseline="step"),
                           3).advantages
    s = (6 / 63) ** 0.5
    want = torch.tensor([[1 / 3, 0, 0], [1 / 3, 0, 0], [-2 / 3, 0, 0]]) / s
    assert torch.allclose(step, want, atol=1e-4)
    group = process_targets(torch.zeros(3), mask, marks, AlgoConfig(advantage="process"), 3).advantages
    # group: rewards [1,0,1,0,0,0,0]: mean 2/7, std sqrt(10)/7; a 0 step is -(2/7)/(sqrt(10)/7) = -0.632
    assert float(group[1, 2]) == pytest.approx(-2 / 10**0.5, abs=1e-4)


def test_process_targets_refuse_missing_marks_and_skip_groups_without_a_comparison():
    mask = torch.ones(2, 4)
    algo = AlgoConfig(advantage="process", adv_std="sample")
    with pytest.raises(ValueError, match="step marks of all 2 trained rows"):
        process_targets(torch.zeros(2), mask, None, algo, 2)
    # one step reward in the group: nothing to compare (and std='sample' would divide by 0): zeros
    marks = StepMarks(rewards=[(1.0,), ()], ends=[(2,), ()], offsets=[0, 0])
    assert process_targets(torch.zeros(2), mask, marks, algo, 2).advantages.abs().max() == 0


# ---------------------------------------------------------------------------------------- config


def _cfg(tmp_path, *overrides) -> TrainConfig:
    return load_config(TrainConfig, None, ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
                                           "model.intermediate_size=64", "run.num_threads=1", "run.progress=false",
                                           "data.task=sum_steps", "data.num_train=64", "data.num_eval=0",
                                           "sampling.max_tokens=16", f"run.out_dir={tmp_path / 'run'}", *overrides])


def test_config_errors_name_the_key(tmp_path):
    validate_train_config(_cfg(tmp_path, "algo.advantage=process", "algo.process_outcome_coef=0.5"))
    with pytest.raises(ConfigError, match="algo.process_outcome_coef=-1"):
        validate_train_config(_cfg(tmp_path, "algo.advantage=process", "algo.process_outcome_coef=-1"))
    with pytest.raises(ConfigError, match="algo.process_outcome_coef=0.5 is only used by algo.advantage='process'"):
        validate_train_config(_cfg(tmp_path, "algo.process_outcome_coef=0.5"))
    with pytest.raises(ConfigError, match="algo.loss='kimi'"):
        validate_train_config(_cfg(tmp_path, "algo.advantage=process", "algo.loss=kimi"))
    with pytest.raises(ConfigError, match="algo.critic"):
        validate_train_config(_cfg(tmp_path, "algo.advantage=process", "algo.critic=shared"))
    with pytest.raises(ConfigError, match="algo.process_baseline='step' is only used by algo.advantage='process'"):
        validate_train_config(_cfg(tmp_path, "algo.process_baseline=step"))
    with pytest.raises(ConfigError, match="algo.process_baseline"):
        _cfg(tmp_path, "algo.advantage=process", "algo.process_baseline=token")
    with pytest.raises(ConfigError, match="algo.advantage='proces'"):
        validate_train_config(_cfg(tmp_path, "algo.advantage=proces"))


def test_train_with_an_outcome_only_reward_fails_naming_the_key(tmp_path):
    cfg = _cfg(tmp_path, "algo.advantage=process", "data.task=arithmetic", "data.digits=1", "sampling.max_tokens=3",
               "sampling.n_prompts=2", "sampling.group_size=2", "run.steps=1")
    with pytest.raises(ValueError, match="algo.advantage='process' needs a reward that judges steps"):
        train(cfg)


def _parity_steps(text: str, example) -> Reward:
    """A scripted step reward an untrained model gets both ways: every character is a step, right
    when its code point is even; the outcome is the first step's."""
    steps = tuple(float(ord(c) % 2 == 0) for c in text)
    ok = bool(steps) and steps[0] == 1.0
    return Reward(float(ok), {"steps_correct": sum(steps) / max(1, len(steps))},
                  Status.CORRECT if ok else Status.INCORRECT, steps=steps, step_ends=tuple(range(len(text))))


def test_process_training_runs_through_train_with_any_step_reward(tmp_path):
    from rlvr.train.tasks import TaskData

    problems = TASK.generate(16, "train", 0)
    task = TaskData("parity", problems, [], lambda e: e.question, _parity_steps, TASK.target)
    cfg = _cfg(tmp_path, "algo.advantage=process", "algo.process_outcome_coef=1", "sampling.n_prompts=4",
               "sampling.group_size=4", "run.steps=2", "optim.lr=1e-2", "algo.kl_coef=0.1", "algo.kl_in=reward",
               "sampling.max_tokens=6")
    res = train(cfg, data=task)
    rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(0.0 <= r["reward/steps_correct"] <= 1.0 and r["grad_norm"] > 0 for r in rows)
    assert rows[1]["kl"] > 0  # the second step's policy differs from the reference: KL in the reward acts
    # the real task's reward logs its two parts
    res = train(_cfg(tmp_path / "b", "algo.advantage=process", "sampling.n_prompts=2", "sampling.group_size=2",
                     "run.steps=1"))
    row = json.loads((res.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert {"reward/steps_correct", "reward/answer"} <= set(row)


# -------------------------------------------------------------------------------------- learning
#
# MEASURED: gain in points of reward/steps_correct (mean of the last 5 of RL_STEPS steps minus the
# first 5; 128 sampled responses a step, T = 1) from the fixture's SFT checkpoint of each seed, under
# the pinned kernels of conftest (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE,STRICT) and the
# native AVX2 path of this machine (ATEN_CPU_CAPABILITY=avx2, MKL_CBWR=AUTO):
#
#     seed                      | 0     | 1      | 2     | 3      | 4     | 5      | median 0-2
#     process, pinned           | +6.1  | +13.3  | +5.8  | +12.2  | +6.3  | +11.6  | +6.1
#     process, native           | +5.0  | +12.1  | +4.9  | +13.2  | +7.9  | +12.1  | +5.0
#     no learning (lr 1e-8)     | +1.3  | +1.0   | -0.6  |        |       |        | +1.0
#     grpo (outcome only)       | -14.8 | -7.7   | -1.7  |        |       |        | -7.7
#     process_baseline=step     | +5.9  | +13.9  | +6.9  |        |       |        | +6.9
#     process_outcome_coef=1    | +4.8  | +13.4  | +4.0  |        |       |        | +4.8
#
# The weakest median of any three of the six seeds: +6.1 pinned, +5.0 native; the threshold (3 points)
# sits below both and above every run that did not learn. GRPO lowers the share: it pays for right
# answers reached through wrong intermediate results. With the sign of the process advantage flipped
# the test fails (-27 points). About 45 s on one thread of an idle machine (SFT fixture 21 s, the
# three RL runs 24 s); the native kernels take half that.

RL_STEPS = 20


def _steps_share(rows: list[dict]) -> tuple[float, float]:
    xs = [r["reward/steps_correct"] for r in rows]
    return statistics.mean(xs[:5]), statistics.mean(xs[-5:])


@pytest.mark.slow  # ~25 s plus its SFT fixture: make test-slow
def test_process_reward_training_raises_the_share_of_correct_steps(steps_task, steps_sft_runs, tmp_path,
                                                                     monkeypatch):
    """From a partly SFT-trained tiny model (tests/conftest.py: steps_sft_runs, one per seed),
    RL_STEPS steps of algo.advantage=process (DeepSeekMath's group normalization, no outcome term):
    the share of correct steps of the sampled responses (reward/steps_correct, T=1, 128 responses a
    step; mean of the last 5 steps minus the first 5) rises, median over three seeds (MEASURED above)."""
    monkeypatch.setattr("rlvr.runs.plots.plot_run", lambda *a, **k: [])
    gains = []
    for seed, sft_run in steps_sft_runs.items():
        ckpt = sft_run / "checkpoints" / f"step_{STEPS_RL_FROM_STEP:06d}"
        cfg = load_config(TrainConfig, None, STEPS_LEARN_MODEL + STEPS_LEARN_COMMON + [
            f"model.init_from={ckpt}", f"run.out_dir={tmp_path / f'p{seed}'}", f"run.steps={RL_STEPS}",
            "run.eval_every=0", "data.num_eval=0", f"run.seed={seed}", f"data.seed={seed}", "optim.lr=5e-4",
            "sampling.n_prompts=16", "sampling.group_size=8", "algo.advantage=process"])
        run_dir = train(cfg, data=steps_task).run_dir
        rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        first, last = _steps_share(rows)
        gains.append(last - first)
        print(f"process seed {seed}: steps correct {first:.3f} -> {last:.3f} ({gains[-1]:+.3f})")
    assert statistics.median(gains) >= 0.03, gains
