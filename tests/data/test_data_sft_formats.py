"""Issue 37, item 17: `rlvr sft data.sft_path=FILE` reads TRL's SFT formats too, {"prompt", "completion"} and
the conversational {"messages": [...]}, beside rlvr's {"prompt", "response"}; a line in none of them is named
with the formats it could be in. (The command itself: tests/cli/test_cli_paths_rewards.py.)"""

from __future__ import annotations

import json
import re

import pytest

from rlvr.data import DataError, load_sft


def _write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_trl_prompt_completion_rows(tmp_path):
    f = _write(tmp_path / "pc.jsonl", [{"prompt": "1+1=", "completion": "2"}, {"prompt": "2+2=", "completion": "4"}])
    pairs = load_sft(f)
    assert [(p.prompt, p.response) for p in pairs] == [("1+1=", "2"), ("2+2=", "4")]


def test_trl_conversational_rows(tmp_path):
    f = _write(tmp_path / "chat.jsonl", [
        {"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]},
        {"messages": [{"role": "system", "content": "Add."}, {"role": "user", "content": "2+2="},
                      {"role": "assistant", "content": "4"}]},
    ])
    one, two = load_sft(f)
    assert (one.prompt, one.response) == ("1+1=", "2")  # one user turn: its text, as question_only reads it
    assert one.messages == [{"role": "user", "content": "1+1="}]
    assert two.response == "4" and "system: Add." in two.prompt and two.prompt.endswith("assistant: ")
    assert two.prompt_text(None) == two.prompt


def test_a_conversation_goes_through_the_chat_template_when_the_tokenizer_has_one(tmp_path):
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    f = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                        {"role": "assistant", "content": "yo"}]}])
    (pair,) = load_sft(f)
    assert pair.prompt_text(Tok()) == "<user>hi<assistant>"


def test_trl_conversational_prompt_completion(tmp_path):
    f = _write(tmp_path / "cpc.jsonl", [{"prompt": [{"role": "user", "content": "1+1="}],
                                         "completion": [{"role": "assistant", "content": "2"}]}])
    (pair,) = load_sft(f)
    assert (pair.prompt, pair.response, pair.messages) == ("1+1=", "2", [{"role": "user", "content": "1+1="}])


@pytest.mark.parametrize("row, needle", [
    ({"question": "1+1=", "answer": "2"}, 'missing key "prompt"'),
    ({"prompt": "1+1="}, 'missing key "response" or "completion"'),
    ({"messages": [{"role": "user", "content": "1+1="}]}, 'must be the assistant'),
    ({"messages": [{"role": "assistant", "content": "2"}]}, "only the answer"),
    ({"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "2"}]}, 'string "content"'),
    ({"messages": "hi"}, "non-empty list"),
])
def test_a_line_in_no_format_is_named_with_the_formats(tmp_path, row, needle):
    f = _write(tmp_path / "bad.jsonl", [{"prompt": "a", "response": "b"}, row])
    with pytest.raises(DataError, match=re.escape(f"{f}:2: ")) as err:
        load_sft(f)
    assert needle in str(err.value) and err.value.line == 2, str(err.value)
