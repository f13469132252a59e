"""reasoning-gym's own scorers as rlvr rewards (data.task=reasoning_gym:<dataset>, rlvr.data.tasks.reasoning_gym).

The reward is the dataset's `score_answer(answer, entry)`, a float in [0, 1] (1 = right; some datasets give
partial credit), called on the dataset built with the problem's own config (example.meta: "rg_dataset",
"rg_config", and "entry", the generator's entry {"question", "answer", "metadata"}). Status CORRECT at 1, else
INCORRECT (the total keeps the partial credit); a scorer that raises or returns no number in [0, 1] is an ERROR,
never a silent 0. The answer:

- `reasoning_gym` (question_only, chat and custom templates): the last `<answer>...</answer>` block when the
  response has one (reasoning-gym's own prompt asks for it), else the whole response, stripped; no format part.
- `reasoning_gym_r1_zero` (the r1_zero template): its answer block, gated on the r1_zero format like `r1_zero`.

reasoning_gym is imported on the first score, not here (the rewards layer imports no optional package).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from typing import Any

from rlvr.rewards.extract import answer_block, parse_r1_zero
from rlvr.rewards.functions import never_raises
from rlvr.rewards.types import ExampleLike, Reward, Status

INSTALL_HINT = "pip install 'rlvr[reasoning-gym]'"
# Config fields of every reasoning-gym dataset that rlvr sets itself (data.seed, data.num_train / num_eval).
RESERVED_KEYS = ("seed", "size")


def import_reasoning_gym():
    """The reasoning_gym module; ImportError saying how to install it when it is absent."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(f"the reasoning-gym package is not installed ({type(exc).__name__}: {exc}); "
                          f"{INSTALL_HINT}") from exc
    return reasoning_gym


def registered_datasets() -> dict[str, tuple[type, type]]:
    """reasoning-gym's registry: dataset name -> (dataset class, config dataclass)."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return DATASETS


def config_kwargs(dataset: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """data.rg as the keyword arguments of the dataset's config dataclass: a list given for a field whose default
    is a tuple (YAML has no tuples: operators=[+, -]) becomes a tuple. Unknown and reserved keys: ValueError
    naming the key and the dataset's keys."""
    config_cls = registered_datasets()[dataset][1]
    fields = {f.name: f for f in dataclasses.fields(config_cls) if f.init}
    known = sorted(k for k in fields if k not in RESERVED_KEYS)
    out = {}
    for key, value in config.items():
        if key in RESERVED_KEYS:
            raise ValueError(f"data.rg.{key}: rlvr sets the dataset's {key} itself (data.seed, data.num_train / "
                             "data.num_eval); leave it out of data.rg")
        if key not in fields:
            raise ValueError(f"data.rg.{key} is not a config key of reasoning-gym's {dataset!r} "
                             f"({config_cls.__name__}); its keys: {', '.join(known) or 'none'}")
        if isinstance(value, list) and isinstance(fields[key].default, tuple):
            value = tuple(value)
        out[key] = value
    return out


def make_dataset(dataset: str, config: Mapping[str, Any], seed: int, size: int):
    """The reasoning-gym dataset `dataset` with data.rg `config`, its seed and size (the config's own validate()
    runs: an AssertionError names the broken rule)."""
    cls, config_cls = registered_datasets()[dataset]
    settings = config_cls(**config_kwargs(dataset, config), seed=seed, size=size)
    if callable(getattr(settings, "validate", None)):
        settings.validate()
    return cls(config=settings)


@functools.lru_cache(maxsize=64)
def _scorer(dataset: str, config_json: str):
    return make_dataset(dataset, json.loads(config_json), seed=0, size=1)


def config_key(config: Mapping[str, Any]) -> str:
    """A config mapping as the scorer cache's key (tuples written as lists: the same config)."""
    return json.dumps(dict(config), sort_keys=True, default=str)


def score_answer(answer: str | None, example: ExampleLike) -> float:
    """reasoning-gym's score of `answer` for the example's entry (example.meta's rg_dataset, rg_config, entry)."""
    meta = getattr(example, "meta", None) or {}
    missing = [k for k in ("rg_dataset", "entry") if k not in meta]
    if missing:
        raise KeyError(f"example.meta has no {', '.join(map(repr, missing))} (keys: {sorted(meta)}): not a "
                       "reasoning_gym:<dataset> problem")
    return _scorer(str(meta["rg_dataset"]), config_key(meta.get("rg_config") or {})).score_answer(answer,
                                                                                                  meta["entry"])


def _scored(answer: str | None, example: ExampleLike, parts: dict[str, float]) -> Reward:
    """The Reward of reasoning-gym's score of `answer`; a scorer failure or a score outside [0, 1]: ERROR."""
    name = (getattr(example, "meta", None) or {}).get("rg_dataset", "?")
    try:
        raw = score_answer(answer, example)
    except Exception as exc:  # noqa: BLE001 - the dataset's scorer is foreign code: its failure is an ERROR
        return Reward(0.0, {}, Status.ERROR, f"reasoning_gym {name}.score_answer: {type(exc).__name__}: {exc}"[:300],
                      answer=answer)
    try:
        score = float(raw)
    except (TypeError, ValueError):
        score = math.nan
    if isinstance(raw, bool) or not 0.0 <= score <= 1.0:  # NaN fails the comparison too
        return Reward(0.0, {}, Status.ERROR, f"reasoning_gym {name}.score_answer returned {raw!r}, not a number "
                      "in [0, 1]", answer=answer)
    status = Status.CORRECT if score >= 1.0 else Status.INCORRECT
    return Reward(score, {**parts, "answer": score}, status, f"reasoning_gym {name}: {score:g}", answer=answer)


@never_raises
def reasoning_gym(response: str, example: ExampleLike) -> Reward:
    """reasoning-gym's score of the last <answer> block, else of the whole response (stripped)."""
    answer = answer_block(response)
    if answer is None:
        answer = response.strip() if isinstance(response, str) else ""
    if not answer:
        return Reward(0.0, {"answer": 0.0}, Status.UNPARSABLE, "empty response")
    return _scored(answer, example, {})


@never_raises
def reasoning_gym_r1_zero(response: str, example: ExampleLike) -> Reward:
    """r1_zero template: reasoning-gym's score of the answer block; the format (`</think> <answer>` ...
    `</answer>`) gates it as in `r1_zero`."""
    parsed = parse_r1_zero(response)
    if not parsed.format_ok:
        return Reward(0.0, {"format": 0.0, "answer": 0.0}, Status.UNPARSABLE, "r1_zero format not followed")
    if parsed.answer is None:
        return Reward(0.0, {"format": 1.0, "answer": 0.0}, Status.UNPARSABLE, "empty answer block")
    return _scored(parsed.answer, example, {"format": 1.0})
