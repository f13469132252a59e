"""`data.env=verifiers:<env>`: a `verifiers` environment (PyPI `verifiers` >= 0.4, prime-intellect's environment
format) run against an OpenAI-compatible endpoint (the rollout gateway, rlvr.gateway), its rubric the reward.

What a verifiers 0.4 environment is (the `verifiers.v1` API; verified against verifiers 0.4.0): a package that
exports a `vf.Taskset` subclass through `__all__` (optionally also an `vf.Env` subclass, for several agents, and a
`vf.Harness`). `Taskset.load()` yields `vf.Task`s; a task's `data` (`vf.TaskData`, frozen pydantic) holds the prompt
(a string or chat messages), an optional system prompt and the taskset's own fields (usually `answer`); its
`@vf.reward` methods score a finished `vf.Trace` (weighted sum = `trace.reward`). One episode is
`Env.run_episode(task, ModelContext)` inside `Env.serving()`: each agent's harness program talks to a local
interception server that forwards every model call to the endpoint and records it on the trace, then the task scores
the trace. There is no `load_environment(**kwargs)` / `SingleTurnEnv` / `Rubric` in 0.4 (that was the 0.1 API).

rlvr runs every agent with its own harness, `rlvr_vf_chat` (below): the chat loop of verifiers' tool-less `null`
harness, run in-process (one chat completion per turn, non-streaming, until a reply without tool calls; the tools are
the MCP tools of the task's toolsets) instead of as a `uv run` script, so nothing is downloaded and no harness
process is started. The runtime is the local `subprocess` one (a temporary directory; verifiers' default is a remote
sandbox). A toolset's server is verifiers' own: `python -m <the toolset's module>` in that runtime, so an
environment with tools must be importable by its module name there (installed, or on PYTHONPATH; not a .py file
given by path). `harness=` picks another verifiers harness by id (e.g. "null", "bash": those install their program
with uv, network needed). No retries (verifiers' are off by default; a retry would add calls to the episode's key).

verifiers is imported inside the functions: rlvr works without it, and a missing package is an error naming the
extra (`pip install 'rlvr[verifiers]'`) only when a verifiers environment is used.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.data.example import Example

INSTALL_HINT = "pip install 'rlvr[verifiers]'"
CHAT_HARNESS = "rlvr_vf_chat"  # the harness id rlvr registers (a module name: verifiers resolves harnesses by module)
MODULE_PREFIX = "rlvr_vf_"  # the module name a file or dotted-module environment is registered under
ERROR_CHARS = 600  # characters of an episode's error message kept
EVAL_SPLITS = ("eval", "test", "validation", "val")
_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w-]*(?:@[\w.+-]+)?$")  # [owner/]name[@version]


def import_verifiers():
    """`verifiers.v1`, or an ImportError that names the extra to install."""
    try:
        import verifiers.v1 as vf
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "verifiers":
            raise ImportError(f"data.env=verifiers:... needs the verifiers package (>= 0.4): {INSTALL_HINT}") from exc
        raise
    return vf


# ---------------------------------------------------------------------------------------------------- the spec

def _plugin_module(name: str) -> str:
    """The module verifiers imports for an environment id (its loader: `owner/name@version` -> `name`, `-` -> `_`)."""
    return name.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def _is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec and not _ID.match(spec)


def check_verifiers_spec(spec: str) -> str | None:
    """The problem with `data.env=verifiers:<spec>`, or None. Imports neither verifiers nor the environment (nor
    torch; of a dotted module path only its parent package, as `importlib.util.find_spec` does): checks the
    spelling, that verifiers is installed and that the file / module / package can be found. Whether it exports a
    Taskset is known when it is loaded (load_verifiers_env)."""
    spec = (spec or "").strip()
    if not spec:
        return "data.env=verifiers:<env> needs an environment: an installed environment package id, a module path or a .py file"
    verifiers = importlib.util.find_spec("verifiers")
    if verifiers is None:
        return f"data.env=verifiers:{spec} needs the verifiers package (>= 0.4): {INSTALL_HINT}"
    if _is_file_spec(spec):
        if not spec.endswith(".py"):
            return f"verifiers environment {spec!r}: a file must be a .py file"
        return None if Path(spec).is_file() else f"verifiers environment {spec!r}: no such file"
    if "/" not in spec and "@" not in spec and "." in spec:  # a dotted module path
        try:
            found = importlib.util.find_spec(spec)
        except (ImportError, ValueError):
            found = None
        return None if found is not None else f"verifiers environment {spec!r}: no module {spec!r} (tried to find it on sys.path)"
    if not _ID.match(spec):
        return (f"verifiers environment {spec!r}: not an environment id ([owner/]name[@version]), a dotted module "
                "path or a .py file")
    module = _plugin_module(spec)
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    builtin = [Path(p) / "v1" / "tasksets" / module for p in (verifiers.submodule_search_locations or [])]
    if not found and not any(p.is_dir() or p.with_suffix(".py").is_file() for p in builtin):  # verifiers' own
        return (f"verifiers environment {spec!r}: no installed package {module!r} (tried verifiers.v1.tasksets.{module} "
                f"and {module}; install the environment first, e.g. `prime env install "
                f"{spec if '/' in spec else '<owner>/' + spec}`)")
    return None


def _register(name: str, module: types.ModuleType) -> str:
    existing = sys.modules.get(name)
    if existing is not None and existing is not module:
        raise ValueError(f"module name {name!r} is taken by another module")
    sys.modules[name] = module
    return name


def _alias(text: str) -> str:
    return MODULE_PREFIX + re.sub(r"[^0-9a-z_]", "_", text.lower())


def _module_id(spec: str) -> str:
    """The id verifiers' loader resolves for `spec`: an installed package's own id, or the module name a file / dotted
    module is registered under (verifiers imports plugins by a plain module name only)."""
    if _is_file_spec(spec):
        path = Path(spec).resolve()
        if not path.is_file():
            raise ValueError(f"verifiers environment {spec!r}: no such file (tried {path})")
        name = _alias(path.stem)
        existing = sys.modules.get(name)
        if existing is not None and Path(getattr(existing, "__file__", "") or "").resolve() == path:
            return name
        name = _alias(f"{path.stem}_{abs(hash(str(path))):x}") if existing is not None else name
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"verifiers environment {spec!r}: cannot import {path} as a module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            module_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ValueError(f"verifiers environment {spec!r}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
        return name
    if "/" not in spec and "@" not in spec and "." in spec:
        try:
            module = importlib.import_module(spec)
        except ImportError as exc:
            raise ValueError(f"verifiers environment {spec!r}: cannot import module {spec!r}: {exc}") from exc
        return _register(_alias(spec), module)
    if not _ID.match(spec):
        raise ValueError(f"verifiers environment {spec!r}: not an environment id ([owner/]name[@version]), a dotted "
                         "module path or a .py file")
    return spec


# ---------------------------------------------------------------------------------------------------- the harness

@functools.cache
def register_chat_harness() -> str:
    """Register rlvr's in-process chat harness with verifiers (as the module `rlvr_vf_chat`) and return its id."""
    vf = import_verifiers()
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.runtimes import ProgramResult

    class RlvrChatHarnessConfig(vf.HarnessConfig):
        """rlvr's in-process chat loop (no settings of its own)."""

    class RlvrChatHarness(vf.Harness[RlvrChatHarnessConfig]):
        """verifiers' `null` harness (a tool-less chat loop, or the taskset's MCP tools), run in this process: every
        model call goes to the rollout's interception endpoint, which records it and forwards it upstream."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_MCP = True
        SUPPORTS_RESUME = True
        SUPPORTS_TOOL_INTERCEPTION = True
        EXECUTES_CODE = False
        NEEDS_CONTAINER = False

        async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
            system, prompt = self.resolve_prompt(data)
            messages: list[dict] = [{"role": "system", "content": system}] if system else []
            if isinstance(prompt, str):
                messages.append({"role": "user", "content": prompt})
            elif prompt:
                messages += [message_to_wire(m) for m in prompt]
            await chat_loop(endpoint, secret, ctx.model, messages, mcp_urls, self.config.tool_timeout,
                            tool_interception_url)
            return ProgramResult(exit_code=0, stdout="", stderr="")

    module = types.ModuleType(CHAT_HARNESS, RlvrChatHarness.__doc__)
    module.__spec__ = importlib.machinery.ModuleSpec(CHAT_HARNESS, None)
    module.RlvrChatHarness, module.RlvrChatHarnessConfig = RlvrChatHarness, RlvrChatHarnessConfig
    module.__all__ = ["RlvrChatHarness", "RlvrChatHarnessConfig"]
    return _register(CHAT_HARNESS, module)


async def chat_loop(endpoint: str, secret: str, model: str, messages: list[dict], mcp_urls: dict[str, str],
                    tool_timeout: float, tool_interception_url: str | None) -> None:
    """The model's turns until a reply without tool calls: one non-streaming chat completion per turn."""
    from contextlib import AsyncExitStack

    import httpx
    from openai import AsyncOpenAI

    async with AsyncExitStack() as stack:
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=httpx.Timeout(None, connect=10.0))
        stack.push_async_callback(client.close)
        tools: list[dict] = []
        dispatch: dict = {}
        servers: dict = {}
        if mcp_urls:
            from verifiers.v1.harnesses.utils.mcp import connect_mcp
            config = {"mcpServers": {name: {"url": url, "timeout": tool_timeout} for name, url in mcp_urls.items()}}
            tools, dispatch, servers = await connect_mcp(config, stack)
        gate = None
        if tool_interception_url and tools:
            gate = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
            stack.push_async_callback(gate.aclose)
        while True:
            completion = await client.chat.completions.create(model=model, messages=messages,
                                                              **({"tools": tools} if tools else {}))
            message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                 "content": await _run_tool(call, dispatch, servers, gate, tool_interception_url,
                                                            secret)})


