"""data.env=verifiers:<env> (rlvr.envs.verifiers_env): a verifiers (>= 0.4) environment's problems, one episode
against an OpenAI-compatible endpoint and its reward. The environments are tests/fixtures/vf_echo_env.py (four
questions, reward 1.0 when the reply contains the answer) and tests/fixtures/vf_tool_env.py (an MCP tool); the
endpoint is a scripted stand-in server on 127.0.0.1, and once the real rlvr.gateway with the tiny model.

Needs the verifiers extra (`pip install -e ".[verifiers]"`); skipped without it."""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytest.importorskip("verifiers.v1", reason="needs the verifiers extra: pip install -e '.[verifiers]'")
pytestmark = pytest.mark.verifiers  # `make test-verifiers` (installs the extra); not in the default suite

from helpers import REPO  # noqa: E402
from helpers.judge_server import send_json  # noqa: E402

from rlvr.data.example import Example  # noqa: E402
from rlvr.envs.verifiers_env import (  # noqa: E402
    CHAT_HARNESS,
    check_verifiers_spec,
    import_verifiers,
    load_verifiers_env,
    run_verifiers_episode,
    verifiers_examples,
)

FIXTURES = REPO / "tests" / "fixtures"
ECHO = str(FIXTURES / "vf_echo_env.py")
# the stand-in model's reply per question, and the reward the echo environment gives it
REPLIES = {"What is 2+3?": ("5", 1.0), "What is 7*6?": ("41", 0.0), "What is 10-4?": ("six", 0.0),
           "What is 9+9?": ("It is 18.", 1.0), "What is 1+1?": ("2", 1.0), "What is 3*3?": ("6", 0.0)}


def _completion(message: dict, model: str) -> bytes:
    reason = "tool_calls" if message.get("tool_calls") else "stop"
    return json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": model,
                       "choices": [{"index": 0, "finish_reason": reason, "message": message}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}}).encode()


class StandIn:
    """/v1/chat/completions on 127.0.0.1 (port 0), in threads. The API key picks the behaviour: "fail-..." answers
    500, "sleep-..." answers after 3 s; otherwise a request with tools gets a call of the first tool (the two
    numbers of the question as a and b) and, once the tool answered, "The sum is <tool output>"; any other request
    the REPLIES text of its last message. Records (authorization, body) of every request."""

    def __init__(self):
        self.requests: list[tuple[str, dict]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization", "")
                with outer.lock:
                    outer.requests.append((auth, body))
                status, data = 200, b""
                if auth.startswith("Bearer fail"):
                    status, data = 500, json.dumps({"error": {"message": "engine exploded", "type": "server_error"}}).encode()
                else:
                    if auth.startswith("Bearer sleep"):
                        time.sleep(3.0)
                    data = _completion(outer.reply(body), body.get("model", ""))
                send_json(self, status, data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @staticmethod
    def reply(body: dict) -> dict:
        last = body["messages"][-1]
        if body.get("tools") and last["role"] == "tool":
            return {"role": "assistant", "content": f"The sum is {last['content']}"}
        if body.get("tools"):
            a, b = (int(x) for x in last["content"].rsplit(" ", 1)[-1].rstrip("?").split("+"))
            name = body["tools"][0]["function"]["name"]
            return {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps({"a": a, "b": b})}}]}
        return {"role": "assistant", "content": REPLIES[last["content"]][0]}

    def calls_of(self, key: str) -> list[dict]:
        with self.lock:
            return [body for auth, body in self.requests if auth == f"Bearer {key}"]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def stand_in():
    server = StandIn()
    yield server
    server.close()


@pytest.fixture(scope="module")
def echo_env():
    return load_verifiers_env(ECHO, eval_args={"split": "test"})


def _by_question(examples: list[Example]) -> dict[str, Example]:
    return {e.question: e for e in examples}


