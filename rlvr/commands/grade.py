"""`rlvr grade FILE.jsonl --reward NAME`: score a file of responses with a reward function.

Each line is a JSON object with a response (`--response-key`, default "response") and, for a reward
that compares against one, a reference answer (`--reference-key`, default "reference"). countdown,
language and the code rewards read no reference (they check meta, or the response alone), so their
lines need none; for a "module:function" reward the reference is required unless
`--reference-key ''` says there is none. Metadata comes from `--meta-key` (default "meta") if that
is an object, else it is the line's other keys (the reference key included), so countdown's
"numbers" and "target" can sit at top level. Writes one result per input line (bad lines included,
with their error) to `--out` (default FILE with suffix .graded.jsonl) and prints a summary table.

Exit status: 0 when at least one line was scored; 1 when none could be (every line bad, or no
lines): the results file is still written, and an accuracy of 0 over nothing would read as a
result; 2 for a usage error (unknown reward, missing file, --on-bad-line fail on a bad line).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import typer

ON_BAD_LINE = ("skip", "fail")


def reference_free_rewards() -> frozenset[str]:
    """Registered rewards that never read Example.reference: countdown checks meta's numbers and
    target, language and format look at the response alone, the code rewards (rlvr.rewards.code)
    run meta's tests."""
    from rlvr.rewards.code.rewards import CODE_REWARD_FUNCTIONS

    return frozenset({"countdown", "language", "format", *CODE_REWARD_FUNCTIONS})


def needs_reference(reward: str) -> bool:
    """Whether the reward spec compares against a reference answer: any part of a composition
    ("r1_zero:1,language:0.1") that is not reference-free does; a "module:function" may, so it does."""
    if ":" in reward and "," not in reward:
        try:
            float(reward.partition(":")[2])
        except ValueError:
            return True  # "module:function": unknown, so the reference is asked for
    names = [item.strip().partition(":")[0].strip() for item in reward.split(",")]
    free = reference_free_rewards()
    return any(name not in free for name in names)


def _read_rows(path: Path, response_key: str, reference_key: str, meta_key: str, need_reference: bool = True):
    """Yield (line_number, row or None, error or None) for every non-blank line. Without
    need_reference a missing (or non-scalar) reference becomes "". A line over the bounds of
    rlvr.data.jsonl (MAX_LINE_CHARS characters, MAX_JSON_DEPTH levels of nesting) is a bad line with
    its reason, like invalid JSON; an over-long line is never held in memory whole."""
    from rlvr.data.jsonl import JSONLineError, line_too_long, parse_json_line, read_lines

    with path.open("r", encoding="utf-8", errors="replace") as f:
        for lineno, raw, length in read_lines(f):
            if raw is None:
                yield lineno, None, line_too_long(length)
                continue
            if not raw.strip():
                continue
            try:
                obj = parse_json_line(raw)
            except json.JSONDecodeError as exc:
                yield lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                continue
            except JSONLineError as exc:
                yield lineno, None, str(exc)
                continue
            if not isinstance(obj, dict):
                yield lineno, None, f"expected a JSON object, got {type(obj).__name__}"
                continue
            required = (response_key, reference_key) if need_reference else (response_key,)
            missing = [k for k in required if k not in obj]
            if missing:
                yield lineno, None, f"missing key(s) {missing}; line has {sorted(obj)}"
                continue
            response = obj[response_key]
            if not isinstance(response, str):
                yield lineno, None, f"key {response_key!r} must be a string, got {type(response).__name__}"
                continue
            reference = obj.get(reference_key, "") if reference_key else ""
            scalar = isinstance(reference, str | int | float) and not isinstance(reference, bool)
            if need_reference and not scalar:
                yield lineno, None, f"key {reference_key!r} must be a string or number, got {type(reference).__name__}"
                continue
            if not scalar:
                reference = ""
            meta = obj.get(meta_key)
            if not isinstance(meta, dict):
                meta = {k: v for k, v in obj.items() if k != response_key}
            yield lineno, {"response": response, "reference": str(reference), "meta": meta}, None


