"""Reward functions: CS336 r1_zero / question_only semantics, gsm8k, countdown, multiple choice,
language consistency, composition, registry, never-raises and picklability."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.rewards import REWARD_FUNCTIONS, compose, get_reward_fn
from rlvr.rewards import countdown as cd
from rlvr.rewards.extract import parse_r1_zero
from rlvr.rewards.language import language_share, script_words
from rlvr.rewards.types import Reward, SimpleExample, Status

EX = SimpleExample("#### 72")
r1 = get_reward_fn("r1_zero")


def parts(r: Reward) -> tuple[float, float, float]:
    return r.total, r.parts["format"], r.parts["answer"]


# --- r1_zero (CS336 r1_zero_reward_fn semantics) --------------------------------------------


def test_r1_zero_cases():
    assert parts(r1("think </think> <answer>72</answer>", EX)) == (1.0, 1.0, 1.0)
    # formatted but wrong: no reward (format is logged, not paid)
    r = r1("think </think> <answer>71</answer>", EX)
    assert parts(r) == (0.0, 1.0, 0.0) and r.status is Status.INCORRECT
    # unformatted: all zero, typed unparsable
    r = r1("think </think>\n<answer>72</answer>", EX)
    assert parts(r) == (0.0, 0.0, 0.0) and r.status is Status.UNPARSABLE
    # a box inside the answer is graded on the box
    assert parts(r1("t </think> <answer>so \\boxed{72}</answer>", EX)) == (1.0, 1.0, 1.0)
    # an unbalanced box: formatted, no answer
    r = r1("t </think> <answer>\\boxed{72</answer>", EX)
    assert parts(r) == (0.0, 1.0, 0.0) and r.status is Status.UNPARSABLE
    # last answer block wins; trailing text after </answer> ignored (documented departure)
    assert r1("t </think> <answer>1</answer> <answer>72</answer>", EX).total == 1.0
    assert r1("t </think> <answer>72</answer> because", EX).total == 1.0
    # reference may be a plain value or a \boxed solution
    assert r1("t </think> <answer>0.5</answer>", SimpleExample("$\\boxed{\\frac12}$")).total == 1.0


def test_extraction_edges_through_the_rewards():
    # a stray extra </answer> after a complete block does not void it
    assert parts(r1("t </think> <answer>72</answer></answer>", EX)) == (1.0, 1.0, 1.0)
    # an unclosed last box does not fall back to an earlier box: no answer
    r = get_reward_fn("math")("so \\boxed{72}, no wait, \\boxed{71", EX)
    assert r.total == 0.0 and r.status is Status.UNPARSABLE
    r = get_reward_fn("question_only")("\\boxed{72} hmm \\boxed{7", EX)
    assert r.total == 0.0 and r.status is Status.UNPARSABLE
    # text after #### that is not a number is no answer (and no last-number fallback)
    r = get_reward_fn("gsm8k")("it is 72\n#### seventy-two", EX)
    assert r.total == 0.0 and r.status is Status.UNPARSABLE
    # leading-dot decimals are numbers: the last-number fallback finds .5
    r = get_reward_fn("gsm8k")("the chance is .5", SimpleExample("#### 0.5"))
    assert r.total == 1.0 and r.answer == ".5"


_FRAGMENTS = st.lists(
    st.sampled_from(["</think>", " ", "<answer>", "</answer>", "72", "\n", "x", "<think>", "</think> <answer>"]),
    max_size=8,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_FRAGMENTS)
def test_r1_zero_format_flag_matches_the_cs336_rule_where_it_is_defined(frags):
    response = "".join(frags)
    # CS336: '"</think> <answer>" in response and "</answer>" in response'. Ours also requires the
    # </answer> to come after the separator, so ours implies theirs, and they agree whenever the
    # last </answer> follows the separator.
    theirs = "</think> <answer>" in response and "</answer>" in response
    ours = parse_r1_zero(response).format_ok
    assert (not ours) or theirs
    if theirs and response.rfind("</answer>") > response.find("</think> <answer>"):
        assert ours


# --- question_only, gsm8k, math ---------------------------------------------------------------


def test_question_only():
    q = get_reward_fn("question_only")
    assert parts(q("so \\boxed{72}", EX)) == (1.0, 1.0, 1.0)
    assert parts(q("#### 72", EX)) == (1.0, 1.0, 1.0)
    assert parts(q("so \\boxed{70}", EX)) == (0.0, 1.0, 0.0)
    r = q("it is 72", EX)  # no box, no #### -> unparsable
    assert parts(r) == (0.0, 0.0, 0.0) and r.status is Status.UNPARSABLE


def test_gsm8k_and_arithmetic_extraction_and_format():
    g = get_reward_fn("gsm8k")
    assert parts(g("so 70 + 2 = 72", EX)) == (1.0, 0.0, 1.0)  # last number, format 0
    assert parts(g("The answer is 72.", EX)) == (1.0, 1.0, 1.0)
    assert parts(g("#### 72", EX)) == (1.0, 1.0, 1.0)
    assert parts(g("72 then #### 71", EX)) == (0.0, 1.0, 0.0)  # explicit marker wins
    assert g("no number", EX).status is Status.UNPARSABLE
    a = get_reward_fn("arithmetic")
    assert a("3 * 4 = 12", SimpleExample("12")).total == 1.0
    assert a("12.0", SimpleExample("12")).total == 1.0
    m = get_reward_fn("math")
    assert m("\\boxed{\\frac{\\sqrt{2}}{2}}", SimpleExample("\\frac{1}{\\sqrt 2}")).total == 1.0


# --- countdown --------------------------------------------------------------------------------

CD = SimpleExample("", {"numbers": [25, 5, 3, 1], "target": 61})


@pytest.mark.parametrize(
    "expr,ok",
    [
        ("(25 - 5) * 3 + 1", True),  # 20*3+1 = 61
        ("1 + 3 * (25 - 5)", True),
        ("(25-5)*3+1 = 61", True),
        ("(25-5)*3+1 = 60", False),  # stated result wrong
        ("25 * 3 - 5 - 1 - 8", False),  # 8 is not given
        ("(25 - 5) * 3", False),  # 1 unused
        ("(25 - 5) * 3 + 1 + 1", False),  # 1 used twice
        ("25 + 5 * 3 + 1 + 20", False),
        ("(25 - 5) ^ 3 + 1", False),  # ^ not allowed
        ("(25 - 5) ** 3 + 1", False),  # ** parses as * * -> error
        ("__import__('os')", False),
        ("(25 - 5) * 3 + 1)", False),  # unbalanced
    ],
)
def test_countdown_cases(expr, ok):
    r = get_reward_fn("countdown")(f"<answer>{expr}</answer>", CD)
    assert (r.total == 1.0) is ok, r.info
    assert r.status is (Status.CORRECT if ok else Status.INCORRECT)


def test_countdown_exact_rational_arithmetic():
    # 6 / 4 * 8 = 12 exactly (floats would also pass; 1/3 * 3 = 1 needs exactness)
    assert cd.check("1 / 3 * 3", [1, 3, 3], 1) == (True, "ok")
    value, used = cd.evaluate("(7 - 3) / (2 * 5)")
    assert value == Fraction(2, 5) and used == [7, 3, 2, 5]
    ok, why = cd.check("5 / (3 - 3)", [5, 3, 3], 1)
    assert not ok and "zero" in why


def test_countdown_missing_meta_is_an_error_naming_the_key():
    r = get_reward_fn("countdown")("<answer>1+2</answer>", SimpleExample("3", {"target": 3}))
    assert r.status is Status.ERROR and "numbers" in r.info


# --- multiple choice, language ---------------------------------------------------------------


def test_multiple_choice():
    mc = get_reward_fn("multiple_choice")
    assert mc("The answer is (B).", SimpleExample("B")).total == 1.0
    assert mc("The answer is (C).", SimpleExample("(B)")).total == 0.0
    ex = SimpleExample("Paris", {"choices": ["London", "Paris", "Rome"]})
    assert mc("Answer: B", ex).total == 1.0
    assert mc("Answer: D", ex).status is Status.UNPARSABLE  # D is not among 3 choices
    assert mc("no idea", SimpleExample("A")).status is Status.UNPARSABLE
    assert mc("B", SimpleExample("Berlin", {"choices": ["x"]})).status is Status.ERROR


def test_language_share_by_hand():
    # "hello 你好" -> words: LATIN (hello), CJK, CJK -> en 1/3, zh 2/3
    assert script_words("hello 你好") == ["LATIN", "CJK", "CJK"]
    assert language_share("hello 你好", "en") == pytest.approx(1 / 3)
    assert language_share("hello 你好", "zh") == pytest.approx(2 / 3)
    # digits and math are ignored: "x = 3 + 4" has one word (x)
    assert language_share("x = 3 + 4", "en") == 1.0
    assert language_share("", "en") == 0.0
    assert language_share("привет мир hello", "ru") == pytest.approx(2 / 3)
    with pytest.raises(KeyError, match="known"):
        language_share("x", "xx")


def test_language_reward_uses_reasoning_only():
    lang = get_reward_fn("language")
    r = lang("we add numbers 你 </think> <answer>答案</answer>", SimpleExample("1", {"language": "en"}))
    # reasoning words: we, add, numbers (LATIN) + 你 (CJK) -> 3/4; the answer is not counted
    assert r.total == pytest.approx(0.75) and r.parts == {"language": pytest.approx(0.75)}


# --- composition, registry, robustness -------------------------------------------------------


def test_compose_weighted_sum_and_parts():
    fn = compose({"r1_zero": 1.0, "language": 0.1})
    r = fn("we add numbers 你 </think> <answer>72</answer>", SimpleExample("72"))
    # 1.0 * 1.0 (correct) + 0.1 * 0.75 (language share) = 1.075
    assert r.total == pytest.approx(1.075)
    assert r.parts["r1_zero"] == 1.0 and r.parts["r1_zero/format"] == 1.0
    assert r.parts["language"] == pytest.approx(0.75)
    assert r.status is Status.CORRECT
    same = get_reward_fn("r1_zero:1.0,language:0.1")
    assert same("we add numbers 你 </think> <answer>72</answer>", SimpleExample("72")) == r


def test_compose_reports_timeouts_of_any_term(monkeypatch):
    def timed_out(response, example):
        return Reward(0.0, {}, Status.TIMEOUT, "killed")

    monkeypatch.setitem(REWARD_FUNCTIONS, "fake_timeout", timed_out)
    r = compose({"r1_zero": 1.0, "fake_timeout": 0.5})("t </think> <answer>72</answer>", SimpleExample("72"))
    assert r.total == 1.0 and r.status is Status.TIMEOUT


def test_registry_errors():
    with pytest.raises(KeyError, match="known: .*r1_zero"):
        get_reward_fn("nope")
    with pytest.raises(KeyError, match="nope"):
        compose({"r1_zero": 1.0, "nope": 1.0})
    with pytest.raises(ValueError, match="bad weight"):
        get_reward_fn("r1_zero:abc")
    for name in ("r1_zero", "question_only", "gsm8k", "arithmetic", "countdown", "multiple_choice", "language"):
        assert name in REWARD_FUNCTIONS


def test_reward_functions_never_raise_and_are_picklable():
    weird = [None, 5, b"bytes"]
    for name in REWARD_FUNCTIONS:
        fn = get_reward_fn(name)
        assert pickle.loads(pickle.dumps(fn)) is fn
        for resp in weird:
            r = fn(resp, SimpleExample("1"))  # type: ignore[arg-type]
            assert isinstance(r, Reward) and r.status is not Status.CORRECT
    composed = compose({"r1_zero": 1.0, "language": 0.1})
    assert pickle.loads(pickle.dumps(composed)) == composed


@st.composite
def countdown_solution(draw):
    """Numbers, an expression using each exactly once, and its value computed independently."""
    k = draw(st.integers(min_value=2, max_value=5))
    nums = draw(st.lists(st.integers(min_value=1, max_value=100), min_size=k, max_size=k))
    items = [(str(n), Fraction(n)) for n in nums]
    while len(items) > 1:
        i = draw(st.integers(min_value=0, max_value=len(items) - 2))
        (a, va), (b, vb) = items[i], items[i + 1]
        op = draw(st.sampled_from("+-*/"))
        if op == "/" and vb == 0:
            op = "+"
        v = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
        items[i : i + 2] = [(f"({a} {op} {b})", v)]
    return nums, items[0][0], items[0][1]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(countdown_solution())
def test_countdown_accepts_every_valid_solution_and_rejects_wrong_targets(sol):
    nums, expr, value = sol
    if value.denominator != 1:
        # a non-integer value can never equal an integer target
        assert not cd.check(expr, nums, int(value) + 1)[0]
        return
    assert cd.check(expr, nums, int(value)) == (True, "ok")
    assert not cd.check(expr, nums, int(value) + 1)[0]
    assert not cd.check(expr, nums + [1], int(value))[0]  # one given number left unused


def test_data_verifier_tolerance_reaches_the_task_reward():
    """data.verifier_tolerance=lenient accepts 3.14 for pi through the task's reward; strict (and the
    default) rejects it."""
    from rlvr.data.example import Example
    from rlvr.train.config import DataConfig
    from rlvr.train.tasks import load_task_data

    ex = Example(id="x", question="q", reference="\\pi")
    got = {}
    for tol in ("", "strict", "lenient"):
        task = load_task_data(DataConfig(task="arithmetic", num_train=10, num_eval=2, reward="math",
                                         verifier_tolerance=tol))
        got[tol] = task.reward_fn("The answer is \\boxed{3.14}", ex).total
    assert got == {"": 0.0, "strict": 0.0, "lenient": 1.0}
