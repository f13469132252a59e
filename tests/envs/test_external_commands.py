"""data.env=external, the command side (rlvr.envs.external): the reward line, and a command that crashes, hangs or
prints a bad reward is an error with its reason, never a 0 (the episode is then unscored)."""

from __future__ import annotations

import json
import shlex
import sys
import time

import pytest

from rlvr.data.example import Example
from rlvr.envs.external import CommandEpisodes, parse_reward_line, problem_json

EX = Example(id="arith:7", question="3+4=", reference="7", meta={"a": 3})
PY = shlex.quote(sys.executable)


@pytest.mark.parametrize("stdout, reward, error", [
    ('{"reward": 1.0}\n', 1.0, ""),
    ('log line\n{"reward": 0.25, "why": "partial"}\n\n', 0.25, ""),
    ('{"reward": 0}', 0.0, ""),
    ("", None, ""),                                   # no line: the task's checker decides
    ("the answer is 7\n", None, ""),                  # not a JSON object: the checker decides
    ('{"reward": 1.0', None, "not valid JSON"),      # starts like one: a garbled reward is an error
    ('{"score": 1.0}', None, 'no numeric "reward"'),
    ('{"reward": "1"}', None, 'no numeric "reward"'),
    ('{"reward": true}', None, 'no numeric "reward"'),
    ('{"reward": NaN}', None, 'no numeric "reward"'),
    ('[1, 2]', None, ""),                             # not an object: starts with "[", no reward given
])
def test_reward_line(stdout, reward, error):
    out = parse_reward_line(stdout)
    assert out.reward == reward
    assert (error in out.error) if error else out.error == ""


def test_the_command_sees_the_endpoint_key_and_problem(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text("import json, os\n"
                      "p = json.loads(os.environ['RLVR_PROBLEM'])\n"
                      "print('working...')\n"
                      "print(json.dumps({'reward': 1.0, 'seen': [os.environ['OPENAI_BASE_URL'], "
                      "os.environ['OPENAI_API_KEY'], os.environ['OPENAI_MODEL'], p]}))\n")
    out = CommandEpisodes(f"{PY} {script}")(EX, "http://127.0.0.1:9/v1", "ep-key", "policy", 30)
    assert out.error == "" and out.reward == 1.0
    assert out.info["seen"] == ["http://127.0.0.1:9/v1", "ep-key", "policy", json.loads(problem_json(EX))]
    assert out.info["seen"][3] == {"id": "arith:7", "question": "3+4=", "reference": "7", "meta": {"a": 3}}


def test_a_crash_is_an_error_naming_the_status_and_stderr():
    out = CommandEpisodes(f"{PY} -c \"import sys; sys.stderr.write('boom: no key\\n'); sys.exit(3)\"")(
        EX, "u", "k", "m", 30)
    assert out.reward is None and "exited with status 3" in out.error and "boom: no key" in out.error


def test_a_hang_is_killed_at_the_timeout_with_its_children(tmp_path):
    marker = tmp_path / "child_alive"
    # the command starts a child that would write the marker after 3 s: killing the process group stops it too
    cmd = (f"{PY} -c \"import time, subprocess, sys; subprocess.Popen([sys.executable, '-c', "
           f"'import time; time.sleep(3); open(\\'{marker}\\', \\'w\\').write(\\'x\\')']); time.sleep(60)\"")
    t0 = time.perf_counter()
    out = CommandEpisodes(cmd)(EX, "u", "k", "m", 1.0)
    assert time.perf_counter() - t0 < 10
    assert out.reward is None and "external.timeout_s=1" in out.error
    time.sleep(3.5)
    assert not marker.exists()


def test_bad_json_is_an_error():
    out = CommandEpisodes(f"{PY} -c \"print('{{\\\"reward\\\": oops}}')\"")(EX, "u", "k", "m", 30)
    assert out.reward is None and out.error.startswith("external.command: its last stdout line is not valid JSON")


def test_a_command_that_cannot_run_is_an_error():
    out = CommandEpisodes("/no/such/agent --go")(EX, "u", "k", "m", 30)
    assert out.reward is None and "exited with status 127" in out.error
