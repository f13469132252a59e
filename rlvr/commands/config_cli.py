"""Shared plumbing of the config-driven commands (train, sft, eval, demo): YAML + dotted overrides
into a config dataclass, `--help` text generated from the field docs, clean error exits."""

from __future__ import annotations

import inspect
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

from rlvr.config import section


def keys_help(cls: type) -> str:
    """One line per config key, `key (default): doc`, for a command's --help (from field docs)."""
    from rlvr.config import config_rows

    # a closed set's choices after its default ("{a, b}" types: Literal fields)
    lines = [f"  {key} ({default}{'; one of ' + tp if tp.startswith('{') else ''}): {doc}"
             for key, tp, default, doc in config_rows(cls)]
    # "\b" keeps click/typer from re-wrapping the block into one paragraph.
    return "\b\nConfig keys (YAML file and/or key=value overrides):\n" + "\n".join(lines)


def with_keys_help(cls: type) -> Callable[[Callable], Callable]:
    """Decorator: append the generated key list of `cls` to a command's docstring."""

    def deco(fn: Callable) -> Callable:
        fn.__doc__ = inspect.cleandoc(fn.__doc__ or "") + "\n\n" + keys_help(cls)
        return fn

    return deco


def load_or_exit(
    cls: type,
    args: Sequence[str | tuple] | None,
    *,
    base: Mapping[str, Any] | None = None,
    extra: Sequence[str | tuple] = (),
):
    """Parse `[CONFIG.yaml] [key=value ...]` (+ extra overrides) into `cls`; on any config error
    print it and exit with status 2 before any work starts. An override may be typed, `(key, value)` or
    `(key, value, origin)`: a path from a flag, never parsed as YAML (rlvr.config.load_config)."""
    from rlvr.config import ConfigError, load_config, split_config_args

    try:
        path, overrides = split_config_args(args)
        return load_config(cls, path, [*overrides, *extra], base=base)
    except (ConfigError, KeyError, ValueError) as exc:
        fail(str(exc))


def threads_override(threads: int, key: str = "run.num_threads") -> list[tuple]:
    """`--threads N` as a typed override of `key` (none when 0)."""
    return [(key, threads, f"--threads {threads}")] if threads else []


# Config keys that hold a path to a file or folder, read relative to the working directory: a resumed run
# reads the relative ones of its config.yaml from the folder the run was started in (resume_path_fixes).
# The second group may also be a hub id (or a registered name): those are rewritten only when the path
# exists there.
RUN_PATH_KEYS = ("model.init_from", "data.train_path", "data.eval_path", "data.sft_path")
RUN_MAYBE_PATH_KEYS = ("model.name", "data.hf_dataset", "teacher.model", "judge.model")


def _override_key(o: str | tuple) -> str:
    return o[0] if isinstance(o, tuple) else o.partition("=")[0].strip()


def _override_value(o: str | tuple) -> Any:
    """The value an override sets (a string override parsed as load_config parses it; None when it does not
    parse: the load reports that)."""
    from rlvr.config import ConfigError, parse_override

    if isinstance(o, tuple):
        return o[1]
    try:
        return parse_override(o)[2]
    except ConfigError:
        return None


def started_in(run_dir: Path, recorded_out_dir: str) -> Path | None:
    """The folder a run was started in, told by its recorded run.out_dir (relative to that folder) being the
    tail of where the run directory is now: `runs/exp` recorded, the run at /home/u/proj/runs/exp ->
    /home/u/proj. None when that cannot be told (an absolute or `..` out_dir, or a run moved or renamed)."""
    if not recorded_out_dir:
        return None
    out = Path(os.path.normpath(recorded_out_dir))
    if out.is_absolute() or ".." in out.parts:
        return None
    here = Path(run_dir).resolve()
    n = len(out.parts)
    if n and here.parts[-n:] != out.parts:
        return None
    return Path(*here.parts[: len(here.parts) - n]) if n else here


def _get(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, Mapping) or part not in data:
            return None
        data = data[part]
    return data


