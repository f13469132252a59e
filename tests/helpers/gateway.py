"""The gateway tests' stand-ins (tests/gateway, tests/envs/test_external_runner.py): a Qwen-like chat template for the
character tokenizer, a spy on a Generator, a scripted Generator."""

from __future__ import annotations

import threading

import torch

from rlvr.models import build_tiny_model
from rlvr.rollout import Rollout

# A Qwen-like chat template (<|im_start|>role\ncontent<|im_end|>\n) that renders tools, tool calls (hermes) and
# tool messages, for the character tokenizer.
CHATML = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.tool_calls is defined %}{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chatml_tokenizer(tok):
    tok.chat_template = CHATML
    tok.eos_token = "<|im_end|>"
    return tok


class Spy:
    """Wraps a Generator and keeps every Rollout it returned, in order, and the specs it was called with."""

    def __init__(self, gen):
        self.gen, self.rollouts, self.specs = gen, [], []

    @property
    def weight_version(self):
        return self.gen.weight_version

    def generate(self, prompts, spec, *, prompt_ids=None):
        out = self.gen.generate(prompts, spec, prompt_ids=prompt_ids)
        self.rollouts += out
        self.specs.append(spec)
        return out


class Scripted:
    """A Generator writing fixed turns in order (each ended by <|im_end|>, cut at max_tokens), logprob -0.5 per
    token; `block` (an Event) holds generate() until set, `fail` makes it raise."""

    weight_version = 3

    def __init__(self, tok, turns):
        self.tok, self.turns, self.n, self.specs = tok, turns, 0, []
        self.block: threading.Event | None = None
        self.entered = threading.Event()
        self.fail = False

    def generate(self, prompts, spec, *, prompt_ids=None):
        self.entered.set()
        self.specs.append(spec)
        if self.block is not None:
            self.block.wait(10)
        if self.fail:
            raise RuntimeError("the engine fell over")
        out = []
        for i, p in enumerate(prompts):
            text = self.turns[self.n % len(self.turns)]
            self.n += 1
            full = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            ids = full[: spec.max_tokens]
            cut = len(full) > spec.max_tokens
            out.append(Rollout(prompt=p, prompt_ids=list(prompt_ids[i]), response_ids=ids,
                               text=self.tok.decode(ids, skip_special_tokens=True), logprobs=[-0.5] * len(ids),
                               finish_reason="length" if cut else "stop", group=i, weight_version=self.weight_version))
        return out


def tiny_chat_policy(seed: int = 0):
    """(model, tokenizer): the tiny model with the ChatML template and <|im_end|> as EOS; pad/bos/eos/unk are never
    sampled (an output bias of -1e4 on them, as a real chat model's are rare too), so a reply's text round-trips."""
    model, tok = build_tiny_model(hidden_size=32, num_layers=1, num_heads=2, seed=seed, special_tokens=("<|im_end|>",))
    tok = chatml_tokenizer(tok)
    model.generation_config.eos_token_id = tok.eos_token_id
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[:4] = -1e4
    model.lm_head = head
    return model, tok


def episodes_through(runner, generator, examples, spec):
    """(rollouts, rewards, the gateway/* metrics) of one GatewayRunner.rollouts call; the runner's gateway is
    stopped afterwards, whatever happened."""
    try:
        ros, rewards = runner.rollouts(generator, examples, spec)
        return ros, rewards, runner.metrics()
    finally:
        runner.close()
