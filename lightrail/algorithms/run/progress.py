"""The step bar of a training stage: a live bar on a terminal, a plain line every minute or so in a log.

rich draws a live bar only on a terminal; written to a file (``lightrail train ... > run.log``, ``nohup``, CI) it
shows the bar once, when it closes, so a 30-minute SFT stage looked stuck. `StepBar` prints progress lines there
instead: step, share done, elapsed time, time left at the rate so far, and the stage's status (loss, reward).
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

__all__ = ["StepBar"]


class StepBar:
    """``with StepBar("SFT", total=steps, completed=step) as bar: ... bar.update(step, "nll 0.412")``.

    On a terminal (or in Jupyter) this is rich's bar (label, bar, ``M/N``, elapsed, status). Elsewhere each `update` prints a line
    when ``every_s`` seconds have passed since the last one (the first after ``every_s``), and the bar prints one
    at the end if the last update was not printed. ``console`` defaults to rich's global console, which the failure
    digests print on too."""

    def __init__(
        self, label: str, *, total: int, completed: int = 0, every_s: float = 60.0, console: Any = None
    ) -> None:
        from rich import get_console

        self.label = label
        self.total = total
        self.every_s = every_s
        self.console = console if console is not None else get_console()
        self._start_step = self._step = completed
        self._status = ""
        self._started = self._printed_at = time.monotonic()
        self._printed_step = completed
        self._live: Any = None
        self._task: Any = None

    def __enter__(self) -> StepBar:
        if self.console.is_terminal or self.console.is_jupyter:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._live = Progress(
                TextColumn(f"[bold]{self.label}[/bold]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"), console=self.console, transient=False,
            )  # fmt: skip
            self._live.__enter__()
            self._task = self._live.add_task("steps", total=self.total, completed=self._step, status="")
        return self

    def update(self, completed: int, status: str = "") -> None:
        """Record that ``completed`` steps are done, with ``status`` to show beside them."""
        self._step, self._status = completed, status
        if self._live is not None:
            self._live.update(self._task, completed=completed, status=status)
        elif time.monotonic() - self._printed_at >= self.every_s:
            self._print_line()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
        elif self._step != self._printed_step:
            self._print_line()

    def _print_line(self) -> None:
        now = time.monotonic()
        elapsed = now - self._started
        line = f"{self.label} {self._step}/{self.total} ({self._step / max(self.total, 1):.0%}), {_clock(elapsed)}"
        done = self._step - self._start_step
        if done > 0 and self._step < self.total:
            line += f", ~{_clock(elapsed / done * (self.total - self._step))} left"
        if self._status:
            line += f"  {self._status}"
        self.console.print(line, markup=False, highlight=False, soft_wrap=True)  # one line each, however long
        self._printed_at, self._printed_step = now, self._step


def _clock(seconds: float) -> str:
    """``1:02:03`` or ``2:03``."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
