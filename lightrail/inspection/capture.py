"""What a rollout failed to capture: no LLM call through lightrail's endpoint, calls without token ids, no reward.

A rollout can succeed and still be useless for training: the agent called its own client instead of
``llm.endpoint`` (nothing recorded), the backend returned no token ids (nothing trainable), or the agent returned
None and emitted no reward (nothing to learn from). These are the most reported problems of a first run, and none
of them raises: `capture_problems` names them from a rollout and the spans of its last attempt, so `lightrail dev`,
the failure digest and `lightrail doctor` can say so. Pure functions, no I/O, except `read_capture_problems`.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from lightrail._errors import counted
from lightrail.store.base import NotFoundError, Store
from lightrail.types import LLM, Attr, Rollout, RolloutStatus, Span, StatusCode

__all__ = [
    "KEY_FIX",
    "CaptureCause",
    "CaptureProblem",
    "capture_problems",
    "key_refusal",
    "llm_expected",
    "read_capture_problems",
]


class CaptureCause(enum.StrEnum):
    """Why a rollout cannot be trained on (its group in the failure digest)."""

    KEY_REFUSED = "key refused"
    NO_LLM_CALL = "no LLM call"
    NO_TOKEN_IDS = "no token ids"
    NO_REWARD = "no reward"


KEY_FIX = (
    "give the agent's client api_key=llm.api_key (runners also set OPENAI_API_KEY to it where the environment sets "
    "none), not a placeholder such as 'dummy'"
)
"""What to do when the gateway refused an agent's key (the agent sent its own instead of the one it was given)."""


def key_refusal(spans: Sequence[Span]) -> CaptureProblem | None:
    """The problem of an attempt in which the gateway refused a call for its key (`Attr.SPAN_KEY_REFUSED`), if any."""
    for span in spans:
        if span.name == Attr.SPAN_KEY_REFUSED:
            status = span.attributes.get(Attr.REFUSED_STATUS)
            why = f"{status} {span.status.message}".strip()
            return CaptureProblem(CaptureCause.KEY_REFUSED, f"the gateway refused the agent's key ({why}): {KEY_FIX}")
    return None


@dataclass(frozen=True)
class CaptureProblem:
    """One cause, and the line a person reads: what was (not) recorded and its likely reason."""

    cause: CaptureCause
    message: str


def capture_problems(rollout: Rollout, spans: Sequence[Span], *, expects_llm: bool = True) -> list[CaptureProblem]:
    """The capture problems of a rollout that succeeded, from the spans of its last attempt (none for a rollout
    that did not succeed: its exception says more). ``expects_llm``: an `LLM` resource was published, so the agent
    had an endpoint to call. A refused key is named whatever the rollout's status (the agent may have raised the
    client's 401 or caught it)."""
    refused = key_refusal(spans)
    if rollout.status is not RolloutStatus.SUCCEEDED:
        return [refused] if refused is not None else []
    problems: list[CaptureProblem] = [] if refused is None else [refused]
    calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
    if not calls and expects_llm and refused is None:
        seen = sum(1 for s in spans if s.attributes.get(Attr.KIND) == "llm")  # the framework's own spans (OTel)
        elsewhere = (
            f"{counted(seen, 'LLM call')} seen over OpenTelemetry went elsewhere: the agent's client has its own "
            "base_url; give it llm.endpoint"
            if seen
            else "the agent did not call llm.endpoint (it may use its own client or base_url)"
        )
        problems.append(CaptureProblem(CaptureCause.NO_LLM_CALL, f"no LLM call recorded: {elsewhere}"))
    untrainable = [
        s
        for s in calls
        if s.status.code is not StatusCode.ERROR and s.attributes.get(Attr.TOKEN_IDS_AVAILABLE) is False
    ]
    if untrainable:
        problems.append(
            CaptureProblem(
                CaptureCause.NO_TOKEN_IDS,
                f"{counted(len(untrainable), 'call')} without token ids: the backend does not return them "
                "(not trainable; vLLM >= 0.10.2 or lightrail's engine does)",
            )
        )
    if rollout.reward is None:
        problems.append(
            CaptureProblem(
                CaptureCause.NO_REWARD,
                "no reward: the agent returned None and emitted no reward (return a float or call emit_reward)",
            )
        )
    return problems


async def read_capture_problems(
    store: Store, rollouts: Iterable[Rollout], *, concurrency: int = 16
) -> dict[str, list[CaptureProblem]]:
    """`capture_problems` of every succeeded or failed rollout of ``rollouts`` by rollout id (those with none left out),
    reading the spans of its last attempt and whether its resources held an `LLM` (at most ``concurrency`` reads
    at once)."""
    limit = asyncio.Semaphore(concurrency)
    expects_llm = llm_expected(store)

    async def one(rollout: Rollout) -> tuple[str, list[CaptureProblem]]:
        async with limit:
            attempts = await store.query_attempts(rollout.rollout_id)
            spans = await store.query_spans(rollout.rollout_id, attempts[-1].attempt_id) if attempts else []
            return rollout.rollout_id, capture_problems(
                rollout, spans, expects_llm=await expects_llm(rollout.resources_version)
            )

    # failed ones too: a refused key is named whether the agent raised the client's 401 or caught it
    read = [r for r in rollouts if r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.FAILED)]
    return {rid: found for rid, found in await asyncio.gather(*(one(r) for r in read)) if found}


def llm_expected(store: Store) -> Callable[[int | None], Awaitable[bool]]:
    """``await expects(version)``: whether the resources of that version (None: the latest) hold an `LLM` served by
    lightrail's gateway (``routed``), i.e. the agent had an endpoint whose calls are recorded; each version is read
    once."""
    known: dict[int | None, bool] = {}

    async def expects(version: int | None) -> bool:
        if version not in known:
            try:
                resources = await store.get_resources(version)
            except NotFoundError:  # a version no longer there: nothing says an endpoint was given
                resources = None
            items = resources.items.values() if resources is not None else ()
            known[version] = any(isinstance(r, LLM) and r.routed for r in items)  # an endpoint lightrail records
        return known[version]

    return expects
