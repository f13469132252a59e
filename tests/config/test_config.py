"""rlvr.config: layering, strict validation with located errors, round-trips, field docs, help."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from rlvr.config import (
    ConfigError,
    config_help,
    config_markdown,
    config_rows,
    dump_yaml,
    field_docs,
    load_config,
    parse_override,
    split_config_args,
    to_dict,
    to_yaml,
    type_name,
)


@dataclass
class OptimSection:
    """Optimizer."""

    lr: float = 1e-5
    """Peak learning rate of AdamW."""
    steps: int = 100
    """Optimizer steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Schedule after warmup."""
    clip: float = 0.0
    """Gradient-norm clip;
    0 = off (a docstring over two lines)."""

    def validate(self) -> None:
        if self.steps < 1:
            raise ValueError(f"optim.steps must be >= 1, got {self.steps}")


@dataclass
class SamplingSection:
    n_prompts: int = 4
    """Prompts per step."""
    group_size: int = 2
    """Responses per prompt."""
    stop: list[str] = field(default_factory=list)
    """Stop strings."""
    greedy: bool = False
    """Greedy decoding."""
    batch: int = field(init=False, default=0)
    """Derived: n_prompts * group_size."""

    def __post_init__(self) -> None:
        self.batch = self.n_prompts * self.group_size


@dataclass
class AlgoSection:
    loss: str = "grpo_clip"
    """Policy loss name."""
    tags: list[int] = field(default_factory=list)
    """Some ints."""
    micro_batch: int = 0
    """Rollouts per backward; 0 = derived (the whole batch)."""


@dataclass
class RootConfig:
    """A trainer config for tests."""

    optim: OptimSection = field(default_factory=lambda: OptimSection(lr=3e-4))
    """Optimizer section (its factory presets lr)."""
    sampling: SamplingSection = field(default_factory=SamplingSection)
    """Sampling section."""
    algo: AlgoSection = field(default_factory=AlgoSection)
    """Algorithm section."""
    name: str = "run"
    """Run name."""
    seed: int = 0
    """Seed; 0 = random."""

    def validate(self) -> None:
        if self.algo.micro_batch == 0:
            self.algo.micro_batch = self.sampling.batch  # derived right after parsing
        if self.sampling.batch % self.algo.micro_batch:
            raise ValueError(
                f"sampling.n_prompts * sampling.group_size = {self.sampling.batch} is not divisible by "
                f"algo.micro_batch = {self.algo.micro_batch}"
            )


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ----------------------------------------------------------------------------------- layering


def test_defaults_include_factory_presets_and_derived_values():
    cfg = load_config(RootConfig)
    assert cfg.optim.lr == 3e-4  # the section's default_factory preset, not the class default 1e-5
    assert cfg.sampling.batch == 8  # 4 * 2 from __post_init__
    assert cfg.algo.micro_batch == 8  # from the top-level validate()


def test_layer_order_defaults_base_yaml_overrides(tmp_path):
    base = {"optim": {"lr": 1e-3, "steps": 7}, "name": "from-base", "sampling.group_size": 4}
    path = write(tmp_path, "optim:\n  lr: 2e-3\nname: from-yaml\n")
    cfg = load_config(RootConfig, path, ["optim.lr=5e-3"], base=base)
    assert cfg.optim.lr == 5e-3  # override beats yaml beats base
    assert cfg.name == "from-yaml"  # yaml beats base
    assert cfg.optim.steps == 7  # base beats defaults
    assert cfg.sampling.group_size == 4  # dotted key in base
    assert cfg.sampling.batch == 16  # derived from the final inputs: 4 prompts * 4
    assert cfg.algo.micro_batch == 16
    assert cfg.optim.schedule == "constant"


def test_derived_values_follow_overrides_even_with_factory_presets():
    cfg = load_config(RootConfig, overrides=["sampling.n_prompts=3", "sampling.group_size=5"])
    assert (cfg.sampling.batch, cfg.algo.micro_batch) == (15, 15)


def test_a_scalar_override_of_a_list_key_is_a_one_item_list(tmp_path):
    """`sampling.stop=</answer>` is what a user types (issue 25, item 12): the list of that string, the raw
    text kept (`007` stays a string); a YAML file still has to write a list."""
    cfg = load_config(RootConfig, overrides=["sampling.stop=</answer>", "algo.tags=3"])
    assert (cfg.sampling.stop, cfg.algo.tags) == (["</answer>"], [3])
    assert load_config(RootConfig, overrides=["sampling.stop=007"]).sampling.stop == ["007"]
    with pytest.raises(ConfigError, match="expects list"):
        load_config(RootConfig, write(tmp_path, "sampling:\n  stop: </answer>\n"))


def test_override_values_are_yaml():
    cfg = load_config(
        RootConfig,
        overrides=[
            'sampling.stop=["</answer>", "\\n\\n"]',
            "algo.tags=[1, 2]",
            "sampling.greedy=true",
            "optim.clip=1",
            "seed=12",
            "name=007",  # a str field takes the raw text, not the int 7
            "optim=={lr: 1e-2}".replace("==", "="),  # a whole section as a mapping
        ],
    )
    assert cfg.sampling.stop == ["</answer>", "\n\n"]
    assert cfg.algo.tags == [1, 2]
    assert cfg.sampling.greedy is True
    assert cfg.optim.clip == 1.0 and isinstance(cfg.optim.clip, float)
    assert cfg.seed == 12
    assert cfg.name == "007"
    assert cfg.optim.lr == 1e-2
    # an empty value is null, which a str field reads as the empty string (its raw text)
    assert load_config(RootConfig, overrides=["name=x", "name="]).name == ""


def test_float_spellings(tmp_path):
    # YAML 1.1 (PyYAML's default) reads `1e-4` as a string; ours reads it as a float, and a quoted
    # "1e-4" string is accepted for a float field too.
    path = write(tmp_path, "optim:\n  lr: 1e-4\n  clip: '2.5e-1'\n")
    cfg = load_config(RootConfig, path)
    assert cfg.optim.lr == 1e-4
    assert cfg.optim.clip == 0.25
    assert load_config(RootConfig, overrides=["optim.lr=3"]).optim.lr == 3.0
    assert load_config(RootConfig, overrides=["optim.steps=1e3"]).optim.steps == 1000


# --------------------------------------------------------------------------------- strictness


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    path = write(tmp_path, "name: x\noptim:\n  steps: 3\n  lrr: 1.0\n")
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, path)
    msg = str(err.value)
    assert f"{path}:4: unknown config key 'optim.lrr'" in msg
    assert "did you mean 'optim.lr'" in msg


def test_unknown_override_and_unknown_section():
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, overrides=["sampling.group_sise=3", "optm.lr=1"])
    assert len(err.value.errors) == 2
    assert "override 'sampling.group_sise=3': unknown config key 'sampling.group_sise'" in str(err.value)
    assert "did you mean 'sampling.group_size'" in str(err.value)
    assert "'optm.lr'; did you mean 'optim.lr'" in str(err.value)


def test_all_errors_reported_at_once_with_locations(tmp_path):
    path = write(tmp_path, "optim:\n  lr: fast\n  steps: 2.5\nsampling:\n  greedy: yes\n")
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, path, ["optim.schedule=linear", "sampling.stop={a: b}"])
    errors = err.value.errors
    assert len(errors) == 5
    text = "\n".join(errors)
    assert f"{path}:2: config key 'optim.lr' expects float, got 'fast' (str)" in text
    assert f"{path}:3: config key 'optim.steps' expects int, got 2.5 (float)" in text
    # `yes` is not a boolean here (YAML 1.1 would silently read it as True)
    assert f"{path}:5: config key 'sampling.greedy' expects bool (true or false), got 'yes' (str)" in text
    # a closed set (a Literal) says the key, the value and every choice, as a section's registry check does
    assert "override 'optim.schedule=linear': optim.schedule='linear' is unknown; known: 'constant', 'cosine'" in text
    assert "'sampling.stop' expects list[str], got {'a': 'b'}" in text


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.steps=true", "expects int"),  # bool is not an int
        ("optim.lr=false", "expects float"),
        ("sampling.n_prompts=[1]", "expects int"),
        ("algo.tags=x", "expects list[int], got 'x'"),
        ("algo.tags=[1, a]", "expects list[int] (item 1: expected int, got 'a')"),
        ("sampling.stop=[1]", "expects list[str] (item 0: expected str (quote the value), got 1)"),
        ("sampling.stop={a: b}", "expects list[str], got {'a': 'b'}"),
        ("seed=null", "expects int, got None"),
        ("seed=", "expects int, got None"),
        ("sampling.greedy=1", "expects bool"),
        ("name=[a]", "expects str"),
        ("optim=3", "is a section"),
        ("optim=", "is a section"),
        ("sampling.batch=3", "unknown config key 'sampling.batch'"),  # init=False: not settable
        ("optim.lr.x=1", "unknown config key 'optim.lr.x'"),
        ("noequals", "expected dotted.key=value"),
        ("=3", "expected dotted.key=value"),
        ("optim.lr=[1", "not valid YAML"),
    ],
)
def test_bad_overrides(override, expected):
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, overrides=[override])
    assert expected in str(err.value)


def test_validate_errors_name_the_keys():
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, overrides=["sampling.n_prompts=3", "algo.micro_batch=4"])
    assert "3 * 2" not in str(err.value)  # the message is the trainer's own, wrapped once
    assert "sampling.n_prompts * sampling.group_size = 6 is not divisible by algo.micro_batch = 4" in str(
        err.value
    )


def test_yaml_dotted_keys_strict_strings_and_lines(tmp_path):
    path = write(tmp_path, "name: no\nsampling.group_size: 3\noptim:\n  schedule: cosine\nalgo.micro_batch: 0\n")
    cfg = load_config(RootConfig, path)
    assert cfg.name == "no"  # not False (YAML 1.1's "Norway problem")
    assert (cfg.sampling.group_size, cfg.optim.schedule, cfg.algo.micro_batch) == (3, "cosine", 12)
    bad = write(tmp_path, "name: x\nsampling.group_sise: 3\nsampling:\n  batch: 4\n", "bad.yaml")
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, bad)
    first, second = err.value.errors
    assert first == f"{bad}:2: unknown config key 'sampling.group_sise'; did you mean 'sampling.group_size'?"
    assert second.startswith(f"{bad}:4: unknown config key 'sampling.batch'")  # derived: not settable


_CALLS: list[str] = []


@dataclass
class Child:
    x: int = 1

    def validate(self) -> None:
        _CALLS.append("child")


@dataclass
class Parent:
    child: Child = field(default_factory=Child)

    def validate(self) -> None:
        _CALLS.append("parent")


def test_section_validate_names_the_section_and_runs_before_the_top_level():
    with pytest.raises(ConfigError) as err:
        load_config(RootConfig, overrides=["optim.steps=0"])
    assert str(err.value) == "invalid config (section 'optim'): optim.steps must be >= 1, got 0"
    _CALLS.clear()
    load_config(Parent)
    assert _CALLS == ["child", "parent"]


def test_duplicate_yaml_key_and_non_mapping_file(tmp_path):
    dup = write(tmp_path, "name: a\nname: b\n", "dup.yaml")
    with pytest.raises(ConfigError, match=r"dup.yaml:2: duplicate key 'name'"):
        load_config(RootConfig, dup)
    nested = write(tmp_path, "optim:\n  lr: 1\n  steps: 2\n  lr: 3\n", "nested.yaml")
    with pytest.raises(ConfigError, match=r"nested.yaml:4: duplicate key 'optim.lr'"):
        load_config(RootConfig, nested)
    lst = write(tmp_path, "- 1\n- 2\n", "list.yaml")
    with pytest.raises(ConfigError, match="expected a mapping of config keys"):
        load_config(RootConfig, lst)
    bad = write(tmp_path, "optim: [\n", "bad.yaml")
    with pytest.raises(ConfigError, match="bad.yaml:2: invalid YAML"):
        load_config(RootConfig, bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(RootConfig, tmp_path / "missing.yaml")
    empty = write(tmp_path, "", "empty.yaml")
    assert load_config(RootConfig, empty) == load_config(RootConfig)


def test_section_given_a_scalar_in_yaml(tmp_path):
    path = write(tmp_path, "optim: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:1: config key 'optim' is a section"):
        load_config(RootConfig, path)
    path = write(tmp_path, "name: x\noptim:\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: config key 'optim' is a section; expected a mapping"):
        load_config(RootConfig, path)


# --------------------------------------------------------------------------------- round trip


def test_dump_and_load_round_trip_exactly(tmp_path):
    cfg = load_config(
        RootConfig,
        overrides=[
            "optim.lr=1.234567890123e-7",
            "sampling.stop=['</answer>', 'yes', 'true', '1e-4', '']",
            "name=null-ish",
            "seed=12",
            "optim.clip=.inf",
            "optim.schedule=cosine",
        ],
    )
    path = dump_yaml(cfg, tmp_path / "sub" / "config.yaml")
    again = load_config(RootConfig, path)
    assert again == cfg
    assert again.sampling.stop == ["</answer>", "yes", "true", "1e-4", ""]
    assert math.isinf(again.optim.clip)
    # derived init=False fields are not written (they could not be read back)
    assert "batch" not in yaml.safe_load(path.read_text())["sampling"]
    assert to_dict(cfg)["sampling"]["stop"] == ["</answer>", "yes", "true", "1e-4", ""]


def test_every_project_config_round_trips(tmp_path):
    from rlvr.train.config import EvalConfig, SFTConfig, TrainConfig
    from rlvr.train.demo import DemoConfig
    from rlvr.train.pg.recipes import RECIPES

    for cls in (TrainConfig, SFTConfig, EvalConfig, DemoConfig):
        cfg = load_config(cls)
        assert load_config(cls, dump_yaml(cfg, tmp_path / f"{cls.__name__}.yaml")) == cfg
    for name, recipe in RECIPES.items():
        cfg = load_config(TrainConfig, base=recipe)
        assert load_config(TrainConfig, dump_yaml(cfg, tmp_path / f"{name}.yaml")) == cfg, name
    # a section preset by its default_factory (SFT's optimizer) keeps its preset under overrides
    sft = load_config(SFTConfig, overrides=["optim.warmup_steps=5"])
    assert (sft.optim.lr, sft.optim.schedule, sft.optim.warmup_steps) == (1e-3, "cosine", 5)


def test_strings_that_look_like_other_types_are_quoted():
    # 'true' and '1e-4' would read back as a bool and a float: the dumper must quote them.
    assert "name: 'true'" in to_yaml(load_config(RootConfig, overrides=["name='true'"]))
    assert "name: '1e-4'" in to_yaml(load_config(RootConfig, overrides=["name='1e-4'"]))
    # 'yes' is a plain string under our resolver, so it needs no quotes
    assert "name: yes\n" in to_yaml(load_config(RootConfig, overrides=["name=yes"]))


# ------------------------------------------------------------------------------ docs and help


def test_field_docs_nested_and_multiline():
    docs = field_docs(RootConfig)
    assert docs["optim.lr"] == "Peak learning rate of AdamW."
    assert docs["optim.clip"] == "Gradient-norm clip; 0 = off (a docstring over two lines)."
    assert docs["optim"] == "Optimizer section (its factory presets lr)."
    assert docs["seed"] == "Seed; 0 = random."
    assert "sampling.batch" not in docs  # derived, not settable
    assert field_docs(SamplingSection)["n_prompts"] == "Prompts per step."
    assert field_docs(AlgoSection)["micro_batch"].startswith("Rollouts per backward")


def test_field_docs_of_real_trainer_configs_are_complete():
    from rlvr.train.config import EvalConfig, SFTConfig, TrainConfig
    from rlvr.train.demo import DemoConfig

    for cls in (TrainConfig, SFTConfig, EvalConfig, DemoConfig):
        docs = field_docs(cls)
        missing = [k for k, v in docs.items() if not v]
        assert not missing, f"{cls.__name__} keys without an attribute docstring: {missing}"
        assert load_config(cls) == load_config(cls, overrides=[])


@dataclass
class BaseDecoding:
    """A base section whose fields two sections inherit."""

    top_p: float = 1.0
    """Nucleus threshold (base)."""
    max_tokens: int = 16
    """Response cap (base)."""


@dataclass
class RolloutDecoding(BaseDecoding):
    """Inherits top_p as is, re-declares max_tokens with its own docstring and default, adds a field."""

    max_tokens: int = 64
    """Response cap of rollouts (subclass)."""
    group_size: int = 2
    """Responses per prompt (subclass only)."""


@dataclass
class InheritingRoot:
    decoding: RolloutDecoding = field(default_factory=RolloutDecoding)
    """Decoding section built by inheritance."""


def test_field_docs_follow_inheritance():
    docs = field_docs(InheritingRoot)
    assert docs["decoding.top_p"] == "Nucleus threshold (base)."  # inherited field: the base's docstring
    assert docs["decoding.max_tokens"] == "Response cap of rollouts (subclass)."  # the subclass's wins
    assert docs["decoding.group_size"] == "Responses per prompt (subclass only)."
    rows = {r[0]: r for r in config_rows(InheritingRoot)}
    assert rows["decoding.max_tokens"][2:] == ("64", "Response cap of rollouts (subclass).")
    assert rows["decoding.top_p"][3] == "Nucleus threshold (base)."
    assert field_docs(BaseDecoding)["max_tokens"] == "Response cap (base)."


def test_sampling_sections_share_the_decoding_base():
    from rlvr.train.config import DecodingConfig, EvalSamplingConfig, SamplingConfig, SFTSamplingConfig

    base = field_docs(DecodingConfig)
    for cls in (SamplingConfig, SFTSamplingConfig, EvalSamplingConfig):
        assert issubclass(cls, DecodingConfig)
        docs = field_docs(cls)
        assert set(base) <= set(docs) and all(docs.values()), cls.__name__
    assert field_docs(SFTSamplingConfig)["stop_thinking_text"] == base["stop_thinking_text"]  # inherited
    assert field_docs(SamplingConfig)["max_tokens"] != base["max_tokens"]  # rlvr train says more
    assert (SamplingConfig().max_tokens, EvalSamplingConfig().temperature, SamplingConfig().temperature) == (16, 0.0, 1.0)


def test_config_rows_and_help():
    rows = {r[0]: r for r in config_rows(RootConfig)}
    assert rows["optim.lr"] == ("optim.lr", "float", "0.0003", "Peak learning rate of AdamW.")
    assert rows["optim.schedule"][1] == "{constant, cosine}"
    assert rows["optim.clip"][1:3] == ("float", "0.0")
    assert rows["sampling.stop"][1:3] == ("list[str]", "[]")
    assert rows["algo.tags"][1:3] == ("list[int]", "[]")
    assert list(rows) == [k for k in field_docs(RootConfig) if k not in ("optim", "sampling", "algo")]
    assert "sampling.batch" not in rows
    text = config_help(RootConfig, width=200)
    assert "optim.lr" in text and "Peak learning rate of AdamW." in text and "\x1b[" not in text
    md = config_markdown(RootConfig)
    assert "| `optim.schedule` | {constant, cosine} | `constant` | Schedule after warmup. |" in md


def test_type_name():
    assert type_name(int) == "int"
    assert type_name(list[str]) == "list[str]"
    assert type_name(Literal["loss", "reward"]) == "{loss, reward}"


def test_parse_override_and_split_args():
    assert parse_override("optim.lr=1e-4") == ("optim.lr", "1e-4", 1e-4)
    assert parse_override("a.b=") == ("a.b", "", None)
    assert parse_override("a=x=y") == ("a", "x=y", "x=y")
    path, ov = split_config_args(["run.yaml", "algo.loss=grpo_clip", "optim.lr=1e-4"])
    assert path == Path("run.yaml") and ov == ["algo.loss=grpo_clip", "optim.lr=1e-4"]
    assert split_config_args(None) == (None, [])
    with pytest.raises(ConfigError, match="neither a config file"):
        split_config_args(["algo.loss"])
    with pytest.raises(ConfigError, match="two config files"):
        split_config_args(["a.yaml", "b.yml"])


def test_not_a_dataclass():
    with pytest.raises(TypeError):
        load_config(dict)  # type: ignore[arg-type]
    assert dataclasses.is_dataclass(load_config(RootConfig))


@pytest.mark.parametrize("tp", [Path, int | None, dict[str, float], tuple[str, ...], OptimSection | None])
def test_unsupported_field_types_are_refused(tp):
    holder = dataclasses.make_dataclass("Holder", [("x", tp, field(default=None))])
    with pytest.raises(TypeError, match=r"Holder.x: unsupported config field type"):
        load_config(holder)


def test_typer_command_takes_file_and_overrides_as_extra_arguments(tmp_path):
    # The pattern docs/config.md recommends for `rlvr train run.yaml algo.loss=... --flag`.
    import typer
    from typer.testing import CliRunner

    seen = {}
    app = typer.Typer()

    @app.command()
    def train(args: list[str] = typer.Argument(None), dry: bool = typer.Option(False, "--dry")):
        path, overrides = split_config_args(args)
        seen["cfg"] = load_config(RootConfig, path, overrides)
        seen["dry"] = dry

    @app.command()
    def other():
        pass

    cfg_file = write(tmp_path, "optim:\n  lr: 2e-3\n", "run.yaml")
    result = CliRunner().invoke(
        app, ["train", str(cfg_file), "sampling.stop=[\"</answer>\"]", "optim.lr=-1e-3", "--dry", "name=x y"]
    )
    assert result.exit_code == 0, result.output
    assert seen["cfg"].optim.lr == -1e-3 and seen["cfg"].sampling.stop == ["</answer>"]
    assert seen["cfg"].name == "x y" and seen["dry"] is True
