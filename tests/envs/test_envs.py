"""rlvr.envs: the environment interface, multi-turn episodes (mask, logprobs, batching per turn),
the calculator / python_tool environments, the loss mask of a hand-built transcript (gradient
checked per token) and `rlvr train data.env=...` with resume."""

from __future__ import annotations

import json

import pytest
import torch

from rlvr.config import ConfigError, load_config
from rlvr.data.example import Example
from rlvr.envs import ENVIRONMENTS, Environment, StepResult, TurnFormat, make_env, register_env, run_episodes
from rlvr.envs.calculator import CalculatorEnv, safe_eval
from rlvr.models import build_tiny_model
from rlvr.rollout import HFGenerator, Rollout, SamplingSpec, rollouts_to_batch
from rlvr.train.config import TrainConfig

EX = Example(id="t", question="Ann has 37 pens and gets 24 more. How many pens now?", reference="61")


class ScriptedGenerator:
    """A Generator that writes fixed turns (same for every row), with logprob -0.25 per token, and
    records each call: what a multi-turn driver must do with any backend."""

    weight_version = 3

    def __init__(self, tokenizer, turns):
        self.tok, self.turns, self.calls = tokenizer, turns, []

    def generate(self, prompts, spec, *, prompt_ids=None):
        self.calls.append((len(prompts), [list(p) for p in prompt_ids], spec))
        text = self.turns[len(self.calls) - 1]
        out = []
        for i, p in enumerate(prompts):
            full = self.tok.encode(text, add_special_tokens=False)
            ids, cut = full[: spec.max_tokens], len(full) > spec.max_tokens
            out.append(Rollout(prompt=p, prompt_ids=list(prompt_ids[i]), response_ids=ids, text=self.tok.decode(ids),
                               logprobs=[-0.25] * len(ids), finish_reason="length" if cut else "stop", group=i,
                               stop_reason=None if cut else "</calc>"))
        return out


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=0)


def test_registry_and_safe_calculator():
    assert {"calculator", "python_tool"} <= set(ENVIRONMENTS)
    assert safe_eval("37*24") == 888 and safe_eval("(7+5)//4") == 3
    for bad in ("__import__('os')", "2**999", "a+1", "1/0", "9" * 70):
        with pytest.raises(ValueError):
            safe_eval(bad)
    env = make_env("calculator", max_turns=3)
    assert env.reset(EX) == EX.question
    assert env.step("<calc>37+24</calc>") == StepResult("<out>61</out>")
    r = env.step("Answer: 61")
    assert r.done and r.reward_parts == {"answer": 1.0}
    env.add_parts(r.reward_parts)  # what the episode driver does with every step's parts
    assert env.final_reward().total == 1.0 and env.log.tool_calls["calc"] == 1
    env.reset(EX)
    assert env.step("<calc>37+</calc>").observation.startswith("<out>error:") and env.log.tool_errors == 1
    assert env.step("the answer is 61").done and env.final_reward().total == 0.0
    assert not env.final_reward().formatted  # no "Answer: N": unparsable
    with pytest.raises(KeyError, match="known: "):
        make_env("nope")
    with pytest.raises(ValueError, match="integrity"):
        make_env("calculator", integrity="ignore")


def test_examples_have_disjoint_splits_and_right_answers():
    tr = CalculatorEnv.generate_examples(300, "train", 1)
    te = CalculatorEnv.generate_examples(60, "test", 1)
    assert not {e.id.split(":")[-1] for e in tr} & {e.id.split(":")[-1] for e in te}
    for e in tr[:50]:
        m = e.meta
        assert int(e.reference) == {"+": m["a"] + m["b"], "-": m["a"] - m["b"], "*": m["a"] * m["b"]}[m["op"]]


def test_episode_transcript_mask_logprobs_and_one_generate_call_per_turn(tiny):
    _, tok = tiny
    gen = ScriptedGenerator(tok, ["<calc>37+24</calc>", "Answer: 61"])
    spec = SamplingSpec(n=3, max_tokens=20, seed=5)
    eps = run_episodes(gen, lambda: make_env("calculator", max_turns=4), [EX, EX], spec, tok, max_tokens_total=100)
    assert len(eps) == 6 and [(e.rollout.group, e.rollout.sample_index) for e in eps] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    # batched per turn: 2 turns -> 2 generate calls of 6 rows each, never one call per episode
    assert [c[0] for c in gen.calls] == [6, 6]
    fmt = TurnFormat(tok)
    assert fmt.chat  # the tiny tokenizer has a (minimal) chat template
    between = fmt.observation("<out>61</out>")
    assert between == "\n<|tool|><out>61</out>\n<|assistant|>"
    turn1, turn2 = tok.encode("<calc>37+24</calc>"), tok.encode("Answer: 61")
    mid = tok.encode(between)
    ro = eps[0].rollout
    assert ro.response_ids == turn1 + mid + turn2
    assert ro.loss_mask == [True] * len(turn1) + [False] * len(mid) + [True] * len(turn2)
    assert ro.logprobs == [-0.25] * len(turn1) + [0.0] * len(mid) + [-0.25] * len(turn2)
    # turn 2 was conditioned on prompt + turn 1 + tool output
    assert gen.calls[1][1][0] == ro.prompt_ids + turn1 + mid
    assert ro.text == "<calc>37+24</calc>\n<|tool|><out>61</out>\n<|assistant|>Answer: 61"
    assert ro.weight_version == 3 and eps[0].reward.total == 1.0 and eps[0].log.turns == 2
    assert gen.calls[0][2].stop == ("</calc>",) and gen.calls[0][2].include_stop_str_in_output


