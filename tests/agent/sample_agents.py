"""Agents the runner tests (and their spawned runner processes) import by reference: ``sample_agents:name``.

Their behaviour is driven by the task input, so one module serves every test.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import time

from lightrail import LitAgent, emit_event, emit_reward, rollout
from lightrail.tracing import current_attempt, span


@rollout
async def tagged(task, rollout, attempt):
    """Emits spans tagged with its own ids, yielding to the loop in between so attempts interleave."""
    for step in range(3):
        emit_event("step", step=step, rid=rollout.rollout_id, aid=attempt.attempt_id)
        await asyncio.sleep(0.01)
        emit_reward(0.1 * step, intermediate=True, response_id=f"{attempt.attempt_id}-{step}")
    async with span("work", rid=rollout.rollout_id):
        await asyncio.sleep(0.01)
    emit_reward(task["reward"])
    return task.get("returned")


@rollout
def sync_tagged(task, rollout, attempt):
    """A sync agent (runs in a worker thread) that also starts a thread of its own, with the context copied."""
    import contextvars

    emit_event("sync", rid=rollout.rollout_id, thread=threading.get_ident())
    seen = {}

    def inner():
        ctx = current_attempt()
        seen["aid"] = ctx.attempt_id if ctx else None
        emit_event("inner", rid=rollout.rollout_id)

    t = threading.Thread(target=contextvars.copy_context().run, args=(inner,))
    t.start()
    t.join()
    time.sleep(0.02)
    assert seen["aid"] == attempt.attempt_id
    emit_reward(task["reward"])


@rollout
async def behave(task):
    """Does what the task says: ``raise`` a ValueError, ``connect`` to a closed port, ``sleep`` (seconds),
    ``return`` a value, ``emit`` a final reward."""
    if "emit" in task:
        emit_reward(task["emit"])
    if "sleep" in task:
        await asyncio.sleep(task["sleep"])
    if task.get("raise"):
        raise ValueError(f"bad answer {task['raise']} for id 0x1f{os.getpid()}")
    if "connect" in task:
        import httpx

        async with httpx.AsyncClient() as client:
            await client.get(f"http://127.0.0.1:{task['connect']}/v1/models")
    return task.get("return")


@rollout
async def sleeper(task, attempt):
    """Sleeps for ``task["sleep"]`` seconds; marks a file when cancelled (for cross-process checks)."""
    try:
        await asyncio.sleep(task["sleep"])
    except asyncio.CancelledError:
        if task.get("mark"):
            with open(task["mark"], "a") as f:
                f.write(attempt.attempt_id + "\n")
        raise
    return 1.0


class Doubler(LitAgent):
    """A class-based agent: reward = 2 * task["x"]."""

    def rollout(self, task, resources, rollout):
        return 2.0 * task["x"]


doubler = Doubler()


@rollout
def where_am_i(task):
    """Reports the interpreter it runs under and whether this (trainer) environment's packages leak into it."""
    emit_event(
        "interpreter",
        executable=sys.executable,
        prefix=sys.prefix,
        has_torch=importlib.util.find_spec("torch") is not None,
        has_crewai=importlib.util.find_spec("crewai") is not None,
    )
    return float(task["x"])
