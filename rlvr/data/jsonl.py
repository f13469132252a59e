"""JSONL reading with validation: every problem names the file and line, nothing is dropped
silently.

Bounds, checked while reading (before anything slow such as tokenizing runs); none is near a real
dataset's rows (the longest line of GSM8K is 1.7 KB, of MATH-500 4 KB, of AIME 2024 11 KB):

    MAX_LINE_CHARS  64 Mi characters in one line: a longer line is skipped over in chunks, never held
                    in memory, and refused
    MAX_TEXT_CHARS  1 Mi characters in one text field that gets tokenized (a required key, question,
                    problem, prompt, answer, solution, response, reference, completion)
    MAX_JSON_DEPTH  100 levels of nested objects / arrays (deeper: Python's parser would raise a raw
                    RecursionError, and later code that walks the row could too)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

MAX_LINE_CHARS = 64 << 20
MAX_TEXT_CHARS = 1 << 20
MAX_JSON_DEPTH = 100
TEXT_KEYS = ("question", "problem", "prompt", "answer", "solution", "response", "reference", "completion")


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


class JSONLineError(ValueError):
    """A line that is no usable JSON value although it may be well-formed: nested deeper than
    MAX_JSON_DEPTH, a number too long to convert. The message is the reason (no file:line)."""


def read_lines(f: TextIO, limit: int | None = None) -> Iterator[tuple[int, str | None, int]]:
    """(line number, text, length) of every line of the text file `f`, holding at most `limit` + 1
    (default MAX_LINE_CHARS) characters of a line in memory: a longer line is read on in chunks and
    yielded with text None and its length (without the newline), so the caller can refuse it by number
    and go on."""
    limit = MAX_LINE_CHARS if limit is None else limit
    lineno = 0
    while True:
        line = f.readline(limit + 1)
        if not line:
            return
        lineno += 1
        if len(line) <= limit or line.endswith("\n"):
            yield lineno, line, len(line.rstrip("\n"))
            continue
        n = len(line)
        while True:
            chunk = f.readline(1 << 20)
            n += len(chunk.rstrip("\n"))
            if not chunk or chunk.endswith("\n"):
                break
        yield lineno, None, n


def line_too_long(length: int, limit: int | None = None) -> str:
    """The reason a line of `length` characters is refused."""
    limit = MAX_LINE_CHARS if limit is None else limit
    return f"line is {length:,} characters long, over the limit of {limit:,} (rlvr.data.jsonl.MAX_LINE_CHARS)"


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests objects / arrays more than `limit` levels deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def parse_json_line(line: str, max_depth: int | None = None) -> Any:
    """json.loads of one line, bounded: json.JSONDecodeError for invalid JSON (as json.loads), and
    JSONLineError for JSON nested more than `max_depth` levels (instead of a RecursionError) or a
    value Python refuses to convert (an integer of more than 4300 digits)."""
    max_depth = MAX_JSON_DEPTH if max_depth is None else max_depth
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise JSONLineError(f"JSON nested deeper than {max_depth} levels (rlvr.data.jsonl.MAX_JSON_DEPTH)") from None
    except ValueError as exc:
        raise JSONLineError(f"invalid JSON: {exc}") from None
    if _too_deep(value, max_depth):
        raise JSONLineError(f"JSON nested deeper than {max_depth} levels (rlvr.data.jsonl.MAX_JSON_DEPTH)")
    return value


def iter_jsonl(path: str | Path, required_keys: Sequence[str] = ()) -> Iterator[tuple[str, dict]]:
    """Yield (location "path:line", row) for each non-blank line of a JSONL file.

    Raises DataError naming file and line for invalid JSON, a line that is not an object, a
    missing required key, a required key whose value is not a string/number, or a line over the
    bounds of the module docstring (length, text field length, nesting depth).
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


def _parse_line(path: Path, lineno: int, line: str | None, required_keys: Sequence[str], length: int = 0) -> dict:
    """One non-blank line as a validated object, else DataError naming the file and line. `line` None:
    the line was longer than MAX_LINE_CHARS (`length` characters; read_lines)."""
    def bad(reason: str) -> DataError:
        return DataError(f"{path}:{lineno}: {reason}", path=path, line=lineno, reason=reason)

    if line is None:
        raise bad(line_too_long(length))
    try:
        row = parse_json_line(line)
    except json.JSONDecodeError as exc:
        raise bad(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    except JSONLineError as exc:
        raise bad(str(exc)) from None
    if not isinstance(row, dict):
        raise bad(f"expected a JSON object, got {type(row).__name__}")
    for key in required_keys:
        if key not in row:
            raise bad(f'missing key "{key}" (has: {", ".join(sorted(row)) or "nothing"})')
        if not isinstance(row[key], str | int | float) or isinstance(row[key], bool):
            raise bad(f'key "{key}" must be a string or number, got {type(row[key]).__name__}')
    for key in dict.fromkeys((*required_keys, *TEXT_KEYS)):
        value = row.get(key)
        if isinstance(value, str) and len(value) > MAX_TEXT_CHARS:
            raise bad(f'key "{key}" is {len(value):,} characters long, over the limit of {MAX_TEXT_CHARS:,} '
                      f"for one text field (rlvr.data.jsonl.MAX_TEXT_CHARS)")
    return row


def _rows(path: Path, required_keys: Sequence[str]) -> Iterator[tuple[str, dict]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line, length in read_lines(f):
            if line is None or line.strip():
                yield f"{path}:{lineno}", _parse_line(path, lineno, line, required_keys, length)


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
            for lineno, line, length in read_lines(f):
                if line is not None and not line.strip():
                    continue
                try:
                    row = _parse_line(path, lineno, line, required_keys, length)
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
