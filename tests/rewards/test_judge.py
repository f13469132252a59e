"""The model judge reward (rlvr.rewards.judge, rlvr.train.judge): against a loopback HTTP server that speaks the
OpenAI chat completions API (scripted verdicts; no network), a scripted and a tiny local judge model, the
composition with other rewards, and the judge section's config errors."""

from __future__ import annotations

import re

import pytest
from helpers.judge_server import JudgeServer

from rlvr.data import Example
from rlvr.rewards import Status, get_reward_fn, score_batch
from rlvr.rewards.functions import math as math_reward
from rlvr.rewards.judge import (
    DEFAULT_PROMPT,
    HTTPJudge,
    JudgeReply,
    JudgeReward,
    fill_prompt,
    judge_metrics,
    parse_verdict,
    prompt_problem,
    reward_uses_judge,
)
from rlvr.rewards.registry import bind_reward, with_tolerance


def semantic(answer: str, reference: str) -> str:
    """A judge that knows 'one half' is 1/2 (which the symbolic checker does not)."""
    same = {("one half", "1/2"), ("1/2", "1/2"), ("0.5", "1/2"), ("7", "7"), ("seven", "7")}
    return "EQUIVALENT" if (answer.strip(), reference.strip()) in same else "DIFFERENT"


def ex(question: str, reference: str, i: int = 0) -> Example:
    return Example(id=f"t:{i}", question=question, reference=reference)


HALF = ex("Pour half of the 1 liter bottle: what fraction of it is poured?", "1/2")
SEVEN = ex("What is 3 + 4?", "7", 1)


def http_judge(server: JudgeServer, **kw) -> JudgeReward:
    opts = {"max_tokens": 5, "timeout_s": 5.0, "concurrency": 4} | kw
    fallback = opts.pop("fallback", "symbolic")
    prompt = opts.pop("prompt", "")
    return JudgeReward(HTTPJudge(server.url, "judge-model", **opts), math_reward, prompt=prompt, fallback=fallback)


# ----------------------------------------------------------------------------------------- the parts


def test_verdict_parsing_last_word_counts_and_not_equivalent_is_different():
    assert parse_verdict("EQUIVALENT") is True
    assert parse_verdict(" different.\n") is False
    assert parse_verdict("NOT EQUIVALENT") is False
    assert parse_verdict("They look DIFFERENT at first, but they are EQUIVALENT") is True
    assert parse_verdict("<think>EQUIVALENT?</think> DIFFERENT") is False
    assert parse_verdict("yes") is None and parse_verdict("") is None and parse_verdict(None) is None


@pytest.mark.parametrize(
    ("reply", "verdict"),
    [
        # issue 36, item 4: a negated verdict word reads as its opposite ("not different" was DIFFERENT)
        ("The answers are equivalent, not different.", True),
        ("The answers are different, not equivalent.", False),
        ("not different", True),
        ("NOT DIFFERENT", True),
        ("They are not really different: EQUIVALENT... no, not equivalent", False),
        ("The answer isn't different from the reference.", True),
        ("These aren't equivalent.", False),
        ("not at all different", True),
        ("NOT_EQUIVALENT", False),
        ("non-equivalent", False),
        ("Inequivalent", False),
        # the last verdict wins, after reasoning; a negation must touch the word
        ("Is 0.5 the same as 1/2? Converting, 1/2 = 0.5. Verdict: EQUIVALENT", True),
        ("1/2 and 0.4 could look equivalent at a glance, but they are not. DIFFERENT", False),
        ("Equivalent or not? DIFFERENT", False),
        ("<think>not different</think> DIFFERENT", False),
        ("equivalently", None),
    ],
)
def test_verdict_parsing_reads_a_negated_word_as_its_opposite(reply, verdict):
    assert parse_verdict(reply) is verdict


