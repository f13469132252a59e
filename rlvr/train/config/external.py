"""The agent programs rlvr does not own (ExternalConfig, `rlvr train`'s `external` section): data.env=external runs
external.command once per episode against the rollout gateway (rlvr.gateway), data.env=verifiers:<env> runs a
verifiers environment's rollouts through it (rlvr.envs.external; docs/agents.md, "Bring your own agent")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.train.config.checks import Checks, changed, default_of

EXTERNAL_ENV = "external"
VERIFIERS_PREFIX = "verifiers:"


def is_gateway_env(env: str) -> bool:
    """data.env names episodes run through the gateway: external, or verifiers:<environment>."""
    return env == EXTERNAL_ENV or env.startswith(VERIFIERS_PREFIX)


@dataclass
class ExternalConfig:
    """Episodes of data.env=external / verifiers:<env> (rlvr.envs.external; docs/agents.md)."""

    command: str = ""
    """data.env=external: the shell command line run once per episode, with OPENAI_BASE_URL, OPENAI_API_KEY (names
    the episode), OPENAI_MODEL and RLVR_PROBLEM (the problem as JSON: id, question, reference, meta) in its
    environment. Its last stdout line {"reward": x} is the reward; without one the task's checker scores the
    last answer the policy gave it. Exit status != 0, a bad JSON line or a timeout: an unscored episode."""
    max_parallel: int = 8
    """Episodes run at once (their calls are batched into one generate call by the gateway)."""
    timeout_s: float = 300.0
    """Wall-clock limit of one episode; past it the command's process group is killed (an unscored episode)."""
    tool_parser: Literal["hermes"] = "hermes"
    """How the gateway reads tool calls out of a chat completion when the request offers tools: hermes =
    <tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5, Hermes, ...)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """data.env=verifiers:<env>: keyword arguments of the environment's load_environment (a mapping)."""

    def validate(self) -> None:
        c = Checks("external")
        c.choices(self)
        c.at_least("max_parallel", self.max_parallel, 1)
        c.need("timeout_s", self.timeout_s, self.timeout_s > 0, "> 0")
        c.done()

    def check_env(self, env: str) -> None:
        """The external keys against data.env (TrainConfig.validate): the command is what data.env=external
        runs, env_args what a verifiers environment loads with; set for another env, it does nothing."""
        c = Checks("external")
        if env == EXTERNAL_ENV and not self.command.strip():
            c.error("data.env=external runs external.command once per episode, and it is empty: set "
                    "external.command='python my_agent.py' (docs/agents.md, \"Bring your own agent\")")
        if env != EXTERNAL_ENV and changed(self, "command"):
            c.error(f"external.command={self.command!r} is run by data.env=external, and data.env={env!r}: set "
                    "data.env=external, or leave external.command empty")
        if not env.startswith(VERIFIERS_PREFIX) and changed(self, "env_args"):
            c.error(f"external.env_args={self.env_args!r} are a verifiers environment's load_environment arguments, "
                    f"and data.env={env!r} is not one: set data.env=verifiers:<environment>, or leave "
                    "external.env_args empty")
        if not is_gateway_env(env):
            for name in ("max_parallel", "timeout_s", "tool_parser"):
                if changed(self, name):
                    c.error(f"external.{name}={getattr(self, name)!r} applies to episodes run through the gateway "
                            f"(data.env=external or verifiers:<env>), and data.env={env!r}: leave external.{name}="
                            f"{default_of(self, name)!r}")
        c.done()