def test_the_module_imports_without_verifiers():
    # and the config check imports neither verifiers nor the environment
    code = ("import sys; from rlvr.envs.verifiers_env import check_verifiers_spec as c; "
            f"print(c({ECHO!r}), c('textarena'), c('gsm8k') is not None, 'verifiers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "None None True False"


def test_examples_of_the_train_and_eval_splits(echo_env):
    train = verifiers_examples(echo_env, "train", None, seed=0)
    assert sorted(e.question for e in train) == ["What is 10-4?", "What is 2+3?", "What is 7*6?", "What is 9+9?"]
    assert [e.id for e in train] == [e.id for e in verifiers_examples(echo_env, "train", None, seed=0)]  # seeded
    assert sorted(e.id for e in verifiers_examples(echo_env, "train", None, seed=1)) == sorted(e.id for e in train)
    assert len({e.id for e in train}) == 4 and all(e.id.startswith("verifiers:vf_echo_env:train:train-") for e in train)
    assert len(verifiers_examples(echo_env, "train", 2, seed=0)) == 2
    e = _by_question(train)["What is 7*6?"]
    assert e.reference == "42"
    task = e.meta["verifiers"]["task"]
    assert task["prompt"] == "What is 7*6?" and task["system_prompt"] == "Answer with the number only."
    assert task["answer"] == "42" and e.meta["verifiers"]["env"] == "vf_echo_env"
    assert json.loads(json.dumps(e.meta)) == e.meta  # the problem survives JSON (RLVR_PROBLEM, logs)
    test = verifiers_examples(echo_env, "test", None, seed=0)
    assert sorted((t.question, t.reference) for t in test) == [("What is 1+1?", "2"), ("What is 3*3?", "9")]
    assert all(t.id.startswith("verifiers:vf_echo_env:test:") for t in test)
    # without eval_args the evaluation problems are the taskset's own
    plain = load_verifiers_env(ECHO)
    assert sorted(t.question for t in verifiers_examples(plain, "eval", None, seed=0)) == sorted(e.question for e in train)


def test_episode_rewards_and_what_the_endpoint_receives(echo_env, stand_in):
    examples = verifiers_examples(echo_env, "train", None, seed=0) + verifiers_examples(echo_env, "test", None, 0)

    def run(i_example):
        i, example = i_example
        return run_verifiers_episode(echo_env, example, stand_in.base_url, f"key-{i}", "policy-x", 30.0,
                                     {"temperature": 0.5, "max_tokens": 16})

    with ThreadPoolExecutor(4) as pool:  # episodes at once, as the runner's worker threads run them
        outcomes = list(pool.map(run, enumerate(examples)))
    assert outcomes == [(REPLIES[e.question][1], "") for e in examples]
    for i, example in enumerate(examples):
        (body,) = stand_in.calls_of(f"key-{i}")  # one call per episode, under the episode's own key
        assert body["model"] == "policy-x" and body["temperature"] == 0.5 and body["max_tokens"] == 16
        assert body["messages"] == [{"role": "system", "content": "Answer with the number only."},
                                    {"role": "user", "content": example.question}]


def test_a_prompt_of_chat_messages(stand_in):
    env = load_verifiers_env(ECHO, {"as_messages": True})
    e = next(x for x in verifiers_examples(env, "train", None, 0) if x.reference == "5")
    assert e.question == "user: What is 2+3?"
    assert e.meta["verifiers"]["task"]["prompt"] == [{"role": "user", "content": "What is 2+3?"}]
    e = Example(**json.loads(json.dumps(e.__dict__)))  # as a JSON problem (RLVR_PROBLEM, a data file) comes back
    assert run_verifiers_episode(env, e, stand_in.base_url, "key-messages", "m", 30.0) == (1.0, "")
    (body,) = stand_in.calls_of("key-messages")
    assert body["messages"][-1] == {"role": "user", "content": "What is 2+3?"}


def test_failures_are_an_error_never_an_exception(echo_env, stand_in):
    e = _by_question(verifiers_examples(echo_env, "train", None, 0))["What is 2+3?"]
    reward, err = run_verifiers_episode(echo_env, e, stand_in.base_url, "fail-1", "m", 30.0)
    assert reward is None and "500" in err and "engine exploded" in err
    assert len(stand_in.calls_of("fail-1")) == 1  # not retried: a retry would add calls to the episode's record
    t0 = time.monotonic()
    reward, err = run_verifiers_episode(echo_env, e, stand_in.base_url, "sleep-1", "m", 1.0)
    assert (reward, err) == (None, "the episode timed out after 1 s") and time.monotonic() - t0 < 10
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    reward, err = run_verifiers_episode(echo_env, e, dead, "key-dead", "m", 30.0)
    assert reward is None and err
    reward, err = run_verifiers_episode(echo_env, Example("x", "q", "r"), stand_in.base_url, "key-x", "m", 30.0)
    assert reward is None and "not a verifiers problem" in err


def test_a_tool_of_the_environment_runs(stand_in, monkeypatch):
    # vf_tool_env by its module name (an installed environment's id); verifiers starts its MCP tool server as
    # `python -m vf_tool_env` in the episode's subprocess runtime, which inherits PYTHONPATH
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FIXTURES), os.environ.get("PYTHONPATH")) if p))
    env = load_verifiers_env("vf_tool_env")
    e = verifiers_examples(env, "train", 1, seed=0)[0]
    assert run_verifiers_episode(env, e, stand_in.base_url, "key-tool", "m", 60.0) == (1.0, "")
    first, second = stand_in.calls_of("key-tool")
    assert [t["function"]["name"] for t in first["tools"]] == ["calc_add"]
    assert second["messages"][-1]["role"] == "tool" and second["messages"][-1]["content"] == e.reference