def test_prompt_fill_keeps_latex_braces_and_checks_placeholders():
    p = fill_prompt("Q={question} R={reference} A={answer}", question="{x}", reference="\\frac{1}{2}",
                    answer="{reference}", response="unused")
    assert p == "Q={x} R=\\frac{1}{2} A={reference}"  # one pass: a field's own braces are not re-filled
    assert prompt_problem(DEFAULT_PROMPT) is None
    assert "{reference}" in prompt_problem("is {answer} right?")
    assert "{answer} or {response}" in prompt_problem("ref {reference}")
    assert prompt_problem("{reference} vs {response}") is None
    assert reward_uses_judge("judge") and reward_uses_judge("judge:1, format:0.1")
    assert not reward_uses_judge("r1_zero") and not reward_uses_judge("") and not reward_uses_judge("judges:1")


def test_unconfigured_judge_is_an_error_naming_the_keys():
    r = get_reward_fn("judge")("The answer is 7.", SEVEN)
    assert r.status is Status.ERROR and "judge.url" in r.info and "judge.model" in r.info


# ------------------------------------------------------------------------------------ against a server


def test_request_body_and_the_judge_overrules_the_symbolic_checker():
    with JudgeServer(semantic) as server:
        judge = http_judge(server)
        responses = ["The answer is one half.", "The answer is 0.3.", "I do not know"]
        rewards = score_batch(judge, responses, [HALF, HALF, HALF])
        # symbolic: 'one half' is not 1/2
        assert math_reward(responses[0], HALF).status is Status.INCORRECT
        assert [r.status for r in rewards] == [Status.CORRECT, Status.INCORRECT, Status.UNPARSABLE]
        assert [r.total for r in rewards] == [1.0, 0.0, 0.0]
        assert rewards[0].parts == {"format": 1.0, "answer": 1.0} and rewards[0].answer == "one half"
        assert "EQUIVALENT" in rewards[0].info
        # no answer, no request: two requests for three responses
        assert len(server.requests) == 2
        path, headers, body = server.requests[0]
        assert path == "/v1/chat/completions"
        assert body["model"] == "judge-model" and body["max_tokens"] == 5 and body["temperature"] == 0.0
        content = body["messages"][0]["content"]
        assert body["messages"][0]["role"] == "user"
        assert HALF.question in content and "Reference answer: 1/2" in content
        assert {"Student's final answer: one half", "Student's final answer: 0.3"} == {
            re.search(r"Student's final answer: .*", b["messages"][0]["content"]).group(0)
            for _, _, b in server.requests}
        assert "Authorization" not in headers
        m = judge_metrics(judge)
        # 'one half': judge yes, symbolic no; '0.3': both no -> agreement 1 of 2
        assert m == {"judge/calls": 2, "judge/cache_hits": 0, "judge/failures": 0, "judge/fallbacks": 0,
                     "judge/agree_symbolic": 0.5}
        assert judge_metrics(judge) == {"judge/calls": 0, "judge/cache_hits": 0, "judge/failures": 0,
                                        "judge/fallbacks": 0}  # taken: reset


def test_cache_same_question_answer_reference_makes_no_second_request():
    with JudgeServer(semantic) as server:
        judge = http_judge(server)
        # two different responses with the same extracted answer: one request, one cache hit
        first = score_batch(judge, ["The answer is one half.", "<answer>one half</answer>"], [HALF, HALF])
        assert len(server.requests) == 1 and [r.total for r in first] == [1.0, 1.0]
        assert judge_metrics(judge)["judge/cache_hits"] == 1
        # a later batch (another step): cached for the run
        again = score_batch(judge, ["so the answer is one half"], [HALF])
        assert len(server.requests) == 1 and again[0].status is Status.CORRECT
        m = judge_metrics(judge)
        assert m["judge/calls"] == 0 and m["judge/cache_hits"] == 1
        # another question with the same answer and reference is another prompt: asked
        other = ex("What is 2/4 in lowest terms?", "1/2", 3)
        score_batch(judge, ["The answer is one half."], [other])
        assert len(server.requests) == 2


