"""The external section and data.env=external / verifiers:<env> in the config: what is needed, what is inert."""

from __future__ import annotations

import pytest

from rlvr.config import ConfigError, load_config
from rlvr.train.config import TrainConfig


def _load(*overrides):
    return load_config(TrainConfig, None, list(overrides))


def test_external_needs_a_command():
    with pytest.raises(ConfigError, match=r"data.env=external runs external.command once per episode, and it is empty"):
        _load("data.env=external")
    cfg = _load("data.env=external", "external.command=python agent.py", "data.task=arithmetic")
    assert cfg.external.command == "python agent.py" and cfg.data.env_makes_problems() is False


def test_external_keys_without_the_gateway_are_refused():
    with pytest.raises(ConfigError) as e:
        _load("external.command=python agent.py", "external.max_parallel=4", "external.env_args={a: 1}")
    msg = str(e.value)
    assert "external.command='python agent.py' is run by data.env=external, and data.env=''" in msg
    assert "external.max_parallel=4 applies to episodes run through the gateway" in msg
    assert "external.env_args={'a': 1} are a verifiers environment's load_environment arguments" in msg


def test_external_reads_the_task_but_not_the_template():
    # data.task / data.reward are the problems and the checker of an external episode: accepted
    _load("data.env=external", "external.command=x", "data.task=gsm8k", "data.reward=math")
    with pytest.raises(ConfigError, match=r"data.template='r1_zero' has no effect with data.env='external'"):
        _load("data.env=external", "external.command=x", "data.template=r1_zero")
    with pytest.raises(ConfigError, match=r"data.env_chat='plain' has no effect with data.env='external'"):
        _load("data.env=external", "external.command=x", "data.env_chat=plain")


def test_unknown_env_names_the_gateway_kinds():
    with pytest.raises(ConfigError) as e:
        _load("data.env=extrenal")
    assert "external" in str(e.value) and "verifiers:<environment>" in str(e.value)


def test_external_section_ranges():
    with pytest.raises(ConfigError) as e:
        _load("data.env=external", "external.command=x", "external.max_parallel=0", "external.timeout_s=0")
    assert "external.max_parallel=0 must be >= 1" in str(e.value) and "external.timeout_s=0" in str(e.value)
    with pytest.raises(ConfigError, match="external.tool_parser"):
        _load("data.env=external", "external.command=x", "external.tool_parser=json")
