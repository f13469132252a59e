"""reasoning-gym's procedural datasets as tasks: `data.task=reasoning_gym:<dataset>` (leg_counting, chain_sum,
basic_arithmetic, ... 100+), config keys in `data.rg` (`data.rg.min_animals=2`). Needs the optional package
(pip install 'rlvr[reasoning-gym]'); nothing is registered up front: rlvr.data.get_task builds the task of a
`reasoning_gym:` name on first use (`rg_task`), and DataConfig.validate checks the package, the name and data.rg
at config load (`config_problems`), before any model loads.

Problems: the generator's entries, drawn in index order from a dataset seeded per split from data.seed (train and
held-out streams differ); as for rlvr's own generators (rlvr.data.tasks.synthetic) a problem's split is a fixed
hash of its question, and each split's problems are distinct, so the held-out problems never appear in training,
deterministic in (data.seed, data.rg). Each becomes an Example: id "reasoning_gym:<dataset>:<index>", question,
reference = the entry's answer, meta = {"rg_dataset", "rg_config", "entry"} (what the scorer needs).

Reward: reasoning-gym's own score_answer (rlvr.rewards.reasoning_gym): `reasoning_gym` for question_only / chat
templates (the <answer> block, else the whole response), `reasoning_gym_r1_zero` for r1_zero.

Rows (data.train_path, `rlvr filter`'s output): {"question", "reference" (or "answer"), "meta": {...}}; a row
without meta.entry is scored on {"question", "answer": reference, "metadata": {}} (enough for the datasets whose
scorer compares the answer; the others report an ERROR naming the missing metadata).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
from collections.abc import Mapping
from typing import Any

from rlvr.data.example import Example
from rlvr.data.jsonl import DataError
from rlvr.data.tasks.base import Task
from rlvr.data.tasks.synthetic import SPLITS, split_of
from rlvr.rewards.reasoning_gym import (
    INSTALL_HINT,
    RESERVED_KEYS,
    config_kwargs,
    make_dataset,
    registered_datasets,
)

PREFIX = "reasoning_gym:"
HELDOUT_FRACTION = 0.1  # the share of a dataset's problems (by question hash) kept for held-out evaluation


def is_reasoning_gym(name: str) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


def dataset_name(task: str) -> str:
    return task[len(PREFIX):] if is_reasoning_gym(task) else task


def unknown_dataset(dataset: str, known) -> str:
    close = difflib.get_close_matches(dataset, list(known), n=5, cutoff=0.5)
    hint = f"; did you mean {', '.join(PREFIX + c for c in close)}?" if close else \
        f"; known datasets: {', '.join(sorted(known))}"
    return f"data.task={PREFIX + dataset!r}: reasoning-gym has no dataset {dataset!r}{hint}"


def config_problems(task: str, config: Mapping[str, Any]) -> list[str]:
    """What is wrong with data.task=reasoning_gym:<dataset> and data.rg, one line each naming the key ([] = ok):
    the package is absent, the dataset is unknown (close names listed), a data.rg key is none of the dataset's
    config keys, or the dataset's config refuses the values."""
    dataset = dataset_name(task)
    try:
        known = registered_datasets()
    except ImportError:
        return [f"data.task={task!r} needs the reasoning-gym package, which is not installed: {INSTALL_HINT}"]
    if not dataset:
        return [f"data.task={task!r}: name a dataset after the prefix, e.g. {PREFIX}leg_counting"]
    if dataset not in known:
        return [unknown_dataset(dataset, known)]
    try:
        config_kwargs(dataset, config)
    except ValueError as exc:
        return [str(exc)]
    try:
        make_dataset(dataset, config, seed=0, size=1)
    except (AssertionError, ValueError, TypeError) as exc:
        return [f"data.rg={dict(config)!r}: reasoning-gym's {dataset!r} refuses it: {type(exc).__name__}: "
                f"{exc or 'its config check failed'}"]
    return []


def _stream_seed(dataset: str, seed: int, split: str) -> int:
    """The dataset seed of a split's stream (train and held-out streams start far apart)."""
    digest = hashlib.blake2b(f"reasoning_gym:{dataset}:{seed}:{split}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def generate(n: int, split: str = "train", seed: int = 0, *, dataset: str, rg: Mapping[str, Any] | None = None,
             heldout_fraction: float = HELDOUT_FRACTION) -> list[Example]:
    """n distinct problems of `split` ("train" or "test") from reasoning-gym's `dataset` with config `rg`,
    deterministic in (seed, split, rg); a problem's split is a hash of its question (train and test never share
    one). ValueError when the dataset yields too few distinct problems of the split."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")
    config = dict(rg or {})
    stream = _stream_seed(dataset, seed, split)
    attempts = 50 * n + 1000
    ds = make_dataset(dataset, config, seed=stream, size=attempts)
    seen: set[str] = set()
    out: list[Example] = []
    for idx in range(attempts):
        if len(out) == n:
            break
        entry = ds[idx]
        question = str(entry["question"])
        if question in seen or split_of(question, heldout_fraction) != split:
            continue
        seen.add(question)
        out.append(Example(id=f"{PREFIX}{dataset}:{split}:{stream}:{idx}", question=question,
                           reference=str(entry["answer"]),
                           meta={"rg_dataset": dataset, "rg_config": config, "entry": entry, "split": split},
                           solution=str(entry["answer"])))
    if len(out) < n:
        raise ValueError(f"reasoning-gym {dataset!r}: found only {len(out)} distinct {split} problems of the {n} "
                         f"asked for in {attempts} draws with data.rg={config}; ask for fewer (data.num_train / "
                         "data.num_eval) or widen data.rg")
    return out


def _parse_row(dataset: str, row: dict, where: str, index: int) -> Example:
    question = str(row["question"])  # as the generator wrote it (not stripped: rows load back unchanged)
    ref = row.get("reference", row.get("answer"))
    if ref is None or str(ref).strip() == "":
        raise DataError(f'{where}: missing key "reference" (or "answer")')
    meta = dict(row.get("meta") or {})
    if not isinstance(meta.get("entry"), Mapping):
        meta["entry"] = {"question": question, "answer": str(ref), "metadata": {}}
    meta.setdefault("rg_dataset", dataset)
    meta.setdefault("rg_config", {})
    return Example(id=str(row.get("id", f"{PREFIX}{dataset}:{where}")), question=question, reference=str(ref),
                   meta=meta, solution=str(ref))


def _make_target(ex: Example, template: str) -> str:
    if template == "r1_zero":
        return f" {ex.reference} </think> <answer>{ex.reference}</answer>"
    return ex.reference


@functools.cache
def rg_task(task: str) -> Task:
    """The Task of `reasoning_gym:<dataset>`; KeyError naming data.task when the package is absent or the dataset
    unknown (rlvr.data.get_task's contract)."""
    dataset = dataset_name(task)
    try:
        known = registered_datasets()
    except ImportError as exc:
        raise KeyError(f"task {task!r}: {exc}") from None
    if dataset not in known:
        raise KeyError(unknown_dataset(dataset, known))
    return Task(
        name=PREFIX + dataset,
        description=f"reasoning-gym's {dataset!r} generator, scored by its own score_answer (data.rg: its config)",
        parse_row=functools.partial(_parse_row, dataset),
        required_keys=("question",),
        default_template="question_only",
        rewards={"r1_zero": "reasoning_gym_r1_zero", "*": "reasoning_gym"},
        make_target=_make_target,
        generate=functools.partial(generate, dataset=dataset),
    )


__all__ = ["PREFIX", "RESERVED_KEYS", "config_problems", "generate", "is_reasoning_gym", "rg_task"]
