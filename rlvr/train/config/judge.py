"""The model judge of data.reward=judge (JudgeConfig; `rlvr train` and `rlvr eval` only), and the refusal of
the judge by the stages without a judge section (refuse_judge)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Literal

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks, changed, default_of

if TYPE_CHECKING:
    from rlvr.train.config.data import DataConfig
    from rlvr.train.config.run import DistributedConfig


# The judge keys only an HTTP judge reads (rlvr.rewards.judge.HTTPJudge), and only a local judge model
# (rlvr.train.judge.build_judge_backend: its generate batch and device; a local forward has no timeout).
_JUDGE_HTTP_KEYS = ("timeout_s", "concurrency", "api_key_env")
_JUDGE_LOCAL_KEYS = ("batch_size", "device")


@dataclass
class JudgeConfig:
    """The model judge of data.reward=judge (rlvr.rewards.judge; docs/verifier.md, "Model judge")."""

    url: str = ""
    """OpenAI-compatible endpoint base (http://127.0.0.1:8000/v1): each sample's prompt is POSTed to
    {url}/chat/completions; '' = a local judge model (judge.model)."""
    model: str = ""
    """With judge.url: the model name sent to the endpoint. Without: a local judge model loaded through the
    generator builder ('tiny', a model folder, a run or checkpoint directory)."""
    prompt: str = ""
    """Template with {question} {reference} and {answer} (the extracted final answer) or {response} (the whole
    response); the reply's last EQUIVALENT / DIFFERENT word is the verdict; '' = the built-in one-word prompt."""
    max_tokens: int = 16
    """Tokens the judge may reply with (one verdict word needs few; more for a judge that reasons first)."""
    timeout_s: float = 30.0
    """Deadline of one request (HTTP); the batch's is timeout_s per round of judge.concurrency requests."""
    concurrency: int = 8
    """HTTP requests in flight at once."""
    batch_size: int = 64
    """Local judge model: prompts per forward batch of its generate call."""
    fallback: Literal["symbolic", "incorrect", "unscored"] = "symbolic"
    """When the judge fails (timeout, HTTP error, unreachable, no verdict word): score the sample with the task's
    symbolic checker (symbolic), as wrong (incorrect), or leave it unscored (unscored: kept out of its group's
    baseline, advantage 0); counted in judge/fallbacks."""
    api_key_env: str = ""
    """Name of the environment variable holding the endpoint's key (sent as a Bearer token, never logged)."""
    device: str = ""
    """Local judge model: torch device; '' = model.device."""

    def validate(self) -> None:
        """URL scheme, prompt placeholders, ranges (whether data.reward uses the judge: the trainer configs)."""
        from rlvr.rewards.judge import check_url, prompt_problem

        c = Checks("judge")
        c.choices(self)
        if self.url and (problem := check_url(self.url)) is not None:
            c.error(f"judge.url={self.url!r} {problem}")
        if self.prompt and (problem := prompt_problem(self.prompt)) is not None:
            c.error(f"judge.prompt: {problem}")
        c.at_least("max_tokens", self.max_tokens, 1)
        c.need("timeout_s", self.timeout_s, self.timeout_s > 0, "> 0")
        c.at_least("concurrency", self.concurrency, 1)
        c.at_least("batch_size", self.batch_size, 1)
        if self.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            c.error(f"judge.api_key_env={self.api_key_env!r} must be the NAME of an environment variable "
                    "(letters, digits, _), not the key itself")
        if self.device:
            c.device("device", self.device)
        c.done()

    def check_reward(self, data: DataConfig, distributed: DistributedConfig | None = None) -> None:
        """Cross-section: a data.reward naming the judge needs judge.url or judge.model, runs its reward in this
        process (not data.reward_isolate, not Ray scorer actors)."""
        from rlvr.rewards.judge import reward_uses_judge

        c = Checks("judge")
        if not reward_uses_judge(data.reward):
            # every judge key is read only by the judge reward: one set without it does nothing (issue 36)
            for f in fields(self):
                if changed(self, f.name):
                    c.error(f"judge.{f.name}={getattr(self, f.name)!r} configures the model judge, which data.reward="
                            f"{data.reward!r} does not use: set data.reward=judge (or a sum naming judge, such as "
                            f"'judge:1,format:0.1'), or leave judge.{f.name} unset")
            c.done()
            return
        for name in (_JUDGE_HTTP_KEYS if not self.url else _JUDGE_LOCAL_KEYS):
            if changed(self, name):
                c.error(f"judge.{name}={getattr(self, name)!r} applies to "
                        + ("an HTTP judge (judge.url), and judge.url is empty: the judge is the local model "
                           f"judge.model={self.model!r}" if not self.url else
                           f"a local judge model, and judge.url={self.url!r} is set: the judge is that endpoint")
                        + f"; leave judge.{name}={default_of(self, name)!r}")
        if not (self.url or self.model):
            c.error(f"data.reward={data.reward!r} uses the model judge: set judge.url (an OpenAI-compatible "
                    "endpoint) or judge.model (a local judge model: tiny, a folder, a run directory)")
        if data.reward_isolate:
            c.error("data.reward_isolate=true: the judge batches and caches its requests in this process; "
                    "unset data.reward_isolate with data.reward=judge")
        if distributed is not None and distributed.placement != "local":
            c.error(f"distributed.placement={distributed.placement!r}: the judge reward runs in the trainer's "
                    "process only so far; use distributed.placement=local with data.reward=judge")
        c.done()


def refuse_judge(data: DataConfig, command: str) -> None:
    """The model judge has a config section in `rlvr train` and `rlvr eval` only: elsewhere data.reward=judge
    would score every response as an error, so it is refused here, naming the key."""
    from rlvr.rewards.judge import reward_uses_judge

    if reward_uses_judge(data.reward):
        raise ConfigError(f"data.reward={data.reward!r}: the model judge is wired into rlvr train and rlvr eval "
                          f"only (their judge section), not {command}")
