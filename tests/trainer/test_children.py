"""The trainer watches every process a run needs: its own (store server, runners, tested under `lightrail train` in
tests/test_first_hour_pass2.py) and those an algorithm starts and hands over with `TrainerContext.watch_child`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from lightrail import Trainer
from lightrail.trainer.children import ChildExited


class _StartsAServer:
    """An algorithm that starts a helper process in ``setup`` (as GRPO starts a vLLM server or update ranks), has the
    trainer watch it, then waits far longer than the test; ``close`` stops the helper on purpose."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.closed_with: int | None = None
        self.forget = lambda: None

    async def setup(self, ctx) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.forget = ctx.watch_child(f"the helper (pid {self.proc.pid})", self.proc.poll)

    async def run(self, ctx) -> None:
        await asyncio.sleep(120)

    async def close(self) -> None:
        assert self.proc is not None
        self.forget()  # stopped on purpose from here
        self.closed_with = self.proc.poll()
        self.proc.kill()
        self.proc.wait()


def _kill_soon(algorithm: _StartsAServer, after_s: float) -> None:
    deadline = time.monotonic() + 60
    while algorithm.proc is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(after_s)
    assert algorithm.proc is not None
    algorithm.proc.kill()


@pytest.mark.parametrize("store", ["sqlite", "in-process"])
def test_a_process_the_algorithm_started_that_dies_stops_the_run_naming_it(store, tmp_path):
    import threading

    from lightrail import MemoryStore

    algorithm = _StartsAServer()
    where = str(tmp_path / "store.db") if store == "sqlite" else MemoryStore()  # (a store server, or none)
    trainer = Trainer(n_runners=1, store=where, algorithm=algorithm)
    killer = threading.Thread(target=_kill_soon, args=(algorithm, 0.5))
    killer.start()
    started = time.monotonic()
    with pytest.raises(ChildExited, match=r"^the helper \(pid \d+\) exited unexpectedly with code -9 \(SIGKILL\)"):
        trainer.fit("tests.algorithms.guard_agents:constant_agent", [{"question": "1 + 1 = ?", "answer": 2}], [])
    killer.join()
    assert time.monotonic() - started < 30  # the run waited 120 s otherwise


def test_what_close_stops_is_stopped_on_purpose(tmp_path):
    """The watch ends before ``close``: a helper stopped there is not a death (the run ends as it would)."""

    class Quick(_StartsAServer):
        async def run(self, ctx) -> None:
            await asyncio.sleep(0.5)

    algorithm = Quick()
    Trainer(n_runners=1, store=str(tmp_path / "store.db"), algorithm=algorithm).fit(
        "tests.algorithms.guard_agents:constant_agent", [{"question": "1 + 1 = ?", "answer": 2}], []
    )
    assert algorithm.closed_with is None  # still running when close stopped it


def test_a_stage_that_stops_its_process_in_close_does_not_stop_the_chain(tmp_path):
    """A `Chain` closes each stage while the run goes on (the trainer's watch is still on): a stage that forgets its
    process before stopping it, as `GRPO` does with its update ranks and vLLM server, ends as it would alone."""
    from lightrail.algorithms.chain import Chain

    class Quick(_StartsAServer):
        async def run(self, ctx) -> None:
            await asyncio.sleep(0.6)  # more than the watch's poll: it sees the helper stopped, were it still watched

    first, second = Quick(), Quick()
    Trainer(n_runners=1, store=str(tmp_path / "store.db"), algorithm=Chain([first, second], names=["a", "b"])).fit(
        "tests.algorithms.guard_agents:constant_agent", [{"question": "1 + 1 = ?", "answer": 2}], []
    )
    assert first.closed_with is None and second.closed_with is None


class _FailsOnItsOwn(_StartsAServer):
    """``run`` fails at once, its helper dead or alive (``kill_first``): what the session names as the cause."""

    kill_first = True

    async def run(self, ctx) -> None:
        assert self.proc is not None
        if self.kill_first:
            self.proc.kill()
            self.proc.wait()
        raise RuntimeError("a call to the helper failed")  # sooner than the watch's next look (0.25 s)


@pytest.mark.parametrize("store", ["sqlite", "in-process"])
def test_a_run_that_fails_because_a_child_died_names_the_child(store, tmp_path):
    """The run failed on its own before the watch looked again: the child that died is still the line's cause (the
    error it caused is chained); a run that fails with its children alive keeps its own error (the runners stopped
    on purpose by then are not taken for dead)."""
    from lightrail import MemoryStore

    def fit(algorithm) -> None:
        where = str(tmp_path / f"{store}-{id(algorithm)}.db") if store == "sqlite" else MemoryStore()
        Trainer(n_runners=1, store=where, algorithm=algorithm).fit(
            "tests.algorithms.guard_agents:constant_agent", [{"question": "1 + 1 = ?", "answer": 2}], []
        )

    with pytest.raises(ChildExited, match=r"^the helper \(pid \d+\) exited unexpectedly") as died:
        fit(_FailsOnItsOwn())
    assert isinstance(died.value.__cause__, RuntimeError)
    alive = _FailsOnItsOwn()
    alive.kill_first = False
    with pytest.raises(RuntimeError, match="a call to the helper failed"):
        fit(alive)
