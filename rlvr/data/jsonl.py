"""JSONL reading with validation: every problem names the file and line, nothing is dropped
silently."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path


class DataError(ValueError):
    """Bad input data. The message starts with `path:line:` (or `path:`) and says what is wrong."""


def iter_jsonl(path: str | Path, required_keys: Sequence[str] = ()) -> Iterator[tuple[str, dict]]:
    """Yield (location "path:line", row) for each non-blank line of a JSONL file.

    Raises DataError naming file and line for invalid JSON, a line that is not an object, a
    missing required key, or a required key whose value is not a string/number.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for key in required_keys:
                if key not in row:
                    raise DataError(
                        f'{where}: missing key "{key}" (has: {", ".join(sorted(row)) or "nothing"})'
                    )
                if not isinstance(row[key], str | int | float) or isinstance(row[key], bool):
                    raise DataError(
                        f'{where}: key "{key}" must be a string or number, got {type(row[key]).__name__}'
                    )
            yield where, row


def read_jsonl(path: str | Path, required_keys: Sequence[str] = ()) -> list[dict]:
    """All rows of a JSONL file, validated as in `iter_jsonl`."""
    return [row for _, row in iter_jsonl(path, required_keys)]


def write_jsonl(path: str | Path, rows) -> Path:
    """Write dict rows one per line (UTF-8, non-ASCII kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
