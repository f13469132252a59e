"""data.task=reasoning_gym:<dataset> (issue 40 item 5): reasoning-gym's generators as train and held-out problems,
scored by reasoning-gym's own score_answer; the package, the dataset name and data.rg checked at config load.
Two generators: leg_counting and chain_sum. Skips (but for the not-installed message) without reasoning_gym."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from rlvr.config import ConfigError, load_config, to_yaml
from rlvr.rewards import Status

# (dataset, data.rg): small settings, so that a tiny model could write the answers (numbers)
GENERATORS = [("leg_counting", {"max_animals": 3, "max_instances": 4}),
              ("chain_sum", {"max_terms": 2, "max_digits": 1})]


@pytest.fixture
def rg():
    return pytest.importorskip("reasoning_gym")


def _data(name: str, config: dict, **over):
    from rlvr.train.config import DataConfig

    return DataConfig(task=f"reasoning_gym:{name}", rg=dict(config), num_train=over.pop("num_train", 60),
                      num_eval=over.pop("num_eval", 12), **over)


def _load(name: str, config: dict, **over):
    from rlvr.train.tasks import load_task_data

    return load_task_data(_data(name, config, **over))


def _train_overrides(name: str, *extra: str) -> list[str]:
    return [f"data.task=reasoning_gym:{name}", *extra]


@pytest.mark.parametrize(("name", "config"), GENERATORS)
def test_problems_are_deterministic_per_seed_and_held_out_ones_never_train(rg, name, config):
    a, b = _load(name, config), _load(name, config)
    key = [(ex.id, ex.question, ex.reference) for ex in a.train + a.eval]
    assert key == [(ex.id, ex.question, ex.reference) for ex in b.train + b.eval]
    assert len(a.train) == 60 and len(a.eval) == 12
    train_q, eval_q = [ex.question for ex in a.train], [ex.question for ex in a.eval]
    assert len(set(train_q)) == 60 and len(set(eval_q)) == 12  # distinct within a split
    assert not set(train_q) & set(eval_q)  # disjoint streams: no held-out problem is trained on
    other = _load(name, config, seed=99)
    assert [ex.question for ex in other.train] != train_q  # data.seed moves the stream
    # a held-out split read alone (rlvr eval: no training problems) is the same one
    from rlvr.train.tasks import load_task_data

    alone = load_task_data(_data(name, config), train=False)
    assert alone.train == [] and [ex.question for ex in alone.eval] == eval_q
    # each problem is the generator's entry: reference = its answer, meta = what score_answer needs
    ex = a.train[0]
    assert ex.meta["rg_dataset"] == name and ex.meta["rg_config"] == config
    assert ex.meta["entry"]["question"] == ex.question and ex.meta["entry"]["answer"] == ex.reference
    assert a.template == "question_only" and a.name == f"reasoning_gym:{name}"


def test_the_dataset_config_reaches_the_generator(rg):
    small = _load("leg_counting", {"min_animals": 1, "max_animals": 1, "max_instances": 4}, num_train=20)
    assert all(ex.meta["entry"]["metadata"]["num_animals"] == 1 for ex in small.train)
    wide = _load("leg_counting", {"min_animals": 3, "max_animals": 3}, num_train=20)
    assert all(ex.meta["entry"]["metadata"]["num_animals"] == 3 for ex in wide.train)


def _wrong(reference: str) -> list[str]:
    n = int(reference)
    return [str(n + 1), str(n - 1), str(-n) if n else "1", "12" if n != 12 else "13"]


@pytest.mark.parametrize(("name", "config"), GENERATORS)
def test_the_reward_is_reasoning_gyms_own_score(rg, name, config):
    task = _load(name, config)
    own = rg.get_score_answer_fn(name)
    for ex in task.eval[:6]:
        entry = ex.meta["entry"]
        right = task.reward_fn(ex.reference, ex)
        assert right.total == own(ex.reference, entry) == 1.0 and right.status is Status.CORRECT
        assert task.reward_fn(f"  {ex.reference}\n", ex).total == 1.0  # the whole response, stripped
        assert task.reward_fn(f"I think <answer>{ex.reference}</answer>", ex).total == 1.0  # its answer block
        for wrong in _wrong(ex.reference):
            r = task.reward_fn(wrong, ex)
            assert r.total == own(wrong, entry) and r.status is (Status.CORRECT if r.total == 1 else Status.INCORRECT)
        # partial credit is reasoning-gym's too (its default scorer: the reference inside a longer answer)
        longer = f"{ex.reference}0"
        partial = task.reward_fn(longer, ex)
        assert partial.total == pytest.approx(own(longer, entry)) and 0 < partial.total < 1
        assert partial.status is Status.INCORRECT and partial.answer == longer
        empty = task.reward_fn("   ", ex)
        assert empty.total == 0 and empty.status is Status.UNPARSABLE


@pytest.mark.parametrize(("name", "config"), GENERATORS)
def test_r1_zero_template_scores_the_answer_block_behind_the_format(rg, name, config):
    task = _load(name, config, template="r1_zero")
    ex = task.eval[0]
    own = rg.get_score_answer_fn(name)
    good = task.reward_fn(f"count them </think> <answer>{ex.reference}</answer>", ex)
    assert good.total == 1.0 and good.parts["format"] == 1.0 and good.status is Status.CORRECT
    wrong = str(int(ex.reference) + 2)
    bad = task.reward_fn(f"x </think> <answer>{wrong}</answer>", ex)
    assert bad.total == own(wrong, ex.meta["entry"]) == 0.0 and bad.parts["format"] == 1.0
    unformatted = task.reward_fn(ex.reference, ex)  # the right number without the r1_zero format: gated
    assert unformatted.total == 0 and unformatted.status is Status.UNPARSABLE
    assert "</think> <answer>" in task.target(ex) and task.stop == ("</answer>",)


def test_a_scorer_that_fails_is_an_error_never_a_silent_zero(rg, monkeypatch):
    import rlvr.rewards.reasoning_gym as R

    ex = _load("chain_sum", GENERATORS[1][1]).eval[0]
    broken = SimpleNamespace(id="x", question=ex.question, reference=ex.reference,
                             meta={**ex.meta, "entry": {"question": ex.question}})  # no "answer": the scorer raises
    r = R.reasoning_gym(ex.reference, broken)
    assert r.status is Status.ERROR and r.total == 0 and "KeyError" in r.info and "chain_sum" in r.info
    assert R.reasoning_gym("5", SimpleNamespace(reference="5", meta={})).status is Status.ERROR  # not an rg problem
    for odd in (1.5, -0.1, float("nan"), "yes", None):
        monkeypatch.setattr(R, "_scorer", lambda *a, _v=odd: SimpleNamespace(score_answer=lambda ans, e: _v))
        r = R.reasoning_gym(ex.reference, ex)
        assert r.status is Status.ERROR and r.total == 0 and "not a number in [0, 1]" in r.info, odd


def test_rows_load_back_as_the_same_problems(rg):
    from rlvr.data import get_task

    task = get_task("reasoning_gym:leg_counting")
    ex = _load("leg_counting", GENERATORS[0][1]).train[0]
    row = {"id": ex.id, "question": ex.question, "reference": ex.reference, "meta": dict(ex.meta)}
    back = task.from_rows([row])[0]
    assert (back.id, back.question, back.reference, back.meta) == (ex.id, ex.question, ex.reference, ex.meta)
    bare = task.from_rows([{"question": "How many legs do 2 dogs have?", "answer": "8"}])[0]
    assert task.reward_fn()("8", bare).total == 1.0 and task.reward_fn()("9", bare).total == 0.0


# ------------------------------------------------------------------------------ config load: the errors


def test_unknown_dataset_is_refused_at_config_load_naming_data_task_and_close_names(rg):
    from rlvr.train.config import TrainConfig

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, _train_overrides("leg_countin"))
    text = str(err.value)
    assert "data.task='reasoning_gym:leg_countin'" in text and "reasoning_gym:leg_counting" in text


def test_data_rg_keys_are_the_datasets_own(rg):
    from rlvr.train.config import TrainConfig

    with pytest.raises(ConfigError) as err:
        load_config(TrainConfig, None, _train_overrides("leg_counting", "data.rg.max_animal=3"))
    text = str(err.value)
    assert "data.rg.max_animal" in text and "max_animals" in text and "LegCountingConfig" in text
    with pytest.raises(ConfigError, match=r"data\.rg\.seed: rlvr sets the dataset's seed itself"):
        load_config(TrainConfig, None, _train_overrides("chain_sum", "data.rg.seed=3"))
    with pytest.raises(ConfigError, match=r"refuses it: AssertionError: min_animals must be positive"):
        load_config(TrainConfig, None, _train_overrides("leg_counting", "data.rg.min_animals=0"))
    with pytest.raises(ConfigError, match=r"data\.rg=.*is not one: set data\.task=reasoning_gym:<dataset>"):
        load_config(TrainConfig, None, ["data.rg.max_animals=3"])  # the default task is arithmetic


def test_data_rg_from_yaml_and_overrides_merges_and_dumps_back(rg, tmp_path):
    from rlvr.train.config import EvalConfig, TrainConfig

    path = tmp_path / "run.yaml"
    path.write_text("data:\n  task: reasoning_gym:leg_counting\n  rg:\n    min_animals: 2\n    max_animals: 5\n")
    cfg = load_config(TrainConfig, path, ["data.rg.max_animals=3", "data.rg={max_instances: 4}"])
    assert cfg.data.rg == {"min_animals": 2, "max_animals": 3, "max_instances": 4}
    dumped = tmp_path / "config.yaml"
    dumped.write_text(to_yaml(cfg))
    assert load_config(TrainConfig, dumped).data.rg == cfg.data.rg
    assert load_config(EvalConfig, None, ["data.task=reasoning_gym:chain_sum", "data.rg.max_terms=2"]).data.rg == \
        {"max_terms": 2}


def test_a_missing_package_says_how_to_install_it_before_any_model_loads(monkeypatch):
    from rlvr.data import get_task
    from rlvr.data.tasks.reasoning_gym import rg_task
    from rlvr.train.config import TrainConfig

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    monkeypatch.setitem(sys.modules, "reasoning_gym.factory", None)
    rg_task.cache_clear()
    try:
        with pytest.raises(ConfigError) as err:
            load_config(TrainConfig, None, _train_overrides("leg_counting"))
        assert "data.task='reasoning_gym:leg_counting'" in str(err.value)
        assert "pip install 'rlvr[reasoning-gym]'" in str(err.value)
        with pytest.raises(KeyError, match=r"pip install 'rlvr\[reasoning-gym\]'"):
            get_task("reasoning_gym:leg_counting")
    finally:
        rg_task.cache_clear()
