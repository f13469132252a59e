"""How a multi-turn transcript is laid out in tokens: the model's chat template when it has one,
a plain-text fallback otherwise.

    fmt = TurnFormat(tokenizer, mode="auto")
    prompt_text = fmt.prompt(system, first_observation)      # ends where the model writes
    between = fmt.observation(tool_output, ended_with_eos)   # text after a model turn, up to the next one

Chat mode renders the conversation with tokenizer.apply_chat_template: the prompt is
[system?, user] with the generation prompt; the text between two model turns is what the template
puts after an assistant message, then the tool message (role "tool", or "user" for templates that
refuse "tool"), then the next generation prompt; found by rendering a conversation with a marker
as the assistant's content and cutting at it. Sampled ids are never re-tokenized: the transcript is
the model's own ids plus the encoded in-between text, so the trainer scores exactly what was
sampled. When the model ended its turn with the end-of-sequence token (e.g. Qwen's <|im_end|>),
the template's copy of that token is dropped from the in-between text.

Plain mode (tokenizers without a chat template, or mode="plain"): the prompt is the system text,
a newline and the observation, then a newline; the in-between text is the tool output exactly as
the environment formatted it (e.g. "<out>84</out>").
"""

from __future__ import annotations

from typing import Literal

ChatMode = Literal["auto", "chat", "plain"]
CHAT_MODES = ("auto", "chat", "plain")
_MARK = "@@RLVR-TURN-MARK@@"


class TurnFormat:
    def __init__(self, tokenizer, mode: ChatMode = "auto"):
        if mode not in CHAT_MODES:
            raise ValueError(f"chat mode {mode!r}; known: {', '.join(CHAT_MODES)}")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if mode == "chat" and not has_template:
            raise ValueError("data.env_chat=chat: the tokenizer has no chat_template (use auto or plain)")
        self.tokenizer = tokenizer
        self.chat = has_template if mode == "auto" else mode == "chat"
        self._tool_role = "tool"
        self._eos_text = tokenizer.eos_token or ""

    @property
    def mode(self) -> str:
        return "chat" if self.chat else "plain"

    def prompt(self, system: str, observation: str) -> str:
        if not self.chat:
            return (f"{system}\n" if system else "") + observation + "\n"
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": observation}]
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    def observation(self, text: str, ended_with_eos: bool = False) -> str:
        """The text between a model turn and the next one, carrying the tool output `text`."""
        if not self.chat:
            return text
        after = self._render_after(text)
        if ended_with_eos and self._eos_text and after.startswith(self._eos_text):
            after = after[len(self._eos_text):]
        return after

    def _render_after(self, text: str) -> str:
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
        for role in (self._tool_role, "user"):
            try:
                rendered = self.tokenizer.apply_chat_template(
                    base + [{"role": role, "content": text}], tokenize=False, add_generation_prompt=True)
            except Exception:  # noqa: BLE001 - templates raise anything (jinja errors) on roles they refuse
                continue
            if _MARK in rendered and text in rendered:
                self._tool_role = role
                return rendered.split(_MARK, 1)[1]
        raise ValueError("the chat template cannot render a tool (or user) message after an assistant turn; "
                         "use data.env_chat=plain")
