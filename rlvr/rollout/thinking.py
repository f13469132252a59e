"""Thinking budgets (Qwen3 style): let the model reason for at most B tokens, then force it to
answer.

Phase 1 samples the reasoning with max_tokens = B and stop = think_end. A response that closed
its think block (or ended with EOS) within the budget is kept as is; one that ran out of budget
gets `stop_thinking_text` appended as forced tokens, except when the budget ran out inside the closing
tag (a tokenizer that spells `</think>` in several tokens: the reasoning ends in "</th"): the model was
already closing its reasoning, so the rest of the tag and what follows the tag in `stop_thinking_text`
are forced instead (appending the whole text would leave "</th\n...</think>" in the context). Phase 2 then samples the answer (with the
caller's max_tokens, stop strings and min_tokens) conditioned on prompt + reasoning (+ forced
text), by token ids, so the trainer sees exactly the tokens the sampler conditioned on.

Budget 0 means no thinking: an empty think block follows the prompt and the answer is sampled directly.

The forced text and the empty block follow the prompt template (rlvr.data.templates.think_style, the one
place that knows how a template closes its reasoning): under r1_zero (whose reward needs the literal
`</think> <answer>` in the response) the close is " </think> <answer>", so the forced text is
"... directly now. </think> <answer>" and budget 0 forces " </think> <answer>" as the response's first
(unsampled) tokens after a prompt ending in "<think>"; under every other template (Qwen3 style) the forced
text is QWEN3_STOP_THINKING and budget 0 puts "<think>\\n\\n</think>\\n\\n" (just "\\n\\n</think>\\n\\n"
after a prompt ending in "<think>") in the prompt, as Qwen3's chat template does with enable_thinking=False.
With no template given the style is read from each prompt (r1 when it ends in "<think>" and mentions
<answer>).

Lengths: Rollout.answer_tokens counts what the answer phase sampled (the tokens spec.max_tokens bounds;
0 when the model ended inside its reasoning); the objective's length terms compare it with max_tokens.

Loss masking: forced tokens were not sampled, so Rollout.loss_mask is False on them and their
Rollout.logprobs entries are 0.0; `rollouts_to_batch` drops them from response_mask. The model
still conditions on them (they stay in the sequence).
"""

from __future__ import annotations

from dataclasses import replace

from rlvr.data.templates import empty_think_block, think_style
from rlvr.data.templates import stop_thinking_text as template_stop_text
from rlvr.rollout.types import Generator, Rollout, SamplingSpec, resolve_prompt_ids, sequence_seed

QWEN3_STOP_THINKING = template_stop_text("qwen3")  # "\n\nConsidering the limited time ... now.\n</think>\n\n"


def _partial_close(text: str, think_end: str) -> int:
    """Length of the longest proper prefix of think_end (2 characters at least, so a lone "<" in
    the reasoning is not taken for a tag) that ends `text`; 0 when none does."""
    for k in range(len(think_end) - 1, 1, -1):
        if text.endswith(think_end[:k]):
            return k
    return 0


def _forced_ids(tok, r: Rollout, stop_thinking_text: str, think_end: str, full: list[int]) -> list[int]:
    """The forced tokens after a reasoning trace that ran out of budget."""
    k = _partial_close(tok.decode(r.response_ids, skip_special_tokens=True), think_end)
    if not k:
        return full
    _, found, after = stop_thinking_text.rpartition(think_end)
    tail = think_end[k:] + (after if found else "\n\n")
    return tok.encode(tail, add_special_tokens=False)


def generate_with_thinking_budget(
    generator: Generator,
    prompts: list[str],
    spec: SamplingSpec,
    budget_tokens: int,
    stop_thinking_text: str = "",
    think_end: str = "</think>",
    think_start: str = "<think>",
    tokenizer=None,
    template: str = "",
) -> list[Rollout]:
    """len(prompts) * spec.n rollouts (prompt-major) whose reasoning is at most `budget_tokens`
    sampled tokens. spec.max_tokens bounds the answer after the reasoning, so a response has at
    most budget_tokens + len(forced tokens) + spec.max_tokens tokens. tokenizer defaults to
    generator.tokenizer (used to encode the forced text and the prompts). template: the prompt
    template's name (or text), which decides how the reasoning closes (rlvr.data.templates.think_style);
    '' = read it from each prompt. stop_thinking_text '' = the template's (QWEN3_STOP_THINKING, or
    "... directly now. </think> <answer>" under r1_zero)."""
    if budget_tokens < 0:
        raise ValueError(f"budget_tokens must be >= 0, got {budget_tokens}")
    tok = tokenizer if tokenizer is not None else getattr(generator, "tokenizer", None)
    if tok is None:
        raise ValueError(
            "generate_with_thinking_budget needs a tokenizer (generator.tokenizer or tokenizer=)"
        )
    styles = [think_style(template, p, think_start) for p in prompts]
    if budget_tokens == 0:
        return _no_thinking(generator, tok, prompts, styles, spec, think_start, think_end)

    think_spec = replace(
        spec,
        max_tokens=budget_tokens,
        min_tokens=min(spec.min_tokens, budget_tokens),
        stop=(think_end,),
        include_stop_str_in_output=True,
    )
    phase1 = generator.generate(prompts, think_spec)
    texts = {st: stop_thinking_text or template_stop_text(st, think_end) for st in set(styles)}
    forced_of = {st: (t, tok.encode(t, add_special_tokens=False)) for st, t in texts.items()}

    cont_idx: list[int] = []  # rollouts that go on to the answer phase
    cont_prompt_ids: list[list[int]] = []
    forced: dict[int, list[int]] = {}
    for k, r in enumerate(phase1):
        if r.stop_reason == "<eos>":
            continue  # the model ended inside (or right after) its reasoning: nothing to continue
        text, ids = forced_of[styles[r.group]]
        extra = _forced_ids(tok, r, text, think_end, ids) if r.finish_reason == "length" else []
        forced[k] = extra
        cont_idx.append(k)
        cont_prompt_ids.append(list(r.prompt_ids) + list(r.response_ids) + list(extra))

    phase2: dict[int, Rollout] = {}
    if cont_idx:
        # One answer per reasoning trace; a fresh seed stream per trace, derived from spec.seed.
        answer_seed = None if spec.seed is None else sequence_seed(spec.seed, -1, budget_tokens)
        answer_spec = replace(spec, n=1, seed=answer_seed)
        outs = generator.generate(
            [phase1[k].prompt for k in cont_idx], answer_spec, prompt_ids=cont_prompt_ids
        )
        phase2 = dict(zip(cont_idx, outs, strict=True))

    results = []
    for k, r in enumerate(phase1):
        if k not in phase2:
            results.append(replace(r, loss_mask=[True] * len(r.response_ids), answer_tokens=0))
            continue
        a, extra = phase2[k], forced[k]
        ids = list(r.response_ids) + list(extra) + list(a.response_ids)
        think_text = tok.decode(r.response_ids, skip_special_tokens=True)
        forced_text = tok.decode(extra, skip_special_tokens=True) if extra else ""
        lps = None
        if r.logprobs is not None and a.logprobs is not None:
            lps = list(r.logprobs) + [0.0] * len(extra) + list(a.logprobs)
        results.append(
            Rollout(
                prompt=r.prompt,
                prompt_ids=list(r.prompt_ids),
                response_ids=ids,
                text=think_text + forced_text + a.text,
                logprobs=lps,
                finish_reason=a.finish_reason,
                group=r.group,
                weight_version=r.weight_version,
                sample_index=r.sample_index,
                stop_reason=a.stop_reason,
                loss_mask=[True] * len(r.response_ids) + [False] * len(extra) + [True] * len(a.response_ids),
                answer_tokens=len(a.response_ids),
            )
        )
    return results


