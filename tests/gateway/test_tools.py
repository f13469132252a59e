"""rlvr.gateway.tools: the hermes tool-call parser (Qwen2.5 / Hermes <tool_call> blocks) and the registry."""

from __future__ import annotations

import json

import pytest

from rlvr.gateway.tools import MAX_PARSE_CHARS, TOOL_PARSERS, ParsedCompletion, get_tool_parser, parse_hermes


def test_one_call_becomes_an_openai_tool_call_and_leaves_no_content():
    text = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    p = parse_hermes(text)
    assert p.content is None and len(p.tool_calls) == 1
    tc = p.tool_calls[0].to_openai("call_0_0")
    assert tc == {"id": "call_0_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    assert json.loads(tc["function"]["arguments"]) == {"a": 1, "b": 2}


def test_text_around_and_two_calls():
    text = ('Let me compute.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
            '<tool_call>{"name": "mul", "parameters": {"x": "é"}}</tool_call> done')
    p = parse_hermes(text)
    assert [c.name for c in p.tool_calls] == ["add", "mul"]
    assert json.loads(p.tool_calls[1].arguments) == {"x": "é"}  # "parameters" read as the arguments
    assert p.content == "Let me compute.\n\n done"


def test_arguments_given_as_a_json_string_are_kept_as_that_string():
    p = parse_hermes('<tool_call>{"name": "f", "arguments": "{\\"q\\": 3}"}</tool_call>')
    assert p.tool_calls[0].arguments == '{"q": 3}'


@pytest.mark.parametrize("body", ['{"name": "add", "arguments": {"a": 1}', "not json", '["add"]', '{"arguments": {}}',
                                  '{"name": "", "arguments": {}}', "[" * 5000])
def test_malformed_blocks_are_no_tool_call_and_stay_in_the_content(body):
    text = f"before <tool_call>{body}</tool_call> after"
    assert parse_hermes(text) == ParsedCompletion(text, [])


def test_a_malformed_block_beside_a_good_one_stays_as_written():
    text = '<tool_call>oops</tool_call><tool_call>{"name": "g", "arguments": {}}</tool_call>'
    p = parse_hermes(text)
    assert [c.name for c in p.tool_calls] == ["g"] and p.content == "<tool_call>oops</tool_call>"


def test_no_tags_an_unclosed_tag_and_oversized_text_are_plain_content():
    assert parse_hermes("just text") == ParsedCompletion("just text", [])
    cut = '<tool_call>{"name": "add", "arguments": {"a"'  # cut by max_tokens
    assert parse_hermes(cut) == ParsedCompletion(cut, [])
    big = '<tool_call>{"name": "f", "arguments": {}}</tool_call>' + " " * MAX_PARSE_CHARS
    assert parse_hermes(big).tool_calls == []


def test_registry_lookup_names_the_known_parsers():
    assert get_tool_parser("hermes") is parse_hermes and "hermes" in TOOL_PARSERS
    with pytest.raises(ValueError, match="known: \\['hermes'"):
        get_tool_parser("nope")
