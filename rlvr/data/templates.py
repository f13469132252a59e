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
