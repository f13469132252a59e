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
    """One supervised pair: the model is trained on `response` given `prompt`."""

    prompt: str
    response: str
    id: str = ""


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
    """Prompt/response JSONL for SFT; both keys required on every line. A file without a single
    pair raises DataError too: training on nothing is never what was meant."""
    out = []
    for where, row in iter_jsonl(path, (prompt_key, response_key)):
        out.append(
            SFTExample(
                prompt=str(row[prompt_key]), response=str(row[response_key]), id=str(row.get("id", where))
            )
        )
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
    "DataError",
    "SFTExample",
    "load_gsm8k",
    "load_hf",
    "load_math",
    "load_sft",
    "load_task_file",
    "sft_examples",
]