def test_requests_run_concurrently_up_to_judge_concurrency():
    with JudgeServer(semantic, hold_s=0.3) as server:
        judge = http_judge(server, concurrency=4)
        examples = [ex(f"q{i}", "7", i) for i in range(8)]
        rewards = score_batch(judge, [f"The answer is {i}." for i in range(8)], examples)
        assert len(server.requests) == 8 and [r.total for r in rewards] == [1.0 if i == 7 else 0.0 for i in range(8)]
        assert 2 <= server.max_inflight <= 4
    with JudgeServer(semantic, hold_s=0.05) as server:
        judge = http_judge(server, concurrency=1)
        score_batch(judge, [f"The answer is {i}." for i in range(4)], [ex(f"q{i}", "7", i) for i in range(4)])
        assert len(server.requests) == 4 and server.max_inflight == 1


def test_timeout_http_error_and_garbage_fall_back_and_are_counted():
    def script(answer, reference):
        return {"one half": ("sleep", 3.0, "EQUIVALENT"), "0.5": ("status", 500), "7": "I think so"}.get(
            answer, "DIFFERENT")

    with JudgeServer(script) as server:
        judge = http_judge(server, timeout_s=0.5)
        examples = [HALF, HALF, SEVEN, SEVEN]
        responses = ["The answer is one half.", "The answer is 0.5.", "The answer is 7.", "The answer is 8."]
        rewards = score_batch(judge, responses, examples)
        # symbolic fallback: 'one half' (slow judge) -> the checker's INCORRECT; '0.5' (HTTP 500) -> CORRECT;
        # '7' (no verdict word) -> CORRECT; '8' -> judged DIFFERENT
        assert [r.status for r in rewards] == [Status.INCORRECT, Status.CORRECT, Status.CORRECT, Status.INCORRECT]
        assert "timeout" in rewards[0].info and "judge.timeout_s" in rewards[0].info
        assert "HTTP 500" in rewards[1].info
        assert "no verdict word" in rewards[2].info
        assert rewards[3].info.startswith("judge: DIFFERENT")
        m = judge_metrics(judge)
        assert m["judge/calls"] == 4 and m["judge/failures"] == 3 and m["judge/fallbacks"] == 3
        assert m["judge/agree_symbolic"] == 1.0  # the one judged sample: both say wrong
        # failures are not cached: asked again next time
        score_batch(judge, ["The answer is 0.5."], [HALF])
        assert len(server.requests) == 5
        # one slow request alone: its own deadline (judge.timeout_s), not only the batch's
        r = judge("So the answer is one half.", HALF)
        assert r.status is Status.INCORRECT and "timeout after 0.5 s (judge.timeout_s)" in r.info

    with JudgeServer(lambda a, r: ("status", 500)) as server:
        judge = http_judge(server, fallback="incorrect")
        r = score_batch(judge, ["The answer is 0.5."], [HALF])[0]  # symbolic would say correct
        assert r.status is Status.INCORRECT and r.total == 0.0 and "judge.fallback=incorrect" in r.info
        assert judge_metrics(judge)["judge/fallbacks"] == 1


def test_unscored_fallback_is_an_error_reward_out_of_the_baseline():
    """judge.fallback=unscored (issue 36, item 4): a sample whose judge request failed is Status.ERROR with
    total 0 (the trainer keeps it out of its group's baseline), the others are judged as usual."""
    with JudgeServer(lambda answer, reference: ("status", 500) if answer == "0.5" else semantic(answer, reference)) \
            as server:
        judge = http_judge(server, fallback="unscored")
        rewards = score_batch(judge, ["The answer is 0.5.", "The answer is one half.", "none"], [HALF, HALF, HALF])
    assert [r.status for r in rewards] == [Status.ERROR, Status.CORRECT, Status.UNPARSABLE]
    assert rewards[0].total == 0.0 and rewards[0].parts["answer"] == 0.0 and rewards[0].answer == "0.5"
    assert rewards[0].info.startswith("judge failed (HTTP 500") and "judge.fallback=unscored" in rewards[0].info
    m = judge_metrics(judge)
    assert m["judge/failures"] == 1 and m["judge/fallbacks"] == 1
    with pytest.raises(ValueError, match="known: symbolic, incorrect, unscored"):
        JudgeReward(ScriptedBackend(set()), math_reward, fallback="retry")


