"""Config system: YAML files and dotted command-line overrides into nested dataclasses, strictly.

A trainer's config is a dataclass composed of small section dataclasses (model, data, sampling,
algo, optim, run). Every field carries an attribute docstring (a string literal on the line after
the field); `field_docs` reads them from the source so the CLI help is generated, not duplicated.

    cfg = load_config(TrainConfig, "run.yaml", ["algo.loss=grpo_clip", "optim.lr=1e-4"], base=recipe)

Layers, lowest first: dataclass defaults < `base` (e.g. a recipe preset) < YAML file < overrides.
Everything is validated before any work starts: an unknown key fails naming the full dotted key,
the file and line, and close matches; a wrong type names the key, the expected type and the value.
After construction each section's `__post_init__` (automatic) and then `validate()` (if defined)
run bottom-up, so derived values are filled right after parsing and cross-field checks fail early.

YAML is read with a stricter resolver than PyYAML's YAML 1.1 default: only `true`/`false` are
booleans (`yes`, `on`, `no` stay strings, so they fail for a bool field and survive for a str
field), and `1e-4` is a float (YAML 1.1 wants `1.0e-4`). `dump_yaml` writes with the same
resolver, so a dumped config loads back exactly.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import functools
import inspect
import io
import re
import textwrap
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")

__all__ = [
    "ConfigError",
    "config_help",
    "config_markdown",
    "config_rows",
    "dump_yaml",
    "field_docs",
    "load_config",
    "parse_override",
    "split_config_args",
    "to_dict",
    "to_yaml",
    "type_name",
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

    def add(tag: str, regexp: re.Pattern, first: str) -> None:
        for ch in first:
            table.setdefault(ch, []).append((tag, regexp))

    add("tag:yaml.org,2002:bool", _BOOL_RE, "tTfF")
    add("tag:yaml.org,2002:int", _INT_RE, "-+0123456789")
    add("tag:yaml.org,2002:float", _FLOAT_RE, "-+0123456789.")
    add("tag:yaml.org,2002:null", _NULL_RE, "~nN")
    table.setdefault(None, []).append(("tag:yaml.org,2002:null", _NULL_RE))  # the empty scalar
    return table


class _Loader(yaml.SafeLoader):
    """SafeLoader with the strict resolver table (see module docstring)."""


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes exactly the strings `_Loader` would read as something else."""


_Loader.yaml_implicit_resolvers = _strict_resolvers()
_Dumper.yaml_implicit_resolvers = _strict_resolvers()


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    return int(loader.construct_scalar(node).replace("_", ""), 0)


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)  # no YAML 1.1 octal/sexagesimal


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def _yaml_line_map(text: str, source: str) -> dict[str, int]:
    """Dotted key -> 1-based line number of the key in a YAML mapping document; rejects duplicates."""
    node = yaml.compose(text, Loader=_Loader)
    lines: dict[str, int] = {}
    errors: list[str] = []

    def walk(n: yaml.Node, prefix: str) -> None:
        if not isinstance(n, yaml.MappingNode):
            return
        seen: set[str] = set()
        for key_node, value_node in n.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = prefix + str(key_node.value)
            if key in seen:
                errors.append(f"{source}:{key_node.start_mark.line + 1}: duplicate key '{key}'")
            seen.add(key)
            lines[key] = key_node.start_mark.line + 1
            walk(value_node, key + ".")

    if node is not None:
        walk(node, "")
    if errors:
        raise ConfigError(errors)
    return lines


# ------------------------------------------------------------------------------ schema helpers


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _init_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """(X, True) for `X | None`, else (tp, False)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(args) < len(typing.get_args(tp)):
            return args[0], True
    return tp, False


def _section_type(tp: Any) -> type | None:
    """The dataclass of a section field (`Section` or `Section | None`), else None."""
    inner, _ = _strip_optional(tp)
    return inner if isinstance(inner, type) and dataclasses.is_dataclass(inner) else None


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key a config accepts: leaves and sections."""
    out = []
    hints = _hints(cls)
    for f in _init_fields(cls):
        key = prefix + f.name
        out.append(key)
        sub = _section_type(hints[f.name])
        if sub is not None:
            out.extend(_all_keys(sub, key + "."))
    return out