async def _run_tool(call, dispatch: dict, servers: dict, gate, gate_url: str | None, secret: str) -> Any:
    """One tool call's result: the MCP tool's output, the policy's stand-in when the rollout's gate denies it, or an
    error text the model reads (bad arguments, an unknown tool)."""
    if gate is not None:
        from verifiers.v1.harnesses.utils.core import gate_tool_call
        decision = await gate_tool_call(gate, gate_url, secret, call)
        if decision["action"] == "deny":  # the policy's tool message stands in for the call's result
            return decision["message"].get("content", "")
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
    if not isinstance(arguments, dict):
        return f"error: tool arguments must be a JSON object, got {type(arguments).__name__}"
    if call.function.name not in dispatch:
        return f"error: unknown tool {call.function.name!r}"
    from verifiers.v1.harnesses.utils.mcp import call_mcp
    return await call_mcp(servers, dispatch, call.function.name, arguments)


# ---------------------------------------------------------------------------------------------------- the environment

@dataclass
class VerifiersEnv:
    """A loaded verifiers environment: `env` (a `verifiers.v1.Env`) runs the episodes, `eval_taskset` (a
    `verifiers.v1.Taskset`, or None: the env's own) lists the evaluation problems."""

    spec: str
    name: str  # for example ids and logs
    env: Any
    eval_taskset: Any = None

    @property
    def taskset(self):
        return self.env.taskset


