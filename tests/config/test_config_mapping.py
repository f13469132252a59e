"""A `dict[str, Any]` config field (data.rg, issue 40 item 5): a free mapping its section checks, set from YAML, as a
whole (`key={a: 1}`, merged into lower layers) or one key at a time (`key.a=1`), emptied by `key=`, dumped back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rlvr.config import ConfigError, config_rows, load_config, to_yaml


@dataclass
class Section:
    name: str = "x"
    """A name."""
    opts: dict[str, Any] = field(default_factory=dict)
    """Free options."""


@dataclass
class Root:
    sec: Section = field(default_factory=Section)
    """The section."""


def test_mapping_field_layers_merge_and_dump_back(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sec:\n  opts:\n    a: 1\n    ops: [+, '-']\n")
    cfg = load_config(Root, path, ["sec.opts.b=2", "sec.opts={a: 3, c: {d: 4}}", "sec.opts.c.e=5"])
    assert cfg.sec.opts == {"a": 3, "ops": ["+", "-"], "b": 2, "c": {"d": 4, "e": 5}}
    again = tmp_path / "again.yaml"
    again.write_text(to_yaml(cfg))
    assert load_config(Root, again).sec.opts == cfg.sec.opts
    assert load_config(Root, path, ["sec.opts="]).sec.opts == {}  # `key=` empties it
    assert load_config(Root).sec.opts == {} and Root().sec.opts is not Section().opts
    rows = {r[0]: r for r in config_rows(Root)}
    assert rows["sec.opts"][1:3] == ("mapping", "{}")


def test_mapping_field_refuses_a_scalar_and_keys_outside_it_stay_unknown():
    with pytest.raises(ConfigError, match=r"'sec\.opts' expects a mapping"):
        load_config(Root, None, ["sec.opts=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'sec\.nam\.x'"):
        load_config(Root, None, ["sec.nam.x=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'sec\.name\.x'"):  # a str field has no keys
        load_config(Root, None, ["sec.name.x=1"])