def resume_path_fixes(run_dir: Path, stored: Any, keep: set[str]) -> tuple[list[tuple], Path | None]:
    """(typed overrides, the folder the run was started in or None) that make the relative paths of a run's
    config.yaml (`stored`, its YAML data) mean what they meant when the run started: each relative
    RUN_PATH_KEYS value (and each RUN_MAYBE_PATH_KEYS one that exists there) joined to the folder the run
    was started in (started_in), when that is not the working directory. Keys in `keep` (set again by the
    command line) are left alone. A path-form data.reward (`./my_checker.py:fn`) is a path too."""
    start = started_in(run_dir, str(_get(stored, "run.out_dir") or ""))
    if start is None or start == Path.cwd().resolve():
        return [], start
    fixes = []
    for key in (*RUN_PATH_KEYS, *RUN_MAYBE_PATH_KEYS):
        value = _get(stored, key)
        if key in keep or not isinstance(value, str) or not value or Path(value).is_absolute():
            continue
        if key in RUN_PATH_KEYS or (start / value).exists():
            fixes.append((key, str(start / value), f"{run_dir / 'config.yaml'} ({key}, relative to {start})"))
    reward = _get(stored, "data.reward")
    if "data.reward" not in keep and isinstance(reward, str):
        from rlvr.rewards.batch import reward_file_spec

        spec = reward_file_spec(reward)
        if spec is not None and not Path(spec[0]).is_absolute() and (start / spec[0]).is_file():
            fixes.append(("data.reward", f"{start / spec[0]}:{spec[1]}",
                          f"{run_dir / 'config.yaml'} (data.reward, relative to {start})"))
    return fixes, start


def load_run_config(
    cls: type,
    args: Sequence[str] | None,
    *,
    resume: Path | None,
    threads: int,
    base: Mapping[str, Any] | None = None,
):
    """The config of a training command (train, sft, ei, distill): `base` (e.g. a recipe) under the file and
    overrides, `--threads` as run.num_threads.

    A resumed run (`--resume RUN`) keeps the knobs it was started with: its config.yaml is the lowest file
    (a YAML file given too is read over it), the command line's overrides apply over both, and only then is
    the whole validated, so an override can repair what no longer holds (`model.init_from=NEW_PATH` after the
    start run moved). run.out_dir is the run directory, as a typed value (a path is never parsed as YAML: `runs/
    exp2 #b` stays that path). Relative paths of the config.yaml are read from the folder the run was started
    in (resume_path_fixes), so `--resume` works from any folder."""
    from rlvr.config import ConfigError, load_config, read_yaml, split_config_args

    extra: list[str | tuple] = threads_override(threads)
    if resume is None:
        cfg = _with_run_task(cls, args, base, extra)
        _warn_ignored_model_keys(cfg)  # (a resumed run's config.yaml records the model's real shape)
        check_user_reward(data.reward if (data := section(cfg, "data")) is not None else "")
        return cfg
    stored_path = resume / "config.yaml"
    if not stored_path.is_file():
        fail(f"--resume {resume}: no config.yaml there (not a run directory)")
    try:
        path, overrides = split_config_args(args)
        stored, _ = read_yaml(stored_path, "run config")
        user_keys = set(read_yaml(path)[1]) if path is not None else set()
    except (ConfigError, ValueError) as exc:
        fail(str(exc))
    for o in overrides:
        value = _override_value(o)
        if _override_key(o) == "run.out_dir" and isinstance(value, str) and Path(value).resolve() != resume.resolve():
            fail(f"--resume {resume} continues that run in place; run.out_dir={value} cannot move it "
                 "(copy the directory first, or drop run.out_dir)")
    keep = user_keys | {_override_key(o) for o in overrides}
    fixes, start = resume_path_fixes(resume, stored, keep)
    extra.append(("run.out_dir", str(resume), f"--resume {resume}"))
    files = [stored_path] + ([path] if path is not None else [])
    from rlvr.train.config import resuming

    try:
        with resuming(resume):  # a start run that is gone: the run's own checkpoint holds the policy
            cfg = load_config(cls, files, [*fixes, *overrides, *extra])
    except (ConfigError, KeyError, ValueError) as exc:
        fail(str(exc) + _resume_hint(resume, stored, start, keep))
    if fixes:
        typer.echo(f"--resume {resume}: the run was started in {start}; its relative paths are read from there: "
                   + ", ".join(f"{k}={v}" for k, v, _ in fixes), err=True)
    check_user_reward(data.reward if (data := section(cfg, "data")) is not None else "")
    return cfg


def _resume_hint(resume: Path, stored: Any, start: Path | None, keep: set[str]) -> str:
    """What to do when a resumed run's config does not load because a relative path of it is not found."""
    rel = [k for k in RUN_PATH_KEYS if k not in keep and isinstance(v := _get(stored, k), str) and v
           and not Path(v).is_absolute()]
    if not rel:
        return ""
    where = (f"from {start}, where the run was started" if start is not None else
             "from the working directory (where the run was started cannot be told: its run.out_dir is not the "
             "tail of the run directory's path, e.g. the directory was moved)")
    return (f" (--resume {resume}: the relative paths of its config.yaml ({', '.join(rel)}) are read {where}; "
            f"give the path again as an override, e.g. {rel[0]}=PATH)")