def type_name(tp: Any) -> str:
    """Readable type: `float`, `int | None`, `tuple[str, ...]`, `{grpo, dr_grpo}` for Literals."""
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return "{" + ", ".join(str(a) for a in args) + "}"
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin in (tuple, list, dict):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{type_name(args[0])}, ...]"
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]" if args else origin.__name__
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


# ------------------------------------------------------------------------------------ field docs


def _class_attribute_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of one class body (not its bases): {field: doc}."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in a REPL / exec: no source, no docs
        return {}
    tree = ast.parse(source)
    cls_node = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if cls_node is None:
        return {}
    docs: dict[str, str] = {}
    body = cls_node.body
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            # Multi-line docstrings are folded into one line: help tables show one row per key.
            docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


@functools.cache
def _own_docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):  # subclasses override their bases' docs
        if dataclasses.is_dataclass(klass):
            docs.update(_class_attribute_docs(klass))
    return docs


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a config dataclass, by dotted key, nested sections included.

    `field_docs(TrainConfig)["optim.lr"] == "Peak learning rate."`; a section's own entry
    (`"optim"`) is the docstring under the section field. Fields without a docstring map to "".
    Parsed from the source with `ast` and cached per class.
    """
    out: dict[str, str] = {}
    docs = _own_docs(cls)
    hints = _hints(cls)
    for f in _init_fields(cls):
        out[f.name] = docs.get(f.name, "")
        sub = _section_type(hints[f.name])
        if sub is not None:
            out.update({f"{f.name}.{k}": v for k, v in field_docs(sub).items()})
    return out


# ------------------------------------------------------------------------------------ coercion


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
    if tp is Any:
        return value
    if tp is type(None):
        if value is None:
            return None
        raise _TypeMismatch("null")
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, raw)
            except _TypeMismatch:
                continue
        raise _TypeMismatch(type_name(tp))
    if origin is Literal:
        for allowed in args:
            # `type(...) is` so that True does not match 1 and 1 does not match 1.0.
            if type(allowed) is type(value) and allowed == value:
                return allowed
        if raw is not None and raw in [str(a) for a in args if isinstance(a, str)]:
            return raw
        raise _TypeMismatch("one of " + ", ".join(repr(a) for a in args))
    if origin in (list, tuple) or origin is dict or tp is dict:
        try:
            return _coerce_container(value, tp, origin, args)
        except _TypeMismatch as exc:
            if str(exc).startswith(type_name(tp)):
                raise
            raise _TypeMismatch(f"{type_name(tp)} ({exc})") from None
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
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise _TypeMismatch("float")
    if tp is str:
        if isinstance(value, str):
            return value
        if raw is not None and not isinstance(value, list | dict):
            return raw  # `run.name=007` on the command line means the string "007"
        raise _TypeMismatch("str (quote the value)")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        for member in tp:
            if value == member.value or value == member.name:
                return member
        raise _TypeMismatch("one of " + ", ".join(repr(m.value) for m in tp))
    if tp is Path:
        if isinstance(value, str | Path):
            return Path(value)
        raise _TypeMismatch("path (str)")
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _TypeMismatch(tp.__name__)
    return value


def _coerce_container(value: Any, tp: Any, origin: Any, args: tuple) -> Any:
    def item(v: Any, t: Any, where: str) -> Any:
        try:
            return _coerce(v, t)
        except _TypeMismatch as exc:
            raise _TypeMismatch(f"{where}: expected {exc}, got {_show(v)}") from None

    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise _TypeMismatch(type_name(tp))
        kt, vt = args if args else (Any, Any)
        return {item(k, kt, f"key {k!r}"): item(v, vt, f"value of {k!r}") for k, v in value.items()}
    if not isinstance(value, list | tuple):
        raise _TypeMismatch(type_name(tp))
    if origin is list:
        t = args[0] if args else Any
        return [item(v, t, f"item {i}") for i, v in enumerate(value)]
    if not args or (len(args) == 2 and args[1] is Ellipsis):
        t = args[0] if args else Any
        return tuple(item(v, t, f"item {i}") for i, v in enumerate(value))
    if len(args) != len(value):
        raise _TypeMismatch(f"{type_name(tp)} (exactly {len(args)} items)")
    return tuple(item(v, a, f"item {i}") for i, (v, a) in enumerate(zip(value, args, strict=True)))


# ------------------------------------------------------------------------------------- layering


class _Builder:
    """Merges layers into a tree of _Leaf values checked against the schema, then builds the config."""

    def __init__(self, cls: type):
        self.cls = cls
        self.tree: dict[str, Any] = {}
        self.errors: list[str] = []
        self.all_keys = _all_keys(cls)

    def _unknown(self, key: str, where: str) -> None:
        # Prefer a near miss inside the same section (optim.lrr -> optim.lr), then any key.
        head, _, last = key.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in self.all_keys if k.rpartition(".")[0] == head]
        close = [f"{head}.{s}" if head else s for s in difflib.get_close_matches(last, siblings, n=3)]
        if not close:
            close = difflib.get_close_matches(key, self.all_keys, n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        self.errors.append(f"{where}: unknown config key '{key}'{hint}")

    def add_mapping(
        self,
        data: Any,
        origin: str,
        lines: dict[str, int] | None = None,
        cls: type | None = None,
        node: dict | None = None,
        prefix: str = "",
    ) -> None:
        """Add one layer given as a (possibly nested, possibly dotted-key) mapping. `cls`, `node`
        and `prefix` place it below the top level (an override that sets a whole section)."""

        def where(ykey: str) -> str:
            if lines is not None and ykey in lines:
                return f"{origin}:{lines[ykey]}"
            return origin

        def walk(cls: type, node: dict, mapping: Mapping, prefix: str, yaml_prefix: str) -> None:
            hints = _hints(cls)
            names = {f.name for f in _init_fields(cls)}
            derived = {f.name for f in dataclasses.fields(cls) if not f.init}
            for raw_key, value in mapping.items():
                key = str(raw_key)
                ykey = yaml_prefix + key  # the key as the YAML line map spells it
                name, dot, rest = key.partition(".")
                if name in derived:
                    self.errors.append(f"{where(ykey)}: '{prefix + name}' is derived and cannot be set")
                    continue
                if name not in names:
                    self._unknown(prefix + key, where(ykey))
                    continue
                sub = _section_type(hints[name])
                if sub is not None and isinstance(value, sub):  # a section instance (e.g. in a preset)
                    value = _plain(value)
                if dot:  # `optim.lr: 1e-4` written inside a mapping
                    if sub is None:
                        self._unknown(prefix + key, where(ykey))
                        continue
                    child = node.get(name)
                    if not isinstance(child, dict):
                        child = node[name] = {}
                    walk(sub, child, {rest: value}, prefix + name + ".", yaml_prefix + name + ".")
                elif sub is not None and isinstance(value, Mapping):
                    child = node.get(name)
                    if not isinstance(child, dict):
                        child = node[name] = {}
                    walk(sub, child, value, prefix + name + ".", ykey + ".")
                elif sub is not None and value is not None:
                    self.errors.append(
                        f"{where(ykey)}: config key '{prefix + name}' is a section; expected a mapping "
                        f"of its keys, got {_show(value)}"
                    )
                else:
                    node[name] = _Leaf(value, where(ykey))

        if not isinstance(data, Mapping):
            self.errors.append(f"{origin}: expected a mapping of config keys, got {_show(data)}")
            return
        walk(cls or self.cls, self.tree if node is None else node, data, prefix, "")

    def add_override(self, text: str) -> None:
        """Add one `dotted.key=value` override; the value is parsed as YAML."""
        origin = f"override '{text}'"
        try:
            key, raw, value = parse_override(text)
        except ConfigError as exc:
            self.errors.extend(exc.errors)
            return
        parts = key.split(".")
        cls, node = self.cls, self.tree
        for i, part in enumerate(parts):
            dotted = ".".join(parts[: i + 1])
            if part not in {f.name for f in _init_fields(cls)}:
                self._unknown(key, origin)
                return
            sub = _section_type(_hints(cls)[part])
            if i == len(parts) - 1:
                if sub is not None and isinstance(value, Mapping):  # `optim={lr: 1e-3}`
                    child = node.get(part)
                    if not isinstance(child, dict):
                        child = node[part] = {}
                    self.add_mapping(value, origin, cls=sub, node=child, prefix=dotted + ".")
                elif sub is not None and value is not None:
                    self.errors.append(f"{origin}: config key '{dotted}' is a section; set its keys, "
                                       f"e.g. {dotted}.<key>=value")
                else:
                    node[part] = _Leaf(value, origin, raw)
                return
            if sub is None:
                self._unknown(key, origin)
                return
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            cls, node = sub, child

    def build(self) -> Any:
        self._check(self.cls, self.tree, "")  # every type error is collected before anything is built
        if self.errors:
            raise ConfigError(self.errors)
        cfg = self._build(self.cls, self.tree, "", None)
        _run_validate(cfg, "")
        return cfg

    def _check(self, cls: type, node: dict, prefix: str) -> None:
        """Coerce every leaf to its field type in place; collect mismatches."""
        hints = _hints(cls)
        for f in _init_fields(cls):
            item = node.get(f.name)
            sub = _section_type(hints[f.name])
            if sub is not None and isinstance(item, dict):
                self._check(sub, item, prefix + f.name + ".")
            elif isinstance(item, _Leaf):
                try:
                    item.value = _coerce(item.value, hints[f.name], item.raw)
                except _TypeMismatch as exc:
                    self.errors.append(
                        f"{item.origin}: config key '{prefix + f.name}' expects {exc}, "
                        f"got {_show(item.value)} ({type(item.value).__name__})"
                    )

    def _build(self, cls: type, node: dict, prefix: str, default_instance: Any) -> Any:
        hints = _hints(cls)
        kwargs: dict[str, Any] = {}
        base_kwargs = _changed_defaults(cls, default_instance)
        for f in _init_fields(cls):
            sub = _section_type(hints[f.name])
            item = node.get(f.name)
            if sub is not None and isinstance(item, dict):
                # The section's own default (a default_factory may preset values) is the lowest layer.
                default = base_kwargs.get(f.name, _field_default(f))
                kwargs[f.name] = self._build(sub, item, prefix + f.name + ".",
                                             default if isinstance(default, sub) else None)
            elif isinstance(item, _Leaf):
                kwargs[f.name] = item.value
            elif f.name in base_kwargs:
                kwargs[f.name] = base_kwargs[f.name]
        try:
            return cls(**kwargs)
        except ConfigError:
            raise
        except (ValueError, TypeError, AssertionError) as exc:
            where = f"section '{prefix[:-1]}'" if prefix else cls.__name__
            raise ConfigError(f"invalid config ({where}): {exc}") from exc


_MISSING = dataclasses.MISSING


def _field_default(f: dataclasses.Field) -> Any:
    if f.default is not _MISSING:
        return f.default
    if f.default_factory is not _MISSING:
        return f.default_factory()
    return None


def _changed_defaults(cls: type, default_instance: Any) -> dict[str, Any]:
    """Init fields where a section's default instance (from its parent's default_factory, e.g.
    `lambda: OptimConfig(lr=1e-3)`) differs from the class defaults: the lowest layer for this
    section. Fields equal to the class default are left to the constructor so that derived values
    are recomputed from the final inputs."""
    if default_instance is None:
        return {}
    try:
        plain = cls()
    except TypeError:  # required fields: every field of the default instance counts
        plain = None
    out = {}
    for f in _init_fields(cls):
        value = getattr(default_instance, f.name)
        if plain is None or value != getattr(plain, f.name):
            out[f.name] = value
    return out


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


# ------------------------------------------------------------------------------------ public API


def parse_override(text: str) -> tuple[str, str, Any]:
    """`'optim.lr=1e-4'` -> ('optim.lr', '1e-4', 1e-4). The value is parsed as (strict) YAML, so
    lists and mappings work: `sampling.stop=["</answer>"]`, `algo.weights={format: 0.1}`."""
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not key or not re.fullmatch(r"[A-Za-z_][\w.]*", key) or ".." in key or key.endswith("."):
        raise ConfigError(f"bad override {text!r}: expected dotted.key=value, e.g. optim.lr=1e-4")
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"bad override {text!r}: value is not valid YAML ({exc.problem})") from exc
    return key, raw.strip(), value


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    base: Mapping[str, Any] | None = None,
) -> T:
    """Build `cls` from defaults < `base` < YAML file at `path` < dotted `overrides`.

    Raises ConfigError (listing every problem found) before anything is constructed if a key is
    unknown or a value has the wrong type; then section `__post_init__`/`validate()` errors.
    `base` may be nested (`{"algo": {"loss": "x"}}`) or dotted (`{"algo.loss": "x"}`).
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    builder = _Builder(cls)
    if base:
        builder.add_mapping(base, "base config")
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file ({exc.strerror or exc})") from exc
        try:
            data = _yaml_load(text)
            lines = _yaml_line_map(text, str(path))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            loc = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            raise ConfigError(f"{loc}: invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
        if data is not None:
            builder.add_mapping(data, str(path), lines)
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of 'key=value' strings, not one string")
    for text in overrides:
        builder.add_override(text)
    return builder.build()


def _plain(v: Any) -> Any:
    """YAML-safe plain value: dataclasses -> dicts, tuples -> lists, enums -> values, paths -> str."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in _init_fields(type(v))}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {_plain(k): _plain(x) for k, x in v.items()}
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, Path):
        return str(v)
    return v


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (tuples -> lists, enums -> values, paths -> str); init fields
    only (derived `init=False` fields cannot be loaded back, so they are not written)."""
    return _plain(cfg)


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text that `load_config` reads back to an equal config."""
    return yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True)


def dump_yaml(cfg: Any, path: str | Path) -> Path:
    """Write `to_yaml(cfg)` to `path` (parent directories created). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg), encoding="utf-8")
    return path