class ScriptedBackend:
    """A judge backend without a server: EQUIVALENT to every prompt, except those whose answer is in `fail`,
    which fail with `reason` (an unreachable judge)."""

    label = "judge.url=http://127.0.0.1:9/v1"

    def __init__(self, fail: set[str], reason: str = "cannot reach the judge: Connection refused"):
        self.fail, self.reason = fail, reason

    def judge(self, prompts):
        out = []
        for p in prompts:
            answer = re.search(r"Student's final answer: (.*)", p).group(1)
            out.append(JudgeReply(None, self.reason) if answer in self.fail else JudgeReply("EQUIVALENT"))
        return out


def _step(judge, answers, *, log, step):
    """One training step as `rlvr train` does it: score the batch, RewardErrorLog.observe, then take judge/*."""
    examples = [ex(f"q{i}", "7", i) for i in range(len(answers))]
    rewards = score_batch(judge, [f"The answer is {a}." for a in answers], examples)
    try:
        log.observe(step, rewards, examples)
    finally:
        metrics = judge_metrics(judge)  # pg.py takes the counts after observe
    return rewards, metrics


def test_most_of_a_steps_judge_requests_failing_stops_the_run():
    """Issue 36, item 4: an unreachable judge is said at its first failure (one line: judge.url, the reason) and
    stops the run when more than half of a step's requests fail; an occasional failure keeps the fallback."""
    from rlvr.rewards.errors import JudgeFailuresStop, RewardErrorLog, RewardErrorsStop

    lines: list[str] = []
    judge = JudgeReward(ScriptedBackend({"1", "2", "3", "11"}), math_reward)
    log = RewardErrorLog("judge", None, key="data.reward", say=lines.append, judge=judge)
    # step 1: every request succeeds: nothing said
    _step(judge, ["4", "5", "6", "7"], log=log, step=1)
    assert lines == []
    # step 2: 1 of 4 fails: the fallback scores it, one line names the judge and the reason, the run goes on
    rewards, m = _step(judge, ["1", "8", "9", "10"], log=log, step=2)
    assert m["judge/failures"] == 1 and m["judge/fallbacks"] == 1
    assert rewards[0].status is Status.INCORRECT and "cannot reach the judge" in rewards[0].info  # symbolic: 1 != 7
    assert len(lines) == 1, lines
    for needle in ("judge.url=http://127.0.0.1:9/v1", "cannot reach the judge: Connection refused", "step 2",
                   "judge.fallback=symbolic"):
        assert needle in lines[0], (needle, lines[0])
    # step 3: 2 of 4 fail, exactly half: not more than half, and the first failure is not said again
    _step(judge, ["2", "11", "12", "13"], log=log, step=3)
    assert len(lines) == 1
    # step 4: 3 of 4 fail: the run stops (a RewardErrorsStop: `error: ...`, exit 1 in the commands)
    with pytest.raises(JudgeFailuresStop) as stop:
        _step(judge, ["1", "2", "3", "14"], log=log, step=4)
    assert isinstance(stop.value, RewardErrorsStop)
    for needle in ("step 4", "3 of 4 judge requests failed", "judge.url=http://127.0.0.1:9/v1",
                   "cannot reach the judge: Connection refused"):
        assert needle in str(stop.value), (needle, str(stop.value))


def test_a_failed_request_among_cached_verdicts_does_not_stop_the_run():
    """One request of a step, failed, while most of the step's samples have cached verdicts: the fallback
    scores one sample of many; no stop (the stop needs most requests AND most judged samples to fail)."""
    from rlvr.rewards.errors import RewardErrorLog

    lines: list[str] = []
    judge = JudgeReward(ScriptedBackend({"1"}), math_reward)
    log = RewardErrorLog("judge", None, key="data.reward", say=lines.append, judge=judge)
    _step(judge, ["4", "5", "6", "7"], log=log, step=1)
    _, m = _step(judge, ["4", "5", "6", "1"], log=log, step=2)  # 3 cache hits, 1 request that fails
    assert m["judge/calls"] == 1 and m["judge/failures"] == 1 and m["judge/cache_hits"] == 3
    assert len(lines) == 1 and "cannot reach the judge" in lines[0]


