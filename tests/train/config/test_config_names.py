"""Issue 39 item 2, one home and one style per config rule: closed choice sets are `Literal` fields (the help lists
the choices, the loader refuses another value naming the key, file and line), the built-in names of the rlvr.algo
registries live torch-free in rlvr.algo.names and every registry checks it agrees at import, the registries users
add to stay open, and the algo section's rules are AlgoConfig.validate's, run once per load."""

from __future__ import annotations

import importlib.util
import sys
import typing
from pathlib import Path

import pytest

import rlvr.algo.names as names
from rlvr.algo.registry import check_names
from rlvr.config import ConfigError, config_help, config_rows, load_config
from rlvr.train.config import AlgoConfig, TrainConfig

# (registry module, registry, its list in rlvr.algo.names)
REGISTRIES = [
    ("advantages", "ADVANTAGE_ESTIMATORS", "ADVANTAGE_ESTIMATOR_NAMES"),
    ("losses", "POLICY_LOSSES", "POLICY_LOSS_NAMES"),
    ("aggregation", "LOSS_AGGREGATIONS", "LOSS_AGGREGATION_NAMES"),
    ("kl", "KL_ESTIMATORS", "KL_ESTIMATOR_NAMES"),
    ("correction", "ROLLOUT_CORRECTIONS", "ROLLOUT_CORRECTION_NAMES"),
]


@pytest.mark.parametrize("module, registry, listed", REGISTRIES)
def test_each_registry_holds_the_names_the_config_reads(module, registry, listed):
    table = getattr(importlib.import_module(f"rlvr.algo.{module}"), registry)
    check_names(table, getattr(names, listed), registry)  # the real ones agree
    with pytest.raises(AssertionError, match=rf"only in {registry}: \['extra'\]"):
        check_names({**table, "extra": None}, getattr(names, listed), registry)
    first = next(iter(table))
    with pytest.raises(AssertionError, match=rf"only in the names: \['{first}'\]"):
        check_names({k: v for k, v in table.items() if k != first}, getattr(names, listed), registry)


@pytest.mark.parametrize("module, registry, listed", REGISTRIES)
def test_a_registry_refuses_to_import_when_the_names_drift(monkeypatch, module, registry, listed):
    # a fresh copy of the registry's module (the real one stays as it is) imported under a names list with one
    # name more: the check at the end of its table raises at import
    monkeypatch.setattr(names, listed, (*getattr(names, listed), "not_registered"))
    path = Path(importlib.import_module(f"rlvr.algo.{module}").__file__)
    spec = importlib.util.spec_from_file_location(f"_copy_of_{module}", path)
    copy = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, copy)  # its dataclasses look their module up
    with pytest.raises(AssertionError, match="only in the names: \\['not_registered'\\]"):
        spec.loader.exec_module(copy)


def test_the_closed_sets_are_literals_and_the_help_lists_their_choices():
    hints = typing.get_type_hints(AlgoConfig)
    assert typing.get_args(hints["kl_estimator"]) == names.KL_ESTIMATOR_NAMES
    assert typing.get_args(hints["aggregation"]) == names.LOSS_AGGREGATION_NAMES
    assert typing.get_args(hints["length_reward"]) == names.LENGTH_REWARD_NAMES
    rows = {key: kind for key, kind, _, _ in config_rows(TrainConfig)}
    assert rows["algo.kl_estimator"] == "{k1, k2, k3, k1_clamped}"
    assert rows["algo.adv_std"] == "{population, sample}"
    assert rows["algo.length_reward"] == "{'', kimi, dapo_overlong}"
    assert rows["model.dtype"] == "{float32, bfloat16}"
    assert rows["rollout.backend"] == "{hf, vllm}"
    assert rows["rollout.cuda_graphs"] == "{auto, true, false}"
    assert rows["distributed.placement"] == "{local, ray}"
    assert rows["optim.schedule"] == "{constant, linear, cosine}"
    # the open sets (users register more) stay strings; the help lists their built-in names
    assert rows["algo.loss"] == "{" + ", ".join(names.POLICY_LOSS_NAMES) + "} or a registered name"
    assert rows["algo.advantage"].startswith("{no_baseline, zero, group_mean, grpo, rloo, batch_std, gae, process}")
    assert "{k1, k2, k3, k1_clamped}" in config_help(TrainConfig, width=300)