def _default_text(value: Any) -> str:
    if value is _MISSING:
        return "(required)"
    text = yaml.dump(_plain(value), Dumper=_Dumper, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def config_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, doc) for every leaf key of a config class, in field order.
    Defaults are those of the top-level default instance (so `lambda: OptimConfig(lr=1e-3)` shows
    1e-3). An optional section that defaults to null gets its own row, then rows for its keys with
    the section class's defaults (what setting one of them starts from)."""
    docs = field_docs(cls)
    rows: list[tuple[str, str, str, str]] = []

    def walk(klass: type, instance: Any, prefix: str) -> None:
        hints = _hints(klass)
        for f in _init_fields(klass):
            key = prefix + f.name
            sub = _section_type(hints[f.name])
            value = getattr(instance, f.name) if instance is not None else _MISSING
            if sub is not None and (value is _MISSING or isinstance(value, sub)):
                walk(sub, None if value is _MISSING else value, key + ".")
            elif sub is not None:  # an optional section that is off by default: it, then its keys
                rows.append((key, type_name(hints[f.name]), _default_text(value), docs.get(key, "")))
                try:
                    walk(sub, sub(), key + ".")
                except TypeError:
                    walk(sub, None, key + ".")
            else:
                rows.append((key, type_name(hints[f.name]), _default_text(value), docs.get(key, "")))

    try:
        instance = cls()
    except TypeError:
        instance = None
    walk(cls, instance, "")
    return rows


