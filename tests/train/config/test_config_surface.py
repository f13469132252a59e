"""The config's surface (issue 39, items 2 and 3): every closed set of choices is listed by `--help-config` (and
`rlvr <cmd> --help`), and no code reads a config section through `getattr(section, "key", default)`: every
stage's sections are dataclasses with those fields, so a default there would only hide a typo or a removed
key (the probes that served "older config objects" are gone)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

import pytest
from helpers import REPO

from rlvr.config import config_help, config_rows
from rlvr.train.config import (
    DemoConfig,
    DistillConfig,
    EIConfig,
    EvalConfig,
    FilterConfig,
    SFTConfig,
    TrainConfig,
)

ROOT = REPO
STAGES = (TrainConfig, SFTConfig, EIConfig, DistillConfig, EvalConfig, FilterConfig, DemoConfig)


def _literal_fields(cls: type, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _literal_fields(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is typing.Literal:
            yield prefix + f.name, typing.get_args(tp)


@pytest.mark.parametrize("cls", STAGES, ids=lambda c: c.__name__)
def test_help_lists_the_choices_of_every_closed_set(cls):
    text = config_help(cls, width=10_000)
    rows = {key: tp for key, tp, _default, _doc in config_rows(cls)}
    fields = list(_literal_fields(cls))
    if cls is TrainConfig:
        assert {"algo.kl_estimator", "rollout.backend", "model.dtype", "distributed.learner"} <= dict(fields).keys()
    for key, choices in fields:
        assert rows[key].startswith("{"), key
        for choice in choices:
            shown = repr(choice) if choice == "" else str(choice).lower() if isinstance(choice, bool) else str(choice)
            assert shown in rows[key], (key, choice, rows[key])
        line = next(x for x in text.splitlines() if x.replace("│", " ").split()[:1] == [key])
        assert rows[key] in line, (key, line)


def config_probes(root: Path = ROOT / "rlvr") -> list[str]:
    """`getattr(<a config section>, "<key>", <default>)` anywhere in rlvr/: the object is a name (or an
    attribute chain) that reads as a config section (cfg, mcfg, rcfg, dcfg, data_cfg, jcfg, algo, or
    `<...>.model/.data/.sampling/.rollout/.algo/.run/.distributed/.teacher/.judge/.optim` of one)."""
    names = {"cfg", "mcfg", "rcfg", "dcfg", "data_cfg", "jcfg", "algo", "sampling_cfg"}
    sections = {"model", "data", "sampling", "rollout", "algo", "run", "distributed", "teacher", "judge", "optim"}
    out = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "config.py" and path.parent.name == "rlvr":  # the loader: generic over every dataclass
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) == 3 and isinstance(node.args[1], ast.Constant)):
                continue
            obj = node.args[0]
            chain = []
            while isinstance(obj, ast.Attribute):
                chain.append(obj.attr)
                obj = obj.value
            base = obj.id if isinstance(obj, ast.Name) else ""
            if base == "self" and chain:  # self.cfg..., self.algo...
                base = chain.pop()
            is_section = base in names and (not chain or chain[-1] in sections)
            if is_section:
                out.append(f"{path.relative_to(root.parent)}:{node.lineno}: {ast.unparse(node)}")
    return out


def test_no_config_section_is_read_with_a_getattr_default():
    assert config_probes() == []


def test_the_probe_check_sees_a_probe(tmp_path):
    pkg = tmp_path / "rlvr"
    pkg.mkdir()
    (pkg / "a.py").write_text('def f(cfg, model):\n    x = getattr(cfg.rollout, "batch_size", 0)\n'
                              '    y = getattr(model.config, "head_dim", None)\n    return getattr(cfg, "judge", None)\n')
    assert config_probes(pkg) == ['rlvr/a.py:2: getattr(cfg.rollout, \'batch_size\', 0)',
                                  'rlvr/a.py:4: getattr(cfg, \'judge\', None)']