REWARD_CHECK_TIMEOUT_S = 5.0


def check_user_reward(spec: str, key: str = "data.reward", example: Any = None, response: str = "2") -> None:
    """Before any model loads: call a reward function of the user's (`module:function`, `FILE.py:function`)
    once, on `example` (default: a dummy rlvr.data.Example with question '1+1' and reference '2') and
    `response`, in a thread for at most REWARD_CHECK_TIMEOUT_S. What no input can excuse is `error: KEY=SPEC:
    ...` (exit 2) in one line naming the file and line: a signature that does not take (response, example), a
    NameError / ImportError / SyntaxError, an attribute the example does not have, or a return value that is
    not a Reward, a float or a bool. Anything else (a KeyError on the dummy's empty meta, a slow call) is left
    to the run, which counts a reward's errors. Registered rewards are not called."""
    from rlvr.rewards.batch import UserReward, as_reward, describe_error, resolve_reward_fn

    if not spec:
        return
    try:
        fn = resolve_reward_fn(spec)
    except Exception:  # noqa: BLE001 - the config's own check reports a spec that does not load
        return
    if not isinstance(fn, UserReward):
        return
    head = f"{key}={spec!r}"
    try:
        inspect.signature(fn.fn).bind("2", object())
    except TypeError:
        fail(f"{head}: {fn.__name__}{inspect.signature(fn.fn)} cannot be called as {fn.__name__}(response, "
             "example); a reward takes the response text and the example")
    except ValueError:  # no signature to read (a builtin): the call says
        pass
    if example is None:
        from rlvr.data import Example

        example = Example(id="rlvr-reward-check", question="1+1", reference="2", meta={})
    got: dict[str, Any] = {}

    def call() -> None:
        try:
            got["out"] = fn.fn(response, example)
        except BaseException as exc:  # noqa: BLE001 - judged below
            got["exc"] = exc

    worker = threading.Thread(target=call, name="rlvr-reward-check", daemon=True)
    worker.start()
    worker.join(REWARD_CHECK_TIMEOUT_S)
    if worker.is_alive():
        return
    exc = got.get("exc")
    if exc is not None:
        broken = (isinstance(exc, NameError | ImportError | SyntaxError)
                  or (isinstance(exc, AttributeError) and getattr(exc, "obj", None) is example))
        if broken:
            fail(f"{head}: a test call before any work (response {response[:40]!r}, reference "
                 f"{getattr(example, 'reference', '')!r}) raised {describe_error(exc, fn)}")
        return
    try:
        as_reward(got.get("out"))
    except (TypeError, ValueError) as err:
        fail(f"{head}: a test call before any work (response {response[:40]!r}, reference "
             f"{getattr(example, 'reference', '')!r}): {err}")


def policy_positionals(args: list[str] | None) -> list[str | tuple]:
    """The natural spellings of the policy of `rlvr eval` / `rlvr filter`, as typed overrides (the path as it
    is, never parsed as YAML): a run directory or checkpoint (`rlvr eval runs/grpo`) is `model.init_from=DIR`,
    a model folder (config.json) `model.name=DIR`, and a run's own config.yaml (`rlvr eval
    runs/grpo/config.yaml`: a trainer's dump, not an eval config) is `model.init_from=` its run. Everything
    else is passed on as it was."""
    from rlvr.train.run_settings import find_run_dir

    out: list[str | tuple] = []
    for arg in args or ():
        p = Path(arg)
        if "=" not in arg and p.is_dir():
            if (p / "config.json").is_file():
                out.append(("model.name", arg, f"{arg} (model.name)"))
                continue
            if find_run_dir(p) is None and not (p / "model" / "config.json").is_file():
                fail(f"{arg}: a directory, but neither a run directory (config.yaml) nor a checkpoint or model "
                     "folder (config.json)")
            out.append(("model.init_from", arg, f"{arg} (model.init_from)"))
        elif p.name == "config.yaml" and p.is_file() and find_run_dir(p.parent) is not None:
            out.append(("model.init_from", str(p.parent), f"{arg} (model.init_from)"))
        else:
            out.append(arg)
    return out


