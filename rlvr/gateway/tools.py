"""Tool-call parsers: a completion's text -> the assistant message's content and OpenAI `tool_calls`.

A parser is `parse(text) -> ParsedCompletion`, registered by name in TOOL_PARSERS (Gateway(tool_parser=NAME)).
Built in: `hermes`, the format of Hermes and Qwen2.5 / Qwen3 chat templates:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Each closed <tool_call>...</tool_call> whose body is a JSON object with a string "name" becomes one call; its
"arguments" (or "parameters") is re-serialized as the JSON string OpenAI clients expect. A block whose body is
not such an object is no tool call: it stays in the content as written. An unclosed tag (a completion cut by
max_tokens) is content too. Model output is hostile input: text over MAX_PARSE_CHARS is not parsed, and the scan
is a linear str.find walk, no regex.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_PARSE_CHARS = 1_000_000


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text (usually an object), as OpenAI's function.arguments

    def to_openai(self, call_id: str) -> dict:
        return {"id": call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class ParsedCompletion:
    content: str | None  # the text outside the tool calls, stripped; None when only tool calls were written
    tool_calls: list[ToolCall] = field(default_factory=list)


def _json_call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            json.loads(args)
            return ToolCall(obj["name"], args)
        except ValueError:
            pass
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def parse_tagged(text: str, open_tag: str, close_tag: str) -> ParsedCompletion:
    """Every closed open_tag ... close_tag block whose body is a JSON {"name": ..., "arguments": ...} object."""
    if len(text) > MAX_PARSE_CHARS or open_tag not in text:
        return ParsedCompletion(text, [])
    calls: list[ToolCall] = []
    kept: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        end = text.find(close_tag, start + len(open_tag)) if start >= 0 else -1
        if start < 0 or end < 0:
            kept.append(text[pos:])
            break
        call = _json_call(text[start + len(open_tag): end].strip())
        if call is None:  # malformed: no call, the block stays in the content
            kept.append(text[pos: end + len(close_tag)])
        else:
            kept.append(text[pos:start])
            calls.append(call)
        pos = end + len(close_tag)
    if not calls:
        return ParsedCompletion(text, [])
    content = "".join(kept).strip()
    return ParsedCompletion(content or None, calls)


def parse_hermes(text: str) -> ParsedCompletion:
    """<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Hermes, Qwen2.5, Qwen3)."""
    return parse_tagged(text, "<tool_call>", "</tool_call>")


TOOL_PARSERS: dict[str, Callable[[str], ParsedCompletion]] = {"hermes": parse_hermes}


def get_tool_parser(name: str) -> Callable[[str], ParsedCompletion]:
    """The parser registered as `name`; a ValueError listing the known names otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; known: {sorted(TOOL_PARSERS)}") from None