def test_turn_limit_and_token_budget(tiny):
    _, tok = tiny
    gen = ScriptedGenerator(tok, ["<calc>1+1</calc>"] * 5)
    eps = run_episodes(gen, lambda: make_env("calculator", max_turns=2), [EX], SamplingSpec(n=1, max_tokens=20),
                       tok, max_tokens_total=500)
    assert eps[0].log.turns == 2 and eps[0].log.truncated and eps[0].rollout.finish_reason == "length"
    gen = ScriptedGenerator(tok, ["<calc>1+1</calc>"] * 5)
    eps = run_episodes(gen, lambda: make_env("calculator", max_turns=9), [EX], SamplingSpec(n=1, max_tokens=20),
                       tok, max_tokens_total=60)
    # turn 1 (16 tokens) + tool output (35: "\n<|tool|><out>2</out>\n<|assistant|>") leave 9 of the 60
    assert len(tok.encode("<calc>1+1</calc>")) == 16 and len(tok.encode(TurnFormat(tok).observation("<out>2</out>"))) == 35
    assert [c[2].max_tokens for c in gen.calls] == [20, 9]
    assert len(eps[0].rollout.response_ids) == 60 and eps[0].log.truncated


def test_plain_format_without_chat_template(tiny):
    _, tok = tiny
    fmt = TurnFormat(tok, "plain")
    assert fmt.prompt("sys", "q") == "sys\nq\n" and fmt.observation("<out>2</out>") == "<out>2</out>"
    saved, tok.chat_template = tok.chat_template, None
    try:
        assert TurnFormat(tok).mode == "plain"
        with pytest.raises(ValueError, match="chat_template"):
            TurnFormat(tok, "chat")
    finally:
        tok.chat_template = saved


def test_real_generator_episodes_are_reproducible(tiny):
    model, tok = tiny
    gen = HFGenerator(model, tok)
    spec = SamplingSpec(n=2, max_tokens=6, seed=11)
    a = run_episodes(gen, lambda: make_env("calculator"), [EX], spec, tok, max_tokens_total=40)
    b = run_episodes(gen, lambda: make_env("calculator"), [EX], spec, tok, max_tokens_total=40)
    assert [e.rollout.response_ids for e in a] == [e.rollout.response_ids for e in b]
    for e in a:  # every sampled token has a real logprob, the rest 0 and out of the loss
        assert all((lp < 0) == m for lp, m in zip(e.rollout.logprobs, e.rollout.loss_mask, strict=True))


def test_loss_mask_gradient_flows_only_through_model_tokens(tiny):
    """A hand-built transcript prompt | model turn | tool output | model turn through the trainer's
    own loss (micro_batch_loss, GRPO's clipped objective, token-mean): the gradient w.r.t. the
    logits is nonzero exactly at positions whose next token the model wrote, and there equals the
    hand-computed -A / n_model_tokens * (onehot(label) - softmax(logits))."""
    from rlvr.algo import loss_normalizers
    from rlvr.train.batching import ForwardSpec
    from rlvr.train.config import AlgoConfig
    from rlvr.train.pg.objective import LossParts, Minibatch, micro_batch_loss

    model, tok = tiny
    prompt, t1, tool, t2 = (tok.encode(s) for s in ("<|user|>2+3?\n<|assistant|>", "<calc>2+3</calc>",
                                                     "\n<|tool|><out>5</out>\n<|assistant|>", "Answer: 5"))
    mask = [True] * len(t1) + [False] * len(tool) + [True] * len(t2)
    ro = Rollout(prompt="p", prompt_ids=prompt, response_ids=t1 + tool + t2, text="", logprobs=None,
                 finish_reason="stop", group=0, loss_mask=mask)
    batch = rollouts_to_batch([ro], tok.pad_token_id)
    T = batch.input_ids.shape[1]
    delta = torch.zeros(1, T, len(tok), requires_grad=True)
    captured = {}

    def hook(mod, inp, out):
        captured["logits"] = out.detach()
        return out + delta[:, : out.shape[1]]

    h = model.lm_head.register_forward_hook(hook)
    try:
        adv = torch.tensor([1.5])
        algo = AlgoConfig()  # GRPO defaults: clipped ratio, token-mean aggregation, no KL, no entropy
        loss, _ = micro_batch_loss(model, Minibatch(batch, adv), loss_normalizers(batch.response_mask),
                                   LossParts.from_algo(algo), ForwardSpec.of(algo, 0))
        loss.backward()
    finally:
        h.remove()
    g = delta.grad[0]  # (T, V)
    n_model = sum(mask)
    P = len(prompt)
    probs = torch.softmax(captured["logits"][0].float(), -1)
    for t in range(T):
        label_is_model_token = P - 1 <= t < P - 1 + len(mask) and mask[t - (P - 1)]
        if not label_is_model_token:
            assert torch.all(g[t] == 0), f"position {t}: gradient through a token the model did not write"
        else:
            onehot = torch.zeros(len(tok))
            onehot[batch.labels[0, t]] = 1
            want = -1.5 / n_model * (onehot - probs[t])
            torch.testing.assert_close(g[t], want, rtol=1e-4, atol=1e-7)
    assert int((g.abs().sum(-1) > 0).sum()) == n_model