def load_from_run(cls: type, args: Sequence[str] | None, extra: Sequence[str], *, training: bool):
    """(config, run directory or None) of `rlvr eval` (training=False) or `rlvr filter` (training=True): when
    model.init_from is a run (or one of its checkpoints), the run's task and response settings
    (rlvr.train.run_settings) are the lowest layer under the file and overrides; a file or override naming
    another task drops the run's data section (it belongs to its own task). An evaluation's data.num_train is
    0 (it reads no training split)."""
    from rlvr.config import ConfigError
    from rlvr.train.config import DataConfig
    from rlvr.train.policy import resolve_model_dir
    from rlvr.train.run_settings import NO_TRAIN, find_run_dir, run_settings

    plain = None if training else NO_TRAIN
    cfg = load_or_exit(cls, args, base=plain, extra=extra)
    if not cfg.model.init_from:
        return cfg, None
    try:
        resolve_model_dir(cfg.model.init_from)
    except FileNotFoundError as exc:
        fail(str(exc))
    run_dir = find_run_dir(cfg.model.init_from)
    if run_dir is None:
        return cfg, None
    try:
        base = run_settings(run_dir, training=training)
    except ConfigError as exc:
        fail(str(exc))
    cfg = load_or_exit(cls, args, base=base, extra=extra)
    if cfg.data.task != base["data"].get("task", DataConfig.task):
        base["data"] = dict((plain or {}).get("data", {}))
        cfg = load_or_exit(cls, args, base=base, extra=extra)
    return cfg, run_dir


