"""The judge's HTTP client against hostile loopback servers (issue 37, items 1 and 5): a redirect never takes the
API key anywhere and is a failed request; an oversize reply is refused without being read; a judge that trickles
its reply is cut at judge.timeout_s for the whole request, leaves no thread or socket behind, and never holds the
process at exit. 127.0.0.1 only; each test is bounded to a few seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest
from helpers import REPO
from helpers.judge_server import JudgeServer

import rlvr.rewards.judge as judge_module
from rlvr.data import Example
from rlvr.rewards import Status, score_batch
from rlvr.rewards.functions import math as math_reward
from rlvr.rewards.judge import HTTPJudge, JudgeReward, judge_metrics

KEY = "sk-judge-SECRET-4242"
MAX_REPLY_BYTES = 1 << 20  # the cap the judge reads (rlvr.rewards.judge.MAX_REPLY_BYTES)
SEVEN = Example(id="t:1", question="What is 3 + 4?", reference="7")


def _judge(url: str, **kw) -> JudgeReward:
    opts = {"max_tokens": 5, "timeout_s": 5.0, "concurrency": 4, "api_key_env": "RLVR_TEST_JUDGE_KEY"} | kw
    fallback = opts.pop("fallback", "incorrect")
    return JudgeReward(HTTPJudge(url, "judge-model", **opts), math_reward, fallback=fallback)


def _judge_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rlvr-judge")]


def _until(cond, within_s: float) -> bool:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ------------------------------------------------------------------------------------------- redirects


def test_a_redirect_is_never_followed_and_the_key_never_leaves(monkeypatch):
    """The judge answers 301/302/303/307/308 to `http://localhost:PORT/other`, another local port or its own
    server: nothing is sent there (urllib's default would resend the POST's headers, the key included, as a
    GET and take that host's EQUIVALENT for the verdict); the request is a failure whose reason names the
    status and says redirects are not followed."""
    monkeypatch.setenv("RLVR_TEST_JUDGE_KEY", KEY)
    with JudgeServer(lambda a, r: "EQUIVALENT") as other, JudgeServer(lambda a, r: "DIFFERENT") as server:
        for code in (301, 302, 303, 307, 308):
            for target in (other, server):
                server.requests.clear()
                location = f"http://localhost:{target.httpd.server_address[1]}/other"
                server.verdict = lambda a, r, code=code, location=location: ("redirect", code, location)
                judge = _judge(server.url)
                r = judge("The answer is 8.", SEVEN)  # the symbolic checker: incorrect; the other host: EQUIVALENT
                assert r.status is Status.INCORRECT and r.total == 0.0, (code, r.info)
                assert f"HTTP {code} from the judge" in r.info and "does not follow redirects" in r.info, r.info
                assert location.removeprefix("http://") in r.info and KEY not in r.info
                assert judge_metrics(judge)["judge/failures"] == 1
                # the judge's own endpoint got the one POST (with the key, as it should); nothing else anywhere
                assert [(p, h.get("Authorization")) for p, h, _ in server.requests] == \
                    [("/v1/chat/completions", f"Bearer {KEY}")], (code, server.requests)
                assert other.requests == [], (code, other.requests)


def test_a_redirect_location_with_credentials_is_not_repeated():
    with JudgeServer(lambda a, r: ("redirect", 302, "http://user:hunter2@localhost:9/x?token=abc")) as server:
        r = _judge(server.url)("The answer is 8.", SEVEN)
    assert "HTTP 302" in r.info and "localhost:9/x" in r.info
    assert "hunter2" not in r.info and "token=abc" not in r.info


# ---------------------------------------------------------------------------------------- reply size


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "streamed"])
def test_an_oversize_reply_fails_fast_without_reading_it_all(with_length):
    """A 64 MiB reply: refused from its Content-Length before its body is read, or cut once past the cap
    (MAX_REPLY_BYTES, 1 MiB) when it has none; the server cannot send more than the cap plus the socket
    buffers before the client closes."""
    size = 64 << 20
    with JudgeServer(lambda a, r: ("big", size, with_length)) as server:
        judge = _judge(server.url)
        t0 = time.monotonic()
        r = judge("The answer is 8.", SEVEN)
        elapsed = time.monotonic() - t0
        assert r.status is Status.INCORRECT and "judge failed" in r.info
        assert "1 MiB" in r.info and "MAX_REPLY_BYTES" in r.info, r.info
        assert elapsed < 3.0
        assert _until(lambda: server.inflight == 0, 5.0)  # the server's writes failed: the client closed
        assert server.sent < size // 2, server.sent
    assert getattr(judge_module, "MAX_REPLY_BYTES", None) == MAX_REPLY_BYTES


def test_a_reply_just_under_the_cap_is_read():
    verdict = "EQUIVALENT " + "x" * (MAX_REPLY_BYTES - 1000)
    with JudgeServer(lambda a, r: verdict[::-1]) as server:  # ends with EQUIVALENT read backwards: no verdict
        r = _judge(server.url)("The answer is 8.", SEVEN)
        assert "no verdict word" in r.info  # read whole and parsed (not refused for its size)


# ------------------------------------------------------------------------------------------ trickling


@pytest.mark.parametrize("what", ["body", "all"], ids=["trickled-body", "trickled-headers"])
def test_a_trickling_judge_is_cut_at_its_total_deadline_and_leaves_no_thread(what):
    """One byte every 0.2 s: each read returns well within judge.timeout_s (urllib's per-read timeout never
    fires), but the request's total deadline (1 s) cuts it: every request fails as a timeout within about 1 s,
    and shortly after no rlvr-judge thread is alive and the server sees its connections closed."""
    with JudgeServer(lambda a, r: ("trickle", 0.2, "EQUIVALENT", what)) as server:
        judge = _judge(server.url, timeout_s=1.0)
        responses = [f"The answer is {i}." for i in (8, 9, 10)]
        t0 = time.monotonic()
        rewards = score_batch(judge, responses, [SEVEN] * 3)
        elapsed = time.monotonic() - t0
        assert elapsed < 1.0 + 0.8, elapsed
        for r in rewards:
            assert r.status is Status.INCORRECT and "timeout after 1 s (judge.timeout_s)" in r.info, r.info
        assert len(server.requests) == 3
        assert _until(lambda: not _judge_threads(), 2.0), _judge_threads()
        assert _until(lambda: server.inflight == 0, 3.0), server.inflight  # the sockets were closed


def test_a_process_scoring_against_a_trickling_judge_exits_promptly():
    """A process that scores one response against a trickling judge (its reply would take ~75 s) prints the
    fallback after judge.timeout_s and exits at once: no worker thread is joined at exit."""
    code = (
        "import time; t0 = time.monotonic()\n"
        "from rlvr.data import Example\n"
        "from rlvr.rewards.functions import math as math_reward\n"
        "from rlvr.rewards.judge import HTTPJudge, JudgeReward\n"
        "judge = JudgeReward(HTTPJudge(URL, 'm', timeout_s=1.0), math_reward, fallback='incorrect')\n"
        "r = judge('The answer is 8.', Example(id='t', question='What is 3 + 4?', reference='7'))\n"
        "print(r.info, flush=True)\n"
    )
    root = REPO
    with JudgeServer(lambda a, r: ("trickle", 0.5, "EQUIVALENT", "body")) as server:
        env = os.environ | {"PYTHONPATH": str(root), "RLVR_NUM_THREADS": "1"}
        t0 = time.monotonic()
        try:
            res = subprocess.run([sys.executable, "-c", f"URL = {server.url!r}\n" + code], capture_output=True,
                                 text=True, env=env, timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the process did not exit within 20 s: a blocked judge thread held it")
        elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    assert "timeout after 1 s (judge.timeout_s)" in res.stdout
    assert elapsed < 12.0, elapsed
