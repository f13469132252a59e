"""Loaders: task JSONL files, GSM8K, MATH-style, prompt/response SFT files, HF datasets.

All file loaders validate every line and raise DataError "path:line: what is wrong"; nothing is
skipped silently. HF `datasets` is imported only inside `load_hf` (it is not a dependency).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError, iter_jsonl
from rlvr.data.tasks import get_task


@dataclass
class SFTExample:
    """One supervised pair: the model is trained on `response` given `prompt`. A conversational row (TRL's
    {"messages": [...]}) keeps its messages before the answer in `messages`; `prompt` is then their plain-text
    layout, and `prompt_text(tokenizer)` lays them out with the tokenizer's chat template when it has one."""

    prompt: str
    response: str
    id: str = ""
    messages: list[dict[str, str]] | None = None

    def prompt_text(self, tokenizer=None) -> str:
        """The prompt as the model reads it: a conversational row through the tokenizer's chat template (with
        the generation prompt) when the tokenizer has one, else `prompt`."""
        if self.messages is not None and tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(self.messages, tokenize=False, add_generation_prompt=True)
        return self.prompt


SFT_FORMATS = ('{"prompt", "response"}', '{"prompt", "completion"} (TRL)',
               '{"messages": [{"role", "content"}, ...]} (TRL conversational)')
_ROLES = ("system", "user", "assistant", "tool")