def test_unscored_judge_failures_are_not_reported_as_the_reward_raising():
    from rlvr.rewards.errors import JudgeFailuresStop, RewardErrorLog

    lines: list[str] = []
    judge = JudgeReward(ScriptedBackend({"1", "2", "3"}), math_reward, fallback="unscored")
    log = RewardErrorLog("judge", None, key="data.reward", say=lines.append, judge=judge)
    rewards, _ = _step(judge, ["1", "5", "6", "7"], log=log, step=1)
    assert rewards[0].status is Status.ERROR
    assert len(lines) == 1 and "judge.fallback=unscored" in lines[0] and "raised" not in lines[0]
    with pytest.raises(JudgeFailuresStop):
        _step(judge, ["1", "2", "3", "8"], log=log, step=2)


def test_eval_failure_note_names_the_judge_and_the_reason():
    from rlvr.rewards.judge import judge_failure_note

    judge = JudgeReward(ScriptedBackend({"1", "2"}), math_reward)
    assert judge_failure_note(judge) is None
    score_batch(judge, ["The answer is 1.", "The answer is 2.", "The answer is 7."], [SEVEN, HALF, SEVEN])
    note = judge_failure_note(judge)
    assert note is not None and "2 of 3 judge requests failed" in note and "judge.url=http://127.0.0.1:9/v1" in note
    assert "cannot reach the judge: Connection refused" in note
    assert judge_metrics(judge)["judge/failures"] == 2  # the note peeked: the counts are still there
    assert judge_failure_note(judge) is None  # taken


def test_unreachable_endpoint_falls_back_without_raising():
    with JudgeServer(semantic) as server:
        url = server.url
    judge = JudgeReward(HTTPJudge(url, "m", timeout_s=2.0), math_reward)  # the server is gone
    r = judge("The answer is 0.5.", HALF)
    assert r.status is Status.CORRECT and "cannot reach the judge: Connection refused" in r.info  # no "[Errno 111]"
    assert judge.label == f"judge.url={url}"
    assert judge_metrics(judge)["judge/failures"] == 1


def test_api_key_is_sent_from_the_env_var_and_never_shown(monkeypatch):
    monkeypatch.setenv("RLVR_TEST_JUDGE_KEY", "sk-secret-123")
    with JudgeServer(semantic) as server:
        judge = http_judge(server, api_key_env="RLVR_TEST_JUDGE_KEY")
        r = judge("The answer is seven.", SEVEN)
        assert r.status is Status.CORRECT
        headers = server.requests[0][1]
        assert headers["Authorization"] == "Bearer sk-secret-123"
        assert "sk-secret" not in repr(judge) and "sk-secret" not in r.info


def test_custom_prompt_with_the_whole_response():
    seen = []

    def script(answer, reference):
        seen.append(answer)
        return "EQUIVALENT"

    prompt = "Reference answer: {reference}\nStudent's final answer: {response}\nSay EQUIVALENT or DIFFERENT."
    with JudgeServer(script) as server:
        judge = http_judge(server, prompt=prompt)
        assert judge("Half of it. The answer is one half.", HALF).status is Status.CORRECT
        assert seen == ["Half of it. The answer is one half."]


def test_composition_and_tolerance_wrapper_bind_the_judge():
    with JudgeServer(semantic) as server:
        judge = http_judge(server)
        composed = bind_reward(get_reward_fn("judge:1,format:0.5"), "judge", judge)
        response = "<think>half</think> <answer>one half</answer>"
        r = score_batch(composed, [response], [HALF])[0]
        # judge 1 (symbolically 0) + 0.5 * format 1
        assert r.total == pytest.approx(1.5) and r.parts["judge"] == 1.0 and r.parts["format"] == 1.0
        assert r.status is Status.CORRECT
        assert judge_metrics(composed)["judge/calls"] == 1
        # with a tolerance wrapper, and the bare name
        wrapped = bind_reward(with_tolerance(get_reward_fn("judge"), "lenient"), "judge", judge)
        assert score_batch(wrapped, ["The answer is one half."], [HALF])[0].total == 1.0
        assert bind_reward(get_reward_fn("judge"), "judge", judge) is judge
        assert len(server.requests) == 1  # the same prompt: cached
        # a reward without the judge is left alone
        assert bind_reward(get_reward_fn("r1_zero"), "judge", judge) is get_reward_fn("r1_zero")