def config_help(cls: type, width: int = 120) -> str:
    """A rich table (rendered to text) of every key: dotted key, type, default, description."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{cls.__name__} keys (set in YAML or as dotted key=value overrides)",
                  show_lines=False, expand=False)
    table.add_column("key", style="bold", no_wrap=True)
    table.add_column("type")
    table.add_column("default")
    table.add_column("description")
    for row in config_rows(cls):
        table.add_row(*row)
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


def split_config_args(args: Sequence[str] | None) -> tuple[Path | None, list[str]]:
    """Split CLI extra arguments into (YAML path or None, overrides).

    For typer: declare `args: list[str] = typer.Argument(None)` and call this, so that
    `rlvr train run.yaml algo.loss=grpo_clip optim.lr=1e-4` works (the path is optional and may
    stand anywhere). Anything that is neither `key=value` nor a .yaml/.yml path is an error.
    """
    path: Path | None = None
    overrides: list[str] = []
    for arg in args or ():
        if "=" in arg and not arg.lower().endswith((".yaml", ".yml")):
            overrides.append(arg)
        elif arg.lower().endswith((".yaml", ".yml")):
            if path is not None:
                raise ConfigError(f"two config files given ({path} and {arg}); pass one and use overrides")
            path = Path(arg)
        else:
            raise ConfigError(f"argument {arg!r} is neither a config file (.yaml) nor an override key=value")
    return path, overrides
