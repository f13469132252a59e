"""Partial rollouts (distributed.segment_tokens): responses sampled in segments across steps, each
segment stamped with the policy version that sampled it, old logprobs taken per segment.

Local placement (no Ray): the sampler wrapper is the same under both placements.
"""

from __future__ import annotations

import sys

import torch

from rlvr.config import load_config
from rlvr.distributed.partial import PartialRollouts
from rlvr.distributed.staleness import BehaviourPolicy
from rlvr.models.tiny import build_tiny_model
from rlvr.rollout import rollouts_to_batch
from rlvr.rollout.hf_generator import HFGenerator
from rlvr.rollout.types import SamplingSpec
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.pg.objective import batch_logprobs
from rlvr.train.pg.recipes import get_recipe


def _model():
    # 6-token vocabulary: a random model ends a response (EOS) about once in 6 tokens, so response
    # lengths are long-tailed up to max_tokens
    return build_tiny_model(alphabet="ab", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=1)


def test_segments_carry_the_version_that_sampled_them_and_old_logprobs_follow():
    model, tok = _model()
    gen = HFGenerator(model, tok)  # colocated: update_weights only bumps the version
    pr = PartialRollouts(gen, tok, segment_tokens=2)
    behaviour = BehaviourPolicy(model, keep=8, logprobs=batch_logprobs)
    spec = lambda seed: SamplingSpec(n=3, temperature=1.0, max_tokens=10, seed=seed)  # noqa: E731
    seen = []
    g = torch.Generator().manual_seed(0)
    for step in range(1, 7):
        behaviour.record(step - 1, model)
        ros, exs = pr.sample([f"ex{step}a", f"ex{step}b"], ["ab", "ba"], spec(step))
        assert len(ros) == len(exs) and len(ros) % 3 == 0 and 0 < len(ros) <= 6  # 1 or 2 whole groups
        for ro, ex in zip(ros, exs, strict=True):
            starts = [k for k, _ in ro.segments]
            versions = [v for _, v in ro.segments]
            assert starts[0] == 0 and starts == sorted(set(starts))
            # every segment but the last is exactly the per-iteration budget; the last ends the response
            assert all(b - a == 2 for a, b in zip(starts, starts[1:], strict=False))
            assert 0 < len(ro.response_ids) - starts[-1] <= 2
            assert versions == sorted(versions) and versions[-1] <= step - 1  # (a backlog group finished earlier)
            assert ro.weight_version == versions[0]
            assert ro.finish_reason == "length" or ro.response_ids[-1] == tok.eos_token_id
            assert int(ex[2:-1]) <= step  # from this step's problems or carried over from earlier ones
            seen.append((step, ro))
        # old logprobs: each token under the version stamped on its segment == the sampler's own
        # logprobs (the weights move a lot between versions, so a wrong stamp would not match)
        batch = rollouts_to_batch(ros, tok.pad_token_id)
        fn = behaviour.old_logprobs_fn(ros, current=step - 1)
        old = (fn or batch_logprobs)(model, batch, 8, 1.0, 0)
        sampler = batch.sampler_logprobs
        mask = batch.response_mask
        assert float(((old - sampler).abs() * mask).max()) < 1e-5
        # the current policy scores the older segments differently (the weights moved), so recomputing
        # them with the learner's weights would not be the behaviour policy
        cur = batch_logprobs(model, batch, 8, 1.0, 0)
        if fn is not None:
            assert float(((cur - sampler).abs() * mask).max()) > 1e-3
        with torch.no_grad():  # a new policy version for the next step
            for p in model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
        gen.update_weights(model.named_parameters(), version=step)
    multi = [ro for _, ro in seen if len({v for _, v in ro.segments}) > 1]
    assert len(multi) >= 3  # responses continued across steps under newer versions
    assert any(ro.weight_version <= step - 3 for step, ro in seen)  # some spanned 3+ versions


