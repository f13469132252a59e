"""Episodes run by programs rlvr does not own, through the rollout gateway (rlvr.gateway): `data.env=external`
runs the user's command once per episode; `data.env=verifiers:<env>` runs a verifiers environment's rollout.

    rlvr train configs/grpo.yaml data.env=external external.command='python my_agent.py'

Per step, for each of the step's problems x group_size episodes, the runner opens a gateway API key that names
the episode, runs the episode (up to external.max_parallel at once, each within external.timeout_s), closes the
key and builds the episode's Rollout from what the gateway recorded: the exact prompt and completion ids and the
sampler's logprobs of every call, merged into one sequence where each call extends the previous one (tool and
user turns in between are out of the loss; rlvr.gateway.record.merge_calls). The trainer then scores exactly the
ids the engine sampled; no text is tokenized again.

The command's environment has OPENAI_BASE_URL, OPENAI_API_KEY (the episode's key), OPENAI_MODEL and RLVR_PROBLEM
(the problem as JSON: id, question, reference, meta). The reward is the JSON object of its last stdout line
(`{"reward": 1.0}`); when its last line is not a JSON object, the task's checker (data.task, data.reward) scores
the last answer the policy gave the episode. An episode is an error, unscored (Status.ERROR: out of its group's
baseline, advantage 0, counted and printed by the run's reward error log; never a silent 0), when the command
exits with a status other than 0, hangs past external.timeout_s (its process group is killed), prints a last
line that starts with "{" but is not a JSON object with a numeric "reward", or makes no call to the gateway.

An agent that rewrites its history (a call whose prompt does not extend the previous call's prompt and
completion) starts a new segment. The episode's Rollout is its last segment (the one that ends with the answer the
reward judges; the group's statistics count the episode once); its earlier segments ride along
(Rollout.earlier_segments) and are trained as rows of their own with the episode's advantage
(rlvr.train.pg.rollout_source.training_rows; counted as gateway/split_episodes and gateway/earlier_segment_tokens).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rlvr.rewards.types import Reward, Status
from rlvr.rollout.types import Rollout, SamplingSpec, sequence_seed

STDERR_SHOWN = 300  # characters of a failed command's stderr in its error


@dataclass
class Outcome:
    """What one episode function returns: its reward, or None (the task's checker scores the last answer), or an
    error (the episode is unscored)."""

    reward: float | None = None
    error: str = ""
    info: dict[str, Any] = field(default_factory=dict)


# (example, base_url, api_key, model_name, timeout_s) -> Outcome; runs in a worker thread, never raises
EpisodeFn = Callable[[Any, str, str, str, float], Outcome]


def problem_json(example) -> str:
    """RLVR_PROBLEM: the problem's fields as JSON (id, question, reference, meta)."""
    meta = getattr(example, "meta", None) or {}
    return json.dumps({"id": str(getattr(example, "id", "")), "question": str(example.question),
                       "reference": str(getattr(example, "reference", "")), "meta": meta}, default=str)


def parse_reward_line(stdout: str) -> Outcome:
    """The command's reward: its last non-blank stdout line when that is a JSON object with a numeric, finite
    "reward"; no reward (the checker decides) when the last line does not start with "{"; an error when it starts
    with "{" but is not such an object (a garbled reward is never read as 0)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines or not lines[-1].startswith("{"):
        return Outcome()
    last = lines[-1]
    try:
        obj = json.loads(last)
    except json.JSONDecodeError as exc:
        return Outcome(error=f"its last stdout line is not valid JSON ({exc.msg}): {last[:120]!r}")
    reward = obj.get("reward") if isinstance(obj, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        return Outcome(error=f"its last stdout line has no numeric \"reward\": {last[:120]!r}")
    return Outcome(reward=float(reward), info=obj)


class CommandEpisodes:
    """data.env=external: one run of `command` (a shell command line) per episode."""

    def __init__(self, command: str, *, cwd: str | None = None):
        self.command = command
        self.cwd = cwd
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def __call__(self, example, base_url: str, api_key: str, model: str, timeout_s: float) -> Outcome:
        env = os.environ | {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key, "OPENAI_MODEL": model,
                            "RLVR_PROBLEM": problem_json(example)}
        try:  # its own session: Ctrl-C reaches the trainer only, and a timeout kills the command's whole tree
            p = subprocess.Popen(self.command, shell=True, env=env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                 start_new_session=True)
        except OSError as exc:
            return Outcome(error=f"external.command could not start: {exc}")
        with self._lock:
            self._running.add(p)
        try:
            try:
                out, err = p.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(p)
                p.communicate()
                return Outcome(error=f"external.command ran past external.timeout_s={timeout_s:g} s (killed)")
        finally:
            with self._lock:
                self._running.discard(p)
        if p.returncode != 0:
            tail = " ".join(err.strip().splitlines()[-3:])[-STDERR_SHOWN:]
            return Outcome(error=f"external.command exited with status {p.returncode}" + (f": {tail}" if tail else ""))
        outcome = parse_reward_line(out)
        if outcome.error:
            outcome.error = f"external.command: {outcome.error}"
        return outcome

    def kill_all(self) -> None:
        """Kill every command still running (Ctrl-C, an error of the trainer)."""
        with self._lock:
            running = list(self._running)
        for p in running:
            _kill(p)


def _kill(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class GatewayEpisode:
    """One finished episode: its Rollout (the trained segment), reward, outcome and the gateway's record."""

    example: Any
    rollout: Rollout
    reward: Reward
    outcome: Outcome
    record: Any  # rlvr.gateway.record.EpisodeRecord
    segments: int


class GatewayRunner:
    """Runs episodes through the gateway for the trainer (the EnvRunner protocol of rlvr.envs.task: rollouts,
    metrics, evaluate, prompt). episode_fn runs one episode (CommandEpisodes, a verifiers rollout);
    reward_fn scores the last answer when the episode gives no reward (None: it must give one)."""

    def __init__(self, name: str, tokenizer, episode_fn: EpisodeFn, *, reward_fn=None, prompt_fn=None,
                 max_parallel: int = 8, timeout_s: float = 300.0, max_tokens_total: int = 256, max_calls: int = 4,
                 tool_parser: str = "hermes", model_name: str = "policy"):
        self.name = name
        self.tokenizer = tokenizer
        self.episode_fn = episode_fn
        self.reward_fn = reward_fn
        self.prompt_fn = prompt_fn or (lambda ex: str(ex.question))
        self.max_parallel, self.timeout_s = max_parallel, timeout_s
        self.max_tokens_total, self.max_calls = max_tokens_total, max_calls
        self.tool_parser, self.model_name = tool_parser, model_name
        self._gateway = None
        self._generator = None
        self._pending: list[GatewayEpisode] = []
        self._gw_metrics: dict[str, float] = {}

    # -- the gateway, started on first use and kept for the run --------------------------------------------------
    def gateway(self, generator, spec: SamplingSpec):
        if self._gateway is not None and self._generator is not generator:
            self.close()
        if self._gateway is None:
            from rlvr.gateway.server import Gateway

            self._gateway = Gateway(generator, self.tokenizer, spec, model_name=self.model_name,
                                    max_batch=max(64, self.max_parallel), tool_parser=self.tool_parser).start()
            self._generator = generator
        self._gateway.spec = spec
        return self._gateway

    def close(self) -> None:
        if self._gateway is not None:
            self._gateway.stop()
        self._gateway, self._generator = None, None

    def prompt(self, example) -> str:
        return self.prompt_fn(example)

    # -- episodes --------------------------------------------------------------------------------------------------
    def episodes(self, generator, examples: Sequence[Any], spec: SamplingSpec) -> list[GatewayEpisode]:
        """len(examples) * spec.n episodes, prompt-major. spec: the run's sampling (its temperature, top-p and
        top-k are the gateway's; its max_tokens caps each call; its stop strings, sampling.stop (the task's are not
        set: the agent writes its own prompts), join each request's)."""
        gw = self.gateway(generator, replace(spec, n=1))
        base = spec.seed if spec.seed is not None else int(torch.randint(0, 2**62, (), dtype=torch.int64))
        jobs = [(i, j, ex) for i, ex in enumerate(examples) for j in range(spec.n)]
        keys = [gw.open_episode(f"{getattr(ex, 'id', i)}#{j}", seed=sequence_seed(base, i, j),
                                max_tokens_total=self.max_tokens_total, max_calls=self.max_calls)
                for i, j, ex in jobs]
        run = lambda job_key: self._run_one(job_key[0][2], gw.base_url, job_key[1])  # noqa: E731
        pool = ThreadPoolExecutor(self.max_parallel, thread_name_prefix="rlvr-episode")
        try:
            outcomes = list(pool.map(run, zip(jobs, keys, strict=True)))
        except BaseException:  # Ctrl-C or a bug: no agent is left running, no key left open
            kill = getattr(self.episode_fn, "kill_all", None)
            if kill is not None:
                kill()
            pool.shutdown(wait=False, cancel_futures=True)
            for k in keys:
                gw.close_episode(k)
            raise
        pool.shutdown()
        records = [gw.close_episode(k) for k in keys]
        out = [self._episode(i, j, ex, rec, oc, spec)
               for (i, j, ex), rec, oc in zip(jobs, records, outcomes, strict=True)]
        self._gw_metrics = gw.metrics()
        return out

    def _run_one(self, example, base_url: str, key: str) -> Outcome:
        try:
            return self.episode_fn(example, base_url, key, self.model_name, self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - an episode function's bug is that episode's error
            return Outcome(error=f"{self.name}: the episode raised {type(exc).__name__}: {exc}"[:400])

    def _episode(self, i: int, j: int, example, record, outcome: Outcome, spec: SamplingSpec) -> GatewayEpisode:
        segments = record.segments()
        error = outcome.error
        if not error and not segments:
            error = f"{self.name}: the episode made no call to the gateway" + (
                f" ({record.errors[0]})" if record.errors else "")
        if error:
            reward = Reward(0.0, {}, Status.ERROR, error)
        elif outcome.reward is not None:
            reward = Reward(outcome.reward, {"episode": outcome.reward}, Status.CORRECT if outcome.reward > 0
                            else Status.INCORRECT, "")
        elif self.reward_fn is None:
            reward = Reward(0.0, {}, Status.ERROR, f"{self.name}: the episode gave no reward")
        else:
            reward = _safe_reward(self.reward_fn, record.last_text, example)
        if segments:
            rows = [self._segment_rollout(seg, i, j, spec) for seg in segments]
            ro = replace(rows[-1], text=record.last_text, earlier_segments=rows[:-1] or None)
        else:  # nothing was sampled: one masked token keeps the row's shape (its advantage is 0: unscored)
            prompt = self.prompt_fn(example)
            ids = list(self.tokenizer.encode(prompt)) or [self.tokenizer.eos_token_id or 0]
            ro = Rollout(prompt=prompt, prompt_ids=ids, response_ids=[self.tokenizer.eos_token_id or 0], text="",
                         logprobs=[0.0] if spec.logprobs else None, finish_reason="stop", group=i,
                         weight_version=getattr(self._generator, "weight_version", 0), sample_index=j,
                         loss_mask=[False])
        return GatewayEpisode(example, ro, reward, outcome, record, len(segments))

    def _segment_rollout(self, seg, i: int, j: int, spec: SamplingSpec) -> Rollout:
        return Rollout(prompt=self.tokenizer.decode(seg.prompt_ids), prompt_ids=list(seg.prompt_ids),
                       response_ids=list(seg.response_ids),
                       text=self.tokenizer.decode([t for t, m in zip(seg.response_ids, seg.loss_mask, strict=True)
                                                   if m], skip_special_tokens=True),
                       logprobs=list(seg.logprobs) if spec.logprobs else None,
                       finish_reason="length" if seg.finish_reason == "length" else "stop", group=i,
                       weight_version=min(seg.weight_versions), sample_index=j, stop_reason=None,
                       loss_mask=list(seg.loss_mask))

    # -- the EnvRunner protocol ------------------------------------------------------------------------------------
    def rollouts(self, generator, examples: Sequence[Any], spec):
        eps = self.episodes(generator, examples, spec)
        self._pending += eps
        return [e.rollout for e in eps], [e.reward for e in eps]

    def metrics(self) -> dict[str, float]:
        """The step's gateway/* metrics: episodes, errors by kind, calls and segments per episode, tokens of
        dropped segments, and the gateway's own (batch sizes, overhead per call)."""
        m, self._pending = episode_metrics(self._pending) | self._gw_metrics, []
        self._gw_metrics = {}
        return m

    def evaluate(self, generator, examples: Sequence[Any], spec, *, chunk_size: int = 0,
                 samples: int = 0) -> dict[str, Any]:
        """Held-out metrics of one episode per example: accuracy (share with a positive reward), reward (mean
        over scored episodes), error share, len/mean and the gateway/* metrics."""
        eps: list[GatewayEpisode] = []
        step = chunk_size or len(examples) or 1
        for s in range(0, len(examples), step):
            eps += self.episodes(generator, examples[s: s + step], replace(spec, n=1))
        scored = [e for e in eps if e.reward.status is not Status.ERROR]
        n = max(1, len(eps))
        out: dict[str, Any] = {
            "accuracy": sum(e.reward.status is Status.CORRECT for e in eps) / n,
            "reward": sum(e.reward.total for e in scored) / max(1, len(scored)),
            "error_rate": (len(eps) - len(scored)) / n,
            "len/mean": sum(sum(e.rollout.loss_mask or []) for e in eps) / n,
        }
        out.update(episode_metrics(eps))
        if samples:
            out["samples"] = [{"source": "eval", "prompt": e.rollout.prompt, "response": e.rollout.text,
                               "reference": getattr(e.example, "reference", ""), "reward": e.reward.total,
                               "status": e.reward.status.value, "error": e.reward.info if e.reward.status is
                               Status.ERROR else ""} for e in eps[:samples]]
        return out


def _safe_reward(reward_fn, text: str, example) -> Reward:
    try:
        return reward_fn(text, example)
    except Exception as exc:  # noqa: BLE001 - a checker's failure is that episode's error, never a 0
        return Reward(0.0, {}, Status.ERROR, f"the task's checker raised {type(exc).__name__}: {exc}"[:300])


def episode_metrics(episodes: Sequence[GatewayEpisode], prefix: str = "gateway/") -> dict[str, float]:
    n = len(episodes)
    if not n:
        return {}
    errors = [e for e in episodes if e.reward.status is Status.ERROR]
    kinds = {"timeout": "timeout_s", "exited": "exited with status", "bad_json": "stdout line",
             "no_call": "no call to the gateway"}
    m = {f"{prefix}episodes": float(n), f"{prefix}error_frac": len(errors) / n,
         f"{prefix}calls_per_episode": sum(len(e.record.calls) for e in episodes) / n,
         f"{prefix}split_episodes": float(sum(e.segments > 1 for e in episodes)),
         f"{prefix}refused_requests": float(sum(len(e.record.errors) for e in episodes))}
    for kind, mark in kinds.items():
        m[f"{prefix}errors/{kind}"] = float(sum(mark in (e.reward.info or "") for e in errors))
    earlier = sum(sum(sum(seg.loss_mask) for seg in e.rollout.earlier_segments or ()) for e in episodes)
    m[f"{prefix}earlier_segment_tokens"] = float(earlier)  # sampled tokens of earlier segments (trained too)
    return m


def external_task_data(task, data_cfg, ext, tokenizer):
    """The TaskData of data.env=external: the task's problems and checker (`task`, loaded as without data.env),
    its episodes run by external.command through the gateway."""
    runner = GatewayRunner("external.command", tokenizer, CommandEpisodes(ext.command), reward_fn=task.reward_fn,
                           prompt_fn=lambda ex: str(ex.question), max_parallel=ext.max_parallel,
                           timeout_s=ext.timeout_s, max_tokens_total=data_cfg.env_max_tokens,
                           max_calls=data_cfg.env_max_turns, tool_parser=ext.tool_parser)
    return replace(task, name=f"external:{task.name}", prompt=runner.prompt, stop=(), env=runner)


def verifiers_task_data(data_cfg, ext, tokenizer, *, train: bool = True):
    """The TaskData of data.env=verifiers:<env>: the environment's datasets, its rollouts through the gateway,
    its rubric the reward."""
    from rlvr.data.task_data import TaskData
    from rlvr.envs.verifiers_env import load_verifiers_env, run_verifiers_episode, verifiers_examples

    spec = data_cfg.env.split(":", 1)[1]
    env = load_verifiers_env(spec, dict(ext.env_args), max_turns=data_cfg.env_max_turns)

    def episode(example, base_url: str, api_key: str, model: str, timeout_s: float) -> Outcome:
        reward, error = run_verifiers_episode(env, example, base_url, api_key, model, timeout_s)
        return Outcome(error=error or "verifiers: no reward") if reward is None else Outcome(reward=reward)

    runner = GatewayRunner(f"verifiers:{spec}", tokenizer, episode, prompt_fn=lambda ex: str(ex.question),
                           max_parallel=ext.max_parallel, timeout_s=ext.timeout_s,
                           max_tokens_total=data_cfg.env_max_tokens, max_calls=data_cfg.env_max_turns,
                           tool_parser=ext.tool_parser)
    tr = verifiers_examples(env, "train", data_cfg.num_train or None, data_cfg.seed) if train else []
    ev = verifiers_examples(env, "eval", data_cfg.num_eval or None, data_cfg.seed)
    return TaskData(name=f"verifiers:{spec}", train=tr, eval=ev, prompt=runner.prompt,
                    reward_fn=_no_text_reward, target=lambda ex: ex.solution or "", env=runner, template="chat")


def _no_text_reward(response: str, example) -> Reward:
    return Reward(0.0, status=Status.ERROR, info="verifiers environment: the reward comes from its rubric on the "
                  "episode, not from a response text")
