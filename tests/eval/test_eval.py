"""rlvr.eval: pass@k against hand-computed and exact-binomial values, maj@k against hand-counted
votes, aggregates of a scripted generator computed by hand, comparison and sweep tables (format
rate "n/a"), and one run with the real HFGenerator."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.eval import (
    comparison_markdown,
    comparison_rows,
    comparison_text,
    default_ks,
    evaluate,
    graded_answer,
    is_formatted,
    length_stats,
    maj_at_k,
    majority_vote,
    mean_maj_at_k,
    mean_pass_at_k,
    pass_at_k,
    results_markdown,
    results_rows,
    results_text,
    status_counts,
    vote_key,
)
from rlvr.eval.metrics import CORRECT_VOTE, format_metric
from rlvr.rewards.types import Reward, Status

# ------------------------------------------------------------------------------------ pass@k


def test_pass_at_k_hand_computed():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10 = 0.7
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7, abs=1e-15)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=1e-15)  # pass@1 = c/n
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3: every 3-subset holds a correct one
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5, abs=1e-15)


def _exact(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 300).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_exact_binomials(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(float(_exact(n, c, k)), rel=1e-12, abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    # C(1000, 100) has 140 digits: a float formula would overflow; the product form stays exact-ish.
    assert pass_at_k(1000, 10, 100) == pytest.approx(float(_exact(1000, 10, 100)), rel=1e-12)
    assert pass_at_k(100_000, 1, 1) == pytest.approx(1e-5, rel=1e-12)


@pytest.mark.parametrize("args", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6), (5.5, 2, 1), (True, 1, 1)])
def test_pass_at_k_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(*args)


def test_mean_pass_at_k_and_default_ks():
    # (5/6 + 1/2 + 0) / 3 = 4/9, see the scripted-generator test below
    assert mean_pass_at_k([(4, 2), (4, 1), (4, 0)], 2) == pytest.approx(4 / 9, abs=1e-15)
    assert default_ks(1) == [1]
    assert default_ks(8) == [1, 2, 4, 8]
    assert default_ks(10) == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError):
        mean_pass_at_k([], 1)


# ------------------------------------------------------------------------------------ maj@k

W12 = ("incorrect", "12")  # a wrong answer's vote


def test_majority_vote_counts_and_breaks_ties_by_first_appearance():
    C = CORRECT_VOTE
    assert majority_vote([W12, C, C]) == C  # 2 votes against 1
    assert majority_vote([W12, C, W12]) == W12
    assert majority_vote([W12, C]) == W12 and majority_vote([C, W12]) == C  # 1:1, the first one wins
    assert majority_vote([None, W12, None]) == W12  # abstentions do not vote
    assert majority_vote([None, None]) is None


def test_maj_at_k_hand_computed():
    C = CORRECT_VOTE
    keys = [W12, C, W12, C, C, None]  # n = 6 samples of one problem, in sample order
    # k=1: groups [12] [C] [12] [C] [C] [-]: 3 of 6 right = accuracy
    assert maj_at_k(keys, 1) == 0.5
    # k=2: [12, C] tie -> 12 (first) = 0; [12, C] = 0; [C, -] = 1  -> 1/3
    assert maj_at_k(keys, 2) == pytest.approx(1 / 3)
    # k=3: [12, C, 12] -> 12 (2:1) = 0; [C, C, -] = 1  -> 1/2
    assert maj_at_k(keys, 3) == 0.5
    # k=4: one group [12, C, 12, C] (samples 4, 5 unused): tie 2:2 -> 12 (first) = 0
    assert maj_at_k(keys, 4) == 0.0
    # k=5: one group [12, C, 12, C, C]: C 3:2 = 1;  k=6: the same votes plus one abstention = 1
    assert maj_at_k(keys, 5) == 1.0 and maj_at_k(keys, 6) == 1.0
    # a problem where nobody voted scores 0 for every k
    assert maj_at_k([None] * 4, 2) == 0.0
    # mean over problems: (1/3 + 0) / 2
    assert mean_maj_at_k([keys, [None] * 6], 2) == pytest.approx(1 / 6)
    for bad in (0, 7, 2.5, True):
        with pytest.raises(ValueError, match="maj_at_k"):
            maj_at_k(keys, bad)
    with pytest.raises(ValueError):
        mean_maj_at_k([], 1)


def test_vote_keys_normalize_wrong_answers_and_merge_correct_ones():
    assert vote_key(True, "1/2") == vote_key(True, "0.5") == vote_key(True, None) == CORRECT_VOTE
    assert vote_key(False, "1,000") == vote_key(False, "1000") == ("incorrect", "1000")  # grader.normalize
    assert vote_key(False, "$12$") == vote_key(False, " 12. ") == W12
    assert vote_key(False, None) is None


def test_graded_answer_prefers_the_reward_then_final_answer():
    assert graded_answer(Reward(0.0, {}, Status.INCORRECT, answer="7"), "#### 9") == "7"
    assert graded_answer(Reward(0.0, {}, Status.INCORRECT), "so \\boxed{9}.") == "9"  # final_answer
    assert graded_answer(Reward(0.0, {}, Status.INCORRECT), "no number") == "no number"  # the response tail
    assert graded_answer(Reward(1.0, {}, Status.CORRECT), "42") == "42"
    for status in (Status.UNPARSABLE, Status.TIMEOUT, Status.ERROR):
        assert graded_answer(Reward(0.0, {}, status, answer="7"), "7") is None  # abstains
    # Reward stays backwards compatible: four positional fields, answer defaults to None
    assert Reward(1.0, {"a": 1.0}, Status.CORRECT, "why").answer is None


def test_format_predicate_length_stats_status_counts():
    assert is_formatted({"format": 1.0, "answer": 0.0}, Status.UNPARSABLE)  # the part decides
    assert not is_formatted({"format": 0.0}, Status.CORRECT)
    assert not is_formatted({}, "incorrect") and not is_formatted({}, "unparsable")  # no format part
    stats = length_stats([1, 2, 3, 10], [True, False, True, False])
    # mean 16/4 = 4; median (2+3)/2 = 2.5; correct (1+3)/2 = 2; incorrect (2+10)/2 = 6
    assert stats == {"len/mean": 4.0, "len/median": 2.5, "len/max": 10.0, "len/correct": 2.0, "len/incorrect": 6.0}
    assert math.isnan(length_stats([3], [False])["len/correct"])
    assert status_counts(["correct", Status.TIMEOUT, "correct"]) == {
        "correct": 2, "incorrect": 0, "unparsable": 0, "timeout": 1, "error": 0}


# ----------------------------------------------------------------------- scripted generator


@dataclass
class FakeRollout:
    text: str
    response_ids: list[int]
    finish_reason: str
    group: int


@dataclass
class ScriptedGenerator:
    """Returns fixed responses per prompt (prompt -> list of n texts); one token per character."""

    script: dict[str, list[str]]
    calls: list[int] = field(default_factory=list)
    weight_version: int = 0

    def generate(self, prompts, spec):
        self.calls.append(len(prompts))
        out = []
        for g, p in enumerate(prompts):
            for text in self.script[p][: spec.n]:
                fin = "length" if len(text) >= spec.max_tokens else "stop"
                out.append(FakeRollout(text, list(range(len(text))), fin, g))
        return out


@dataclass
class Ex:
    id: str
    reference: str
    meta: dict = field(default_factory=dict)


def answer_reward(response: str, example) -> Reward:
    if not response.startswith("A:"):
        return Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE, "no A:")
    ok = response[2:] == example.reference
    return Reward(float(ok), {"format": 1.0, "answer": float(ok)}, Status.CORRECT if ok else Status.INCORRECT)


@dataclass
class Spec:
    n: int = 4
    temperature: float = 1.0
    max_tokens: int = 3


SCRIPT = {
    "p0": ["A:5", "A:5", "A:4", "x"],  # ref 5: 2 correct, 1 incorrect, 1 unparsable
    "p1": ["A:7", "A:1", "A:2", "A:3"],  # ref 7: 1 correct, 3 incorrect
    "p2": ["x", "x", "x", "x"],  # ref 9: 4 unparsable
}
EXAMPLES = [Ex("e0", "5"), Ex("e1", "7"), Ex("e2", "9")]


def test_evaluate_aggregates_by_hand():
    res = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], answer_reward, Spec())
    assert res.num_examples == 3 and res.n == 4 and len(res.samples) == 12
    assert res.accuracy == 3 / 12  # 2 + 1 + 0 correct
    assert res.format_rate == 7 / 12  # 3 + 4 + 0 responses start with "A:"
    assert res.mean_reward == 3 / 12
    # pass@1 = (2/4 + 1/4 + 0)/3 = 0.25; pass@2 = (5/6 + 1/2 + 0)/3 = 4/9; pass@4 = (1 + 1 + 0)/3
    assert res.pass_at_k == pytest.approx({1: 0.25, 2: 4 / 9, 4: 2 / 3}, abs=1e-15)
    # maj@k: answer_reward reports no answer, so wrong ones vote with final_answer ("A:4" -> "4").
    # p0 votes C C 4 -  : k=2 [C C]=1 [4 -]=0 -> 1/2; k=4 C 2:1 = 1
    # p1 votes C 1 2 3  : k=2 [C 1] tie -> C (first) = 1, [2 3] tie -> 2 = 0 -> 1/2; k=4 all 1:1 -> C = 1
    # p2 votes - - - -  : 0 and 0
    # maj@2 = (1/2 + 1/2 + 0)/3 = 1/3, maj@4 = (1 + 1 + 0)/3 = 2/3; no maj@1 (it is accuracy)
    assert res.maj_at_k == pytest.approx({2: 1 / 3, 4: 2 / 3}, abs=1e-15)
    assert [s.answer for s in res.samples[:4]] == ["5", "5", "4", None]
    assert res.seconds > 0
    assert res.status_counts == {"correct": 3, "incorrect": 4, "unparsable": 5, "timeout": 0, "error": 0}
    # lengths: p0 3,3,3,1; p1 3,3,3,3; p2 1,1,1,1 -> mean 26/12; median of five 1s and seven 3s = 3
    # correct: three of length 3 -> 3; incorrect: 3 + 1 + 3*3 + 4*1 = 17 over 9
    assert res.lengths["len/mean"] == pytest.approx(26 / 12)
    assert res.lengths["len/median"] == 3.0 and res.lengths["len/max"] == 3.0
    assert res.lengths["len/correct"] == 3.0
    assert res.lengths["len/incorrect"] == pytest.approx(17 / 9)
    assert res.truncated_rate == 7 / 12  # the length-3 responses hit max_tokens=3
    s = res.samples[2]
    assert (s.example_id, s.sample_index, s.response, s.status, s.reference) == ("e0", 2, "A:4", "incorrect", "5")
    assert [len(g) for g in res.per_example()] == [4, 4, 4]
    m = res.metrics("eval/")
    assert m["eval/accuracy"] == 0.25 and m["eval/pass@2"] == pytest.approx(4 / 9)
    assert m["eval/status/unparsable"] == 5
    assert m["eval/maj@4"] == pytest.approx(2 / 3) and "eval/maj@1" not in m
    assert res.sample_rows(limit=1)[0]["parts"] == {"format": 1.0, "answer": 1.0}


def test_evaluate_chunks_give_the_same_result_and_report_progress():
    gen = ScriptedGenerator(SCRIPT)
    seen = []
    res = evaluate(gen, EXAMPLES, ["p0", "p1", "p2"], answer_reward, Spec(), chunk_size=2,
                   on_chunk=lambda done, total: seen.append((done, total)))
    assert gen.calls == [2, 1] and seen == [(2, 3), (3, 3)]
    whole = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], answer_reward, Spec())
    assert res.samples == whole.samples and res.pass_at_k == whole.pass_at_k


def test_greedy_n1_has_no_pass_at_k_and_batch_scorer_is_used():
    calls = []

    def scorer(texts, examples):
        calls.append(len(texts))
        return [answer_reward(t, e) for t, e in zip(texts, examples, strict=True)]

    res = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], None,
                   Spec(n=1, temperature=0.0), scorer=scorer)
    assert calls == [3] and res.greedy and res.pass_at_k == {}
    assert res.accuracy == pytest.approx(2 / 3)  # first responses: A:5 (ok), A:7 (ok), x


def test_format_rate_is_na_without_format_part():
    def no_parts(response, example):
        if response == "x":
            return Reward(0.0, {}, Status.UNPARSABLE)
        return Reward(1.0, {}, Status.CORRECT)

    res = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], no_parts, Spec())
    # the reward says nothing about format: NaN, shown "n/a" by every table (issue 16 item 11)
    assert math.isnan(res.format_rate) and math.isnan(res.metrics()["format_rate"])
    assert ["format_rate", "n/a"] in comparison_rows({"x": res})
    names, rows = results_rows({"x": res})
    assert rows[0][1 + names.index("format_rate")] == "n/a"
    # the same for flat dicts with any label, e.g. the demo's "format rate (greedy)" row
    demo = {"a": {"format rate (greedy)": math.nan}, "b": {"format rate (greedy)": None}}
    assert comparison_rows(demo, ["format rate (greedy)"]) == [["format rate (greedy)", "n/a", "n/a", "-"]]
    assert format_metric("eval/format_rate", math.nan) == "n/a" and format_metric("accuracy", math.nan) == "-"
    # with a format part, even when it is 0 everywhere, the rate is a number
    zero = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"],
                    lambda r, e: Reward(0.0, {"format": 0.0}, Status.INCORRECT), Spec())
    assert zero.format_rate == 0.0 and format_metric("format_rate", zero.format_rate) == "0.0%"


def test_maj_at_k_votes_with_the_reward_answer():
    # A reward that reports its normalized answer: "A:04" and "A:4" are the same wrong answer 4.
    def answer_field(response, example):
        got = response[2:].lstrip("0") if response.startswith("A:") else None
        if got is None:
            return Reward(0.0, {}, Status.UNPARSABLE)
        ok = got == example.reference
        return Reward(float(ok), {}, Status.CORRECT if ok else Status.INCORRECT, answer=got)

    script = {"p": ["A:5", "A:04", "A:4", "A:3"]}  # ref 5: votes C, 4, 4, 3 -> 4 wins 2:1:1
    res = evaluate(ScriptedGenerator(script), [Ex("e", "5")], ["p"], answer_field, Spec())
    assert res.maj_at_k == {2: 0.5, 4: 0.0}  # k=2: [C 4] tie -> C = 1, [4 3] = 0 -> 1/2
    assert [s.answer for s in res.samples] == ["5", "4", "4", "3"]


def test_raising_reward_is_counted_as_error_and_bad_inputs_fail():
    def boom(response, example):
        raise ZeroDivisionError("bad")

    res = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], boom, Spec(n=2))
    assert res.status_counts["error"] == 6 and res.accuracy == 0.0
    assert "ZeroDivisionError" in res.samples[0].info
    with pytest.raises(ValueError, match="2 examples but 3 prompts"):
        evaluate(ScriptedGenerator(SCRIPT), EXAMPLES[:2], ["p0", "p1", "p2"], answer_reward, Spec())
    short = ScriptedGenerator({"p0": ["A:5"]})
    with pytest.raises(RuntimeError, match="returned 1 rollouts for 1 prompts x n=4"):
        evaluate(short, EXAMPLES[:1], ["p0"], answer_reward, Spec())


# ------------------------------------------------------------------------------------ tables


def test_comparison_rows_text_and_markdown():
    before = {"accuracy": 0.25, "format_rate": 0.5, "len/mean": 10.0, "pass@4": 0.5, "other": 3.0}
    after = {"accuracy": 0.45, "format_rate": 0.875, "len/mean": 8.5, "pass@4": 0.75, "other": 1.0}
    rows = comparison_rows({"after SFT": before, "after RL": after})
    assert rows == [
        ["accuracy", "25.0%", "45.0%", "+20.0 pts"],
        ["pass@4", "50.0%", "75.0%", "+25.0 pts"],
        ["format_rate", "50.0%", "87.5%", "+37.5 pts"],
        ["len/mean", "10.00", "8.50", "-1.50"],
    ]
    md = comparison_markdown({"after SFT": before, "after RL": after}, metrics=["accuracy", "other"])
    assert md.splitlines() == [
        "| metric | after SFT | after RL | delta (after RL - after SFT) |",
        "|---|---:|---:|---:|",
        "| accuracy | 25.0% | 45.0% | +20.0 pts |",
        "| other | 3.00 | 1.00 | -2.00 |",
    ]
    text = comparison_text({"before": before, "after": after}, title="held-out")
    assert "held-out" in text and "+20.0 pts" in text and "\x1b" not in text
    one = comparison_rows({"only": {"accuracy": 0.5}})
    assert one == [["accuracy", "50.0%"]]


def test_results_rows_one_row_per_result():
    sweep = {"0": {"accuracy": 0.25, "maj@4": 0.5, "format_rate": math.nan, "len/mean": 12.0, "time/eval_s": 1.5},
             "256": {"accuracy": 0.5, "maj@4": 0.75, "format_rate": math.nan, "len/mean": 200.0, "time/eval_s": 3.25}}
    names, rows = results_rows(sweep)
    assert names == ["accuracy", "maj@4", "format_rate", "len/mean", "time/eval_s"]
    assert rows == [["0", "25.0%", "50.0%", "n/a", "12.00", "1.50"], ["256", "50.0%", "75.0%", "n/a", "200.0", "3.25"]]
    text = results_text(sweep, label="thinking budget", title="sweep")
    assert "thinking budget" in text and "sweep" in text and text.count("n/a") == 2
    assert results_markdown(sweep, metrics=["accuracy"], label="budget").splitlines() == [
        "| budget | accuracy |", "|---|---:|", "| 0 | 25.0% |", "| 256 | 50.0% |"]
    # glob rows sort numbers as numbers (pass@2 before pass@16), whatever the dict order
    assert results_rows({"r": {"pass@16": 1.0, "pass@2": 0.5}})[0] == ["pass@2", "pass@16"]


def test_comparison_of_eval_results():
    res = evaluate(ScriptedGenerator(SCRIPT), EXAMPLES, ["p0", "p1", "p2"], answer_reward, Spec())
    rows = {r[0]: r for r in comparison_rows({"a": res, "b": res})}
    assert rows["accuracy"] == ["accuracy", "25.0%", "25.0%", "+0.0 pts"]
    assert rows["pass@2"][1] == "44.4%"  # 4/9


# --------------------------------------------------------------------------- real generator


def test_evaluate_with_real_hf_generator_on_tiny_model():
    from rlvr.models.tiny import build_tiny_model
    from rlvr.rollout import HFGenerator, SamplingSpec

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)
    gen = HFGenerator(model, tok, batch_size=16)
    prompts = ["1+2=", "3+4="]
    greedy = SamplingSpec(n=1, temperature=0.0, max_tokens=6, seed=0)
    outs = gen.generate(prompts, greedy)

    def exact(response, example):
        ok = response == example.reference
        return Reward(float(ok), {}, Status.CORRECT if ok else Status.INCORRECT)

    # example 0's reference is the model's own greedy output, example 1's is not: accuracy 1/2
    examples = [Ex("a", outs[0].text), Ex("b", outs[1].text + "#")]
    res = evaluate(gen, examples, prompts, exact, greedy)
    assert res.accuracy == 0.5 and res.greedy
    assert [s.num_tokens for s in res.samples] == [len(o.response_ids) for o in outs]
    sampled = SamplingSpec(n=4, temperature=1.0, max_tokens=6, seed=3)
    a = evaluate(gen, examples, prompts, exact, sampled)
    assert [s.response for s in a.samples] == [s.response for s in evaluate(gen, examples, prompts, exact,
                                                                             sampled).samples]
    # chunked: the first chunk equals the unchunked run; later chunks must not reuse its seeds
    # (the same prompt twice, one per chunk, would otherwise get identical samples)
    same = evaluate(gen, examples, ["1+2=", "1+2="], exact, sampled, chunk_size=1)
    assert [s.response for s in same.samples[:4]] == [s.response for s in a.samples[:4]]
    assert [s.response for s in same.samples[4:]] != [s.response for s in same.samples[:4]]
    greedy_chunked = evaluate(gen, examples, prompts, exact, greedy, chunk_size=1)
    assert [s.response for s in greedy_chunked.samples] == [s.response for s in res.samples]
    counts = [(4, sum(s.correct for s in g)) for g in a.per_example()]
    assert a.pass_at_k[2] == pytest.approx(mean_pass_at_k(counts, 2))
    assert set(a.pass_at_k) == {1, 2, 4}