def _no_thinking(generator, tok, prompts, styles, spec, think_start, think_end) -> list[Rollout]:
    """Budget 0. Qwen3 style: the empty think block goes into the prompt (as Qwen3's chat template writes
    it with enable_thinking=False). r1 style: " </think> <answer>" is forced as the response's first
    tokens (loss_mask False), so the graded text holds the separator r1_zero's reward needs."""
    blocks = [empty_think_block(p, st, think_start, think_end) for p, st in zip(prompts, styles, strict=True)]
    if all(st != "r1" for st in styles):
        return generator.generate([p + b for p, b in zip(prompts, blocks, strict=True)], spec)
    base_ids = resolve_prompt_ids(tok, list(prompts), None)
    forced, rendered, ids = [], [], []
    for p, st, b, pid in zip(prompts, styles, blocks, base_ids, strict=True):
        if st == "r1":
            f = tok.encode(b, add_special_tokens=False)
            forced.append(f)
            rendered.append(p)
            ids.append(list(pid) + f)
        else:
            forced.append([])
            rendered.append(p + b)
            ids.append(resolve_prompt_ids(tok, [p + b], None)[0])
    out = []
    for a in generator.generate(rendered, spec, prompt_ids=ids):
        f = forced[a.group]
        if not f:
            out.append(a)
            continue
        out.append(replace(
            a, prompt_ids=list(a.prompt_ids[: len(a.prompt_ids) - len(f)]), response_ids=f + list(a.response_ids),
            text=tok.decode(f, skip_special_tokens=True) + a.text,
            logprobs=None if a.logprobs is None else [0.0] * len(f) + list(a.logprobs),
            loss_mask=[False] * len(f) + [True] * len(a.response_ids), answer_tokens=len(a.response_ids)))
    return out


class ThinkingBudgetGenerator:
    """A Generator whose every generate() call applies a thinking budget (the config keys
    sampling.thinking_budget / sampling.stop_thinking_text reach the sampler through it).

    Weight updates and sleep go to the wrapped generator, so the trainer pushes weights to the
    same engine whichever sampler it samples through."""

    def __init__(self, inner: Generator, budget_tokens: int, stop_thinking_text: str = "", template: str = ""):
        if budget_tokens < 0:
            raise ValueError(f"thinking budget must be >= 0, got {budget_tokens}")
        self.inner = inner
        self.budget_tokens = budget_tokens
        self.stop_thinking_text = stop_thinking_text  # '' = the template's (rlvr.data.templates)
        self.template = template

    def __getattr__(self, name):  # tokenizer, model, weight_version, update_weights, sleep ...
        return getattr(self.inner, name)

    def generate(self, prompts: list[str], spec: SamplingSpec, *, prompt_ids=None) -> list[Rollout]:
        if prompt_ids is not None:
            raise ValueError("a thinking budget renders its own prompts; prompt_ids are not supported")
        return generate_with_thinking_budget(self.inner, prompts, spec, self.budget_tokens, self.stop_thinking_text,
                                             template=self.template)


def with_thinking_budget(generator: Generator, budget_tokens: int, stop_thinking_text: str = "",
                         template: str = "") -> Generator:
    """`generator` itself when budget_tokens < 0 (off), else a ThinkingBudgetGenerator around it.
    template: the task's prompt template (TaskData.template), which decides the forced text and the
    empty block (rlvr.data.templates.think_style); '' = read from each prompt."""
    if budget_tokens < 0:
        return generator
    return ThinkingBudgetGenerator(generator, budget_tokens, stop_thinking_text, template)
