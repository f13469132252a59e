"""Stage pipelines: `rlvr pipeline stages.yaml [--resume]` and `run_pipeline(path_or_spec)`.

A pipeline is a YAML file with an output directory, settings shared by every stage, and a list of
named stages run in order (docs/pipeline.md):

    out_dir: runs/r1                       # the pipeline directory (relative to the working directory)
    init_from: ""                          # policy of the first stage ('' = a fresh model.name)
    shared:                                # keys of every stage's config (skipped where a kind lacks one)
      data: {task: arithmetic, reward: r1_zero}
    stages:
      - name: cold_start                   # unique; its run directory is out_dir/01_cold_start
        kind: sft                          # sft | rl (= train) | ei (= rejection_sampling) | eval | filter
        config: sft.yaml                   # optional config file of that command (relative to this file)
        overrides: {run.steps: 100}        # optional keys, nested or dotted (or a list of "key=value")
      - name: rl
        kind: rl
        recipe: grpo                       # rl only: `rlvr train --recipe`
        init_from: previous                # previous (default) | none | a stage name | a path

Each stage's config is layered, lowest first: the command's defaults < the recipe (rl) < `shared`
< the stage's config file < its overrides < what the pipeline sets (run.out_dir, model.init_from,
and after a filter stage data.train_path, placed above `shared`). Every stage is built and checked
before the first one runs, so a wrong key in stage 4 fails at once, naming the stage and the key.

Every stage is a library function of its config, `fn(cfg, *, resume=False)`, and the pipeline is the table
STAGES {kind: (config class, function, the command's extra checks)} plus resume bookkeeping:
sft -> rlvr.train.sft.train_sft, rl -> rlvr.train.pg.loop.train, ei -> rlvr.train.ei.train_ei (run directories,
metrics and checkpoints as their commands write them), eval -> rlvr.train.evaluation.evaluate_policy (eval.json,
eval.samples.jsonl and config.yaml in the stage's directory), filter -> rlvr.train.filtering.filter_problems
(its train.jsonl becomes data.train_path of the stages after it; the stage's `options` are its filter.* keys).
Each stage starts from the policy of the last stage before it that trained one (filter and eval stages pass
it through). The pipeline file is read with rlvr.config.read_yaml, the stage configs with
rlvr.config.load_config, so both fail with the file, line and key.

Resume (`--resume`): a training stage whose newest checkpoint is at run.steps is finished and
skipped; one with an earlier checkpoint continues from it; one without restarts. Eval and filter
stages are finished when their stage.json records the same settings. Once a stage has run, every
later stage starts over (its input changed). A finished stage whose settings differ from those it
ran with is an error, not silently reused.

After every stage the pipeline directory gets summary.json and summary.md (stage, kind, steps,
held-out accuracy and format rate under the stage's reward, wall time, run directory).
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import (
    ConfigError,
    YamlDumper,
    config_rows,
    dump_yaml,
    load_config,
    parse_override,
    read_yaml,
    to_dict,
)
from rlvr.data import DataError, get_task, load_sft
from rlvr.train.batching import BatchConfigError
from rlvr.train.config import EIConfig, EvalConfig, FilterConfig, FilterSelectConfig, SFTConfig, TrainConfig
from rlvr.train.ei import train_ei, validate_ei_config
from rlvr.train.evaluation import evaluate_policy
from rlvr.train.filtering import filter_problems
from rlvr.train.pg.loop import train, validate_train_config
from rlvr.train.pg.recipes import get_recipe
from rlvr.train.session import checkpoint_step, last_metrics, say
from rlvr.train.sft import train_sft, validate_sft_config

ALIASES = {"train": "rl", "rejection_sampling": "ei"}
PIPELINE_KEYS = ("out_dir", "init_from", "shared", "stages", "overwrite", "description")
STAGE_KEYS = ("name", "kind", "config", "overrides", "recipe", "init_from", "options", "description")
# Keys the pipeline sets itself; a stage or `shared` that sets them is refused (the message says the way).
MANAGED = {
    "run.out_dir": "each stage's run directory is OUT_DIR/NN_NAME (set out_dir at the top)",
    "run.out": "an eval stage writes OUT_DIR/NN_NAME/eval.json",
    "model.init_from": "use the stage key init_from (previous | none | a stage name | a path), or init_from at "
                       "the top for the first stage",
    "run.overwrite": "use overwrite: true at the top (start the pipeline over) or --resume",
}
# Path-valued keys that a pipeline file may give relative to itself.
PATH_KEYS = ("data.train_path", "data.eval_path", "data.sft_path")
# Keys whose change does not change what a finished stage computed.
_IGNORED_CHANGES = ("run.num_threads", "run.progress", "run.overwrite", "run.steps", "run.out_dir", "run.out",
                    "run.log_samples_every", "run.num_log_samples", "run.checkpoint_every", "run.keep_checkpoints")
SUMMARY_FILES = ("summary.json", "summary.md")
STAGE_MARKER = "stage.json"
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


# ------------------------------------------------------------------------------------------ spec


@dataclass
class StageSpec:
    """One stage of a pipeline."""

    name: str
    kind: str  # one of KINDS (aliases resolved)
    config: str = ""  # a config file of the stage's command ('' = none)
    recipe: str = ""  # rl: a recipe name (rlvr.train.pg.recipes)
    overrides: dict[str, Any] = field(default_factory=dict)  # dotted key -> value
    init_from: str = "previous"  # previous | none | an earlier stage's name | a path
    options: dict[str, Any] = field(default_factory=dict)  # filter: options of `rlvr filter` (k, band, ...)
    where: str = ""  # "file:line" of the stage's entry, for messages
    lines: dict[str, str] = field(default_factory=dict)  # override key -> "file:line"

    @property
    def label(self) -> str:
        return f"stage '{self.name}' (kind {self.kind})"


@dataclass
class PipelineSpec:
    """A parsed pipeline file (or mapping)."""

    out_dir: str
    stages: list[StageSpec]
    shared: dict[str, Any] = field(default_factory=dict)  # dotted key -> value
    init_from: str = ""  # policy of the first stage ('' = fresh model.name)
    overwrite: bool = False  # start over: delete the stage directories of an earlier run first
    source: str = "<spec>"  # the file it came from
    shared_lines: dict[str, str] = field(default_factory=dict)

    def stage_dir(self, index: int) -> Path:
        return Path(self.out_dir) / f"{index + 1:02d}_{self.stages[index].name}"


def load_pipeline(path_or_spec: str | Path | Mapping[str, Any] | PipelineSpec, overrides: Sequence[str] = (),
                  *, threads: int = 0) -> PipelineSpec:
    """Parse a pipeline file (or an equivalent mapping) and apply command-line overrides:
    `out_dir=DIR`, `overwrite=true`, `init_from=PATH`, `shared.KEY=VALUE`, `stages.NAME.KEY=VALUE`
    (KEY a config key of that stage, or one of its stage keys init_from, recipe, config).
    threads > 0 sets shared run.num_threads. Raises ConfigError naming the stage and the key."""
    if isinstance(path_or_spec, PipelineSpec):
        spec = path_or_spec
    elif isinstance(path_or_spec, Mapping):
        spec = _parse(path_or_spec, source="<spec>", base_dir=Path("."), lines={})
    else:
        path = Path(path_or_spec)
        data, lines = read_yaml(path, "the pipeline file")
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: a pipeline file is a mapping with out_dir, shared and stages; got "
                              f"{type(data).__name__}")
        spec = _parse(data, source=str(path), base_dir=path.parent, lines=lines)
    _apply_overrides(spec, overrides)
    if threads:
        spec.shared["run.num_threads"] = threads
    return spec


def _flatten(value: Any, prefix: str = "", path: tuple = (), where: dict[str, tuple] | None = None) -> dict[str, Any]:
    """Nested and/or dotted mapping -> {dotted key: leaf value} (lists are leaves). `where`
    collects each dotted key's YAML path (for line numbers)."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = f"{prefix}{k}"
        if where is not None:
            where[key] = (*path, str(k))
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + ".", (*path, str(k)), where))
        else:
            out[key] = v
    return out


