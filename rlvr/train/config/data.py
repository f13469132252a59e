"""The data section: task, files and columns, reward, online filter and curriculum, multi-turn environment
(DataConfig); and data.thinking_mode's rule, which every stage runs (check_thinking_mode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rlvr.config import ConfigError
from rlvr.train.config.checks import Checks, changed, default_of, error_text
from rlvr.train.config.external import EXTERNAL_ENV, VERIFIERS_PREFIX, is_gateway_env

# Training problems a synthetic task generates when data.num_train is 0 (the default), or all its distinct
# ones if fewer: a default that every task's generator can make (20000 was refused on the demo's own task).
SYNTHETIC_TRAIN = 20000


@dataclass
class DataConfig:
    """Where prompts and references come from."""

    task: str = "arithmetic"
    """Task name from rlvr.data's registry (arithmetic, gsm8k, ...): loader, prompt template and checker; or
    reasoning_gym:<dataset> (a reasoning-gym generator and its own scorer; pip install 'rlvr[reasoning-gym]')."""
    rg: dict[str, Any] = field(default_factory=dict)
    """data.task=reasoning_gym:<dataset>: the dataset's config keys, one at a time (data.rg.<key>=value) or as a
    mapping (data.rg={min_digits: 2, max_digits: 3}); {} = its defaults. Its seed and size are data.seed / num_*."""
    train_path: str = ""
    """JSONL of training examples; '' = the task's built-in source (synthetic tasks generate their own)."""
    sft_path: str = ""
    """`rlvr sft` only: JSONL to train on instead of the task's own targets: {"prompt", "response"} pairs, TRL's
    {"prompt", "completion"} (plain or conversational) or {"messages": [...]} rows."""
    eval_path: str = ""
    """JSONL of held-out examples; '' = the task's built-in held-out split."""
    hf_dataset: str = ""
    """Hugging Face dataset for the training (and, with hf_eval_split, held-out) rows instead of train_path: a hub
    id, a folder written by save_to_disk or a folder of data files (needs the `datasets` package)."""
    hf_config: str = ""
    """data.hf_dataset: its subset ("main" for openai/gsm8k); '' = the default one."""
    hf_split: str = "train"
    """data.hf_dataset: the split to train on."""
    hf_eval_split: str = ""
    """data.hf_dataset: the split of held-out problems ("test"); '' = data.eval_path or the task's own."""
    question_key: str = ""
    """Your rows' column holding the question (TRL's "prompt"), for train/eval files and data.hf_dataset; '' = the
    task's own name ("question"; MATH: "problem")."""
    answer_key: str = ""
    """Your rows' column holding the answer (a final answer for task=math; GSM8K's "... #### 42" for task=gsm8k);
    '' = the task's own name ("answer")."""
    eval_question_key: str = ""
    """Your held-out rows' column holding the question (data.eval_path, data.hf_eval_split) when it differs from
    the training rows' (a custom train file paired with MATH-500's "problem"); '' = data.question_key."""
    eval_answer_key: str = ""
    """Your held-out rows' column holding the answer, when it differs from the training rows'; '' = data.answer_key."""
    template: str = ""
    """Prompt template name (r1_zero, question_only, ...); '' = the task's default."""
    thinking_mode: Literal["", "think", "no_think"] = ""
    """Qwen3's mode switch: think or no_think appends '/think' or '/no_think' to each question (no_think needs
    sampling.thinking_budget=0: the response starts with a closed, empty think block; not with data.env); '' = no tag."""
    reward: str = ""
    """Reward function: a name from rlvr.rewards, a weighted sum 'r1_zero:1,language:0.1', or your own
    'module:function' or 'path/to/file.py:function' ((response, example) -> Reward, or a float / bool: > 0 is
    correct); '' = the task's default checker."""
    reward_workers: int = 1
    """Threads (and verifier processes) that score a rollout batch (rlvr.rewards.score_batch)."""
    reward_timeout_s: float = 0.0
    """Deadline per symbolic check (or per reward call with reward_isolate); 0 = RLVR_VERIFIER_TIMEOUT_S or 3 s."""
    reward_isolate: bool = False
    """Run every reward call in a killable worker process (for untrusted or slow reward functions)."""
    score_while_generating: bool = False
    """Score each rollout as soon as the sampler finishes it, on a background thread, while the other rows decode
    (the hf sampler hands them on: at the step a row ends, or at the CUDA-graph decode's host checks); the step
    then waits only for the last rows' rewards (time/score), time/score_while_generating says how much scoring was
    hidden. Same rewards. Worth it where responses end at different times and rewards are slow or run outside this
    process (reward_isolate's workers, a code sandbox, a judge); Python rewards on this process's threads compete
    with the decode loop for the GIL. Off by default: not yet measured on a GPU. Refused where the sampler returns
    every rollout at once (vllm, a thinking budget, data.env, sampling ahead, partial rollouts, the Ray placement)."""
    num_train: int = 0
    """Synthetic tasks: how many training problems to generate, 0 = 20000 or all the task's distinct ones if
    fewer (9006 for the demo's four 1-digit terms); file tasks: cap on rows read, 0 = all."""
    num_eval: int = 200
    """Held-out problems used for periodic and final evaluation."""
    seed: int = 1234
    """Seed of the synthetic data generator and of the training-order shuffle."""
    digits: int = 3
    """Arithmetic task and the calculator / python_tool environments: digits per operand."""
    operands: int = 2
    """Arithmetic task only: terms per problem ("3+5+7=" has 3)."""
    verifier_tolerance: Literal["", "strict", "lenient"] = ""
    """Numeric tolerance of the math verifier: strict (agreement to ~6 significant digits: 3.14 is not pi)
    or lenient (3 significant digits, the old rule); '' = the process default (strict, or the
    RLVR_VERIFIER_TOLERANCE environment variable). See docs/verifier.md."""
    filter_band: str = ""
    """rlvr train: keep only problems whose latest pass-rate estimate is in this band (medium = (0, 1),
    never-solved, not-always-solved, solved-at-least-once, or an interval such as [0.1, 0.9]); problems
    not measured yet are kept; '' = no online filter. See docs/filtering.md."""
    filter_every: int = 0
    """rlvr train: re-estimate pass rates before step 1 and every N steps (filter_k samples of the next
    filter_pool problems); 0 = estimates come only from the training groups themselves."""
    filter_k: int = 8
    """data.filter_every: samples per problem of a pass-rate refresh."""
    filter_pool: int = 0
    """data.filter_every: problems per refresh (the next ones of the training stream); 0 = every training problem."""
    curriculum: Literal["", "pass_rate"] = ""
    """rlvr train: pass_rate = draw each step's problems by estimated pass rate (weight 4r(1-r) +
    curriculum_floor, unmeasured problems count as 0.5) instead of the shuffled stream; '' = stream."""
    curriculum_floor: float = 0.05
    """data.curriculum=pass_rate: weight added to every problem, so none becomes unreachable."""
    env: str = ""
    """Multi-turn environment from rlvr.envs (calculator, python_tool, code_repair): rollouts are episodes with
    tool calls and the reward comes from the environment; external = your agent program (external.command) on
    the task's problems, through the OpenAI-compatible rollout gateway; verifiers:<env> = a verifiers
    environment, through the gateway; '' = single-turn task. See docs/agents.md."""
    env_max_turns: int = 4
    """data.env: model turns per episode (through the gateway: calls per episode; one more is refused)."""
    env_max_tokens: int = 256
    """data.env: token budget per episode after the prompt (model turns + tool output); sampling.max_tokens caps
    each turn."""
    env_integrity: Literal["zero", "report"] = "zero"
    """data.env: an integrity flag (git history, remotes, network, test edits, ...) zeroes the episode's reward
    (zero) or is only logged (report)."""
    env_chat: Literal["auto", "chat", "plain"] = "auto"
    """data.env: lay the transcript out with the tokenizer's chat template (auto: when it has one) or as plain text."""

    def validate(self) -> None:
        """Task, template and reward names, files and ranges. Whether a synthetic task has as many
        distinct problems as asked for depends on which splits the command reads:
        check_problem_counts, called by the trainer configs' validate()."""
        from rlvr.data import PROMPT_TEMPLATES, TASKS

        c = Checks("data")
        c.choices(self)
        if self.filter_band:
            from rlvr.data.filters import Band

            try:
                Band.parse(self.filter_band)
            except ValueError as exc:
                c.error(f"data.filter_band={self.filter_band!r}: {error_text(exc)}")
        c.at_least("filter_every", self.filter_every, 0)
        c.at_least("filter_k", self.filter_k, 1)
        c.at_least("filter_pool", self.filter_pool, 0)
        c.at_least("curriculum_floor", self.curriculum_floor, 0)
        if self.filter_every and not (self.filter_band or self.curriculum):
            c.error(f"data.filter_every={self.filter_every} refreshes pass rates that nothing reads: set "
                    "data.filter_band or data.curriculum=pass_rate too")
        for problem in self.inert_problems():
            c.error(problem)
        if self.env.startswith(VERIFIERS_PREFIX):
            from rlvr.envs.verifiers_env import check_verifiers_spec

            if (problem := check_verifiers_spec(self.env[len(VERIFIERS_PREFIX):])) is not None:
                c.error(f"data.env={self.env!r}: {problem}")
        elif self.env and self.env != EXTERNAL_ENV:
            from rlvr.envs import ENVIRONMENTS

            c.one_of("env", self.env, [*sorted(ENVIRONMENTS), EXTERNAL_ENV, VERIFIERS_PREFIX + "<environment>"])
        if self.env:
            c.at_least("env_max_turns", self.env_max_turns, 1)
            c.at_least("env_max_tokens", self.env_max_tokens, 1)
            if self.filter_band or self.curriculum:
                c.error("data.env: the online filter and the curriculum (data.filter_band, data.curriculum) "
                        "sample single responses; they do not run episodes yet")
        task = TASKS.get(self.task)
        if is_reasoning_gym(self.task):  # reasoning_gym:<dataset>: the package, the name and data.rg checked now
            from rlvr.data.tasks.reasoning_gym import config_problems, rg_task

            problems = config_problems(self.task, self.rg)
            for problem in problems:
                c.error(problem)
            task = None if problems else rg_task(self.task)
        elif task is None:
            c.one_of("task", self.task, sorted(TASKS))
        template_ok = not self.template or self.template in PROMPT_TEMPLATES or "{question}" in self.template
        if not template_ok:
            c.error(f"data.template={self.template!r} is unknown; known: "
                    f"{', '.join(repr(k) for k in sorted(PROMPT_TEMPLATES))}, or a template text containing {{question}}")
        if self.reward:
            from rlvr.rewards.batch import resolve_reward_fn

            try:
                if not callable(resolve_reward_fn(self.reward)):
                    raise TypeError(f"{self.reward} is not a function")
            except (KeyError, ValueError, TypeError) as exc:
                c.error(f"data.reward={self.reward!r}: {error_text(exc)}")
            except (ImportError, AttributeError) as exc:  # a 'module:function' of the user's that does not load
                c.error(f"data.reward={self.reward!r}: {type(exc).__name__}: {exc} (a 'module:function' reward must "
                        "be importable: installed, on PYTHONPATH or in the current folder; or give its file, "
                        "path/to/file.py:function)")
        elif task is not None and template_ok:
            try:
                task.reward_name(self.template or None)
            except KeyError as exc:
                c.error(f"data.template={self.template!r}: {error_text(exc)}; set data.reward")
        for name in ("train_path", "eval_path", "sft_path"):
            c.file(name, getattr(self, name))
        if self.hf_dataset:
            if self.train_path:
                c.error(f"data.hf_dataset={self.hf_dataset!r} and data.train_path={self.train_path!r} are two "
                        "sources of training rows: give one")
            if self.hf_eval_split and self.eval_path:
                c.error(f"data.hf_eval_split={self.hf_eval_split!r} and data.eval_path={self.eval_path!r} are two "
                        "sources of held-out rows: give one")
            if task is not None and task.parse_row is None:
                c.error(f"data.hf_dataset: task {self.task!r} generates its own problems; use a task that reads "
                        "rows (gsm8k, math, ...)")
            try:
                import datasets  # noqa: F401
            except ImportError:
                c.error(f"data.hf_dataset={self.hf_dataset!r} needs the `datasets` package: pip install datasets")
        else:
            for name in ("hf_config", "hf_eval_split", "hf_split"):
                if changed(self, name):
                    c.error(f"data.{name}={getattr(self, name)!r} applies to data.hf_dataset, which is not set: "
                            f"set data.hf_dataset, or leave data.{name}={default_of(self, name)!r}")
        c.at_least("reward_workers", self.reward_workers, 1)
        c.at_least("reward_timeout_s", self.reward_timeout_s, 0)
        c.at_least("num_train", self.num_train, 0)
        c.at_least("num_eval", self.num_eval, 0)
        c.at_least("digits", self.digits, 1)
        c.at_least("operands", self.operands, 2)
        c.done()

    def inert_problems(self) -> list[str]:
        """The data keys set to a non-default value that another data key makes do nothing, one line each naming
        both keys (issue 36: a key accepted and ignored is refused). A default is never refused."""
        out = []
        if self.env:
            inert = _EXTERNAL_INERT_DATA if self.env == EXTERNAL_ENV else _ENV_INERT_DATA
            if is_gateway_env(self.env):
                inert = inert | _GATEWAY_INERT_DATA
            for name, why in inert.items():
                if changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)!r} has no effect with data.env={self.env!r}: {why}; "
                               f"leave data.{name}={default_of(self, name)!r} with data.env")
            if changed(self, "digits") and not is_gateway_env(self.env) and _env_knobs(self.env) == ():
                out.append(f"data.digits={self.digits} has no effect with data.env={self.env!r}: its generator takes "
                           f"no digits (calculator and python_tool do); leave data.digits={default_of(self, 'digits')} "
                           "with this environment")
        else:
            for name in ("env_max_turns", "env_max_tokens", "env_integrity", "env_chat"):
                if changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)!r} applies to data.env (multi-turn episodes), "
                               f"which is not set: set data.env, or leave data.{name}={default_of(self, name)!r}")
            for name in ("eval_question_key", "eval_answer_key"):
                if changed(self, name) and not (self.eval_path or (self.hf_dataset and self.hf_eval_split)):
                    out.append(f"data.{name}={getattr(self, name)!r} names a column of your held-out rows, but none "
                               "are read (data.eval_path is empty, and no data.hf_eval_split of data.hf_dataset): "
                               f"give data.eval_path, or leave data.{name} empty")
            for name in ("question_key", "answer_key"):
                if changed(self, name) and not (self.train_path or self.eval_path or self.hf_dataset):
                    out.append(f"data.{name}={getattr(self, name)!r} names a column of your rows, but no rows are read "
                               f"(data.train_path, data.eval_path and data.hf_dataset are empty: task {self.task!r} "
                               f"uses its built-in problems): give a file or data.hf_dataset, or leave data.{name} "
                               "empty")
        if changed(self, "rg") and not is_reasoning_gym(self.task):
            out.append(f"data.rg={self.rg!r} configures a reasoning-gym dataset, but data.task={self.task!r} is not "
                       "one: set data.task=reasoning_gym:<dataset>, or leave data.rg empty")
        if not self.filter_every:
            for name in ("filter_k", "filter_pool"):
                if changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)} sizes the pass-rate refresh of data.filter_every, "
                               f"which is 0 (no refresh): set data.filter_every > 0, or leave "
                               f"data.{name}={default_of(self, name)}")
        if changed(self, "curriculum_floor") and self.curriculum != "pass_rate":
            out.append(f"data.curriculum_floor={self.curriculum_floor} weights the problems of data.curriculum="
                       f"pass_rate, which is not set (data.curriculum={self.curriculum!r}): set data.curriculum="
                       f"pass_rate, or leave data.curriculum_floor={default_of(self, 'curriculum_floor')}")
        return out

    def env_makes_problems(self) -> bool:
        """data.env makes the problems (a built-in environment's generator or files, a verifiers environment's
        dataset); data.env=external reads the task's (data.task, its files)."""
        return bool(self.env) and self.env != EXTERNAL_ENV

    def generated_train_count(self) -> int:
        """How many training problems a generator makes: data.num_train, or (0) SYNTHETIC_TRAIN, capped at the
        task's distinct training problems with these settings (when countable)."""
        if self.num_train:
            return self.num_train
        from rlvr.data import TASKS

        task = TASKS.get(self.task)
        if self.env_makes_problems() or task is None or task.capacity is None:
            return SYNTHETIC_TRAIN
        try:
            have = task.capacity("train", **self._knobs())
        except ValueError:
            return SYNTHETIC_TRAIN  # the generator names the problem itself
        return SYNTHETIC_TRAIN if have is None else min(SYNTHETIC_TRAIN, have)

    def _knobs(self) -> dict:
        # The generator knobs rlvr.train.tasks passes for this task (its _difficulty; a test checks they
        # agree): each is the config key data.<knob>.
        return {"digits": self.digits, "operands": self.operands} if self.task == "arithmetic" else {}

    def check_problem_counts(self, splits: tuple[str, ...] = ("train", "test")) -> None:
        """Refuse data.num_train / data.num_eval above the number of distinct problems a synthetic
        task's generator can make of that split ("train" / "test") with these settings: counted, not
        drawn (drawing them all is slow for a large split). A split read from a file is not checked."""
        from rlvr.data import TASKS

        task = TASKS.get(self.task)
        if self.env_makes_problems() or task is None or task.capacity is None:  # environments generate their own problems
            return
        c = Checks("data")
        knobs = self._knobs()
        for name, n, split, path_key in (("num_train", self.num_train, "train", "train_path"),
                                         ("num_eval", self.num_eval, "test", "eval_path")):
            if split not in splits or getattr(self, path_key) or (name == "num_train" and not n):
                continue  # num_train=0: as many as there are, up to SYNTHETIC_TRAIN
            try:
                have = task.capacity(split, **knobs)
            except ValueError as exc:
                c.error(f"data (task={self.task!r}): {exc}")
                break
            if have is not None and n > have:
                settings = ", ".join(f"data.{k}={v}" for k, v in knobs.items()) or "its generator's settings"
                fix = f"raise {' or '.join(f'data.{k}' for k in knobs)}" if knobs else f"give data.{path_key}"
                c.error(f"data.{name}={n}: task {self.task!r} has only {have} distinct "
                        f"{'training' if split == 'train' else 'held-out'} problems with {settings}; "
                        f"lower data.{name} or {fix}")
        c.done()


