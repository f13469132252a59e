"""Trainer glue: `rlvr train data.env=NAME` turns the data section into a TaskData whose `env` is an
EnvRunner. The trainer (rlvr.train.pg.rollout_source.sample_groups) then samples groups of episodes instead of
single responses, and takes their rewards from the environment; everything downstream (advantages,
the GRPO-family losses, PPO's critic, checkpoints and resume) sees ordinary Rollouts whose
loss_mask keeps tool output out of the loss.

Config keys (rlvr.train.config.DataConfig): data.env, data.env_max_turns, data.env_max_tokens
(token budget per episode after the prompt; sampling.max_tokens limits each model turn),
data.env_integrity (zero / report), data.env_chat (auto / chat / plain). Problems come from the
environment's generator (data.num_train / data.num_eval / data.seed) or data.train_path /
data.eval_path (JSONL of rlvr.data.Example rows, read by the environment's task loader).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.data.example import Example
from rlvr.data.jsonl import read_jsonl
from rlvr.data.task_data import TaskData
from rlvr.envs.base import get_env
from rlvr.envs.format import TurnFormat
from rlvr.envs.rollout import Episode, episode_metrics, run_episodes
from rlvr.rewards.types import Reward, Status, format_rate


class EnvRunner:
    """Runs episodes of one registered environment for the trainer and collects their metrics."""

    def __init__(self, env_name: str, tokenizer, *, max_turns: int = 4, max_tokens: int = 256,
                 integrity: str = "zero", chat: str = "auto", workers: int = 1, env_kwargs: dict | None = None):
        self.cls = get_env(env_name)
        self.name = env_name
        self.tokenizer = tokenizer
        self.max_turns, self.max_tokens, self.integrity = max_turns, max_tokens, integrity
        self.fmt = TurnFormat(tokenizer, chat)
        self.workers = workers
        self.env_kwargs = dict(env_kwargs or {})
        self.make_env()  # fail now (bad max_turns / integrity) rather than at the first step
        self._pending: list[Episode] = []

    def make_env(self):
        return self.cls(max_turns=self.max_turns, integrity=self.integrity, **self.env_kwargs)

    def prompt(self, example) -> str:
        env = self.make_env()
        try:
            return self.fmt.prompt(env.system, env.reset(example))
        finally:
            env.close()

    def episodes(self, generator, examples: Sequence[Any], spec) -> list[Episode]:
        return run_episodes(generator, self.make_env, examples, spec, self.tokenizer, fmt=self.fmt,
                            max_tokens_total=self.max_tokens, workers=self.workers)

    def rollouts(self, generator, examples: Sequence[Any], spec):
        """(rollouts, rewards) of len(examples) * spec.n episodes (prompt-major); the episodes are
        kept for metrics() (tool calls, flags, ... of this training step)."""
        eps = self.episodes(generator, examples, spec)
        self._pending += eps
        return [e.rollout for e in eps], [e.reward for e in eps]

    def close(self) -> None:
        """Nothing to stop: the environments of a step are closed with their episodes."""

    def metrics(self) -> dict[str, float]:
        """env/* metrics of the episodes sampled since the last call (one training step)."""
        m, self._pending = episode_metrics(self._pending), []
        return m

    def evaluate(self, generator, examples: Sequence[Any], spec, *, chunk_size: int = 0,
                 samples: int = 0) -> dict[str, Any]:
        """Held-out metrics of one episode per example: accuracy (solved share, flagged episodes
        count as unsolved under integrity=zero), reward, format_rate (rlvr.rewards.types.format_rate:
        NaN when the env's reward has no format part), len/mean and the env/* metrics."""
        eps: list[Episode] = []
        step = chunk_size or len(examples) or 1
        for s in range(0, len(examples), step):
            eps += self.episodes(generator, examples[s: s + step], spec)
        n = max(1, len(eps))
        out: dict[str, Any] = {
            "accuracy": sum(e.reward.status is Status.CORRECT for e in eps) / n,
            "reward": sum(e.reward.total for e in eps) / n,
            "format_rate": format_rate([e.reward.parts for e in eps]),
            "len/mean": sum(len(e.rollout.response_ids) for e in eps) / n,
        }
        out.update(episode_metrics(eps))
        if samples:
            out["samples"] = [{"source": "eval", "prompt": e.rollout.prompt, "response": e.rollout.text,
                               "reference": getattr(e.example, "reference", ""), "reward": e.reward.total,
                               "parts": dict(e.reward.parts), "status": e.reward.status.value,
                               "flags": [f.name for f in e.log.flags]} for e in eps[:samples]]
        return out


def _no_text_reward(response: str, example) -> Reward:
    return Reward(0.0, status=Status.ERROR, info="environment task: the reward comes from the episode "
                  "(rlvr.envs), not from the response text")


def env_task_data(data_cfg, tokenizer, *, train: bool = True):
    """TaskData for data.env=NAME (see the module docstring)."""
    if tokenizer is None:
        raise ValueError(f"data.env={data_cfg.env!r} needs the policy's tokenizer")
    runner = EnvRunner(data_cfg.env, tokenizer, max_turns=data_cfg.env_max_turns, max_tokens=data_cfg.env_max_tokens,
                       integrity=data_cfg.env_integrity, chat=data_cfg.env_chat,
                       workers=max(1, data_cfg.reward_workers))
    cls = runner.cls

    def load(path: str, n: int) -> list:
        rows = [Example(id=str(r.get("id", f"{path}:{i}")), question=str(r["question"]), reference=str(r["reference"]),
                        meta=dict(r.get("meta") or {}), solution=r.get("solution"))
                for i, r in enumerate(read_jsonl(path, required_keys=("question", "reference")))]
        return rows[:n] if n else rows

    import inspect

    # generator knobs an environment declares (the calculator's digits per operand: data.digits)
    knobs = {k: getattr(data_cfg, k) for k in ("digits",) if k in inspect.signature(cls.generate_examples).parameters}
    if not train:
        tr = []
    elif data_cfg.train_path:
        tr = load(data_cfg.train_path, data_cfg.num_train)
    else:
        tr = cls.generate_examples(data_cfg.generated_train_count(), "train", data_cfg.seed, **knobs)
    ev = load(data_cfg.eval_path, 0) if data_cfg.eval_path else cls.generate_examples(data_cfg.num_eval, "test",
                                                                                        data_cfg.seed, **knobs)
    return TaskData(name=f"env:{data_cfg.env}", train=tr, eval=ev, prompt=runner.prompt, reward_fn=_no_text_reward,
                    target=lambda ex: ex.solution or "", stop=cls.stop, template=runner.fmt.mode, env=runner)