def _parse(data: Mapping[str, Any], *, source: str, base_dir: Path, lines: Mapping[str, int]) -> PipelineSpec:
    """The spec of a pipeline mapping; `lines` (rlvr.config.read_yaml's, dotted paths with list indices) places
    each message at its file:line."""
    errors: list[str] = []

    def at(*path) -> str:
        key = ".".join(map(str, path))
        return f"{source}:{lines[key]}" if key in lines else source

    for key in data:
        if key not in PIPELINE_KEYS:
            errors.append(f"{at(key)}: unknown pipeline key '{key}'{_hint(str(key), PIPELINE_KEYS)}; "
                          f"known: {', '.join(PIPELINE_KEYS)}")
    out_dir = data.get("out_dir")
    if not isinstance(out_dir, str) or not out_dir.strip():
        errors.append(f"{at('out_dir')}: out_dir (the pipeline directory) must be a non-empty string, got {out_dir!r}")
    overwrite = data.get("overwrite", False)
    if not isinstance(overwrite, bool):
        errors.append(f"{at('overwrite')}: overwrite must be true or false, got {overwrite!r}")
    init_from = data.get("init_from") or ""
    if not isinstance(init_from, str):
        errors.append(f"{at('init_from')}: init_from must be a path, got {init_from!r}")
        init_from = ""
    shared_raw = data.get("shared") or {}
    shared: dict[str, Any] = {}
    shared_lines: dict[str, str] = {}
    if not isinstance(shared_raw, Mapping):
        errors.append(f"{at('shared')}: shared must be a mapping of config keys, got {shared_raw!r}")
    else:
        where: dict[str, tuple] = {}
        shared = _flatten(shared_raw, where=where)
        shared_lines = {k: at("shared", *where[k]) for k in shared}
        _resolve_paths(shared, base_dir)
    stages_raw = data.get("stages")
    stages: list[StageSpec] = []
    if not isinstance(stages_raw, list) or not stages_raw:
        errors.append(f"{at('stages')}: stages must be a non-empty list of stages (each with a name and a kind)")
        stages_raw = []
    names: set[str] = set()
    for i, raw in enumerate(stages_raw):
        stage = _parse_stage(raw, i, at=at, base_dir=base_dir, stages_raw=stages_raw, names=names, errors=errors)
        if stage is not None:
            stages.append(stage)
    if errors:
        raise ConfigError(errors)
    return PipelineSpec(out_dir=str(out_dir), stages=stages, shared=shared, init_from=str(_relative_to(init_from, base_dir))
                        if init_from else "", overwrite=overwrite, source=source, shared_lines=shared_lines)