def test_a_value_outside_a_closed_set_names_the_key_file_line_and_choices(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algo:\n  kl_estimator: k4\nrollout:\n  cuda_graphs: true\nmodel:\n  dtype: float16\n")
    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, path)
    text = "\n".join(err.value.errors)
    assert f"{path}:2: algo.kl_estimator='k4' is unknown; known: 'k1', 'k2', 'k3', 'k1_clamped'" in text
    # a YAML bool where the choices are strings: told to quote it (as a str field is)
    assert f"{path}:4: rollout.cuda_graphs=True is unknown; known: 'auto', 'true', 'false' (quote it" in text
    # a value refused for a reason says it (the field's metadata)
    assert f"{path}:6: model.dtype='float16' is refused: AdamW's eps" in text
    # on the command line the text is the string, as for a str field
    assert load_config(TrainConfig, None, ["rollout.cuda_graphs=false"]).rollout.cuda_graphs == "false"
    with pytest.raises(ConfigError, match=r"override 'algo.adv_std=pop': algo.adv_std='pop' is unknown; "
                                          r"known: 'population', 'sample'"):
        load_config(TrainConfig, None, ["algo.adv_std=pop"])


def test_a_section_built_in_python_gets_the_same_words():
    a = AlgoConfig(kl_estimator="k4", adv_std="pop")
    with pytest.raises(ConfigError) as err:
        a.validate()
    assert "algo.kl_estimator='k4' is unknown; known: 'k1', 'k2', 'k3', 'k1_clamped'" in err.value.errors
    assert "algo.adv_std='pop' is unknown; known: 'population', 'sample'" in err.value.errors


def test_the_open_registries_accept_a_name_registered_before_loading(monkeypatch):
    from rlvr.algo import ADVANTAGE_ESTIMATORS, POLICY_LOSSES

    monkeypatch.setitem(POLICY_LOSSES, "my_loss", POLICY_LOSSES["grpo_clip"])
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS, "my_adv", ADVANTAGE_ESTIMATORS["grpo"])
    cfg = load_config(TrainConfig, None, ["algo.loss=my_loss", "algo.advantage=my_adv"])
    assert (cfg.algo.loss, cfg.algo.advantage) == ("my_loss", "my_adv")
    with pytest.raises(ConfigError, match="algo.loss='ppo_typo' is unknown; known: .*'my_loss'"):
        load_config(TrainConfig, None, ["algo.loss=ppo_typo"])


def test_the_algo_rules_are_the_sections_and_run_once(monkeypatch):
    # an algo-only rule is AlgoConfig.validate's, with every other algo problem at once
    with pytest.raises(ConfigError) as err:
        AlgoConfig(advantage="gae", refill_rounds=2, clip_high=-1.0).validate()
    assert err.value.errors == [
        "algo.clip_high=-1.0 must be >= 0",
        "algo.advantage='gae' needs a value model: set algo.critic=shared or separate",
        "algo.refill_rounds=2 refills the groups that algo.filter_zero_variance drops; set "
        "algo.filter_zero_variance=true too",
    ]
    calls = []
    real = AlgoConfig.kl_loss_problem

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(AlgoConfig, "kl_loss_problem", counted)
    cfg = load_config(TrainConfig, None, [])  # the section's validate, then TrainConfig.validate: once
    assert len(calls) == 1
    calls.clear()
    cfg.validate()  # a config built (or changed) in Python: TrainConfig.validate re-checks the algo section, once
    assert len(calls) == 1
