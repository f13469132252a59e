"""Prompt + response length against the positions a model has, checked before any work.

A model has `config.max_position_embeddings` positions (GPT-2's `n_positions` is read through the same
name). An absolute-position model indexes past its table (a long IndexError from inside the forward), a
RoPE model runs on silently past the length it was trained for, and the tiny model generated 5000 tokens
with 512 positions for two minutes after its progress bar said 100%. `check_positions` refuses such a
config with one line naming the keys (sampling.max_tokens, and the longest prompt's example) before a
run directory exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlvr.config import ConfigError

_SPECIAL = 16  # room for the special tokens a tokenizer adds around a prompt (BOS, a chat header's)


def max_positions(model: Any) -> int | None:
    """The model's position limit from its config, None when it states none."""
    config = getattr(model, "config", None)
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def prompt_lengths(tokenizer: Any, prompts: Sequence[str]) -> list[int]:
    """Token counts of the prompts as the samplers encode them (rlvr.rollout.types.resolve_prompt_ids:
    special tokens added), in one batch call of the tokenizer."""
    if not prompts:
        return []
    return [len(x) for x in tokenizer(list(prompts), add_special_tokens=True)["input_ids"]]


def check_positions(model: Any, tokenizer: Any, prompts: Sequence[tuple[str, str]], response_tokens: int, *,
                    response_keys: str, model_desc: str) -> None:
    """Raise ConfigError when the longest prompt plus `response_tokens` (what `response_keys` allow a
    response, e.g. "sampling.max_tokens=5000") exceeds the model's positions. `prompts`: (example id, prompt
    text) pairs; `model_desc`: how the config named the model (model.name=tiny, model.init_from=RUN)."""
    limit = max_positions(model)
    if limit is None or not prompts:
        return
    # A prompt takes at most one token per UTF-8 byte (byte-level BPE, byte fallback, a character
    # tokenizer) plus a few special ones: only prompts whose bound does not fit are tokenized.
    prompts = [x for x in prompts if len(x[1].encode("utf-8")) + _SPECIAL + response_tokens > limit]
    if not prompts:
        return
    lengths = prompt_lengths(tokenizer, [p for _, p in prompts])
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    need = lengths[longest] + response_tokens
    if need <= limit:
        return
    room = limit - lengths[longest]
    fix = (f"lower it to at most {room}" if room > 0 else "no response fits: shorten the prompts (data.template)")
    raise ConfigError(
        f"{response_keys} + the longest prompt ({lengths[longest]} tokens, example {prompts[longest][0]}) = {need} "
        f"positions, but the model has {limit} (max_position_embeddings of {model_desc}): {fix}, or use a model "
        "with more positions")