def is_reasoning_gym(task: str) -> bool:
    """data.task names a reasoning-gym dataset (reasoning_gym:<dataset>, rlvr.data.tasks.reasoning_gym)."""
    return task.startswith("reasoning_gym:")


# Data keys that do nothing with data.env (rlvr.envs.task.env_task_data reads none of them), and why.
_ENV_INERT_DATA = {
    "task": "the environment makes the problems and scores the episodes (the task is not read)",
    "template": "the environment lays out its own prompts and turns (data.env_chat)",
    "thinking_mode": "the environment lays out its own prompts and turns; no thinking-mode tag is added",
    "reward": "the environment scores each episode itself; no reward function is called",
    "reward_timeout_s": "the environment scores each episode itself; no reward function is called",
    "reward_isolate": "the environment scores each episode itself; no reward function is called",
    "verifier_tolerance": "the environment scores each episode itself; the task's math verifier is not called",
    "hf_dataset": "the environment generates its problems or reads data.train_path / data.eval_path rows",
    "question_key": "the environment reads the 'question' and 'reference' keys of data.train_path / data.eval_path rows",
    "answer_key": "the environment reads the 'question' and 'reference' keys of data.train_path / data.eval_path rows",
    "eval_question_key": "the environment reads the 'question' and 'reference' keys of data.train_path / data.eval_path rows",
    "eval_answer_key": "the environment reads the 'question' and 'reference' keys of data.train_path / data.eval_path rows",
    "operands": "only the arithmetic task's generator reads it (an environment's generator takes data.digits at most)",
}