def _dotted(mapping: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """{"data": {"task": "x"}, "algo.loss": "y"} -> {"data.task": "x", "algo.loss": "y"}."""
    out: dict[str, Any] = {}
    for key, value in (mapping or {}).items():
        if isinstance(value, Mapping):
            out.update(_dotted(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _init_from(cls: type, args: Sequence[str | tuple] | None, base: Mapping[str, Any] | None,
               extra: Sequence[str | tuple]) -> str:
    """model.init_from as the file and overrides set it ('' when unset, or when the config does not load: the
    full load reports that)."""
    from rlvr.config import ConfigError, load_config, split_config_args

    try:
        path, overrides = split_config_args(args)
        return getattr(getattr(load_config(cls, path, [*overrides, *extra], base=base), "model", None),
                       "init_from", "")
    except (ConfigError, KeyError, ValueError):
        pass
    try:  # a config that loads only with the run's settings: the override alone names the run
        _, overrides = split_config_args(args)
    except (ConfigError, ValueError):
        return ""
    found = [_override_value(o) for o in [*overrides, *extra] if _override_key(o) == "model.init_from"]
    return found[-1] if found and isinstance(found[-1], str) else ""


def _with_run_task(cls: type, args: Sequence[str] | None, base: Mapping[str, Any] | None, extra: Sequence[str]):
    """The config of a new run. When model.init_from is a run directory (or one of its checkpoints), the run's
    task and response settings (its data.* keys, sampling max_tokens / top_p / stop / keep_stop /
    thinking_budget / stop_thinking_text: what `rlvr eval` takes from it) are a layer above `base` (a recipe)
    and below the file and overrides, as `rlvr eval` and `rlvr filter` read them: `rlvr train
    model.init_from=runs/sft` trains and evaluates on the task the SFT run learned, not on the defaults. A
    file or override naming another task drops the run's data section (it belongs to its own task)."""
    import dataclasses
    import typing

    from rlvr.config import ConfigError
    from rlvr.train.config import DataConfig
    from rlvr.train.run_settings import find_run_dir, run_settings

    init_from = _init_from(cls, args, base, extra)
    run_dir = find_run_dir(init_from) if init_from else None
    if run_dir is None:
        return load_or_exit(cls, args, base=base, extra=extra)
    try:
        settings = run_settings(run_dir, training=True)
    except ConfigError as exc:
        fail(str(exc))
    sampling_keys = {f.name for f in dataclasses.fields(typing.get_type_hints(cls)["sampling"])}
    settings["sampling"] = {k: v for k, v in settings["sampling"].items() if k in sampling_keys}
    run_task = settings["data"].get("task", DataConfig.task)
    layered = {**_dotted(base), **_dotted(settings)}
    cfg = load_or_exit(cls, args, base=layered, extra=extra)
    taken = "task (data.*) and response settings (sampling.*)"
    if cfg.data.task != run_task:  # another task asked for: the run's data section is not its own
        layered = {**_dotted(base), **_dotted({"sampling": settings["sampling"]})}
        cfg = load_or_exit(cls, args, base=layered, extra=extra)
        taken = "response settings (sampling.*)"
    typer.echo(f"model.init_from={init_from}: the run's {taken} from {run_dir / 'config.yaml'} (a file or "
               "override still wins)", err=True)
    return cfg


# Keys that only shape a freshly built tiny model: with model.init_from the weights' own config wins.
_TINY_KEYS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "tie_embeddings")


def _warn_ignored_model_keys(cfg) -> None:
    m = section(cfg, "model")
    if m is None or not (m.init_from or m.name != "tiny"):
        return
    plain = type(m)()
    ignored = [k for k in _TINY_KEYS if getattr(m, k) != getattr(plain, k)]
    if ignored:
        src = f"model.init_from={m.init_from}" if m.init_from else f"model.name={m.name}"
        typer.echo(f"warning: {', '.join('model.' + k for k in ignored)} shape only a new tiny model; "
                   f"ignored with {src} (the model's own config.json decides)", err=True)


def run_trainer(fn, cfg, *, resume: bool, resume_command: str = "", **kwargs):
    """Run a trainer (train, train_sft) with the command line's error policy: a config, data, model
    loading (rlvr.models.loading.ModelLoadError) or run-directory problem found before the run starts is `error: ...` exit 2; a run that diverged
    (NaN/inf), whose rollout engine failed (start, weight push, push check), whose reward raised on
    most of a step's responses or whose checkpoint could not be written is `error: ...` exit 1;
    everything else is a bug and keeps its traceback. `resume_command` (a pipeline's own `rlvr pipeline ...
    --resume`) replaces the resume command a Ctrl-C message names (the stage's `rlvr train --resume DIR`)."""
    from rlvr.config import ConfigError
    from rlvr.models.loading import ModelLoadError
    from rlvr.rewards.errors import RewardErrorsStop
    from rlvr.rollout.types import EngineError
    from rlvr.runs.checkpoint import CheckpointDamaged, CheckpointSaveError
    from rlvr.train.batching import BatchConfigError
    from rlvr.train.session import CheckpointFailed, Interrupted, TrainingDiverged
    from rlvr.train.tasks import TaskDataError

    try:
        return fn(cfg, resume=resume, **kwargs)
    except Interrupted as exc:  # Ctrl-C / SIGTERM in the loop: the step's checkpoint is saved
        message = str(exc)
        if resume_command:
            cut = re.search(r";?\s*resume with: rlvr \S+ --resume .*$", message, flags=re.S)
            message = (message[:cut.start()] if cut else message) + f"; resume with: {resume_command}"
        typer.echo(message, err=True)
        raise typer.Exit(130) from None
    except KeyboardInterrupt:  # before the loop (loading, first sampling): nothing to save yet
        typer.echo("interrupted before training started: nothing was saved"
                   + (f"; resume with: {resume_command}" if resume_command else ""), err=True)
        raise typer.Exit(130) from None
    except (TrainingDiverged, EngineError, RewardErrorsStop, CheckpointFailed, CheckpointSaveError) as exc:
        typer.echo(f"error: {exc}", err=True)  # the run stopped: what was lost, what is intact, how to resume
        raise typer.Exit(1) from None
    except (ConfigError, BatchConfigError, TaskDataError, CheckpointDamaged, FileExistsError, FileNotFoundError,
            NotADirectoryError, ModelLoadError) as exc:
        fail(str(exc))


def run_stage(fn, cfg, **kwargs):
    """Run a stage that is not a training loop (rlvr.train.filtering.filter_problems,
    rlvr.train.evaluation.evaluate_policy): bad input (config, data, model folder, positions) and an engine
    that failed are `error: ...` exit 2; everything else is a bug and keeps its traceback."""
    from rlvr.config import ConfigError
    from rlvr.rollout.types import EngineError
    from rlvr.train.tasks import TaskDataError

    try:
        return fn(cfg, **kwargs)
    except (ConfigError, TaskDataError, EngineError, OSError) as exc:
        fail(str(exc))


def report(result) -> None:
    """The last lines of a training command: held-out numbers (when there were any) and the run. A sharded
    run's ranks > 0 (torchrun's RANK) say nothing: rank 0 speaks for the run."""
    import math
    import os

    if int(os.environ.get("RANK", "0") or 0) > 0:
        return

    ev = result.eval or {}
    parts = []
    if "accuracy" in ev:
        parts.append(f"accuracy {ev['accuracy']:.1%}")
    fmt = ev.get("format_rate")
    if "accuracy" in ev:  # None / NaN: the reward has no format part, so a rate does not apply
        parts.append("format rate n/a" if fmt is None or math.isnan(fmt) else f"format rate {fmt:.1%}")
    if "len/mean" in ev:
        parts.append(f"mean length {ev['len/mean']:.1f}")
    typer.echo(f"held-out: {', '.join(parts)}" if parts else "held-out: not evaluated (no held-out problems)")
    typer.echo(f"run directory: {result.run_dir} (plots in {Path(result.run_dir) / 'plots'})")


def fail(message: str) -> None:
    """Print `error: message` to stderr and exit with status 2."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