def load_verifiers_env(spec: str, env_args: dict | None = None, *, eval_args: dict | None = None,
                       harness: str | None = CHAT_HARNESS, max_turns: int | None = None) -> VerifiersEnv:
    """Load the verifiers environment `spec`: an installed environment package id (`name`, `owner/name@version`), a
    dotted module path or a `path/to/file.py`, each exporting a `vf.Taskset` subclass through `__all__`.

    `env_args` are the taskset's config fields (`--env.taskset.*` of `vf-eval`); `eval_args` are overrides of them for
    the evaluation problems (e.g. `{"split": "test"}`; None: the evaluation problems are the taskset's own).
    `harness`: the verifiers harness id every agent runs (default rlvr's in-process chat loop; None: the taskset's own).
    `max_turns`: model turns per episode (None: the environment's). A bad spec or bad arguments raise ValueError."""
    vf = import_verifiers()
    spec = (spec or "").strip()
    if not spec:
        raise ValueError("a verifiers environment is needed: an environment package id, a module path or a .py file")
    env_id = _module_id(spec)
    if harness == CHAT_HARNESS:
        register_chat_harness()
    from verifiers.v1.utils.loaders import taskset_class
    try:
        taskset_class(env_id)
        config_cls = vf.env_config_type(env_id)
    except (ImportError, TypeError, AttributeError, ValueError) as exc:
        module = _plugin_module(env_id)
        legacy = sys.modules.get(module) is not None and hasattr(sys.modules[module], "load_environment")
        raise ValueError(f"verifiers environment {spec!r}: {exc} (rlvr tried the module verifiers.v1.tasksets.{module}, "
                         f"then {module}; an environment exports one verifiers.v1.Taskset subclass through __all__"
                         + ("; its load_environment() is the verifiers < 0.4 layout, which verifiers 0.4 does not run)"
                            if legacy else ")")) from exc
    agent: dict[str, Any] = {"runtime": {"type": "subprocess"}, "retries": {"max_retries": 0}}
    if harness:
        agent["harness"] = {"id": harness}
    if max_turns is not None:
        agent["max_turns"] = int(max_turns)
    roles = [name for name, f in config_cls.model_fields.items() if isinstance(f.default, vf.AgentConfig)]
    data = {"taskset": {**(env_args or {}), "id": env_id}, "interception": {"type": "server"},
            "retries": {"max_retries": 0}, **{role: dict(agent) for role in roles}}
    try:
        env = vf.load_environment(vf.resolve_env_config(data))
    except Exception as exc:
        raise ValueError(f"verifiers environment {spec!r}: cannot build it with env_args={env_args!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
    eval_taskset = None
    if eval_args:
        try:
            taskset_config = type(env.taskset.config).model_validate(
                {**env.taskset.config.model_dump(), **eval_args, "id": env_id})
            eval_taskset = type(env.taskset)(taskset_config)
        except Exception as exc:
            raise ValueError(f"verifiers environment {spec!r}: bad eval_args {eval_args!r}: {type(exc).__name__}: "
                             f"{exc}") from exc
    return VerifiersEnv(spec=spec, name=_display_name(spec), env=env, eval_taskset=eval_taskset)


def _display_name(spec: str) -> str:
    return Path(spec).stem if _is_file_spec(spec) else spec


# ---------------------------------------------------------------------------------------------------- the problems

def _render_prompt(data) -> str:
    """A task's prompt as text for logs: the string, or `role: content` lines of its messages."""
    prompt = data.prompt
    if prompt is None:
        return ""
    if isinstance(prompt, str):
        return prompt
    from verifiers.v1.types import content_text
    return "\n".join(f"{m.role}: {content_text(m.content)}" for m in prompt)


def verifiers_examples(env: VerifiersEnv, split: str, n: int | None, seed: int) -> list[Example]:
    """`n` problems of the environment (all of them when None or more than it has), shuffled with `seed`: the train
    split from the env's taskset, an evaluation split ("eval", "test", ...) from `eval_taskset` (or the env's when
    there is none). An infinite taskset gives its first `n` tasks (it cannot be shuffled).

    Example(id "verifiers:<env>:<split>:<task id or idx>", question = the prompt as text, reference = the task's
    `answer` field ("" when it has none), meta["verifiers"] = {"env", "split", "key", "task": the task's data as JSON:
    prompt (string or messages), system_prompt, answer and every other field}); the episode rebuilds the task from
    meta, so examples survive a JSON round trip."""
    taskset = env.eval_taskset if split in EVAL_SPLITS and env.eval_taskset is not None else env.taskset
    if not taskset.bounded:
        if n is None:
            raise ValueError(f"verifiers environment {env.spec!r} is infinite: give a number of problems")
        tasks = list(taskset.take(n))
    else:
        tasks = list(taskset.shuffle(seed=seed))
        tasks = tasks if n is None else tasks[:n]
    out = []
    for task in tasks:
        data = task.data
        answer = getattr(data, "answer", None)
        ident = data.id if data.id is not None else data.idx
        out.append(Example(
            id=f"verifiers:{env.name}:{split}:{ident}",
            question=_render_prompt(data),
            reference="" if answer is None else str(answer),
            meta={"verifiers": {"env": env.name, "split": split, "key": task.key,
                                "task": data.model_dump(mode="json", exclude_none=True)}},
        ))
    return out


def _task(env: VerifiersEnv, example: Example):
    info = (example.meta or {}).get("verifiers")
    if not isinstance(info, dict) or "task" not in info:
        raise ValueError(f"example {example.id!r} is not a verifiers problem (no meta['verifiers']['task'])")
    taskset = env.taskset
    task_cls = type(taskset).task_type()
    return task_cls(task_cls.data_type().model_validate(info["task"]), taskset.config.task)


# ---------------------------------------------------------------------------------------------------- one episode

def run_verifiers_episode(env: VerifiersEnv, example: Example, base_url: str, api_key: str, model: str,
                          timeout_s: float, sampling_args: dict | None = None) -> tuple[float | None, str]:
    """Run ONE episode of `example` against the OpenAI-compatible endpoint `base_url` (".../v1") with `api_key`, and
    score it with the task's rewards: (reward, "") or (None, "the error") when anything failed (a model call, the
    harness, scoring, the timeout). Never raises. Runs its own event loop (asyncio.run): call it from worker threads.

    `sampling_args` (temperature, top_p, max_tokens, and any other key the endpoint takes) override what the harness
    sends. The reward is the trace's `reward` (the weighted sum of the task's `@vf.reward`s); with several agents, the
    mean over the trainable agents' traces."""
    try:
        return asyncio.run(_episode(env, example, base_url, api_key, model, float(timeout_s), sampling_args))
    except Exception as exc:  # noqa: BLE001 - an episode never raises
        return None, _clip(f"{type(exc).__name__}: {exc}")


async def _episode(env: VerifiersEnv, example, base_url, api_key, model, timeout_s, sampling_args):
    vf = import_verifiers()
    task = _task(env, example)
    # verifiers reads the endpoint's key from an environment variable (one per episode; a name with API_KEY in it
    # is not inherited by the processes verifiers starts, e.g. tool servers)
    key_var = f"RLVR_VF_API_KEY_{uuid.uuid4().hex}"
    os.environ[key_var] = api_key
    try:
        client = vf.EvalClientConfig(base_url=base_url, api_key_var=key_var)
        ctx = vf.ModelContext(model=model, client=client, sampling=vf.SamplingConfig.model_validate(sampling_args or {}))
        venv = copy.copy(env.env)  # serving() keeps its servers on the env: one copy per episode (episodes run at once)
        try:
            async with asyncio.timeout(timeout_s):
                async with venv.serving():
                    episode = await venv.run_episode(task, ctx)
        except TimeoutError:
            return None, f"the episode timed out after {timeout_s:g} s"
    finally:
        os.environ.pop(key_var, None)
    return episode_outcome(episode)


def episode_outcome(episode) -> tuple[float | None, str]:
    """(reward, "") of a finished verifiers Episode, or (None, its error)."""
    if not episode.ok:
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        if errors:
            last = errors[-1]
            return None, _clip(f"{last.type}: {last.message}")
        return None, "the episode failed without an error message"
    traces = [t for t in episode.traces if t.agent is None or t.agent.trainable] or list(episode.traces)
    if not traces:
        return None, "the episode ran no agent"
    return sum(t.reward for t in traces) / len(traces), ""


def _clip(text: str) -> str:
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."
