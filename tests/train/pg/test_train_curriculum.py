"""Online difficulty filtering and the pass-rate curriculum of `rlvr train` (data.filter_band,
data.filter_every, data.curriculum): scripted problems that are always, never or sometimes solved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.training import TINY, spread_task

from rlvr.config import ConfigError, load_config
from rlvr.data.filters import PassCounts
from rlvr.train.config import DataConfig, TrainConfig
from rlvr.train.pg.curriculum import ProblemSource
from rlvr.train.pg.loop import train


def _cfg(tmp_path, *overrides) -> TrainConfig:
    return load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path / 'run'}", "sampling.n_prompts=4",
                                                  "sampling.group_size=4", *overrides])


def _rows(run_dir) -> list[dict]:
    return [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(("band", "want"), [("never-solved", 0.0), ("'[1, 1]'", 1.0)])
def test_online_band_trains_only_on_the_problems_in_the_band(tmp_path, band, want):
    task = spread_task(n_always=4, n_never=4, n_mixed=4)
    rows = _rows(train(_cfg(tmp_path, f"data.filter_band={band}", "data.filter_every=2", "data.filter_k=8",
                            "run.steps=3"), data=task).run_dir)
    assert [r["accuracy"] for r in rows] == [want] * 3  # only never (always) solved problems were drawn
    assert rows[0]["filter/refreshed"] == 12 and "filter/refreshed" not in rows[1]
    assert rows[2]["filter/refreshed"] == 12  # refreshed before step 1 and step 3 (every 2)
    assert sum(r["filter/skipped"] for r in rows) > 0 and not any("filter/short" in r for r in rows)


def test_online_medium_band_leaves_no_group_without_a_reward_spread_after_the_refresh(tmp_path):
    task = spread_task(n_always=4, n_never=4, n_mixed=4)
    base = _rows(train(_cfg(tmp_path / "a", "run.steps=3"), data=task).run_dir)
    rows = _rows(train(_cfg(tmp_path / "b", "data.filter_band=medium", "data.filter_every=10", "run.steps=3"),
                       data=task).run_dir)
    assert max(r["zero_var_groups"] for r in rows) <= 0.25  # a mixed problem can still draw 4 alike answers
    assert min(r["zero_var_groups"] for r in base) >= 0.5  # without the filter 2/3 of the problems cannot spread


def test_curriculum_draws_by_pass_rate_and_is_a_pure_function_of_seed_and_step():
    task = spread_task(n_always=4, n_never=4, n_mixed=4)
    cfg = DataConfig(curriculum="pass_rate", curriculum_floor=0.0)
    src = ProblemSource(task.train, cfg, run_seed=3)
    ids = src.ids
    # measured: the first 8 problems at 0/4 or 4/4, the mixed ones at 2/4 -> weight 4r(1-r) = 1, others 0
    src.table.update(PassCounts(ids=ids, correct=[4] * 4 + [0] * 4 + [2] * 4, k=4))
    batch, pos = src.draw(4, 0, step=5)
    assert sorted(ex.meta["kind"] for ex in batch) == ["mixed"] * 4 and pos == 4
    again, _ = ProblemSource(task.train, cfg, run_seed=3), None
    again.table.update(PassCounts(ids=ids, correct=[4] * 4 + [0] * 4 + [2] * 4, k=4))
    assert [ex.id for ex in again.draw(3, 0, step=5)[0]] == [ex.id for ex in src.draw(3, 0, step=5)[0]]
    # with a floor every problem is reachable; drawn shares follow the weights (1 + f) vs f
    cfg2 = DataConfig(curriculum="pass_rate", curriculum_floor=0.25)
    src2 = ProblemSource(task.train, cfg2, run_seed=0)
    src2.table.update(PassCounts(ids=ids, correct=[4] * 4 + [0] * 4 + [2] * 4, k=4))
    counts = {"always": 0, "never": 0, "mixed": 0}
    for step in range(300):
        for ex in src2.draw(1, 0, step=step)[0]:
            counts[ex.meta["kind"]] += 1
    # P(mixed) = 4 * 1.25 / (4 * 1.25 + 8 * 0.25) = 5/7
    assert abs(counts["mixed"] / 300 - 5 / 7) < 0.08, counts
    assert counts["always"] > 0 and counts["never"] > 0


def test_band_draw_skips_out_of_band_problems_in_stream_order_and_tops_up_when_short():
    task = spread_task(n_always=4, n_never=4, n_mixed=4)
    src = ProblemSource(task.train, DataConfig(filter_band="medium"), run_seed=0)
    src.table.update(PassCounts(ids=src.ids, correct=[4] * 4 + [0] * 4 + [2] * 4, k=4))
    batch, pos = src.draw(4, 0, step=1)
    assert [ex.meta["kind"] for ex in batch] == ["mixed"] * 4
    assert src.last["filter/skipped"] == pos - 4 and "filter/short" not in src.last
    batch, _ = src.draw(6, 0, step=1)  # only 4 in the band: two passes, then topped up from the stream
    assert src.last["filter/short"] == 2 and len(batch) == 6


def test_curriculum_state_is_checkpointed_and_resume_draws_the_same(tmp_path):
    task = spread_task(n_always=4, n_never=4, n_mixed=4)
    common = ["data.curriculum=pass_rate", "data.filter_every=2", "data.filter_k=4", "run.checkpoint_every=2"]
    straight = _rows(train(_cfg(tmp_path / "a", *common, "run.steps=4"), data=task).run_dir)
    train(_cfg(tmp_path / "b", *common, "run.steps=2"), data=task)
    state = json.loads((tmp_path / "b" / "run" / "checkpoints" / "step_000002" / "trainer_state.json").read_text())
    assert len(state["pass_rates"]["counts"]) == 12
    resumed = _rows(train(_cfg(tmp_path / "b", *common, "run.steps=4"), data=task, resume=True).run_dir)
    drop = ("time", "mem/", "tokens_per_s", "perf/")
    for a, b in zip(straight[2:], resumed[2:], strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(drop)} == \
            {k: v for k, v in b.items() if not k.startswith(drop)}


def test_filter_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.filter_every"):
        _cfg(tmp_path, "data.filter_every=5")
    with pytest.raises(ConfigError, match="data.filter_band"):
        _cfg(tmp_path, "data.filter_band=hardish")
    with pytest.raises(ConfigError, match="data.curriculum"):
        _cfg(tmp_path, "data.curriculum=easy_first")


def test_stream_is_unchanged_without_a_filter():
    from rlvr.train.session import take

    task = spread_task()
    src = ProblemSource(task.train, DataConfig(), run_seed=0)
    batch, pos = src.draw(5, 7, step=1)
    assert batch == take(task.train, 7, 5, DataConfig().seed) and pos == 12 and not src.active
