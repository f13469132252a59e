"""The judge section made into the run's judge reward (rlvr.rewards.judge.JudgeReward): an HTTP endpoint
(judge.url) or a local judge model (judge.model: 'tiny', a folder, a run or checkpoint directory) loaded like
a policy and sampled greedily through the generator builder (rlvr.rollout.build_generator, hf backend), one
generate call per batch. Lives in the train layer because the local model needs rlvr.models / rlvr.rollout,
which the rewards layer may not import; load_task_data injects the judge into the task's reward."""

from __future__ import annotations

from collections.abc import Sequence

from rlvr.rewards.judge import HTTPJudge, JudgeReply, JudgeReward
from rlvr.rewards.types import RewardFn
from rlvr.rollout import build_generator
from rlvr.rollout.types import SamplingSpec
from rlvr.train.config import RolloutConfig
from rlvr.train.policy import build_policy


class GeneratorJudge:
    """A judge backend over any rlvr Generator: each prompt (in the tokenizer's chat template when it has one)
    sampled greedily for max_tokens, all in one generate call. Never raises: a failure of the call makes
    every reply of the batch a failure with its reason. Bounded by max_tokens (a local forward cannot be
    interrupted, so judge.timeout_s does not apply)."""

    def __init__(self, generator, tokenizer, *, max_tokens: int = 16, chat: bool | None = None,
                 label: str = "the local judge model"):
        self.generator, self.tokenizer, self.max_tokens = generator, tokenizer, int(max_tokens)
        self.chat = bool(getattr(tokenizer, "chat_template", None)) if chat is None else chat
        self.label = label  # what the messages call this judge (judge.model=...)

    def __repr__(self) -> str:
        return f"GeneratorJudge({type(self.generator).__name__}, max_tokens={self.max_tokens})"

    def _text(self, prompt: str) -> str:
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)

    def judge(self, prompts: Sequence[str]) -> list[JudgeReply]:
        if not prompts:
            return []
        try:
            spec = SamplingSpec(n=1, temperature=0.0, max_tokens=self.max_tokens, seed=0, logprobs=False)
            rollouts = self.generator.generate([self._text(p) for p in prompts], spec)
            return [JudgeReply(r.text) for r in rollouts]
        except Exception as exc:  # noqa: BLE001 - a judge never raises into the trainer
            why = f"local judge failed: {type(exc).__name__}: {exc}"[:200]
            return [JudgeReply(None, why) for _ in prompts]


def build_judge_backend(jcfg, *, device: str = "cpu", seed: int = 0):
    """The backend the judge section names: HTTPJudge for judge.url, else the local model judge.model."""
    if jcfg.url:
        return HTTPJudge(jcfg.url, jcfg.model, max_tokens=jcfg.max_tokens, timeout_s=jcfg.timeout_s,
                         concurrency=jcfg.concurrency, api_key_env=jcfg.api_key_env)
    if not jcfg.model:
        raise ValueError("judge: set judge.url (an OpenAI-compatible endpoint) or judge.model (a local judge model)")
    name, init_from = jcfg.model, ""
    if jcfg.model != "tiny":
        from pathlib import Path

        if Path(jcfg.model).is_dir():  # a model folder, a checkpoint or a run directory
            name, init_from = "", jcfg.model
    try:
        model, tokenizer = build_policy(name or "tiny", init_from=init_from, device=jcfg.device or device, seed=seed)
    except (OSError, ValueError) as exc:
        raise ValueError(f"judge.model={jcfg.model!r}: {exc}") from exc
    model.eval()
    rcfg = RolloutConfig(backend="hf", batch_size=jcfg.batch_size, shared_prefix=True, cuda_graphs="false")
    generator = build_generator(rcfg, model, tokenizer, seed=seed, default_batch_size=jcfg.batch_size)
    return GeneratorJudge(generator, tokenizer, max_tokens=jcfg.max_tokens, label=f"judge.model={jcfg.model}")


def build_judge(jcfg, symbolic: RewardFn, *, device: str = "cpu", seed: int = 0, backend=None) -> JudgeReward:
    """The run's judge reward: judge section `jcfg`, the task's own checker `symbolic` (extraction and
    fallback); `backend` replaces the one the section names (tests script one)."""
    if backend is None:
        backend = build_judge_backend(jcfg, device=device, seed=seed)
    return JudgeReward(backend, symbolic, prompt=jcfg.prompt, fallback=jcfg.fallback)
