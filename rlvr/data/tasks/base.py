"""The task interface. A task ties together how examples are read, how a prompt is rendered,
and which reward function checks the answer, so the training reward and the evaluation metric
come from the same place and cannot drift apart.

Adding a task = one module in rlvr/data/tasks/ that defines a `TASK = Task(...)`, plus its name
in `_TASK_MODULES` of rlvr/data/tasks/__init__.py (modules that are absent are skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError, iter_jsonl
from rlvr.data.templates import render_prompt
from rlvr.rewards import get_reward_fn


@dataclass(frozen=True)
class Task:
    """A named task.

    parse_row(row, where, index) -> Example: one raw row (JSONL line or HF record) to an Example;
        raises DataError starting with `where` ("path:line") when the row is bad.
    required_keys: keys every raw row must have (checked before parse_row, naming file:line).
    default_template: prompt template used when none is given.
    rewards: template name -> reward function name in rlvr.rewards; key "*" is the fallback.
    make_target(example, template) -> str: the SFT response for that template (None: the task
        has no canonical response format).
    generate(n, split, seed, **difficulty) -> list[Example]: synthetic tasks only.
    capacity(split, heldout_fraction=0.1, **difficulty) -> int | None: how many distinct problems of
        `split` generate() can produce with those knobs (None: too many to count), so a config that
        asks for more fails at once instead of after a minute of drawing.
    stops: template name -> stop strings (default: r1_zero stops at "</answer>").
    """

    name: str
    description: str
    parse_row: Callable[[dict, str, int], Example] | None = None
    required_keys: tuple[str, ...] = ()
    default_template: str = "question_only"
    rewards: Mapping[str, str] = field(default_factory=dict)
    make_target: Callable[[Example, str], str] | None = None
    generate: Callable[..., list[Example]] | None = None
    capacity: Callable[..., int | None] | None = None
    # template name -> stop strings that end a response besides EOS (r1_zero: the answer tag,
    # kept in the output so the r1_zero checker sees the closed tag).
    stops: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: {"r1_zero": ("</answer>",)})

    def stop_strings(self, template: str | None = None) -> tuple[str, ...]:
        """Stop strings for responses to prompts rendered with `template` (use with
        include_stop_str_in_output=True)."""
        return tuple(self.stops.get(template or self.default_template, ()))

    def reward_name(self, template: str | None = None) -> str:
        """Reward function name for prompts rendered with `template`."""
        template = template or self.default_template
        if template in self.rewards:
            return self.rewards[template]
        if "*" in self.rewards:
            return self.rewards["*"]
        raise KeyError(
            f"task {self.name!r} has no reward for template {template!r}; has: {sorted(self.rewards)}"
        )

    def reward_fn(self, template: str | None = None):
        """The RewardFn `(response, example) -> Reward` for prompts rendered with `template`."""
        return get_reward_fn(self.reward_name(template))

    def prompt(self, example: Example, template: str | None = None, tokenizer=None) -> str:
        """Prompt text of `example` rendered with `template` (default: the task's)."""
        return render_prompt(example.question, template or self.default_template, tokenizer)

    def target(self, example: Example, template: str | None = None) -> str:
        """SFT response text for `example` under `template`."""
        if self.make_target is None:
            raise ValueError(f"task {self.name!r} defines no SFT target format")
        return self.make_target(example, template or self.default_template)

    def from_rows(self, rows: Iterable[dict], source: str = "rows",
                  columns: Mapping[str, str] | None = None) -> list[Example]:
        """Rows (dicts) -> Examples, validating required keys; errors name `source` and the row.
        columns: {"question": your column, "answer": your column} (map_columns)."""
        if self.parse_row is None:
            raise ValueError(f"task {self.name!r} is synthetic; use generate()")
        out = []
        for i, row in enumerate(rows):
            where = f"{source}:{i}"
            for key in source_keys(self.required_keys, columns):
                if key not in row:
                    raise DataError(f'{where}: missing key "{key}" (has: {", ".join(sorted(row))})')
            out.append(self.parse_row(map_columns(row, columns, where), where, i))
        return out

    def load(self, path: str | Path, columns: Mapping[str, str] | None = None) -> list[Example]:
        """Examples from a JSONL file; a bad line raises DataError "path:line: ...". columns: as in
        from_rows (a TRL-style {"prompt", "answer"} file: columns={"question": "prompt"})."""
        if self.parse_row is None:
            raise ValueError(f"task {self.name!r} is synthetic; use generate()")
        return [
            self.parse_row(map_columns(row, columns, where), where, i)
            for i, (where, row) in enumerate(iter_jsonl(path, source_keys(self.required_keys, columns)))
        ]


# The keys a task's parse_row reads for the question and the answer (the first is what a mapped column
# becomes; the others are dropped from a mapped row so that they cannot take precedence).
COLUMN_ALIASES = {"question": ("question", "problem"), "answer": ("answer", "reference")}


def source_keys(required: Iterable[str], columns: Mapping[str, str] | None) -> tuple[str, ...]:
    """The required keys of a raw row under a column mapping: a mapped key is required under its own name."""
    columns = {k: v for k, v in (columns or {}).items() if v}
    renamed = {alias: columns[role] for role, aliases in COLUMN_ALIASES.items() if role in columns
               for alias in aliases}
    out = [renamed.get(k, k) for k in required]
    out += [v for v in columns.values() if v not in out]
    return tuple(dict.fromkeys(out))


def map_columns(row: dict, columns: Mapping[str, str] | None, where: str = "") -> dict:
    """The row with your columns under the names tasks read (data.question_key / data.answer_key):
    columns={"question": "prompt"} turns {"prompt": "2+2?", "answer": "4"} into {"question": "2+2?",
    "answer": "4"}; the task's other names for that role ("problem"; "reference") are dropped."""
    columns = {k: v for k, v in (columns or {}).items() if v}
    if not columns:
        return row
    out = dict(row)
    for role, source in columns.items():
        if source not in row:
            raise DataError(f'{where}: missing key "{source}" (data.{role}_key; has: {", ".join(sorted(row))})')
        value = row[source]
        if isinstance(value, list) and role == "question":  # TRL's conversational format: a list of messages
            raise DataError(f'{where}: key "{source}" holds a list (chat messages?); rlvr renders the prompt '
                            "itself from a question text and data.template: map a plain-text column")
        for alias in COLUMN_ALIASES[role]:
            out.pop(alias, None)
        out[COLUMN_ALIASES[role][0]] = value
    return out