def test_bad_specs_name_what_was_tried(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        load_verifiers_env(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match=r"no_such_env_xyz.*tried"):
        load_verifiers_env("no_such_env_xyz")
    with pytest.raises(ValueError, match="exports no Taskset subclass"):
        load_verifiers_env("json")
    legacy = tmp_path / "legacy_env.py"  # the verifiers 0.1 layout: load_environment(), no Taskset
    legacy.write_text("def load_environment(**kwargs):\n    return None\n")
    with pytest.raises(ValueError, match=r"Taskset.*verifiers < 0.4 layout"):
        load_verifiers_env(str(legacy))
    with pytest.raises(ValueError, match="nope"):
        load_verifiers_env(ECHO, {"nope": 1})
    with pytest.raises(ValueError, match="eval_args"):
        load_verifiers_env(ECHO, eval_args={"split": 3})
    assert check_verifiers_spec(ECHO) is None
    assert check_verifiers_spec("json") is None  # found; whether it is an environment is known at load
    assert "needs an environment" in check_verifiers_spec(" ")
    assert "no such file" in check_verifiers_spec(str(tmp_path / "missing.py"))
    assert "no installed package 'no_such_env'" in check_verifiers_spec("owner/no-such-env@1.0")
    assert "no module" in check_verifiers_spec("nosuchpkg.mod")
    assert "not an environment id" in check_verifiers_spec("a b")


def test_without_verifiers_the_error_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "verifiers" or m.startswith("verifiers.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "verifiers", None)
    with pytest.raises(ImportError, match=r"pip install 'rlvr\[verifiers\]'"):
        import_verifiers()
    with pytest.raises(ImportError, match=r"rlvr\[verifiers\]"):
        load_verifiers_env(ECHO)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verifiers" else find_spec(name, *a))
    assert "pip install 'rlvr[verifiers]'" in check_verifiers_spec(ECHO)


def test_an_episode_through_the_gateway_with_the_tiny_model(echo_env):
    from rlvr.gateway.server import Gateway
    from rlvr.models.tiny import build_tiny_model
    from rlvr.rollout.hf_generator import HFGenerator
    from rlvr.rollout.types import SamplingSpec

    model, tok = build_tiny_model()
    examples = verifiers_examples(echo_env, "train", 2, seed=0)
    with Gateway(HFGenerator(model, tok), tok, SamplingSpec(max_tokens=6, temperature=1.0)) as gw:
        for example in examples:
            key = gw.open_episode(example.id, seed=3)
            reward, err = run_verifiers_episode(echo_env, example, gw.base_url, key, gw.model_name, 60.0,
                                                {"max_tokens": 6})
            record = gw.close_episode(key)
            assert err == "" and record.errors == []
            (call,) = record.calls  # the harness's one model call, with the exact ids the policy sampled
            assert 0 < len(call.completion_ids) <= 6 and len(call.logprobs) == len(call.completion_ids)
            assert example.question in tok.decode(call.prompt_ids)
            assert reward == float(example.reference in record.last_text.strip())
    assert CHAT_HARNESS in sys.modules  # rlvr's in-process harness ran the episodes


def test_rlvr_train_runs_a_verifiers_environment_through_the_gateway(tmp_path):
    """`rlvr train data.env=verifiers:<file>`: the environment's problems, its rollouts through the gateway, its
    rubric the reward (each sample's reward is 1.0 exactly when the reply contains the answer)."""
    from helpers.cli import run_rlvr

    out = tmp_path / "run"
    res = run_rlvr("train", f"data.env=verifiers:{REPO / 'tests' / 'fixtures' / 'vf_echo_env.py'}",
                   "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=6", "run.steps=2",
                   "data.num_eval=2", f"run.out_dir={out}", "run.log_samples_every=1", "run.num_log_samples=2",
                   timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["gateway/episodes"] for r in rows] == [4.0, 4.0] and all(r["gateway/error_frac"] == 0 for r in rows)
    assert rows[-1]["eval/gateway/episodes"] == 2.0 and rows[-1]["eval/error_rate"] == 0.0
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["reward"] == float(s["reference"] in s["response"]) for s in samples)
