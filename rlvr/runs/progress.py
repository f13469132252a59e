"""Progress display for long loops: a live rich bar on a terminal, plain periodic lines elsewhere.

    with Progress(total=cfg.run.steps, description="grpo") as bar:
        for step in range(start, cfg.run.steps):
            ...
            bar.update(1, reward=0.41, acc=0.25, loss=0.013)

On a TTY this is a rich progress bar with the latest fields. When the stream is not a TTY (CI,
a subprocess, output piped to a file) it prints one plain line every `log_every` updates and at the
end -- `grpo 10/60 (17%) 0:00:12<0:01:00 reward=0.41 acc=0.25 loss=0.013` -- so logs hold no
escape codes. `RLVR_PROGRESS=rich|plain|off` forces a mode.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, TextIO

MODES = ("rich", "plain", "off")


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a != 0 and (a < 1e-3 or a >= 1e5):
        return f"{v:.3g}"
    return f"{v:.4g}" if a < 10 else f"{v:.1f}"


def _fmt_time(s: float) -> str:
    s = int(max(s, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_fields(fields: dict[str, Any]) -> str:
    """`reward=0.41 acc=0.25 loss=0.013` (4 significant digits, scientific for tiny/huge)."""
    return " ".join(f"{k}={_fmt_value(v)}" for k, v in fields.items())


class Progress:
    """Progress of one loop of `total` steps (None = unknown) with live named fields.

    mode: "rich" | "plain" | "off" | None (None: RLVR_PROGRESS, else rich on a TTY, plain otherwise).
    log_every: plain mode prints every this many steps (default: about 20 lines per run).
    start: steps already done (a resumed run starts its bar there).
    """

    def __init__(self, total: int | None, description: str = "", *, mode: str | None = None,
                 log_every: int | None = None, start: int = 0, stream: TextIO | None = None):
        self.total = total
        self.description = description
        self.stream = stream if stream is not None else sys.stdout
        mode = mode or os.environ.get("RLVR_PROGRESS", "").strip() or None
        if mode is None:
            isatty = getattr(self.stream, "isatty", None)
            mode = "rich" if callable(isatty) and isatty() else "plain"
        if mode not in MODES:
            raise ValueError(f"unknown progress mode {mode!r}; known: {', '.join(MODES)}")
        self.mode = mode
        self.completed = start
        self._start = start
        self.fields: dict[str, Any] = {}
        self.log_every = log_every or max(1, (total or 200) // 20)
        self._t0 = time.monotonic()
        self._last_printed = start
        self._rich = None
        self._task = None
        if mode == "rich":
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )
            from rich.progress import Progress as RichProgress

            self._rich = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("<"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self._rich.start()
            self._task = self._rich.add_task(description, total=total, completed=start, info="")

    def update(self, advance: int = 1, **fields: Any) -> None:
        """Advance by `advance` steps and set live fields (they persist until changed)."""
        self.completed += advance
        self.fields.update(fields)
        if self.mode == "rich":
            self._rich.update(self._task, advance=advance, info=format_fields(self.fields))
        elif self.mode == "plain":
            done = self.total is not None and self.completed >= self.total
            if self.completed - self._last_printed >= self.log_every or (done and self._last_printed < self.total):
                self._print_line()

    def set_fields(self, **fields: Any) -> None:
        """Change fields without advancing (shown with the next update / line)."""
        self.update(0, **fields)

    def line(self) -> str:
        """The plain progress line for the current state."""
        elapsed = time.monotonic() - self._t0
        if self.total:
            pct = f" ({100 * self.completed / self.total:.0f}%)"
            done_here = self.completed - self._start
            left = (self.total - self.completed) * elapsed / done_here if done_here > 0 else 0.0
            count = f"{self.completed}/{self.total}{pct} {_fmt_time(elapsed)}<{_fmt_time(left)}"
        else:
            count = f"{self.completed} {_fmt_time(elapsed)}"
        parts = [p for p in (self.description, count, format_fields(self.fields)) if p]
        return " ".join(parts)

    def _print_line(self) -> None:
        self._last_printed = self.completed
        print(self.line(), file=self.stream, flush=True)

    def log(self, message: str) -> None:
        """Print a message above the bar (rich) or as its own line (plain)."""
        if self.mode == "rich":
            self._rich.console.print(message)
        elif self.mode == "plain":
            print(message, file=self.stream, flush=True)

    def close(self) -> None:
        if self.mode == "rich" and self._rich is not None:
            self._rich.stop()
            self._rich = None
        elif self.mode == "plain" and self.completed != self._last_printed:
            self._print_line()  # the final state is always in the log

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