@register_env
class DenseTestEnv(Environment):
    """Two turns, a dense reward (share of digits the model wrote): a random tiny model gets a reward
    spread, so the resume test moves weights and Adam state."""

    name = "test_dense"

    def reset(self, example):
        self._begin()
        return example.question

    def step(self, action):
        self.log.tool_calls["echo"] += 1
        self.add_parts({"digits": sum(c.isdigit() for c in action) / max(1, len(action))})
        return StepResult("<out>ok</out>", done=self.log.turns >= 2)

    @classmethod
    def generate_examples(cls, n, split, seed):
        return [Example(id=f"d{i}", question=f"{i}+{seed}?", reference="0") for i in range(n)]


TINY_ENV = ["data.env=calculator", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
            "model.intermediate_size=64", "data.num_train=40", "data.num_eval=4", "sampling.n_prompts=2",
            "sampling.group_size=2", "sampling.max_tokens=8", "data.env_max_tokens=40", "run.progress=false",
            "run.num_threads=1", "optim.lr=1e-3", "run.log_samples_every=1"]


def test_config_keys_are_checked(monkeypatch):
    with pytest.raises(ConfigError, match="data.env='nope' is unknown"):
        load_config(TrainConfig, None, ["data.env=nope"])
    with pytest.raises(ConfigError, match="data.env_max_turns"):
        load_config(TrainConfig, None, ["data.env=calculator", "data.env_max_turns=0"])
    with pytest.raises(ConfigError, match="data.env"):
        load_config(TrainConfig, None, ["data.env=calculator", "data.curriculum=pass_rate"])
    from rlvr.train.pg.loop import validate_train_config
    from rlvr.train.tasks import TaskDataError, load_task_data

    with pytest.raises(ConfigError, match="thinking_budget"):
        validate_train_config(load_config(TrainConfig, None, ["data.env=calculator", "sampling.thinking_budget=8"]))
    with pytest.raises(ConfigError, match="algo.advantage=process"):
        validate_train_config(load_config(TrainConfig, None, ["data.env=calculator", "algo.advantage=process"]))
    import importlib.util

    find = importlib.util.find_spec  # placement=ray passes its own checks as if Ray were installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: find("json") if name == "ray" else find(name, *a))
    for key in ("distributed.max_staleness=1", "distributed.segment_tokens=4"):
        with pytest.raises(ConfigError, match="data.env: multi-turn episodes"):
            validate_train_config(load_config(TrainConfig, None, ["data.env=calculator", "distributed.placement=ray", key]))
    with pytest.raises(TaskDataError, match="rlvr train` only"):  # eval / sft / ei / filter refuse it clearly
        load_task_data(load_config(TrainConfig, None, ["data.env=calculator"]).data, None)


