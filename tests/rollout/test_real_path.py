"""The real path on CPU: the generator is chosen by config and receives the learner's weights after
every optimizer step; the task's prompt contract (r1_zero's `</answer>` stop, kept in the text)
reaches every sampler, so a response that ends in the stop string is scored correct through
`train`, `rlvr eval` and `rlvr grade` alike.

Both stand-in generators here are NOT built on HFGenerator: they sample from their own copy of the
weights (or follow a script), so a weight push or a stop string that got lost would show.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import load_config
from rlvr.rollout import GENERATOR_BACKENDS, Rollout, SamplingSpec
from rlvr.rollout.hf_generator import find_completed_stop
from rlvr.train.config import TrainConfig
from rlvr.train.pg.loop import train
from rlvr.train.pg.recipes import get_recipe

TINY = ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.intermediate_size=64",
        "data.num_train=80", "data.num_eval=4", "data.digits=1", "sampling.n_prompts=2", "sampling.group_size=4",
        "sampling.max_tokens=4", "run.progress=false", "run.num_threads=1", "optim.lr=5e-2"]


class OwnCopyGenerator:
    """Samples token by token (no KV cache) from its OWN deep copy of the policy and records every
    weight push: (version, a clone of every tensor it was given)."""

    def __init__(self, model, tokenizer):
        self.model = copy.deepcopy(model).eval()
        self.tokenizer = tokenizer
        self.weight_version = -1
        self.pushes: list[tuple[int, dict[str, torch.Tensor]]] = []
        self.sampled_with: list[int] = []  # weight_version at each generate() call
        self.sleeps = 0

    def update_weights(self, named_tensors, version: int) -> None:
        given = {n: t.detach().clone() for n, t in named_tensors}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(given[n])
        self.pushes.append((version, given))
        self.weight_version = version

    def sleep(self) -> None:
        self.sleeps += 1

    @torch.no_grad()
    def generate(self, prompts, spec: SamplingSpec, *, prompt_ids=None) -> list[Rollout]:
        self.sampled_with.append(self.weight_version)
        g = torch.Generator().manual_seed(spec.seed or 0)
        eos = self.tokenizer.eos_token_id
        out = []
        for i, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt)
            for j in range(spec.n):
                resp, lps = [], []
                for _ in range(spec.max_tokens):
                    logits = self.model(torch.tensor([ids + resp])).logits[0, -1].float()
                    logp = torch.log_softmax(logits / max(spec.temperature, 1e-6), -1)
                    tok = int(torch.multinomial(logp.exp(), 1, generator=g)) if spec.temperature > 0 else int(logp.argmax())
                    resp.append(tok)
                    lps.append(float(logp[tok]))
                    if tok == eos:
                        break
                out.append(Rollout(prompt=prompt, prompt_ids=ids, response_ids=resp,
                                   text=self.tokenizer.decode(resp, skip_special_tokens=True), logprobs=lps,
                                   finish_reason="stop" if resp[-1] == eos else "length", group=i,
                                   weight_version=self.weight_version, sample_index=j))
        return out


def test_generator_holds_the_learners_weights_after_every_step(tmp_path, monkeypatch):
    built: list[OwnCopyGenerator] = []

    def backend(rcfg, model, tokenizer, **_):
        built.append(OwnCopyGenerator(model, tokenizer))
        return built[-1]

    monkeypatch.setitem(GENERATOR_BACKENDS, "own_copy", backend)
    cfg = load_config(TrainConfig, None, TINY + [f"run.out_dir={tmp_path}", "run.steps=3", "run.checkpoint_every=1",
                                                 "run.keep_checkpoints=5", "run.seed=1",
                                                 "data.reward=language"], base=get_recipe("grpo"))  # a reward with spread
    cfg.rollout.backend = "own_copy"  # a registered backend; the YAML key validates hf|vllm only
    res = train(cfg)
    gen = built[0]
    # version 0 = the start weights (pushed when built), then one push per optimizer step
    assert [v for v, _ in gen.pushes] == [0, 1, 2, 3]
    for step in (1, 2, 3):
        saved = load_file(tmp_path / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")
        pushed = gen.pushes[step][1]
        for name, t in saved.items():
            assert torch.equal(pushed[name], t), (step, name)  # exactly the learner's weights
    assert not torch.equal(gen.pushes[0][1]["lm_head.weight"], gen.pushes[3][1]["lm_head.weight"])  # it learned
    # and its own copy (what it samples from) is the last step's policy
    final = load_file(tmp_path / "checkpoints" / "step_000003" / "model" / "model.safetensors")
    for name, p in gen.model.named_parameters():
        assert torch.equal(p, final[name]), name
    # rollouts of step s were sampled by the weights of step s-1; the final evaluation by step 3's
    assert gen.sampled_with == [0, 1, 2, 3]
    rows = [json.loads(x) for x in (res.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/policy_version"] for r in rows] == [0, 1, 2]
    assert all(r["rollout/staleness"] == 0 for r in rows)
    assert gen.sleeps == 3  # the trainer lets the engine free its memory after every rollout phase


# ------------------------------------------------------------------ the stop string, end to end

SCRIPT_TAIL = " and then the model rambles on"


class ScriptedGenerator:
    """Answers an r1_zero arithmetic prompt with a correct answer in tags followed by rambling, and
    cuts at a stop string exactly as the real backends do (HFGenerator's find_completed_stop)."""

    def __init__(self, model, tokenizer):
        self.tokenizer = tokenizer
        self.weight_version = 0
        self.specs: list[SamplingSpec] = []

    def update_weights(self, named_tensors, version):
        self.weight_version = version

    def sleep(self):
        pass

    def generate(self, prompts, spec, *, prompt_ids=None):
        self.specs.append(spec)
        out = []
        for i, prompt in enumerate(prompts):
            q = re.search(r"User: ([0-9+]+)=\s*\nAssistant:", prompt).group(1)
            ans = sum(int(x) for x in q.split("+"))
            full = f" {q}={ans} </think> <answer>{ans}</answer>{SCRIPT_TAIL}"
            ids = self.tokenizer.encode(full, add_special_tokens=False)
            for j in range(spec.n):
                resp, text, reason = ids, full, "length"
                for k in range(1, len(ids) + 1):  # token by token, like a sampler
                    hit = find_completed_stop(self.tokenizer, ids[:k], spec.stop, spec.include_stop_str_in_output)
                    if hit is not None:
                        resp, text, reason = ids[:k], hit[1], "stop"
                        break
                out.append(Rollout(prompt=prompt, prompt_ids=self.tokenizer.encode(prompt), response_ids=list(resp),
                                   text=text, logprobs=None, finish_reason=reason, group=i,
                                   weight_version=self.weight_version, sample_index=j))
        return out


@pytest.fixture()
def scripted(monkeypatch):
    made: list[ScriptedGenerator] = []

    def backend(rcfg, model, tokenizer, **_):
        made.append(ScriptedGenerator(model, tokenizer))
        return made[-1]

    monkeypatch.setitem(GENERATOR_BACKENDS, "hf", backend)  # what every command builds by default
    return made


R1 = ["data.task=arithmetic", "data.template=r1_zero", "data.operands=2", "sampling.max_tokens=64"]


def test_a_response_ending_in_the_stop_string_is_correct_through_train_eval_and_grade(tmp_path, scripted):
    runner = CliRunner()
    run = tmp_path / "run"
    res = runner.invoke(app, ["train", "--recipe", "grpo", *TINY, *R1, "run.steps=1", f"run.out_dir={run}"])
    assert res.exit_code == 0, res.output
    spec = scripted[0].specs[0]
    assert "</answer>" in spec.stop and spec.include_stop_str_in_output  # from the task, nothing set by hand
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert row["accuracy"] == 1.0 and row["reward/format"] == 1.0 and row["reward/answer"] == 1.0
    assert row["eval/accuracy"] == 1.0
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert sample["response"].endswith("</answer>") and SCRIPT_TAIL not in sample["response"]

    out = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", f"model.init_from={run}", "data.num_eval=4", f"run.out={out}"])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["accuracy"] == 1.0  # the run's r1_zero settings were taken over
    graded_in = tmp_path / "responses.jsonl"
    graded_in.write_text("".join(json.dumps({"response": json.loads(x)["response"], "reference": json.loads(x)["reference"]}) + "\n"
                                 for x in out.with_suffix(".samples.jsonl").read_text().splitlines()))
    res = runner.invoke(app, ["grade", str(graded_in), "--reward", "r1_zero"])
    assert res.exit_code == 0, res.output
    graded = [json.loads(x) for x in Path(str(graded_in).replace(".jsonl", ".graded.jsonl")).read_text().splitlines()]
    assert len(graded) == 4 and all(g["status"] == "correct" for g in graded), graded


def test_without_keeping_the_stop_string_the_r1_zero_reward_is_zero(tmp_path, scripted):
    """The bug this guards against: with the stop string cut off, every r1_zero response loses its
    closing tag and scores 0. sampling.keep_stop=false shows the failure mode is real."""
    cfg = load_config(TrainConfig, None, TINY + R1 + ["run.steps=1", f"run.out_dir={tmp_path}", "sampling.keep_stop=false"],
                      base=get_recipe("grpo"))
    res = train(cfg)
    row = json.loads((res.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["accuracy"] == 0.0 and row["reward/format"] == 0.0
