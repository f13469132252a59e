"""Config system: YAML files and dotted command-line overrides into nested dataclasses, strictly.

A trainer's config is a dataclass composed of small section dataclasses (model, data, sampling,
algo, optim, run). Every field carries an attribute docstring (a string literal on the line after
the field); `field_docs` reads them from the source so the CLI help is generated, not duplicated.
A section may inherit fields from a base section (the sampling sections from DecodingConfig): the
help follows the MRO, and a subclass that re-declares a field with its own docstring wins.

    cfg = load_config(TrainConfig, "run.yaml", ["algo.loss=grpo_clip", "optim.lr=1e-4"], base=recipe)

Layers, lowest first: dataclass defaults (a section's `default_factory` preset included) < `base`
(e.g. a recipe preset) < YAML file < overrides. Everything is validated before any work starts: an
unknown key fails naming the full dotted key, the file and line, and close matches; a wrong type
names the key, the expected type and the value; all problems are reported at once. After
construction each section's `__post_init__` (automatic) and then `validate()` (if defined) run
bottom-up, so derived values are filled right after parsing and cross-field checks fail early. A
top-level `validate()` that re-checks sections for a config built in Python calls `validate_sections`,
which skips the sections this load has just checked (each rule runs once).

Field types: `str`, `int`, `float`, `bool`, `Literal[...]`, `list[X]` of those, `dict[str, Any]` (a free
mapping whose keys its section checks: `data.rg.min_digits=2` sets one of its keys, `data.rg={a: 1}` merges a
mapping into it, `data.rg=` empties it), and section dataclasses (every field with a default). Anything else is
refused when the config is loaded.
A `Literal` is a closed choice set: the help lists its choices, and a value outside them fails naming
the key, the file and line and the choices (`choice_problem`, the one wording, which a section's
`validate()` uses for a config built in Python); a field's metadata `refused={value: reason}` says why
a value that is no choice is refused (model.dtype=float16). An open set (a registry users may add to)
stays a `str` checked by its section against the live registry; metadata `names=(...)` lists its
built-in names in the help.

YAML is read with a stricter resolver than PyYAML's YAML 1.1 default: only `true`/`false` are
booleans (`yes`, `on`, `no` stay strings, so they fail for a bool field and survive for a str
field), and `1e-4` is a float (YAML 1.1 wants `1.0e-4`). `dump_yaml` writes with the same
resolver, so a dumped config loads back exactly.
"""

from __future__ import annotations

import ast
import contextvars
import dataclasses
import difflib
import functools
import inspect
import io
import re
import textwrap
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "choice_problem",
    "config_help",
    "config_markdown",
    "config_rows",
    "dump_yaml",
    "field_docs",
    "field_metadata",
    "load_config",
    "parse_override",
    "split_config_args",
    "to_dict",
    "to_yaml",
    "type_name",
    "unknown_choice",
    "validate_sections",
]


class ConfigError(ValueError):
    """A config could not be loaded. `errors` holds one line per problem (all are reported at once)."""

    def __init__(self, errors: str | Sequence[str]):
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        if len(self.errors) == 1:
            msg = self.errors[0]
        else:
            msg = f"{len(self.errors)} config errors:\n" + "\n".join(f"  - {e}" for e in self.errors)
        super().__init__(msg)


# ------------------------------------------------------------------------------------------ YAML

_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_RE = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$|^0x[0-9a-fA-F_]+$|^0o[0-7_]+$")
_FLOAT_RE = re.compile(
    r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)"
    r"|\.(?:nan|NaN|NAN))$"
)
_NULL_RE = re.compile(r"^(?:~|null|Null|NULL|)$")


def _strict_resolvers() -> dict:
    """Implicit-resolver table: YAML 1.2-like bools, ints, floats (incl. 1e-4) and nulls."""
    table: dict[str | None, list] = {}
    for tag, regexp, first in [
        ("bool", _BOOL_RE, "tTfF"),
        ("int", _INT_RE, "-+0123456789"),
        ("float", _FLOAT_RE, "-+0123456789."),
        ("null", _NULL_RE, "~nN"),
    ]:
        for ch in first:
            table.setdefault(ch, []).append((f"tag:yaml.org,2002:{tag}", regexp))
    table[None] = [("tag:yaml.org,2002:null", _NULL_RE)]  # the empty scalar
    return table