def test_partial_rollouts_from_the_config_key(tmp_path):
    over = [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "data.reward=language",
        "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=8",
        # long-tailed lengths with a random tiny model: many characters end a response
        'sampling.stop=["0","1","2","3","4","5","6","7","8","9","a","e","i","o","u","s","t","n"]',
        "optim.lr=1e-2", "run.steps=5", "run.progress=false", "run.num_threads=1", "run.log_samples_every=0",
        "distributed.segment_tokens=2", f"run.out_dir={tmp_path / 'run'}",
    ]
    rows: list[dict] = []
    ray_before = "ray" in sys.modules
    train(load_config(TrainConfig, None, over, base=get_recipe("grpo")), on_step=lambda s, m: rows.append(dict(m)))
    assert ray_before or "ray" not in sys.modules  # the local placement never imports ray
    assert len(rows) == 5
    assert all(r["partial/rounds"] >= 0 for r in rows) and any(r["partial/carried"] > 0 for r in rows)
    assert any(r["rollout/staleness"] >= 1 for r in rows)  # trained on responses begun under older versions
    # the ratio's denominator is the behaviour policy of each segment: it matches the sampler's logprobs
    assert max(r["rollout/logprob_diff_max"] for r in rows if "rollout/logprob_diff_max" in r) < 1e-4


def test_distributed_keys_are_checked_before_any_work():
    import pytest

    from rlvr.config import ConfigError

    with pytest.raises(ConfigError, match=r"distributed\.max_staleness.*distributed\.placement=ray"):
        load_config(TrainConfig, None, ["distributed.max_staleness=1"])
    with pytest.raises(ConfigError, match=r"distributed\.num_learners=2.*distributed\.placement=ray"):
        load_config(TrainConfig, None, ["distributed.num_learners=2"])
    with pytest.raises(ConfigError, match=r"distributed\.placement='mpi' is unknown"):
        load_config(TrainConfig, None, ["distributed.placement=mpi"])
    with pytest.raises(ConfigError, match=r"distributed\.generator_cpus=0"):
        load_config(TrainConfig, None, ["distributed.placement=ray", "distributed.generator_cpus=0"])


def _partial_cfg(out, steps: int):
    over = [
        "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=40", "data.num_eval=4", "data.digits=1", "data.reward=language",
        "sampling.n_prompts=2", "sampling.group_size=2", "sampling.max_tokens=8",
        'sampling.stop=["0","1","2","3","4","5","6","7","8","9","a","e","i","o","u","s","t","n"]',
        "algo.train_batch_size=2",  # 2 optimizer steps per group: Adam state matters
        "optim.lr=1e-2", f"run.steps={steps}", "run.progress=false", "run.num_threads=1",
        "run.log_samples_every=0", "run.eval_every=0", "distributed.segment_tokens=2", f"run.out_dir={out}",
    ]
    return load_config(TrainConfig, None, over, base=get_recipe("grpo"))


def test_partial_rollouts_resume_equals_uninterrupted(tmp_path):
    """The responses in flight at a checkpoint (and the behaviour-policy snapshots their older
    segments need) are checkpointed: 2 steps + --resume to 4 == 4 steps straight."""
    import json

    from safetensors.torch import load_file

    timing = ("time", "mem/", "tokens_per_s", "perf/")

    def rows(run):
        out = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        return [{k: v for k, v in r.items() if not k.startswith(timing)} for r in out]

    def weights(run):
        latest = (run / "checkpoints" / "latest").read_text().strip()
        return load_file(str(next((run / "checkpoints" / latest / "model").glob("*.safetensors"))))

    straight = train(_partial_cfg(tmp_path / "a", 4)).run_dir
    a = rows(straight)
    assert a[1]["partial/carried"] > 0  # responses are in flight at the step-2 checkpoint
    assert any(r["rollout/staleness"] >= 1 for r in a[2:])  # ... and trained on after it
    train(_partial_cfg(tmp_path / "b", 2))
    resumed = train(_partial_cfg(tmp_path / "b", 4), resume=True).run_dir
    b = rows(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    b[1] = {k: v for k, v in b[1].items() if not k.startswith("eval/")}  # the 2-step run's final evaluation
    assert a == b  # step 3: the responses carried over the checkpoint, continued as in the straight run
    wa, wb = weights(straight), weights(resumed)
    assert wa.keys() == wb.keys() and wa
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
