"""JSONL reading with validation: every problem names the file and line, nothing is dropped
silently."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """Bad input data. The message starts with `path:line:` (or `path:`) and says what is wrong.

    `path`, `line` and `reason` hold the parts separately (None / None / the message when the raiser
    did not give them), so a command can say which config key named the file without repeating it.
    """

    def __init__(self, message: str, *, path: str | Path | None = None, line: int | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = message if reason is None else reason


def iter_jsonl(path: str | Path, required_keys: Sequence[str] = ()) -> Iterator[tuple[str, dict]]:
    """Yield (location "path:line", row) for each non-blank line of a JSONL file.

    Raises DataError naming file and line for invalid JSON, a line that is not an object, a
    missing required key, or a required key whose value is not a string/number.
    """
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise DataError(f"{path}: {what}", path=path, reason=what)
    try:
        yield from _rows(path, required_keys)
    except UnicodeDecodeError as exc:
        # Decoding runs a chunk ahead of the lines, so no line number would be exact.
        reason = f"not UTF-8 text ({exc.reason})"
        raise DataError(f"{path}: {reason}", path=path, reason=reason) from None


def _parse_line(path: Path, lineno: int, line: str, required_keys: Sequence[str]) -> dict:
    """One non-blank line as a validated object, else DataError naming the file and line."""
    def bad(reason: str) -> DataError:
        return DataError(f"{path}:{lineno}: {reason}", path=path, line=lineno, reason=reason)

    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise bad(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(row, dict):
        raise bad(f"expected a JSON object, got {type(row).__name__}")
    for key in required_keys:
        if key not in row:
            raise bad(f'missing key "{key}" (has: {", ".join(sorted(row)) or "nothing"})')
        if not isinstance(row[key], str | int | float) or isinstance(row[key], bool):
            raise bad(f'key "{key}" must be a string or number, got {type(row[key]).__name__}')
    return row


def _rows(path: Path, required_keys: Sequence[str]) -> Iterator[tuple[str, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if line.strip():
                yield f"{path}:{lineno}", _parse_line(path, lineno, line, required_keys)


def scan_jsonl(path: str | Path, required_keys: Sequence[str] = (),
               check_row: Callable[[dict, str, int], Any] | None = None) -> tuple[int, list[DataError]]:
    """(rows that passed, every bad line) of a JSONL file: the checks of `iter_jsonl` and then
    `check_row(row, "path:line", index)` (a task's parse_row) on each line, all of them instead of
    stopping at the first, so a command can name every bad line at once. A file that cannot be read
    at all (missing, not UTF-8) raises DataError as `iter_jsonl` does."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "no such file"
        raise DataError(f"{path}: {what}", path=path, reason=what)
    good, errors = 0, []
    try:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = _parse_line(path, lineno, line, required_keys)
                    if check_row is not None:
                        check_row(row, f"{path}:{lineno}", good + len(errors))
                    good += 1
                except DataError as exc:
                    errors.append(DataError(str(exc), path=path, line=lineno, reason=exc.reason.removeprefix(
                        f"{path}:{lineno}: ")))
                except (ValueError, KeyError, TypeError) as exc:
                    reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
                    reason = str(reason).removeprefix(f"{path}:{lineno}: ")
                    errors.append(DataError(f"{path}:{lineno}: {reason}", path=path, line=lineno, reason=reason))
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8 text ({exc.reason})"
        raise DataError(f"{path}: {reason}", path=path, reason=reason) from None
    return good, errors


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
