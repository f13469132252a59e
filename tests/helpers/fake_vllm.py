"""A scripted stand-in `vllm` module for VLLMGenerator's adapter tests (tests/rollout/test_rollout_vllm.py,
tests/distributed/test_cuda_paths.py), in the default suite, without an engine.

The stand-in computes nothing with a model: each request (prompt token ids, seed) is looked up in a table of
completions in vLLM's output shape (token_ids with the EOS or the token that completed a stop string, one logprob
dict per position that also holds a decoy entry, finish_reason, stop_reason = stop string / stop token id / None,
and a `text` from "vLLM's own detokenizer" that the adapter must not use). A request it was not scripted for
raises."""

import sys
import types
from types import SimpleNamespace

from rlvr.models.tiny import DEFAULT_ALPHABET, build_char_tokenizer

EOS = 2  # the char tokenizer's <eos>
UNK = 3  # never sampled here: the decoy entry of every logprob dict
IM_END = 100  # the one extra special token ("<|im_end|>"), right after the 100 base ids
VLLM_TEXT = "<vLLM detokenizer output: must not reach Rollout.text>"


def ids(text: str) -> list[int]:
    """The char tokenizer's ids by its documented rule (4 specials, then one id per character)."""
    return [4 + DEFAULT_ALPHABET.index(c) for c in text]


def completion(token_ids, logprobs, finish_reason, stop_reason=None):
    """One vLLM CompletionOutput: the decoy (a lower-id, much less likely token) comes first in
    each position's dict, so picking "the first entry" instead of the sampled token fails."""
    assert len(token_ids) == len(logprobs)
    return SimpleNamespace(
        token_ids=tuple(token_ids),
        text=VLLM_TEXT,
        logprobs=[{UNK: SimpleNamespace(logprob=-50.0), t: SimpleNamespace(logprob=lp)}
                  for t, lp in zip(token_ids, logprobs, strict=True)],
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )


def install_fake_vllm(monkeypatch, script, version="0.11.0"):
    """A `vllm` module whose LLM answers from `script`: {(prompt ids tuple, seed): [completion, ...]}.
    Returns the record of what the adapter asked for."""
    rec = SimpleNamespace(llm_kwargs=None, requests=[], params=[], events=[], loaded=[], rpc=[], warmups=0)

    class SamplingParams(SimpleNamespace):
        pass

    class LLM:
        def __init__(self, **kwargs):
            rec.llm_kwargs = kwargs

        def collective_rpc(self, method, args=(), kwargs=None):
            """vLLM's worker methods by name: the in-place reload (in-process pushes get the tensors
            themselves) and rlvr's file-based reload (rlvr.rollout.vllm_worker, separate process)."""
            rec.events.append(method)
            rec.rpc.append((args, kwargs))
            if method == "reload_weights":
                assert kwargs["is_checkpoint_format"] is True
                rec.loaded.extend(kwargs["weights_iterator"])
            elif method == "rlvr_reload_from_file":
                from safetensors.torch import load_file

                rec.loaded.extend(load_file(args[0]).items())
            else:
                raise AssertionError(f"unexpected worker method {method}")
            return [None]

        def reset_prefix_cache(self):
            rec.events.append("reset_prefix_cache")

        def sleep(self, level):
            rec.events.append(f"sleep({level})")

        def wake_up(self, tags=None):
            rec.events.append(f"wake_up({','.join(tags)})")

        def generate(self, requests, params, use_tqdm=False):
            if [r["prompt_token_ids"] for r in requests] == [[0]] and params.max_tokens == 1:
                rec.warmups += 1  # the one-token forward at start (VLLMGenerator.__init__)
                return [SimpleNamespace(outputs=[completion([EOS], [-1.0], "stop")])]
            rec.events.append("generate")
            outs = []
            for req, p in zip(requests, params, strict=True):
                rec.requests.append(req)
                rec.params.append(p)
                key = (tuple(req["prompt_token_ids"]), p.seed)
                if key not in script:
                    raise KeyError(f"stand-in vLLM got an unscripted request {key}")
                cs = script[key]
                assert len(cs) == p.n, (key, p.n)
                for c in cs:
                    assert len(c.token_ids) <= p.max_tokens
                if p.logprobs is None:
                    cs = [SimpleNamespace(**{**vars(c), "logprobs": None}) for c in cs]
                outs.append(SimpleNamespace(outputs=cs))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.__version__ = version
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # restored after the test
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    return rec


def make_generator(monkeypatch, script, **kwargs):
    version = kwargs.pop("version", "0.11.0")
    rec = install_fake_vllm(monkeypatch, script, version=version)
    from rlvr.rollout.vllm_generator import VLLMGenerator

    tok = build_char_tokenizer(special_tokens=("<|im_end|>",))
    return VLLMGenerator("some/model-path", tokenizer=tok, **kwargs), rec