def _parse_stage(raw: Any, i: int, *, at, base_dir: Path, stages_raw: Sequence[Any], names: set[str],
                 errors: list[str]) -> StageSpec | None:
    """Stage i of the pipeline's `stages` list (its name added to `names`), or None when it is not a mapping;
    every problem appended to `errors` at its file:line (`at`)."""
    where_i = at("stages", i)
    if not isinstance(raw, Mapping):
        errors.append(f"{where_i}: stage {i + 1} must be a mapping with name and kind, got {raw!r}")
        return None
    name = raw.get("name")
    label = f"stage '{name}'" if isinstance(name, str) and name else f"stage {i + 1}"
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        errors.append(f"{where_i}: {label}: name must be letters, digits, '_', '-', '.' (got {name!r})")
        name = f"stage{i + 1}"
    elif name in names:
        errors.append(f"{where_i}: {label}: the name is used by an earlier stage; names must be unique")
    names.add(name)
    for key in raw:
        if key not in STAGE_KEYS:
            errors.append(f"{at('stages', i, key)}: {label}: unknown stage key '{key}'"
                          f"{_hint(str(key), STAGE_KEYS)}; known: {', '.join(STAGE_KEYS)} (config keys go "
                          "under overrides)")
    kind = raw.get("kind")
    kind = ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if kind not in KINDS:
        known = ", ".join([*KINDS, *(f"{a} (= {k})" for a, k in ALIASES.items())])
        errors.append(f"{at('stages', i, 'kind')}: {label}: unknown stage kind {raw.get('kind')!r}"
                      f"{_hint(str(raw.get('kind')), [*KINDS, *ALIASES])}; known: {known}")
        kind = "?"
    label = f"stage '{name}' (kind {kind})"
    stage = StageSpec(name=name, kind=kind, where=where_i)
    cfg_path = raw.get("config") or ""
    if not isinstance(cfg_path, str):
        errors.append(f"{at('stages', i, 'config')}: {label}: config must be a path, got {cfg_path!r}")
    else:
        stage.config = str(_relative_to(cfg_path, base_dir)) if cfg_path else ""
    recipe = raw.get("recipe") or ""
    if recipe and kind != "rl":
        errors.append(f"{at('stages', i, 'recipe')}: {label}: recipe applies to rl stages only")
    stage.recipe = str(recipe)
    init = raw.get("init_from", "previous")
    if init is None:
        init = "none"
    if not isinstance(init, str):
        errors.append(f"{at('stages', i, 'init_from')}: {label}: init_from must be previous, none, a stage "
                      f"name or a path; got {init!r}")
        init = "previous"
    # previous | none | a stage's name (resolved when the stage runs) | a path, relative to this file
    keep = init in ("previous", "none", "") or _is_stage_ref(init, stages_raw)
    stage.init_from = init if keep else str(_relative_to(init, base_dir))
    ov = raw.get("overrides") or {}
    if isinstance(ov, list):
        for j, text in enumerate(ov):
            try:
                key, _raw, value = parse_override(str(text))
            except ConfigError as exc:
                errors.append(f"{at('stages', i, 'overrides', j)}: {label}: {exc}")
                continue
            stage.overrides[key] = value
            stage.lines[key] = at("stages", i, "overrides", j)
    elif isinstance(ov, Mapping):
        where = {}
        stage.overrides = _flatten(ov, where=where)
        stage.lines = {k: at("stages", i, "overrides", *where[k]) for k in stage.overrides}
    else:
        errors.append(f"{at('stages', i, 'overrides')}: {label}: overrides must be a mapping of config keys "
                      f"(or a list of key=value), got {ov!r}")
    _resolve_paths(stage.overrides, base_dir)
    opts = raw.get("options") or {}
    if opts and kind != "filter":
        errors.append(f"{at('stages', i, 'options')}: {label}: options apply to filter stages only "
                      "(config keys go under overrides)")
    elif not isinstance(opts, Mapping):
        errors.append(f"{at('stages', i, 'options')}: {label}: options must be a mapping, got {opts!r}")
    else:
        stage.options = dict(opts)
    return stage


def _is_stage_ref(value: str, stages_raw: Sequence[Any]) -> bool:
    return any(isinstance(s, Mapping) and s.get("name") == value for s in stages_raw)


def _relative_to(path: str, base_dir: Path) -> Path:
    """An input path of a pipeline file: relative ones are relative to the file's directory."""
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() or str(base_dir) in ("", ".") else base_dir / p


def _resolve_paths(values: dict[str, Any], base_dir: Path) -> None:
    for key in PATH_KEYS:
        if isinstance(values.get(key), str) and values[key]:
            values[key] = str(_relative_to(values[key], base_dir))