def test_tolerance_wrapper_reaches_the_symbolic_checks_on_worker_threads():
    """The fallback is the task checker under the run's tolerance, also when prepare_batch checks on threads."""
    pi = ex("What is pi?", "\\pi", 5)
    with JudgeServer(lambda a, r: ("status", 500)) as server:  # every request fails: the checker decides
        for tolerance, want in (("strict", Status.INCORRECT), ("lenient", Status.CORRECT)):
            judge = bind_reward(with_tolerance(get_reward_fn("judge"), tolerance), "judge", http_judge(server))
            rewards = score_batch(judge, ["The answer is 3.14.", "So the answer is 3.14"], [pi, pi], workers=2)
            assert [r.status for r in rewards] == [want, want], tolerance


# ----------------------------------------------------------------------------------------- local model


class ScriptedGenerator:
    """A Generator that answers each prompt from a script (counts its generate calls)."""

    def __init__(self, reply):
        self.reply, self.calls, self.weight_version = reply, [], 0

    def generate(self, prompts, spec, *, prompt_ids=None):
        from types import SimpleNamespace

        self.calls.append((list(prompts), spec))
        return [SimpleNamespace(text=self.reply(p)) for p in prompts]


def test_local_backend_one_generate_call_per_batch():
    from rlvr.train.judge import GeneratorJudge

    def reply(prompt):
        answer = re.search(r"Student's final answer: (.*)", prompt).group(1)
        return semantic(answer, "1/2")

    gen = ScriptedGenerator(reply)
    judge = JudgeReward(GeneratorJudge(gen, tokenizer=None, max_tokens=3, chat=False), math_reward)
    responses = ["The answer is one half.", "The answer is 0.3.", "So the answer is one half."]
    rewards = score_batch(judge, responses, [HALF, HALF, HALF], workers=2)
    assert [r.total for r in rewards] == [1.0, 0.0, 1.0]
    assert len(gen.calls) == 1 and len(gen.calls[0][0]) == 2  # one call, the distinct prompts
    spec = gen.calls[0][1]
    assert spec.temperature == 0.0 and spec.max_tokens == 3 and spec.n == 1


def test_tiny_local_judge_model_through_the_generator_builder(tmp_path):
    """A tiny random judge model saved to a folder and loaded by judge.model through the project's builders
    (load_task_data -> build_judge -> build_policy + build_generator): its replies are garbage, so every
    answered sample falls back to the symbolic checker and is counted."""
    from rlvr.models import build_tiny_model, save_policy
    from rlvr.train.config import DataConfig, JudgeConfig
    from rlvr.train.judge import GeneratorJudge
    from rlvr.train.tasks import load_task_data

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=3)
    save_policy(model, tok, tmp_path / "judge")
    data = DataConfig(task="arithmetic", reward="judge", num_train=4, num_eval=4, digits=1)
    task = load_task_data(data, None, judge=JudgeConfig(model=str(tmp_path / "judge"), max_tokens=4))
    judge = task.reward_fn
    assert isinstance(judge, JudgeReward) and isinstance(judge.backend, GeneratorJudge)
    examples = list(task.eval[:4])
    responses = [e.reference for e in examples[:2]] + ["0", "no number"]
    rewards = score_batch(task.reward_fn, responses, examples)
    symbolic = [get_reward_fn("arithmetic")(r, e) for r, e in zip(responses, examples, strict=True)]
    assert [r.status for r in rewards] == [s.status for s in symbolic]  # the fallback's verdicts
    assert rewards[0].status is Status.CORRECT and rewards[3].status is Status.UNPARSABLE
    assert all("no verdict word" in r.info for r in rewards[:3])
    m = judge_metrics(task.reward_fn)
    answered = sum(s.status is not Status.UNPARSABLE for s in symbolic)
    assert m["judge/calls"] + m["judge/cache_hits"] == answered and m["judge/fallbacks"] == answered
    assert m["judge/failures"] == m["judge/calls"] >= 1 and "judge/agree_symbolic" not in m
    # the same model by name 'tiny' builds too (a fresh random one)
    tiny = load_task_data(data, None, judge=JudgeConfig(model="tiny", max_tokens=2))
    assert isinstance(tiny.reward_fn.backend, GeneratorJudge)


