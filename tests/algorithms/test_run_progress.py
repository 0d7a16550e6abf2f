"""A training stage's step bar: live on a terminal; in a log (``lightrail train ... > run.log``) a progress line every
``every_s`` seconds with the time left, where rich alone showed nothing until the stage ended."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from lightrail.algorithms.run import progress
from lightrail.algorithms.run.progress import StepBar


class Clock:
    """A settable stand-in for `time.monotonic`, so the test needs no sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    return clock


def log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=200), out


def test_in_a_log_a_line_every_interval_with_the_time_left_and_the_last_step_at_the_end(clock):
    console, out = log_console()
    assert not console.is_terminal
    with StepBar("SFT", total=200, completed=100, every_s=60, console=console) as bar:  # resumed at step 100
        clock.now += 30
        bar.update(110, "nll 1.200")  # 30 s: not yet
        clock.now += 30
        bar.update(120, "nll 0.900")  # 60 s: 20 steps in 60 s, 80 to go
        clock.now += 59
        bar.update(150, "nll 0.700")
        clock.now += 1
        bar.update(160, "nll 0.600")  # 60 s after the last line
        clock.now += 10
        bar.update(170, "nll 0.500")
    assert out.getvalue().splitlines() == [
        "SFT 120/200 (60%), 1:00, ~4:00 left  nll 0.900",
        "SFT 160/200 (80%), 2:00, ~1:20 left  nll 0.600",
        "SFT 170/200 (85%), 2:10, ~0:56 left  nll 0.500",  # the bar closing (a failure, or a stop) prints where it is
    ]


def test_a_finished_stage_ends_with_its_last_step_once(clock):
    console, out = log_console()
    with StepBar("GRPO", total=3, every_s=0, console=console) as bar:
        for step in (1, 2, 3):
            clock.now += 3700 if step == 3 else 1
            bar.update(step, f"reward {step / 10:.3f}")
    assert out.getvalue().splitlines() == [
        "GRPO 1/3 (33%), 0:01, ~0:02 left  reward 0.100",
        "GRPO 2/3 (67%), 0:02, ~0:01 left  reward 0.200",
        "GRPO 3/3 (100%), 1:01:42  reward 0.300",
    ]


def test_on_a_terminal_the_live_bar_shows_steps_and_status():
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    with StepBar("SFT", total=4, console=console) as bar:
        bar.update(3, "nll 0.250")
    shown = out.getvalue()
    assert "SFT" in shown and "3/4" in shown and "nll 0.250" in shown
    assert "left" not in shown  # rich's bar, not the log lines