class _Loader(yaml.SafeLoader):
    """SafeLoader with the strict resolver table (see module docstring)."""


class YamlDumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings `_Loader` would read as something else."""


_Loader.yaml_implicit_resolvers = _strict_resolvers()
YamlDumper.yaml_implicit_resolvers = _strict_resolvers()
_Loader.add_constructor(  # no YAML 1.1 octal/sexagesimal
    "tag:yaml.org,2002:int", lambda loader, node: int(loader.construct_scalar(node).replace("_", ""), 0)
)


# A YAML document is read within these bounds: its values counted as the aliases expand them (an alias
# is walked again each time it is used, as the loaded data would be), and its nesting. A config or
# pipeline file holds a few hundred values; a "billion laughs" file (9 anchors of 9 aliases each: 9^9
# values) is refused at the first value past the bound, before it is built, instead of hanging rlvr and
# eating memory. Anchors and aliases themselves are allowed (as Docker Compose, GitLab CI and Kubernetes
# allow them; go-yaml and SnakeYAML bound their expansion too).
MAX_YAML_VALUES = 20_000
MAX_YAML_DEPTH = 100


def _compose(text: str, source: str):
    """(node or None, loader) of one YAML document. Its nesting is checked first, on the parser's events
    (PyYAML's composer recurses: a document nested thousands deep would end in a slow RecursionError)."""
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{source}:{event.start_mark.line + 1}: YAML nested too deeply (more than "
                                  f"{MAX_YAML_DEPTH} levels)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    loader = _Loader(text)
    try:
        return loader.get_single_node(), loader
    except BaseException:
        loader.dispose()
        raise


def _bounded_walk(node: yaml.Node, source: str, visit=None) -> None:
    """Walk `node` as its aliases expand it (each alias walked where it is used), calling
    visit(node, prefix, depth) on each collection; ConfigError naming the source and line as soon
    as the walk passes MAX_YAML_VALUES values or MAX_YAML_DEPTH levels."""
    budget = [MAX_YAML_VALUES]
    top = [node.start_mark.line + 1]  # the line of the top-level entry being walked: where the expansion is

    def walk(n: yaml.Node, prefix: str, depth: int) -> None:
        budget[0] -= 1
        line = n.start_mark.line + 1
        if depth == 1:
            top[0] = line
        if budget[0] < 0:
            line = top[0]
            raise ConfigError(
                f"{source}:{line}: YAML anchors and aliases expand this document past {MAX_YAML_VALUES:,} values "
                "(an alias bomb?); rlvr reads a config or pipeline file only up to that size: write the values out, "
                "or alias fewer of them")
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{source}:{line}: YAML nested too deeply (more than {MAX_YAML_DEPTH} levels)")
        if isinstance(n, yaml.SequenceNode):
            if visit is not None:
                visit(n, prefix)
            for i, item in enumerate(n.value):
                walk(item, f"{prefix}{i}.", depth + 1)
        elif isinstance(n, yaml.MappingNode):
            if visit is not None:
                visit(n, prefix)
            for key_node, value_node in n.value:
                walk(key_node, prefix, depth + 1)
                walk(value_node, f"{prefix}{key_node.value}." if isinstance(key_node, yaml.ScalarNode)
                     else prefix, depth + 1)

    walk(node, "", 0)


def _yaml_load(text: str, source: str = "YAML value") -> Any:
    """The strict loader's value of `text`, bounded as a file is (MAX_YAML_VALUES, MAX_YAML_DEPTH)."""
    node, loader = _compose(text, source)
    try:
        if node is None:
            return None
        _bounded_walk(node, source)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _read_yaml(text: str, source: str) -> tuple[Any, dict[str, int]]:
    """(data, {dotted key: 1-based line}) of a YAML document, parsed once; rejects duplicate keys, and a
    document whose aliases expand past MAX_YAML_VALUES values (checked before it is built)."""
    node, loader = _compose(text, source)
    lines: dict[str, int] = {}
    errors: list[str] = []

    def visit(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.SequenceNode):  # list items by index ("stages.2.kind"), for files with lists
            for i, item in enumerate(n.value):
                lines.setdefault(f"{prefix}{i}", item.start_mark.line + 1)
            return
        seen: set[str] = set()
        for key_node, _value_node in n.value:
            key = prefix + str(key_node.value)
            if key in seen:
                errors.append(f"{source}:{key_node.start_mark.line + 1}: duplicate key '{key}'")
            seen.add(key)
            lines.setdefault(key, key_node.start_mark.line + 1)

    try:
        if node is None:
            return None, lines
        _bounded_walk(node, source, visit)
        if errors:
            raise ConfigError(list(dict.fromkeys(errors)))
        return loader.construct_document(node), lines
    finally:
        loader.dispose()


# ---------------------------------------------------------------------------------------- schema

_SCALARS = (str, int, float, bool)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _is_mapping(tp: Any) -> bool:
    """A free mapping field, `dict[str, Any]` (its keys are its section's to check)."""
    return typing.get_origin(tp) is dict and typing.get_args(tp) == (str, Any)


def _supported(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal or _is_mapping(tp):
        return True
    if origin is list:
        return _supported(typing.get_args(tp)[0]) and not _is_section(typing.get_args(tp)[0])
    return tp in _SCALARS or _is_section(tp)


@functools.cache
def _schema(cls: type) -> dict[str, tuple[Any, type]]:
    """Every dotted key `cls` accepts (sections and leaves, in field order) -> (type, owning class)."""
    out: dict[str, tuple[Any, type]] = {}

    def walk(klass: type, prefix: str) -> None:
        hints = typing.get_type_hints(klass)
        for f in dataclasses.fields(klass):
            if not f.init:  # derived: neither settable nor written
                continue
            tp = hints[f.name]
            if not _supported(tp):
                raise TypeError(f"{klass.__name__}.{f.name}: unsupported config field type {type_name(tp)}")
            out[prefix + f.name] = (tp, klass)
            if _is_section(tp):
                walk(tp, prefix + f.name + ".")

    walk(cls, "")
    return out


def type_name(tp: Any) -> str:
    """Readable type: `float`, `list[str]`, `{loss, reward}` for Literals."""
    if typing.get_origin(tp) is Literal:
        return "{" + ", ".join(_choice_text(a, quote=False) for a in typing.get_args(tp)) + "}"
    if typing.get_origin(tp) is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if _is_mapping(tp):
        return "mapping"
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _choice_text(choice: Any, quote: bool = True) -> str:
    """A choice as YAML spells it: true / false for bools, '' for the empty string, strings quoted (quote=True)."""
    if isinstance(choice, bool):
        return str(choice).lower()
    if isinstance(choice, str) and (quote or not choice):
        return repr(choice)
    return str(choice)


def unknown_choice(key: str, value: Any, known: Sequence[Any]) -> str:
    """The one wording of a value outside a set of names, closed (a Literal field) or open (a registry):
    `algo.kl_in='both' is unknown; known: 'loss', 'reward'`."""
    return f"{key}={_show(value)} is unknown; known: {', '.join(_choice_text(k) for k in known)}"


def _is_choice(value: Any, choices: Sequence[Any]) -> bool:
    # `type(...) is` so that True does not match 1 and 1 does not match 1.0.
    return any(type(allowed) is type(value) and allowed == value for allowed in choices)


def choice_problem(key: str, value: Any, tp: Any, refused: Mapping[str, str] | None = None) -> str | None:
    """Why `value` is none of the choices of the Literal type `tp` of config key `key`, or None. A value in
    `refused` (a field's metadata: value -> reason, `{key}` in the reason spelled as the key) is refused with its
    reason; a YAML bool or number whose text is a choice (`cuda_graphs: true` for the string 'true') is told to
    be quoted."""
    choices = typing.get_args(tp)
    if _is_choice(value, choices):
        return None
    if refused and isinstance(value, str) and value in refused:
        return f"{key}={value!r} is refused: {refused[value].format(key=key)}"
    text = _choice_text(value, quote=False)
    hint = (f" (quote it: YAML reads {text} as a {type(value).__name__}, not the string {text!r})"
            if isinstance(value, bool | int | float) and text in choices else "")
    return unknown_choice(key, value, choices) + hint


def field_metadata(cls: type, name: str) -> Mapping[str, Any]:
    """The metadata of field `name` of the dataclass `cls` (`refused`, `names`: module docstring)."""
    return next((f.metadata for f in dataclasses.fields(cls) if f.name == name), {})


# ------------------------------------------------------------------------------------ field docs


@functools.cache
def _class_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of one class body: {field: doc}, folded into one line each."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in a REPL / exec: no source, no docs
        return {}
    body = next((n.body for n in ast.parse(source).body if isinstance(n, ast.ClassDef)), [])
    return {
        node.target.id: " ".join(inspect.cleandoc(nxt.value.value).split())
        for node, nxt in zip(body, body[1:], strict=False)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
    }


def _field_doc(cls: type, name: str) -> str:
    """The docstring of field `name` of `cls`: from the first class of its MRO whose body documents it,
    so a section that inherits a field (a sampling section from DecodingConfig) shows the base's
    docstring, and one that re-declares it with its own docstring shows that."""
    for klass in cls.__mro__:
        if dataclasses.is_dataclass(klass) and (doc := _class_docs(klass).get(name)) is not None:
            return doc
    return ""


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass, by dotted key, nested sections included.

    `field_docs(TrainConfig)["optim.lr"] == "Peak learning rate of AdamW."`; a section's own entry
    (`"optim"`) is the docstring under the section field. Inherited fields carry the docstring of the
    nearest class that documents them. Fields without a docstring map to "".
    """
    return {key: _field_doc(owner, key.rpartition(".")[2]) for key, (_, owner) in _schema(cls).items()}


# -------------------------------------------------------------------------------------- coercion


class _Leaf:
    """One value set by one layer: the value, where it came from, and the raw override text."""

    __slots__ = ("value", "origin", "raw")

    def __init__(self, value: Any, origin: str, raw: str | None = None):
        self.value, self.origin, self.raw = value, origin, raw


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _TypeMismatch(Exception):
    pass


def _coerce(value: Any, tp: Any, raw: str | None = None) -> Any:
    """Convert a YAML value to `tp` or raise _TypeMismatch(expected description)."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        for allowed in choices:
            if _is_choice(value, (allowed,)):
                return allowed
        if raw is not None and raw in choices:
            return raw  # `rollout.cuda_graphs=true` on the command line means the string "true", as for a str
        raise _TypeMismatch("one of " + ", ".join(_choice_text(a) for a in choices))
    if _is_mapping(tp):
        if value is None:  # `data.rg=`: the empty mapping
            return {}
        if not isinstance(value, Mapping):
            raise _TypeMismatch("a mapping ({key: value, ...}, or set one key as <key>.<name>=value)")
        return {str(k): v for k, v in value.items()}
    if origin is list:
        one = raw is not None and value is not None and not isinstance(value, list | dict)
        if one:  # `sampling.stop=</answer>` on the command line: a one-item list
            value = [value]
        if not isinstance(value, list):
            raise _TypeMismatch(type_name(tp))
        out = []
        for i, v in enumerate(value):
            try:
                out.append(_coerce(v, typing.get_args(tp)[0], raw if one else None))
            except _TypeMismatch as exc:
                if one:  # `algo.tags=x`: say what the key takes, not what item 0 of a list nobody wrote was
                    raise _TypeMismatch(type_name(tp)) from None
                raise _TypeMismatch(f"{type_name(tp)} (item {i}: expected {exc}, got {_show(v)})") from None
        return out
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _TypeMismatch("bool (true or false)")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e3 written for 1000
            return int(value)
        raise _TypeMismatch("int")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        try:
            return float(value.strip())  # a quoted "1e-4"
        except (AttributeError, ValueError):
            raise _TypeMismatch("float") from None
    if isinstance(value, str):  # tp is str
        return value
    if raw is not None and not isinstance(value, list | dict):
        return raw  # `run.name=007` on the command line means the string "007"
    raise _TypeMismatch("str (quote the value)")


# -------------------------------------------------------------------------------------- layering


class _Builder:
    """Merges layers into {dotted leaf key: _Leaf} checked against the schema, then builds the config."""

    def __init__(self, cls: type):
        self.cls = cls
        self.schema = _schema(cls)
        self.leaves: dict[str, _Leaf] = {}
        self.errors: list[str] = []

    def _unknown(self, key: str, where: str) -> None:
        # Prefer a near miss inside the same section (optim.lrr -> optim.lr), then any key.
        head, _, last = key.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in self.schema if k.rpartition(".")[0] == head]
        close = [f"{head}.{s}" if head else s for s in difflib.get_close_matches(last, siblings, n=3)]
        if not close:
            close = difflib.get_close_matches(key, list(self.schema), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        self.errors.append(f"{where}: unknown config key '{key}'{hint}")

    def _mapping_key(self, key: str) -> tuple[str, Any] | None:
        """(the mapping field, the path below it) of `data.rg.min_digits` (a key inside a `dict[str, Any]` field)."""
        parts = key.split(".")
        for i in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:i])
            if head in self.schema:
                return (head, parts[i:]) if _is_mapping(self.schema[head][0]) else None
        return None

    def _set(self, key: str, value: Any, origin: str, raw: str | None = None) -> None:
        """Set the leaf `key`; a mapping set on a mapping field merges into what lower layers set (later wins)."""
        old = self.leaves.get(key)
        if _is_mapping(self.schema[key][0]) and old is not None and isinstance(old.value, Mapping) \
                and isinstance(value, Mapping):
            value = _merged(old.value, value)
        self.leaves[key] = _Leaf(value, origin, raw)

    def _set_inside(self, key: str, value: Any, origin: str) -> bool:
        """`data.rg.min_digits=2`: one key of a mapping field (False: `key` is inside none)."""
        found = self._mapping_key(key)
        if found is None:
            return False
        head, path = found
        for name in reversed(path):
            value = {name: value}
        self._set(head, value, origin)
        return True

    def add_mapping(self, data: Any, origin: str, lines: Mapping[str, int] | None = None, prefix: str = "") -> None:
        """Add one layer given as a (possibly nested, possibly dotted-key) mapping; `prefix` places
        it below the top level (an override that sets a whole section)."""
        lines = lines or {}
        if not isinstance(data, Mapping):
            self.errors.append(f"{origin}: expected a mapping of config keys, got {_show(data)}")
            return
        for raw_key, value in data.items():
            key = prefix + str(raw_key)  # as the YAML line map spells it, dotted keys included
            where = f"{origin}:{lines[key]}" if key in lines else origin
            if key not in self.schema:
                if not self._set_inside(key, value, where):
                    self._unknown(key, where)
            elif not _is_section(self.schema[key][0]):
                self._set(key, value, where)
            elif isinstance(value, Mapping):
                self.add_mapping(value, origin, lines, key + ".")
            else:
                self.errors.append(f"{where}: config key '{key}' is a section; expected a mapping "
                                   f"of its keys, got {_show(value)}")

    def add_override(self, text: str | tuple) -> None:
        """Add one `dotted.key=value` override (the value is parsed as YAML), or one typed override
        `(key, value)` / `(key, value, origin)` whose value is taken as it is (a path from a flag)."""
        if isinstance(text, tuple):
            if len(text) not in (2, 3) or not isinstance(text[0], str):
                raise TypeError(f"a typed override is (key, value) or (key, value, origin), got {text!r}")
            key, value = text[0], text[1]
            origin = text[2] if len(text) == 3 else f"{key}={value}"
            if key not in self.schema:
                if not self._set_inside(key, value, origin):
                    self._unknown(key, origin)
            elif _is_section(self.schema[key][0]):
                self.errors.append(f"{origin}: config key '{key}' is a section; set its keys")
            else:
                self._set(key, value, origin)
            return
        origin = f"override '{text}'"
        try:
            key, raw, value = parse_override(text)
        except ConfigError as exc:
            self.errors.extend(exc.errors)
            return
        if key not in self.schema:
            if not self._set_inside(key, value, origin):
                self._unknown(key, origin)
        elif not _is_section(self.schema[key][0]):
            self._set(key, value, origin, raw)
        elif isinstance(value, Mapping):  # `optim={lr: 1e-3}`
            self.add_mapping(value, origin, prefix=key + ".")
        else:
            self.errors.append(f"{origin}: config key '{key}' is a section; set its keys, e.g. {key}.<key>=value")

    def build(self) -> Any:
        for key in self.schema:  # every type error is collected (in field order) before anything is built
            if (item := self.leaves.get(key)) is None:
                continue
            tp, owner = self.schema[key]
            try:
                item.value = _coerce(item.value, tp, item.raw)
            except _TypeMismatch as exc:
                if typing.get_origin(tp) is Literal:  # a closed choice set: the wording its section's checks use
                    refused = field_metadata(owner, key.rpartition(".")[2]).get("refused")
                    self.errors.append(f"{item.origin}: {choice_problem(key, item.value, tp, refused)}")
                    continue
                self.errors.append(f"{item.origin}: config key '{key}' expects {exc}, "
                                   f"got {_show(item.value)} ({type(item.value).__name__})")
        if self.errors:
            raise ConfigError(self.errors)
        cfg = self._build(self.cls, "", None)
        token = _VALIDATED.set(set())
        try:
            _run_validate(cfg, "")
        finally:
            _VALIDATED.reset(token)
        return cfg

    def _build(self, cls: type, prefix: str, default: Any) -> Any:
        """`cls` from the set leaves under `prefix`, over `default` (the instance its parent's
        default_factory makes, e.g. `lambda: OptimConfig(lr=1e-3)`). Only the fields where that
        instance differs from the class defaults are passed on, so that derived values are
        recomputed from the final inputs."""
        kwargs: dict[str, Any] = {}
        if default is not None:
            plain = cls()
            kwargs = {f.name: getattr(default, f.name) for f in dataclasses.fields(cls)
                      if f.init and getattr(default, f.name) != getattr(plain, f.name)}
        for f in dataclasses.fields(cls):
            key = prefix + f.name
            if key in self.schema and _is_section(self.schema[key][0]):
                if f.name not in kwargs:
                    kwargs[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                kwargs[f.name] = self._build(self.schema[key][0], key + ".", kwargs[f.name])
            elif key in self.leaves:
                kwargs[f.name] = self.leaves[key].value
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (ValueError, TypeError, AssertionError) as exc:
            where = f"section '{prefix[:-1]}'" if prefix else cls.__name__
            raise ConfigError(f"invalid config ({where}): {exc}") from exc


def _merged(old: Mapping, new: Mapping) -> dict:
    """`new` over `old`, mappings inside merged the same way."""
    out = dict(old)
    for k, v in new.items():
        out[k] = _merged(out[k], v) if isinstance(out.get(k), Mapping) and isinstance(v, Mapping) else v
    return out


# The ids of the sections load_config has validated so far in this load (None outside one): a top-level
# validate() that re-checks sections for a config built in Python (validate_sections) skips those.
_VALIDATED: contextvars.ContextVar[set[int] | None] = contextvars.ContextVar("rlvr_config_validated", default=None)


def _run_validate(cfg: Any, prefix: str) -> None:
    """Call `validate()` on every section (children first), then on the top level."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            _run_validate(value, prefix + f.name + ".")
    validate = getattr(cfg, "validate", None)
    if callable(validate):
        try:
            validate()
        except ConfigError:
            raise
        except (ValueError, TypeError, AssertionError) as exc:
            where = f"section '{prefix[:-1]}'" if prefix else type(cfg).__name__
            raise ConfigError(f"invalid config ({where}): {exc}") from exc
    if (done := _VALIDATED.get()) is not None:
        done.add(id(cfg))


def validate_sections(cfg: Any, *names: str) -> None:
    """Run `validate()` of the sections `names` of `cfg` (and of their own sections, children first), as
    load_config does: for a top-level `validate()` that re-checks them when the config was built in Python.
    Inside load_config a section it has already validated is skipped, so each rule runs once per load."""
    done = _VALIDATED.get() or set()
    for name in names:
        section = getattr(cfg, name)
        if id(section) not in done:
            _run_validate(section, name + ".")


def section(cfg: Any, name: str) -> Any:
    """The section `name` of a config dataclass, or None when its class declares no such section (the demo's
    config has no data or model section): for code that serves every stage's config."""
    return getattr(cfg, name) if name in {f.name for f in dataclasses.fields(cfg)} else None


# ------------------------------------------------------------------------------------ public API


def _hashes(value: Any) -> int:
    """How many '#' the strings (keys included) of a loaded YAML value hold."""
    if isinstance(value, str):
        return value.count("#")
    if isinstance(value, Mapping):
        return sum(_hashes(k) + _hashes(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_hashes(v) for v in value)
    return 0


def parse_override(text: str) -> tuple[str, str, Any]:
    """`'optim.lr=1e-4'` -> ('optim.lr', '1e-4', 1e-4). The value is parsed as (strict) YAML, so
    lists and mappings work: `sampling.stop=["</answer>"]`, `optim={lr: 1e-3}`. A value that YAML would cut
    at a comment (`run.out_dir=runs/exp2 #b` reads as `runs/exp2`) is refused, not truncated: quote it.
    A path from a flag is never parsed: it is a typed override, `(key, value)` (load_config)."""
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not re.fullmatch(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", key):
        raise ConfigError(f"bad override {text!r}: expected dotted.key=value, e.g. optim.lr=1e-4")
    try:
        value = _yaml_load(raw, f"override '{text}'") if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"bad override {text!r}: value is not valid YAML ({exc.problem})") from exc
    if raw.count("#") > _hashes(value):  # a '#' that is in no string of the value began a YAML comment
        starts = [m.end() - 1 for m in re.finditer(r"(?:^|\s)#", raw)]
        unquoted = [i for i in starts if raw[:i].count("'") % 2 == 0 and raw[:i].count('"') % 2 == 0]
        cut = raw[(unquoted or starts or [raw.index("#")])[0]:].strip()
        raise ConfigError(f"bad override {text!r}: YAML reads {cut!r} as a comment and would drop it (the value "
                          f"would be {_show(value)}); quote the value to keep it, e.g. \"{key}={_quote(raw.strip())}\" "
                          "(the outer quotes are the shell's), or leave the comment out")
    return key, raw.strip(), value


def _quote(text: str) -> str:
    """`text` as a single-quoted YAML scalar."""
    return "'" + text.replace("'", "''") + "'"


def read_yaml(path: str | Path, what: str = "config file") -> tuple[Any, dict[str, int]]:
    """(data, {dotted key: 1-based line}) of a YAML file with the strict rules above; list items are keyed by
    index. ConfigError naming the file (and line) when it cannot be read, is not YAML or repeats a key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: cannot read {what}: it is not UTF-8 text ({exc.reason} at byte {exc.start})") \
            from None
    try:
        return _read_yaml(text, str(path))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        loc = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{loc}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc


def load_config(
    cls: type[T],
    path: str | Path | Sequence[str | Path] | None = None,
    overrides: Sequence[str | tuple] = (),
    base: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from defaults < `base` < YAML file at `path` < `overrides`.

    `path` may be several files, later ones winning (a resumed run's config.yaml, then a file of the
    user's). An override is a `"dotted.key=value"` string, its value parsed as YAML, or a typed
    `(key, value)` / `(key, value, origin)` tuple whose value is taken as it is: a path from a flag
    (`--resume DIR`) is never parsed (`runs/exp2 #b` stays that path). Raises ConfigError (listing every
    problem found) before anything is constructed if a key is unknown or a value has the wrong type;
    then section `__post_init__`/`validate()` errors. `base` may be nested (`{"algo": {"loss": "x"}}`)
    or dotted (`{"algo.loss": "x"}`).
    """
    if not _is_section(cls):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'key=value' strings, not one string")
    builder = _Builder(cls)
    if base:
        builder.add_mapping(base, "base config")
    paths = [] if path is None else [path] if isinstance(path, str | Path) else list(path)
    for one in paths:
        data, lines = read_yaml(one)
        if data is not None:
            builder.add_mapping(data, str(one), lines)
    for text in overrides:
        builder.add_override(text)
    return builder.build()


def to_dict(cfg: Any) -> Any:
    """Plain nested dict of a config, init fields only (derived `init=False` fields cannot be
    loaded back, so they are not written)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, list | tuple):
        return [to_dict(x) for x in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text that `load_config` reads back to an equal config."""
    return yaml.dump(to_dict(cfg), Dumper=YamlDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)


def dump_yaml(cfg: Any, path: str | Path) -> Path:
    """Write `to_yaml(cfg)` to `path` (parent directories created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg), encoding="utf-8")
    return path


def config_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every leaf key of a config class, in field order.
    Defaults are those of the top-level default instance (so `lambda: OptimConfig(lr=1e-3)` shows
    1e-3)."""
    docs, instance, rows = field_docs(cls), cls(), []
    for key, (tp, owner) in _schema(cls).items():
        if not _is_section(tp):
            value = functools.reduce(getattr, key.split("."), instance)
            text = yaml.dump(to_dict(value), Dumper=YamlDumper, default_flow_style=True, width=10_000)
            kind = type_name(tp)
            if names := field_metadata(owner, key.rpartition(".")[2]).get("names"):  # an open set: its built-ins
                kind = "{" + ", ".join(_choice_text(n, quote=False) for n in names) + "} or a registered name"
            rows.append((key, kind, text.strip().removesuffix("...").strip(), docs[key]))
    return rows


def config_help(cls: type, width: int = 120) -> str:
    """A rich table (rendered to text) of every key: dotted key, type, default, description."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{cls.__name__} keys (set in YAML or as dotted key=value overrides)",
                  show_lines=False, expand=False)
    table.add_column("key", style="bold", no_wrap=True)
    for name in ("type", "default", "description"):
        table.add_column(name)
    for row in config_rows(cls):  # Text, not markup: `pip install 'rlvr[lora]'` keeps its brackets
        table.add_row(*(Text(cell) for cell in row))
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(table)
    return buf.getvalue()


def config_markdown(cls: type) -> str:
    """The same table as markdown (for docs)."""
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key, tp, default, doc in config_rows(cls):
        cells = [f"`{key}`", tp.replace("|", "\\|"), f"`{default}`", doc.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def split_config_args(args: Sequence[str | tuple] | None) -> tuple[Path | None, list[str | tuple]]:
    """Split CLI extra arguments into (YAML path or None, overrides).

    For typer: declare `args: list[str] = typer.Argument(None)` and call this, so that
    `rlvr train run.yaml algo.loss=grpo_clip optim.lr=1e-4` works (the path is optional and may
    stand anywhere). Anything that is neither `key=value` nor a .yaml/.yml path is an error. A typed
    override `(key, value)` (a command's spelling of a path, e.g. `rlvr eval RUN_DIR`) passes as it is.
    """
    path: Path | None = None
    overrides: list[str | tuple] = []
    for arg in args or ():
        if isinstance(arg, tuple):
            overrides.append(arg)
        elif arg.lower().endswith((".yaml", ".yml")) and "=" not in arg:
            if path is not None:
                raise ConfigError(f"two config files given ({path} and {arg}); pass one and use overrides")
            path = Path(arg)
        elif "=" in arg:
            overrides.append(arg)
        else:
            raise ConfigError(f"argument {arg!r} is neither a config file (.yaml) nor an override key=value")
    return path, overrides
