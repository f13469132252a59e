"""VLLMGenerator's adapter logic on CPU, against a stand-in `vllm` module (the real engine is
checked by scripts/gpu_check.sh on a GPU machine). The stand-in answers each request with
HFGenerator, mimicking vLLM's output records (token_ids incl. EOS, per-position logprob dicts,
stop_reason = the stop string or None)."""

import sys
import types
from types import SimpleNamespace

import pytest

from rlvr.models import build_tiny_model
from rlvr.rollout import HFGenerator, SamplingSpec


@pytest.fixture()
def fake_vllm(monkeypatch):
    model, tok = build_tiny_model(hidden_size=32, num_layers=2, num_heads=2, seed=0)
    hf = HFGenerator(model, tok)
    calls = {"loaded": [], "reset": 0, "llm_kwargs": None, "params": []}

    class SamplingParams(SimpleNamespace):
        pass

    class LLM:
        def __init__(self, **kwargs):
            calls["llm_kwargs"] = kwargs
            runner = SimpleNamespace(
                model=SimpleNamespace(load_weights=lambda weights: calls["loaded"].extend(weights))
            )
            worker = SimpleNamespace(worker=SimpleNamespace(model_runner=runner))
            self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker))

        def reset_prefix_cache(self):
            calls["reset"] += 1

        def generate(self, requests, params, use_tqdm=False):
            outs = []
            for req, p in zip(requests, params, strict=True):
                calls["params"].append(p)
                spec = SamplingSpec(
                    n=p.n,
                    temperature=p.temperature,
                    top_p=p.top_p,
                    top_k=max(p.top_k, 0),
                    max_tokens=p.max_tokens,
                    min_tokens=p.min_tokens,
                    stop=tuple(p.stop or ()),
                    include_stop_str_in_output=p.include_stop_str_in_output,
                    seed=p.seed,
                )
                rs = hf.generate(["?"], spec, prompt_ids=[req["prompt_token_ids"]])
                completions = [
                    SimpleNamespace(
                        token_ids=r.response_ids,
                        text=r.text,
                        logprobs=[
                            {t: SimpleNamespace(logprob=lp)}
                            for t, lp in zip(r.response_ids, r.logprobs, strict=True)
                        ],
                        finish_reason=r.finish_reason,
                        stop_reason=r.stop_reason if r.stop_reason not in (None, "<eos>") else None,
                    )
                    for r in rs
                ]
                outs.append(SimpleNamespace(outputs=completions))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.11.0"
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # restored after the test
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    from rlvr.rollout.vllm_generator import VLLMGenerator

    return VLLMGenerator("unused-path", tokenizer=tok), hf, calls


def test_vllm_adapter_rollouts_match_hf_rollouts(fake_vllm):
    gen, hf, calls = fake_vllm
    assert calls["llm_kwargs"]["logprobs_mode"] == "processed_logprobs"
    prompts = ["12+3=", "7*8="]
    spec = SamplingSpec(n=2, max_tokens=8, seed=5, stop=("5",), include_stop_str_in_output=True)
    out = gen.generate(prompts, spec)
    # one n=1 request per sample, each with its own derived seed
    assert len(calls["params"]) == 4 and len({p.seed for p in calls["params"]}) == 4
    assert all(p.top_k == -1 and p.logprobs == 0 for p in calls["params"])
    assert [(r.group, r.sample_index) for r in out] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in out:
        assert r.prompt_ids == gen.tokenizer.encode(r.prompt)
        assert len(r.logprobs) == len(r.response_ids)
        if r.finish_reason == "stop" and r.stop_reason == "5":
            assert r.text.endswith("5") and "5" not in r.text[:-1]
    greedy = SamplingSpec(temperature=0, max_tokens=8)
    assert [r.response_ids for r in gen.generate(prompts, greedy)] == [
        r.response_ids for r in hf.generate(prompts, greedy)
    ]


def test_vllm_adapter_update_weights_in_process(fake_vllm):
    gen, hf, calls = fake_vllm
    gen.update_weights(hf.model.named_parameters(), version=7)
    names = [n for n, _ in calls["loaded"]]
    assert names == [n for n, _ in hf.model.named_parameters()]
    assert calls["reset"] == 1 and gen.weight_version == 7
    assert gen.generate(["1="], SamplingSpec(max_tokens=2, seed=0))[0].weight_version == 7


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