def _messages(value, key: str) -> list[dict[str, str]]:
    """A list of {"role", "content"} messages (TRL's conversational format), else ValueError saying what is
    wrong."""
    if not isinstance(value, list) or not value:
        raise ValueError(f'key "{key}" must be a non-empty list of {{"role", "content"}} messages, got '
                         f"{type(value).__name__ if not isinstance(value, list) else 'an empty list'}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f'{key}[{i}] must be an object with a string "role" and a string "content"')
        if m["role"] not in _ROLES:
            raise ValueError(f'{key}[{i}]: role {m["role"]!r} is not one of {", ".join(_ROLES)}')
        out.append({"role": m["role"], "content": m["content"]})
    return out


def _plain_layout(messages: list[dict[str, str]]) -> str:
    """The prompt of a conversation for a tokenizer without a chat template: one user turn is its text (as
    question_only reads a question); more turns are their texts, each after its role, one per paragraph."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return messages[0]["content"]
    return "\n\n".join(f"{m['role']}: {m['content']}" for m in messages) + "\n\nassistant: "


def sft_pair(row: dict, prompt_key: str = "prompt", response_key: str = "response") -> tuple[str, str, list | None]:
    """(prompt, response, prompt messages or None) of one SFT row in any of SFT_FORMATS; ValueError (or
    KeyError for a missing key) naming what is wrong. A {"prompt", "completion"} row whose prompt and
    completion are message lists (TRL's conversational prompt-completion) works too; the completion is one
    assistant message."""
    if "messages" in row and prompt_key not in row:
        msgs = _messages(row["messages"], "messages")
        if msgs[-1]["role"] != "assistant":
            raise ValueError('the last of "messages" must be the assistant\'s answer (role "assistant"), got role '
                             f'{msgs[-1]["role"]!r}')
        if len(msgs) < 2:
            raise ValueError('"messages" holds only the answer: the messages before it are the prompt')
        return _plain_layout(msgs[:-1]), msgs[-1]["content"], msgs[:-1]
    response = response_key if response_key in row else (
        "completion" if response_key == "response" and "completion" in row else response_key)
    for key in (prompt_key, response):
        if key not in row:
            other = " or \"completion\"" if key == "response" else ""
            raise KeyError(f'missing key "{key}"{other} (has: {", ".join(sorted(row)) or "nothing"}); an SFT line is '
                           + ", ".join(SFT_FORMATS))
    prompt, answer = row[prompt_key], row[response]
    if isinstance(prompt, list) or isinstance(answer, list):  # conversational prompt-completion
        msgs = _messages(prompt, prompt_key) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        done = _messages(answer, response) if isinstance(answer, list) else [{"role": "assistant",
                                                                                "content": str(answer)}]
        if len(done) != 1 or done[0]["role"] != "assistant":
            raise ValueError(f'"{response}" must be one assistant message')
        return _plain_layout(msgs), done[0]["content"], msgs
    for key, value in ((prompt_key, prompt), (response, answer)):
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ValueError(f'key "{key}" must be a string or number, got {type(value).__name__}')
    return str(prompt), str(answer), None


def load_task_file(task: str, path: str | Path) -> list[Example]:
    """Examples of task `task` (a name in TASKS) from a JSONL file."""
    return get_task(task).load(path)


def load_gsm8k(path: str | Path) -> list[Example]:
    """GSM8K JSONL (question, answer with '#### final'); reference has commas stripped."""
    return get_task("gsm8k").load(path)


def load_math(path: str | Path) -> list[Example]:
    """MATH-style JSONL (problem/question, solution with \\boxed{} or answer)."""
    return get_task("math").load(path)


def load_sft(
    path: str | Path, prompt_key: str = "prompt", response_key: str = "response"
) -> list[SFTExample]:
    """SFT pairs from a JSONL file, each line in one of SFT_FORMATS: {"prompt", "response"}, TRL's
    {"prompt", "completion"} and TRL's conversational {"messages": [...]} (the last message is the
    assistant's answer, the ones before it the prompt: SFTExample.prompt_text). Every line is checked;
    DataError names the file and line. A file without a single pair raises DataError too: training on
    nothing is never what was meant."""
    out = []
    for where, row in iter_jsonl(path):
        lineno = int(where.rpartition(":")[2])
        try:
            prompt, response, messages = sft_pair(row, prompt_key, response_key)
        except (KeyError, ValueError) as exc:
            reason = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            raise DataError(f"{path}:{lineno}: {reason}", path=path, line=lineno, reason=reason) from None
        out.append(SFTExample(prompt=prompt, response=response, id=str(row.get("id", where)), messages=messages))
    if not out:
        reason = f'no {prompt_key}/{response_key} pairs: the file is empty (or only blank lines)'
        raise DataError(f"{path}: {reason}", path=path, reason=reason)
    return out


def sft_examples(
    examples: Iterable[Example], task: str, template: str | None = None, tokenizer=None
) -> list[SFTExample]:
    """Task examples -> SFT pairs: the task's prompt under `template` and its target format."""
    t = get_task(task)
    return [SFTExample(t.prompt(ex, template, tokenizer), t.target(ex, template), ex.id) for ex in examples]


def load_hf(
    task: str, dataset: str, split: str = "train", *, config: str | None = None,
    columns: dict[str, str] | None = None, **kwargs
) -> list[Example]:
    """Examples from a Hugging Face dataset (needs the `datasets` package): a hub id (with `config`,
    its subset, e.g. "main" for openai/gsm8k), a folder written by Dataset(Dict).save_to_disk, or a
    folder of data files. Rows are parsed by the task's parse_row like JSONL lines; columns:
    {"question": your column, "answer": your column} (Task.from_rows). The config keys
    data.hf_dataset / hf_config / hf_split / hf_eval_split call this."""
    try:
        import datasets
    except ImportError as exc:
        raise ImportError("the `datasets` package is not installed: pip install datasets") from exc
    path = Path(dataset)
    if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        ds = datasets.load_from_disk(str(path))  # save_to_disk's layout
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{dataset} has no split {split!r}; it has: {', '.join(ds)}")
            ds = ds[split]
        elif split != "train":
            raise ValueError(f"{dataset} is one saved Dataset without splits; it has no split {split!r}")
    else:
        ds = datasets.load_dataset(dataset, config, split=split, **kwargs)
    return get_task(task).from_rows((dict(r) for r in ds), source=f"{dataset}[{split}]", columns=columns)


__all__ = [
    "SFT_FORMATS",
    "DataError",
    "SFTExample",
    "load_gsm8k",
    "load_hf",
    "load_math",
    "load_sft",
    "load_task_file",
    "sft_examples",
    "sft_pair",
]