def _hint(word: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(known), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def _apply_overrides(spec: PipelineSpec, overrides: Sequence[str]) -> None:
    errors: list[str] = []
    by_name = {s.name: s for s in spec.stages}
    def path(value: Any, raw: str, origin: str) -> str:
        """A path key's value: the text as written unless YAML quoted it (`out_dir=007` is '007', not 7); a
        value YAML reads as a mapping or list (`out_dir=runs/a: b`) is refused: quote it."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, dict | list):
            errors.append(f"{origin}: a path, but YAML reads it as a {type(value).__name__}: quote the value")
            return ""
        return raw

    for text in overrides:
        origin = f"override '{text}'"
        try:
            key, raw, value = parse_override(text)
        except ConfigError as exc:
            errors.extend(exc.errors)
            continue
        if key == "out_dir":
            spec.out_dir = path(value, raw, origin)
        elif key == "overwrite":
            if not isinstance(value, bool):
                errors.append(f"{origin}: overwrite must be true or false")
            else:
                spec.overwrite = value
        elif key == "init_from":
            spec.init_from = path(value, raw, origin)
        elif key.startswith("shared."):
            spec.shared[key[len("shared."):]] = value
            spec.shared_lines[key[len("shared."):]] = origin
        elif key.startswith("stages."):
            name, _, rest = key[len("stages."):].partition(".")
            stage = by_name.get(name)
            if stage is None:
                errors.append(f"{origin}: no stage named '{name}'{_hint(name, list(by_name))}; stages: "
                              f"{', '.join(by_name)}")
            elif not rest:
                errors.append(f"{origin}: expected stages.{name}.KEY=VALUE")
            elif rest in ("init_from", "recipe", "config"):
                setattr(stage, rest, "none" if value is None and rest == "init_from" else path(value, raw, origin))
            else:
                stage.overrides[rest] = value
                stage.lines[rest] = origin
        else:
            errors.append(f"{origin}: unknown pipeline key '{key}'; overrides are out_dir=DIR, overwrite=true, "
                          "init_from=PATH, shared.KEY=VALUE or stages.NAME.KEY=VALUE")
    if errors:
        raise ConfigError(errors)


# --------------------------------------------------------------------------------- stage configs


def _check_sft(cfg: SFTConfig) -> None:
    """`rlvr sft`'s checks: the batch arithmetic, then every line of data.sft_path."""
    validate_sft_config(cfg)
    if cfg.data.sft_path:
        try:
            load_sft(cfg.data.sft_path)
        except DataError as exc:
            where = f"line {exc.line}: " if exc.line is not None else ""
            raise ConfigError(f"data.sft_path={cfg.data.sft_path}: {where}{exc.reason}") from None
        except OSError as exc:
            raise ConfigError(f"data.sft_path={cfg.data.sft_path}: cannot read it ({exc.strerror or exc})") from None


def _eval_stage(cfg: EvalConfig, *, resume: bool = False) -> dict[str, Any]:
    """An eval stage: rlvr.train.evaluation.evaluate_policy (as `rlvr eval`), writing run.out (the stage's
    eval.json) and config.yaml next to it. The held-out metrics, with the number of problems."""
    ev = evaluate_policy(cfg, resume=resume)
    dump_yaml(cfg, Path(cfg.run.out).parent / "config.yaml")
    metrics = {k: v for k, v in ev.metrics().items() if not k.startswith("status/")}
    return {**metrics, "problems": ev.problems}


def _filter_stage(cfg: FilterConfig, *, resume: bool = False) -> dict[str, Any]:
    """A filter stage: rlvr.train.filtering.filter_problems; its train.jsonl feeds the stages after it."""
    result = filter_problems(cfg, resume=resume)
    say(f"kept {result.kept} of {result.problems} problems -> {result.dataset}")
    return {}


@dataclass(frozen=True)
class StageKind:
    """What a stage kind runs: its config class, the library function `fn(cfg, *, resume) -> result`, and the
    cross-field checks its command runs before any work (beyond the config's own validate())."""

    config: type
    run: Callable[..., Any]
    check: Callable[[Any], None] | None
    command: str  # the `rlvr` command of the same config, for messages
    trains: bool  # it leaves a run directory with checkpoints: the policy of the stages after it


# Every stage is a library function of its config (docs/design.md, "Stages").
STAGES: dict[str, StageKind] = {
    "sft": StageKind(SFTConfig, train_sft, _check_sft, "sft", trains=True),
    "rl": StageKind(TrainConfig, train, validate_train_config, "train", trains=True),
    "ei": StageKind(EIConfig, train_ei, validate_ei_config, "ei", trains=True),
    "eval": StageKind(EvalConfig, _eval_stage, None, "eval", trains=False),
    "filter": StageKind(FilterConfig, _filter_stage, None, "filter", trains=False),
}
KINDS = tuple(STAGES)
TRAINING_KINDS = tuple(kind for kind, sk in STAGES.items() if sk.trains)
# `options` of a filter stage: the filter.* keys by their names (k, band, ...), as `rlvr filter`'s flags.
FILTER_OPTIONS = tuple(f.name for f in fields(FilterSelectConfig))


def config_class(kind: str) -> type:
    """The config dataclass of a stage kind."""
    return STAGES[kind].config


def _config_keys(kind: str) -> list[str]:
    return [row[0] for row in config_rows(config_class(kind))]


def _value_text(value: Any) -> str:
    """A value as the YAML text `rlvr.config.parse_override` reads back to the same value."""
    if value is None:
        return ""
    # rlvr.config's dumper quotes exactly the strings its strict loader would read as something else
    text = yaml.dump(value, Dumper=YamlDumper, default_flow_style=True, width=1_000_000, allow_unicode=True)
    return text.strip().removesuffix("...").strip()


def _check_keys(spec: PipelineSpec) -> None:
    """Every stage override names a key of its kind's config; every shared key is a key of at least one
    stage's kind; nobody sets what the pipeline manages. All problems at once."""
    errors: list[str] = []
    kinds = {s.kind for s in spec.stages}
    known_any = {k for kind in kinds for k in _config_keys(kind)}
    for key in spec.shared:
        where = spec.shared_lines.get(key, spec.source)
        if key in MANAGED:
            errors.append(f"{where}: shared: {key} is set by the pipeline: {MANAGED[key]}")
        elif key not in known_any:
            errors.append(f"{where}: shared: unknown config key '{key}'{_hint(key, sorted(known_any))} (no stage "
                          f"kind of this pipeline has it: {', '.join(sorted(kinds))})")
    for stage in spec.stages:
        keys = _config_keys(stage.kind)
        for key in stage.overrides:
            where = stage.lines.get(key, stage.where or spec.source)
            if key in MANAGED:
                errors.append(f"{where}: {stage.label}: {key} is set by the pipeline: {MANAGED[key]}")
            elif key not in keys:
                errors.append(f"{where}: {stage.label}: unknown config key '{key}'{_hint(key, keys)} "
                              f"(see `rlvr {STAGES[stage.kind].command} --help-config`)")
        unknown = [k for k in stage.options if k not in FILTER_OPTIONS]
        if unknown:
            errors.append(f"{stage.where}: {stage.label}: unknown filter option(s) {', '.join(map(repr, unknown))}; "
                          f"known: {', '.join(FILTER_OPTIONS)}")
    if errors:
        raise ConfigError(errors)


def _previous_policy(spec: PipelineSpec, index: int) -> str:
    """The run directory of the last stage before `index` that trained a policy, or the pipeline's
    init_from ('' = a fresh model)."""
    for j in range(index - 1, -1, -1):
        if spec.stages[j].kind in TRAINING_KINDS:
            return str(spec.stage_dir(j))
    return spec.init_from


def _init_from(spec: PipelineSpec, index: int) -> str:
    stage = spec.stages[index]
    value = stage.init_from
    if value in ("previous", ""):
        return _previous_policy(spec, index)
    if value == "none":
        return ""
    names = [s.name for s in spec.stages]
    if value in names:
        j = names.index(value)
        if j >= index or spec.stages[j].kind not in TRAINING_KINDS:
            raise ConfigError(f"{stage.where or spec.source}: {stage.label}: init_from={value!r} must name an "
                              f"earlier stage that trains a policy ({', '.join(TRAINING_KINDS)})")
        return str(spec.stage_dir(j))
    return value


def _train_path(spec: PipelineSpec, index: int) -> str:
    """data.train_path from the last filter stage before `index` ('' = none)."""
    for j in range(index - 1, -1, -1):
        if spec.stages[j].kind == "filter":
            return str(spec.stage_dir(j) / "train.jsonl")
    return ""


def stage_layers(spec: PipelineSpec, index: int, *, init_from: str, train_path: str = "",
                 overwrite: bool = False) -> tuple[dict[str, Any], str | None, list[str | tuple]]:
    """(base mapping, config file or None, overrides: strings, and typed (key, value, origin) for paths) of a stage: defaults < recipe < shared
    (< data.train_path of a filter before it) < config file < the stage's overrides < run.out_dir /
    run.out and model.init_from."""
    stage = spec.stages[index]
    keys = set(_config_keys(stage.kind))
    base: dict[str, Any] = {}
    if stage.recipe:
        try:
            base.update(get_recipe(stage.recipe))
        except KeyError as exc:
            raise ConfigError(f"{stage.where or spec.source}: {stage.label}: {exc.args[0]}") from None
    base.update({k: v for k, v in spec.shared.items() if k in keys})
    if train_path and "data.train_path" in keys:
        base["data.train_path"] = train_path
    overrides = [f"{k}={_value_text(v)}" for k, v in stage.overrides.items()]
    overrides += [f"filter.{k}={_value_text(v)}" for k, v in stage.options.items()]  # a filter stage's options
    out = spec.stage_dir(index)
    # the paths the pipeline sets are typed overrides: a path is never read as YAML (rlvr.config.load_config)
    if stage.kind == "eval":
        overrides.append(("run.out", str(out / "eval.json"), f"the pipeline's run.out of {stage.label}"))
    else:
        overrides.append(("run.out_dir", str(out), f"the pipeline's run.out_dir of {stage.label}"))
    overrides.append(("model.init_from", init_from, f"the pipeline's model.init_from of {stage.label}"))
    if stage.kind in TRAINING_KINDS or stage.kind == "filter":
        overrides.append(f"run.overwrite={'true' if overwrite or stage.kind == 'filter' else 'false'}")
    return base, (stage.config or None), overrides


def build_stage_config(spec: PipelineSpec, index: int, *, init_from: str, train_path: str = "",
                       overwrite: bool = False):
    """The stage's config object, checked as its command checks it before any work. ConfigError
    (naming the stage) on any problem."""
    stage = spec.stages[index]
    kind = STAGES[stage.kind]
    base, path, overrides = stage_layers(spec, index, init_from=init_from, train_path=train_path, overwrite=overwrite)
    try:
        cfg = load_config(kind.config, path, overrides, base=base)
        if kind.check is not None:  # the trainer's cross-field checks (batch arithmetic, registries)
            kind.check(cfg)
    except (ConfigError, BatchConfigError, KeyError, ValueError) as exc:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        raise ConfigError(f"{stage.where or spec.source}: {stage.label}: {text}") from None
    return cfg


def validate_pipeline(spec: PipelineSpec) -> None:
    """Build every stage's config before any work (later stages with a placeholder for the
    earlier stages' outputs), so a mistake anywhere fails at once."""
    if len({str(spec.stage_dir(i)) for i in range(len(spec.stages))}) != len(spec.stages):
        raise ConfigError("two stages would share a run directory")
    _check_keys(spec)
    errors: list[str] = []
    for i, stage in enumerate(spec.stages):
        try:
            init = _init_from(spec, i)
            produced = init and any(init == str(spec.stage_dir(j)) for j in range(i))
            if init and not produced and not Path(init).exists():
                raise ConfigError(f"{stage.where or spec.source}: {stage.label}: init_from {init}: no such run, "
                                  "checkpoint or model directory")
            build_stage_config(spec, i, init_from="" if produced else init)
        except ConfigError as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigError(errors)


# ------------------------------------------------------------------------------------------ running


@dataclass
class StageResult:
    """What one stage produced."""

    name: str
    kind: str
    run_dir: Path
    status: str  # ran | resumed | skipped
    steps: int | None = None  # optimizer steps / rounds of a training stage; None for eval / filter
    eval: dict[str, Any] = field(default_factory=dict)  # final held-out metrics (accuracy, format_rate, ...)
    seconds: float = 0.0  # wall time of the stage (its first run's, when skipped)
    reward: str = ""  # the reward its held-out numbers are under

    @property
    def accuracy(self) -> float | None:
        return self.eval.get("accuracy")

    def row(self) -> dict[str, Any]:
        return {"stage": self.name, "kind": self.kind, "status": self.status, "steps": self.steps,
                "accuracy": self.accuracy, "format_rate": _finite(self.eval.get("format_rate")),
                "reward": self.reward, "seconds": round(self.seconds, 3), "run_dir": str(self.run_dir),
                "eval": {k: _finite(v) for k, v in self.eval.items()}}


@dataclass
class PipelineResult:
    """Every stage's result, in order."""

    out_dir: Path
    stages: list[StageResult]
    seconds: float

    def stage(self, name: str) -> StageResult:
        return next(s for s in self.stages if s.name == name)

    @property
    def first_accuracy(self) -> float | None:
        """Held-out accuracy of the first stage that reports one."""
        return next((s.accuracy for s in self.stages if s.accuracy is not None), None)

    @property
    def final_accuracy(self) -> float | None:
        """Held-out accuracy of the last stage that reports one."""
        return next((s.accuracy for s in reversed(self.stages) if s.accuracy is not None), None)


def _finite(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _say(message: str) -> None:
    say(message)


def run_pipeline(path_or_spec: str | Path | Mapping[str, Any] | PipelineSpec, resume: bool = False, *,
                 overrides: Sequence[str] = (), threads: int = 0) -> PipelineResult:
    """Run a pipeline's stages in order (see the module docstring). resume=True skips the finished
    stages of an earlier run of the same pipeline and continues the interrupted one.

    Raises ConfigError (a bad file, kind or key, naming the stage), FileExistsError (the pipeline
    directory holds an earlier run and neither resume nor overwrite was asked for) before any stage
    runs; a stage's own errors propagate (TrainingDiverged, ...)."""
    spec = load_pipeline(path_or_spec, overrides, threads=threads)
    validate_pipeline(spec)
    out = Path(spec.out_dir)
    dirs = [spec.stage_dir(i) for i in range(len(spec.stages))]
    if resume and spec.overwrite:
        raise ConfigError("overwrite: true starts the pipeline over and --resume continues it; drop one")
    earlier = [p for p in [*dirs, *(out / f for f in SUMMARY_FILES)] if p.exists()]
    if not resume and earlier:
        if not spec.overwrite:
            raise FileExistsError(
                f"out_dir={out} already holds a run of this pipeline ({', '.join(p.name for p in earlier[:3])}"
                f"{' ...' if len(earlier) > 3 else ''}): continue it with --resume, start over with overwrite=true, "
                "or choose another out_dir")
        for p in earlier:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    if resume and not earlier:
        _say(f"note: {out} holds no earlier run of this pipeline: starting it")
    out.mkdir(parents=True, exist_ok=True)
    _write_spec(spec, out)
    previous = _read_summary(out) if resume else {}
    t_start = time.perf_counter()
    results: list[StageResult] = []
    started = False  # a stage ran in this call: every later stage starts over
    n = len(spec.stages)
    try:
        for i, stage in enumerate(spec.stages):
            run_dir = dirs[i]
            head = f"[pipeline {i + 1}/{n}] {stage.name} ({stage.kind})"
            init = _init_from(spec, i)
            train_path = _train_path(spec, i)
            if started and run_dir.exists():
                shutil.rmtree(run_dir)
            state = "new" if started else _stage_state(spec, i, init, train_path)
            if state == "done":
                res = _finished_result(spec, i, init, train_path, previous.get(stage.name))
                results.append(res)
                _say(f"{head}: finished earlier{_outcome(res)}; skipped")
                _write_summary(out, spec, results, time.perf_counter() - t_start)
                continue
            cfg = build_stage_config(spec, i, init_from=init, train_path=train_path, overwrite=state == "new")
            src = f" from {init}" if init else " from a fresh model"
            recipe = f", recipe {stage.recipe}" if stage.recipe else ""
            verb = "resuming" if state == "partial" else "running"
            _say(f"{head}: {verb}{src}{recipe} -> {run_dir}")
            t0 = time.perf_counter()
            res = _run_stage(spec, i, cfg, resume=state == "partial")
            res.seconds = time.perf_counter() - t0 + (previous.get(stage.name, {}).get("seconds") or 0.0
                                                      if state == "partial" else 0.0)
            res.status = "resumed" if state == "partial" else "ran"
            _write_marker(run_dir, stage, cfg, res)
            results.append(res)
            started = True
            _say(f"{head}: done in {time.perf_counter() - t0:.1f} s{_outcome(res)}")
            _write_summary(out, spec, results, time.perf_counter() - t_start)
    except BaseException:
        _write_summary(out, spec, results, time.perf_counter() - t_start, failed=spec.stages[len(results)].name
                       if len(results) < n else None)
        raise
    total = time.perf_counter() - t_start
    _write_summary(out, spec, results, total)
    return PipelineResult(out_dir=out, stages=results, seconds=total)


def _outcome(res: StageResult) -> str:
    parts = []
    if res.steps is not None:
        parts.append(f"{res.steps} steps")
    if res.accuracy is not None:
        fmt = _finite(res.eval.get("format_rate"))
        parts.append(f"held-out accuracy {res.accuracy:.1%}" + (f" (format {fmt:.1%})" if fmt is not None else ""))
    return f": {', '.join(parts)}" if parts else ""


def _stage_state(spec: PipelineSpec, index: int, init: str, train_path: str) -> str:
    """new (no usable output), partial (a training stage with a checkpoint before run.steps) or done.
    A finished or partial stage whose settings changed since it ran is refused (ConfigError)."""
    stage = spec.stages[index]
    run_dir = spec.stage_dir(index)
    if not run_dir.is_dir():
        return "new"
    cfg = build_stage_config(spec, index, init_from=init, train_path=train_path)
    if stage.kind in TRAINING_KINDS:
        step = checkpoint_step(run_dir)
        if step is None:
            return "new"  # stopped before its first checkpoint: start it over
        changed = _changed_keys(cfg, run_dir / "config.yaml")
        if changed:
            raise ConfigError(
                f"{stage.where or spec.source}: {stage.label}: its settings changed since it ran in {run_dir} "
                f"({'; '.join(changed[:6])}{' ...' if len(changed) > 6 else ''}). Restore them, or delete {run_dir} "
                "to run it (and the stages after it) again, or start the pipeline over with overwrite=true")
        return "done" if step >= cfg.run.steps else "partial"
    marker = run_dir / STAGE_MARKER
    if not marker.is_file():
        return "new"
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "new"
    same = (_normalized(recorded.get("config") or {}) == _normalized(_config_dict(cfg))
            and recorded.get("options", {}) == (stage.options or {}))
    return "done" if same else "new"  # eval and filter are re-run when their settings changed


def _config_dict(cfg) -> dict[str, Any]:
    return _flatten(to_dict(cfg))


def _normalized(flat: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in flat.items():
        if k in _IGNORED_CHANGES:
            continue
        if (k in PATH_KEYS or k == "model.init_from") and isinstance(v, str) and v:
            v = os.path.realpath(v)
        out[k] = v
    return out


def _changed_keys(cfg, recorded: Path) -> list[str]:
    """'key: old -> new' for every setting that differs from a run's config.yaml (threads,
    progress, steps and the output paths excepted)."""
    try:
        old = _normalized(_config_dict(load_config(type(cfg), recorded)))
    except (ConfigError, OSError) as exc:
        return [f"{recorded} cannot be read back ({exc})"]
    new = _normalized(_config_dict(cfg))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in new if old.get(k) != new.get(k)]


def _reward_name(cfg) -> str:
    if cfg.data.reward:
        return cfg.data.reward
    try:
        return get_task(cfg.data.task).reward_name(cfg.data.template or None)
    except KeyError:
        return ""


def _run_stage(spec: PipelineSpec, index: int, cfg, *, resume: bool) -> StageResult:
    stage = spec.stages[index]
    res = StageResult(stage.name, stage.kind, spec.stage_dir(index), "ran")
    out = STAGES[stage.kind].run(cfg, resume=resume)
    if stage.kind in TRAINING_KINDS:
        res.steps, res.eval = out.steps, dict(out.eval or {})
    else:
        res.eval = out
    res.reward = _reward_name(cfg) if stage.kind != "filter" else ""
    return res


def _finished_result(spec: PipelineSpec, index: int, init: str, train_path: str,
                     previous: Mapping[str, Any] | None) -> StageResult:
    """The result of a stage finished by an earlier call: its metrics and marker."""
    stage = spec.stages[index]
    run_dir = spec.stage_dir(index)
    res = StageResult(stage.name, stage.kind, run_dir, "skipped")
    marker = {}
    if (run_dir / STAGE_MARKER).is_file():
        try:
            marker = json.loads((run_dir / STAGE_MARKER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            marker = {}
    cfg = build_stage_config(spec, index, init_from=init, train_path=train_path)
    res.reward = _reward_name(cfg) if stage.kind != "filter" else ""
    if stage.kind in TRAINING_KINDS:
        res.steps = checkpoint_step(run_dir)
        last = last_metrics(run_dir)
        res.eval = {k[len("eval/"):]: v for k, v in last.items() if k.startswith("eval/")}
        res.seconds = float(marker.get("seconds") or (previous or {}).get("seconds") or last.get("time") or 0.0)
    else:
        res.eval = dict(marker.get("eval") or {})
        res.seconds = float(marker.get("seconds") or 0.0)
    return res


def _write_marker(run_dir: Path, stage: StageSpec, cfg, res: StageResult) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    payload = {"name": stage.name, "kind": stage.kind, "steps": res.steps, "seconds": res.seconds,
               "eval": {k: _finite(v) for k, v in res.eval.items()}, "options": stage.options or {},
               "config": _config_dict(cfg)}
    tmp = run_dir / (STAGE_MARKER + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, run_dir / STAGE_MARKER)


def _write_spec(spec: PipelineSpec, out: Path) -> None:
    """The pipeline as it runs (file + overrides), for the record."""
    stages = []
    for s in spec.stages:
        entry: dict[str, Any] = {"name": s.name, "kind": s.kind}
        if s.config:
            entry["config"] = s.config
        if s.recipe:
            entry["recipe"] = s.recipe
        if s.init_from != "previous":
            entry["init_from"] = s.init_from
        if s.overrides:
            entry["overrides"] = dict(s.overrides)
        if s.options:
            entry["options"] = dict(s.options)
        stages.append(entry)
    doc = {"out_dir": spec.out_dir, "init_from": spec.init_from, "shared": dict(spec.shared), "stages": stages}
    (out / "pipeline.yaml").write_text(f"# resolved from {spec.source}\n" + yaml.safe_dump(doc, sort_keys=False),
                                       encoding="utf-8")


def _read_summary(out: Path) -> dict[str, dict]:
    try:
        rows = json.loads((out / "summary.json").read_text(encoding="utf-8")).get("stages", [])
    except (OSError, ValueError, AttributeError):
        return {}
    return {r.get("stage"): r for r in rows if isinstance(r, dict)}


def _write_summary(out: Path, spec: PipelineSpec, results: list[StageResult], seconds: float,
                   failed: str | None = None) -> None:
    rows = [r.row() for r in results]
    done = {r.name for r in results}
    pending = [{"stage": s.name, "kind": s.kind, "status": "failed" if s.name == failed else "pending",
                "run_dir": str(spec.stage_dir(i))} for i, s in enumerate(spec.stages) if s.name not in done]
    first = next((r.accuracy for r in results if r.accuracy is not None), None)
    final = next((r.accuracy for r in reversed(results) if r.accuracy is not None), None)
    payload = {"pipeline": spec.source, "out_dir": str(out), "complete": not pending, "seconds": round(seconds, 3),
               "first_accuracy": first, "final_accuracy": final, "stages": rows + pending}
    (out / "summary.json").write_text(json.dumps(payload, indent=1, default=str), encoding="utf-8")
    (out / "summary.md").write_text(summary_markdown(payload), encoding="utf-8")


def summary_markdown(payload: Mapping[str, Any]) -> str:
    """The summary table: stage, kind, steps, held-out accuracy and format rate (under the stage's
    reward), wall time, run directory."""

    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1%}"

    lines = [f"# Pipeline {payload['out_dir']}", "",
             f"From `{payload['pipeline']}`; {'complete' if payload['complete'] else 'incomplete'}, "
             f"{payload['seconds']:.1f} s in this call.", "",
             "| stage | kind | status | steps | accuracy | format rate | reward | wall time | run dir |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in payload["stages"]:
        secs = r.get("seconds")
        lines.append("| " + " | ".join([
            r["stage"], r["kind"], r["status"], "-" if r.get("steps") is None else str(r["steps"]),
            pct(r.get("accuracy")), pct(r.get("format_rate")), f"`{r['reward']}`" if r.get("reward") else "-",
            "-" if secs is None else f"{secs:.1f} s", f"`{r['run_dir']}`"]) + " |")
    if payload.get("first_accuracy") is not None and payload.get("final_accuracy") is not None:
        lines += ["", f"Held-out accuracy: first stage {payload['first_accuracy']:.1%}, last stage "
                      f"{payload['final_accuracy']:.1%} (each under its stage's reward)."]
    return "\n".join(lines) + "\n"