def test_a_failing_local_backend_never_raises():
    class Broken:
        def judge(self, prompts):
            raise RuntimeError("boom")

    judge = JudgeReward(Broken(), math_reward)
    r = judge("The answer is 0.5.", HALF)
    assert r.status is Status.ERROR and "boom" in r.info  # a backend bug: counted as an error, not raised

    from rlvr.train.judge import GeneratorJudge

    class BrokenGen:
        def generate(self, prompts, spec, prompt_ids=None):
            raise RuntimeError("out of memory")

    judge = JudgeReward(GeneratorJudge(BrokenGen(), None, chat=False), math_reward)
    r = judge("The answer is 0.5.", HALF)
    assert r.status is Status.CORRECT and "out of memory" in r.info  # the fallback
    assert judge_metrics(judge)["judge/fallbacks"] == 1


def test_backend_reply_count_mismatch_is_a_fallback():
    class Short:
        def judge(self, prompts):
            return [JudgeReply("EQUIVALENT")]

    judge = JudgeReward(Short(), math_reward)
    rewards = score_batch(judge, ["The answer is one half.", "The answer is 0.2."], [HALF, HALF])
    assert [r.status for r in rewards] == [Status.INCORRECT, Status.INCORRECT]
    assert all("replies" in r.info for r in rewards)


# --------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["judge.url=ftp://127.0.0.1/v1"], "judge.url='ftp://127.0.0.1/v1' must start with http://"),
        (["judge.url=http://127.0.0.1:1/v1", "judge.prompt=Is {answer} right?"], "judge.prompt: the judge prompt "
                                                                                   "must contain {reference}"),
        (["data.reward=judge"], "set judge.url"),
        (["data.reward=judge:1,format:0.1", "judge.url=http://127.0.0.1:1/v1", "data.reward_isolate=true"],
         "data.reward_isolate=true"),
        (["judge.api_key_env=sk-abc-123"], "judge.api_key_env='sk-abc-123' must be the NAME"),
        (["judge.timeout_s=0"], "judge.timeout_s=0"),
        (["judge.fallback=retry"], "judge.fallback"),
    ],
)
def test_config_errors_name_the_key(overrides, needle):
    from rlvr.config import ConfigError, load_config
    from rlvr.train.config import EvalConfig, TrainConfig

    with pytest.raises(ConfigError) as exc:
        load_config(TrainConfig, None, overrides)
    assert needle in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        load_config(EvalConfig, None, overrides)
    assert needle in str(exc.value)


@pytest.mark.parametrize("command", ["sft", "ei", "filter", "distill"])
def test_commands_without_a_judge_section_refuse_it(command):
    from rlvr.config import ConfigError, load_config
    from rlvr.train.config import DistillConfig, EIConfig, FilterConfig, SFTConfig

    cls = {"sft": SFTConfig, "ei": EIConfig, "filter": FilterConfig, "distill": DistillConfig}[command]
    with pytest.raises(ConfigError, match=f"data.reward='judge:1,format:0.1'.*not rlvr {command}"):
        load_config(cls, None, ["data.reward=judge:1,format:0.1"])


def test_config_with_a_judge_loads():
    from rlvr.config import load_config
    from rlvr.train.config import TrainConfig

    cfg = load_config(TrainConfig, None, ["data.reward=judge:1,format:0.1", "judge.url=https://judge.example/v1",
                                          "judge.model=m", "judge.api_key_env=JUDGE_KEY"])
    assert cfg.judge.url == "https://judge.example/v1" and cfg.judge.fallback == "symbolic"
