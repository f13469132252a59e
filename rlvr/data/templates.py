"""Prompt templates: r1_zero and question_only ship as package data (rlvr/assets/prompts/),
"chat" uses the tokenizer's own chat template, and any string containing "{question}" is a
template too.

Substitution is a plain `str.replace("{question}", ...)`, not `str.format`, because questions
contain braces (LaTeX, code) that format() would choke on.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

PLACEHOLDER = "{question}"


@cache
def _asset(name: str) -> str:
    return resources.files("rlvr").joinpath("assets", "prompts", f"{name}.prompt").read_text(encoding="utf-8")


def _r1_zero(question: str, tokenizer=None) -> str:
    return _asset("r1_zero").replace(PLACEHOLDER, question)


def _question_only(question: str, tokenizer=None) -> str:
    return _asset("question_only").replace(PLACEHOLDER, question)


def _chat(question: str, tokenizer=None) -> str:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("template 'chat' needs a tokenizer that has a chat_template")
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


# name -> (question, tokenizer) -> prompt text
PROMPT_TEMPLATES = {"r1_zero": _r1_zero, "question_only": _question_only, "chat": _chat}


def template_text(name: str) -> str:
    """Raw text of a packaged template ("r1_zero", "question_only")."""
    if name not in ("r1_zero", "question_only"):
        raise KeyError(f"no packaged template text for {name!r}; known: question_only, r1_zero")
    return _asset(name)


def render_prompt(question: str, template: str = "question_only", tokenizer=None) -> str:
    """Prompt text for `question`. template: a name in PROMPT_TEMPLATES, or a literal template
    containing "{question}". Unknown name -> KeyError listing the known ones."""
    if template in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[template](question, tokenizer)
    if PLACEHOLDER in template:
        return template.replace(PLACEHOLDER, question)
    raise KeyError(
        f"unknown prompt template {template!r}; known: {', '.join(sorted(PROMPT_TEMPLATES))} "
        f"or a string containing {PLACEHOLDER}"
    )


# ------------------------------------------------------------------ how a template closes its reasoning
#
# The one place that knows how a prompt template closes a reasoning block and opens the answer. The
# thinking budget's forced text and its budget-0 empty block (rlvr.rollout.thinking) and `rlvr filter`'s
# no-reasoning prompt (rlvr.data.filters.no_reasoning_prompt) are all built from it, so a forced answer is
# graded by the template's own reward:
#   "r1"    the r1_zero template: its reward needs the literal `</think> <answer>` in the response
#           (rlvr.rewards.extract.R1_SEPARATOR), so the close is " </think> <answer>";
#   "qwen3" every other template (chat, question_only, literal ones): Qwen3's "</think>\n\n", as its chat
#           template writes it.

THINK_STYLES = ("r1", "qwen3")
_STOP_THINKING_LEAD = ("\n\nConsidering the limited time by the user, I have to give the solution based on the "
                       "thinking directly now.")


def think_style(template: str = "", prompt: str = "", think_start: str = "<think>") -> str:
    """'r1' or 'qwen3' for a template name (r1_zero -> r1; chat, question_only -> qwen3). A literal
    template, or no template with a rendered `prompt` instead: r1 when the text ends with `think_start`
    and mentions <answer> (the r1_zero contract), else qwen3."""
    if template == "r1_zero":
        return "r1"
    if template in PROMPT_TEMPLATES:
        return "qwen3"
    text = template or prompt
    return "r1" if text.rstrip().endswith(think_start) and "<answer>" in text else "qwen3"


def _check_style(style: str) -> None:
    if style not in THINK_STYLES:
        raise ValueError(f"unknown think style {style!r}; known: {', '.join(THINK_STYLES)}")


def think_close(style: str, think_end: str = "</think>") -> str:
    """The text that closes a reasoning block and opens the answer: r1 " </think> <answer>",
    qwen3 "</think>\\n\\n"."""
    _check_style(style)
    return f" {think_end} <answer>" if style == "r1" else f"{think_end}\n\n"


def stop_thinking_text(style: str, think_end: str = "</think>") -> str:
    """The text a thinking budget forces when the reasoning ran out: Qwen3's "Considering the limited
    time ... directly now." then the style's close (qwen3: "\\n</think>\\n\\n", Qwen3's own text;
    r1: " </think> <answer>")."""
    sep = "\n" if style == "qwen3" else ""
    return _STOP_THINKING_LEAD + sep + think_close(style, think_end)


def empty_think_block(prompt: str, style: str, think_start: str = "<think>", think_end: str = "</think>") -> str:
    """The closed, empty think block that follows `prompt` when the model answers without reasoning
    (thinking budget 0, `rlvr filter --no-reasoning-k`); only its closing part when the prompt already
    ends with `think_start` (as r1_zero's does). qwen3: "<think>\\n\\n</think>\\n\\n" (Qwen3's chat
    template with enable_thinking=False); r1: "<think> </think> <answer>"."""
    opened = prompt.rstrip().endswith(think_start)
    if style == "r1":
        return think_close(style, think_end) if opened else f"{think_start}{think_close(style, think_end)}"
    _check_style(style)
    return f"\n\n{think_end}\n\n" if opened else f"{think_start}\n\n{think_end}\n\n"


# Qwen3's thinking-mode switch: one model, a reasoning mode and an instant-answer mode, chosen per request by a
# tag at the end of the user's turn. rlvr appends the tag to the question the template renders
# (data.thinking_mode, `rlvr eval --thinking-mode`); no_think also closes an empty think block at the start of
# the response (sampling.thinking_budget=0, rlvr.rollout.thinking), as Qwen3's chat template does with
# enable_thinking=False.
THINKING_MODES = ("think", "no_think")


def mode_tagged(question: str, mode: str) -> str:
    """`question` with the thinking-mode tag ("/think" or "/no_think") appended; '' = unchanged."""
    if not mode:
        return question
    if mode not in THINKING_MODES:
        raise ValueError(f"unknown thinking mode {mode!r}; known: {', '.join(THINKING_MODES)}")
    return f"{question} /{mode}"
