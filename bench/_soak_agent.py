"""The agent of ``bench/soak.py``: a short rollout that writes spans and a reward, like a small real agent, and
reports what it saw so the bench can check nothing was lost or counted twice."""

from __future__ import annotations

import asyncio

from lightrail import emit_event, emit_reward, rollout


@rollout
async def soak(task, attempt):
    """Three events and a reward over ``task["step_s"]`` x 3 of awaits (tools, model calls); runners hold many at
    once."""
    for step in range(3):
        emit_event("step", step=step, n=task["n"])
        await asyncio.sleep(task["step_s"])
    emit_reward(1.0)
    return 1.0