def grade(
    file: Path = typer.Argument(..., help="JSONL file of responses to score."),
    reward: str = typer.Option(..., "--reward", help="Reward function name (e.g. r1_zero, gsm8k, 'r1_zero:1,language:0.1')."),
    reference_key: str = typer.Option(
        "reference", "--reference-key",
        help="Key of the reference answer ('' = the lines have none). Rewards that read none "
        "(countdown, language, code*) do not require it."),
    response_key: str = typer.Option("response", "--response-key", help="Key of the model response."),
    meta_key: str = typer.Option("meta", "--meta-key", help="Key of the metadata object (else: the other keys)."),
    on_bad_line: str = typer.Option("skip", "--on-bad-line", help="skip: report and go on; fail: stop before scoring."),
    out: Path | None = typer.Option(None, "--out", help="Per-line results JSONL (default FILE.graded.jsonl)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Scoring threads / verifier processes."),
    timeout: float = typer.Option(3.0, "--timeout", min=0.01, help="Deadline per symbolic check, seconds."),
    isolate: bool = typer.Option(False, "--isolate", help="Run each whole reward call in a killable process."),
) -> None:
    """Score a JSONL file of responses: accuracy, format rate, counts per status, answers/s.

    Exit status 1 when no line could be scored (the results file is still written), 2 on a usage error.
    """
    from rich.console import Console
    from rich.table import Table

    from rlvr.rewards.batch import ScoreCounters, resolve_reward_fn, score_batch
    from rlvr.rewards.types import SimpleExample


    def fail(msg: str) -> typer.Exit:
        typer.echo(msg, err=True)
        return typer.Exit(2)

    if on_bad_line not in ON_BAD_LINE:
        raise fail(f"error: --on-bad-line must be one of {', '.join(ON_BAD_LINE)}, got {on_bad_line!r}")
    if file.is_dir():
        found = sorted(str(p) for p in file.glob("*.jsonl"))
        hint = (f"; JSONL files there: {', '.join(found[:4])}{' ...' if len(found) > 4 else ''}" if found
                else "; it holds no .jsonl file")
        raise fail(f"error: {file} is a directory: rlvr grade scores one JSONL file of responses{hint}")
    if not file.is_file():
        raise fail(f"error: {file}: no such file")
    try:
        resolve_reward_fn(reward)
    except (KeyError, ValueError, TypeError, ImportError, AttributeError) as exc:
        raise fail(f"error: --reward: {exc}") from exc

    rows: list[tuple[int, dict[str, Any]]] = []
    bad: list[tuple[int, str]] = []
    need_reference = bool(reference_key) and needs_reference(reward)
    for lineno, row, problem in _read_rows(file, response_key, reference_key, meta_key, need_reference):
        if problem is not None:
            bad.append((lineno, problem))
            typer.echo(f"{file}:{lineno}: {problem}", err=True)
            if on_bad_line == "fail":
                raise fail("stopping (--on-bad-line fail); nothing was scored or written")
        else:
            rows.append((lineno, row))
    if rows:  # a reward function of the user's: one call on the first line before scoring them all
        from rlvr.commands.config_cli import check_user_reward

        check_user_reward(reward, "--reward", SimpleExample(rows[0][1]["reference"], rows[0][1]["meta"]),
                          rows[0][1]["response"])

    counters = ScoreCounters()
    rewards = score_batch(
        reward,
        [r["response"] for _, r in rows],
        [SimpleExample(r["reference"], r["meta"]) for _, r in rows],
        workers=workers,
        timeout_s=timeout,
        isolate=isolate,
        counters=counters,
    )

    out_path = out if out is not None else file.with_suffix(".graded.jsonl")
    records: list[tuple[int, dict[str, Any]]] = [
        (
            lineno,
            {"line": lineno, "reward": r.total, "parts": dict(r.parts), "status": r.status.value, "info": r.info},
        )
        for (lineno, _), r in zip(rows, rewards, strict=True)
    ]
    records += [(lineno, {"line": lineno, "reward": None, "status": "bad_line", "info": why}) for lineno, why in bad]
    records.sort(key=lambda x: x[0])
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for _, rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(out_path)

    table = Table(title=f"rlvr grade {file.name} --reward {reward}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("lines scored", str(counters.total))
    table.add_row("bad lines (skipped)", str(len(bad)))
    table.add_row("accuracy", f"{counters.accuracy:.4f}")
    fmt = counters.format_rate  # NaN: the reward has no format part (the definition rlvr eval uses)
    table.add_row("format rate", "n/a (no format part)" if math.isnan(fmt) else f"{fmt:.4f}")
    for status, n in counters.by_status.items():
        table.add_row(f"status {status}", str(n))
    table.add_row("answers/s", f"{counters.per_second:,.0f}")
    table.add_row("results", str(out_path))
    Console().print(table)
    if not rows:
        # An accuracy of 0.0000 over no lines would read as a result: say so and fail.
        what = f"all {len(bad)} lines were bad (see above)" if bad else "it has no non-blank lines"
        typer.echo(f"error: no line of {file} was scored: {what}", err=True)
        raise typer.Exit(1)