# ... with data.env=external (the task's problems and checker are used: the command gets the problem, the checker
# scores the last answer when the command prints no reward)
_EXTERNAL_INERT_DATA = {
    "template": "the agent program writes its own messages; the gateway applies the model's chat template",
    "thinking_mode": "the agent program writes its own messages; no thinking-mode tag is added",
}
# ... with any env run through the gateway (external, verifiers:<env>)
_GATEWAY_INERT_DATA = {
    "env_integrity": "the built-in environments' integrity rules do not run in an agent program",
    "env_chat": "the gateway lays chat requests out with the model's chat template (/v1/chat/completions) and "
                "takes /v1/completions prompts as they come",
}


def _env_knobs(env: str) -> tuple[str, ...] | None:
    """The data keys an environment's problem generator takes (the calculator's digits), None for an unknown name
    (DataConfig.validate names it). rlvr.envs imports torch: only here."""
    import inspect

    from rlvr.envs import ENVIRONMENTS

    cls = ENVIRONMENTS.get(env)
    if cls is None:
        return None
    return tuple(k for k in ("digits",) if k in inspect.signature(cls.generate_examples).parameters)


def refuse_score_while_generating(data: DataConfig, command: str) -> None:
    """data.score_while_generating is rlvr train's (its synchronous source scores the hf sampler's rollouts as they
    finish); another command that scores after generating refuses a value it would not act on."""
    if data.score_while_generating:
        raise ConfigError(f"data.score_while_generating=true applies to rlvr train only; {command} scores its "
                          "samples after generating them (leave it false)")


def check_thinking_mode(data: DataConfig, sampling, command: str = "") -> None:
    """data.thinking_mode: no_think closes the think block at once (sampling.thinking_budget=0, rlvr.rollout.
    thinking); a command that trains on fixed targets (sft, distill) cannot switch its targets' mode."""
    mode = data.thinking_mode
    if not mode:
        return
    if command:
        raise ConfigError(f"data.thinking_mode={mode!r}: `{command}` trains on fixed targets whose thinking does not "
                          "follow a tag; the switch is for sampling commands (rlvr train, eval, ei, filter)")
    if mode == "no_think" and sampling.thinking_budget != 0:
        raise ConfigError(f"data.thinking_mode=no_think answers without reasoning: set sampling.thinking_budget=0 (the "
                          f"closed, empty think block starts the response; it is {sampling.thinking_budget})")