@pytest.mark.parametrize("recipe", ["grpo", "rloo", "ppo"])
def test_train_with_env_and_resume_matches_uninterrupted_run(tmp_path, recipe, monkeypatch):
    """`rlvr train`'s own loop on data.env=calculator for a GRPO-family recipe: 3 steps in one go ==
    2 steps + resume to 3 (every non-timing metric, the env/* metrics included, and the weights;
    the 2-step run's final evaluation at step 2 is the one extra)."""
    from rlvr.runs import plots
    from rlvr.train.pg.loop import train

    monkeypatch.setattr(plots, "plot_run", lambda *a, **k: None)  # plotting is most of the time here
    from rlvr.train.pg.recipes import get_recipe

    def cfg(out, steps):
        return load_config(TrainConfig, None, TINY_ENV + [f"run.out_dir={out}", f"run.steps={steps}", "data.env=test_dense", "data.env_max_tokens=64",
                                                          "run.checkpoint_every=2"], base=get_recipe(recipe))

    full = train(cfg(tmp_path / "full", 3))
    train(cfg(tmp_path / "cut", 2))
    resumed = train(cfg(tmp_path / "cut", 3), resume=True)
    timing = ("time", "tokens_per_s", "mem/", "perf/")

    def rows(p):
        out = [json.loads(x) for x in (p / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(timing)
                 and not (k.startswith("eval/") and r["step"] == 2)} for r in out]

    assert rows(full.run_dir) == rows(resumed.run_dir)
    wa, wb = _weights(full.run_dir), _weights(resumed.run_dir)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    last = rows(full.run_dir)[-1]
    assert last["env/turns"] == 2 and last["env/tool_calls/echo"] == 2 and last["eval/env/turns"] == 2
    assert last["grad_norm"] > 0 and last["reward/digits"] > 0  # the weights moved: resume restores real state
    sample = json.loads((full.run_dir / "samples.jsonl").read_text().splitlines()[0])
    assert sample["prompt"].startswith("<|user|>") and "parts" in sample


def _weights(run):
    from safetensors.torch import load_file

    latest = (run / "checkpoints" / "latest").read_text().strip()
    out = {}
    for f in sorted((run / "checkpoints" / latest / "model").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def test_cli_train_data_env(tmp_path, monkeypatch):
    """The user's path: `rlvr train --recipe dr_grpo data.env=python_tool ...` (tools run in the sandbox),
    then `rlvr train --resume` of the finished run says there is nothing to do."""
    from typer.testing import CliRunner

    from rlvr.cli import app
    from rlvr.runs import plots

    monkeypatch.setattr(plots, "plot_run", lambda *a, **k: None)
    out = tmp_path / "r"
    res = CliRunner().invoke(app, ["train", "--recipe", "dr_grpo", *TINY_ENV, "data.env=python_tool",
                                   "data.env_max_turns=2", "run.steps=1", f"run.out_dir={out}"])
    assert res.exit_code == 0, res.output[-2000:]
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["step"] == 1 and m["env/turns"] >= 1 and m["tokens/generated"] > 0
    cfg = (out / "config.yaml").read_text()
    assert "env: python_tool" in cfg and "env_max_turns: 2" in cfg
    res = CliRunner().invoke(app, ["train", "--resume", str(out)])
    assert res.exit_code == 0 and "nothing to do" in res.output


QWEN_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_chat_template_between_turns_qwen_style():
    """A Qwen-style template whose end of turn is the EOS token: the text between two model turns is
    the template's tool message and next generation prompt; the <|im_end|> the model already sampled
    is not repeated, and a turn that ended at a stop string gets the template's <|im_end|>."""
    from rlvr.models import build_char_tokenizer

    tok = build_char_tokenizer(special_tokens=("<|im_start|>", "<|im_end|>"))
    tok.chat_template = QWEN_LIKE
    tok.eos_token = "<|im_end|>"
    fmt = TurnFormat(tok)
    assert fmt.prompt("", "2+3?") == "<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    tail = "\n<|im_start|>tool\n<out>5</out><|im_end|>\n<|im_start|>assistant\n"
    assert fmt.observation("<out>5</out>", ended_with_eos=True) == tail
    assert fmt.observation("<out>5</out>", ended_with_eos=False) == "<|im_end|>" + tail
    ids = tok.encode(fmt.observation("<out>5</out>", ended_with_eos=False), add_special_tokens=False)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_end|>")  # one special id, not characters


def test_demonstrations_and_warm_start(tiny):
    """The learning test's warm start, small: scripted episodes through the real driver keep the
    calculator's output out of the mask, and the SFT on them lowers the loss of the model tokens."""
    from rlvr.envs.demos import play, sft_warm_start

    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=1)
    fmt = TurnFormat(tok, "plain")
    exs = CalculatorEnv.generate_examples(4, "train", 0, digits=1)
    eps = [play(lambda: make_env("calculator"), ex, [f"<calc>{ex.meta['a']}{ex.meta['op']}{ex.meta['b']}</calc>",
                                                      f"\nAnswer: {ex.reference}"], tok, fmt) for ex in exs]
    for ep, ex in zip(eps, exs, strict=True):
        assert ep.reward.total == 1.0
        out = tok.encode(f"<out>{ex.reference}</out>")
        assert ep.rollout.loss_mask.count(False) == len(out)
    losses = sft_warm_start(model, tok, eps, steps=15, batch_size=4, lr=5e-3, seed=0)
    assert losses[-1] < 0.7 * losses[0]
