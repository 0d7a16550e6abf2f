"""The calculator agent of `bench/async_rl.py`, whose tool calls take a heavy-tailed delay.

Each calculator call of a training rollout sleeps ``min(scale * Pareto(alpha), cap)`` seconds, drawn from a seed
made of the question, the sample index and the call's number, so the same rollout waits the same in the synchronous
and the asynchronous arm (``LIGHTRAIL_BENCH_DELAY="scale,alpha,cap"``, set by the bench). Validation rollouts are
not delayed. Each rollout appends ``{"rollout_id", "seconds"}`` (its wall time) to ``$LIGHTRAIL_BENCH_DURATIONS``.

Concurrency model: the runner runs several rollouts at once in threads; the current rollout's key and call count
live in a context variable, so the one patched ``calculate`` delays each call by its own rollout's schedule.
"""

from __future__ import annotations

import contextvars
import json
import os
import random
import time
import zlib

import lightrail.demos.calculator.agent as calc
from lightrail import rollout as _rollout

_CURRENT: contextvars.ContextVar[list | None] = contextvars.ContextVar("bench_async_rollout", default=None)
_calculate = calc.calculate


def tool_delay(key: str, call: int, scale: float, alpha: float, cap: float) -> float:
    """The delay of call number ``call`` of the rollout keyed ``key``: the same in every arm and every run."""
    rng = random.Random(zlib.crc32(f"{key}|{call}".encode()))
    return min(scale * rng.paretovariate(alpha), cap)


def _delayed_calculate(expression: str) -> str:
    state = _CURRENT.get()
    if state is not None:
        key, calls, (scale, alpha, cap) = state
        time.sleep(tool_delay(key, calls[0], scale, alpha, cap))
        calls[0] += 1
    return _calculate(expression)


calc.calculate = _delayed_calculate  # solve() looks the tool up in its module at each call


@_rollout
def delayed_calculator_agent(task, llm, rollout):
    """The demo's calculator agent (reward 1 for the exact answer), its tool slowed as the module docstring says."""
    started = time.monotonic()
    delay = os.environ.get("LIGHTRAIL_BENCH_DELAY")
    if delay and rollout.mode == "train":
        scale, alpha, cap = (float(x) for x in delay.split(","))
        _CURRENT.set([f"{task['question']}|{rollout.sample_index}", [0], (scale, alpha, cap)])
    try:
        answer = calc.solve(
            task["question"], base_url=llm.endpoint, model=llm.model, api_key=llm.api_key or "none", **llm.sampling
        )
    finally:
        _CURRENT.set(None)
    if rollout.mode == "train" and (path := os.environ.get("LIGHTRAIL_BENCH_DURATIONS")):
        with open(path, "a") as f:
            f.write(json.dumps({"rollout_id": rollout.rollout_id, "seconds": time.monotonic() - started}) + "\n")
    return 1.0 if answer == task["answer"] else 0.0
