"""The contract every `Store` keeps; runs against each implementation (see the ``store`` fixture in conftest)."""

from __future__ import annotations

import asyncio
import re
import time

import msgspec
import pytest

from lightrail.store import InvalidIdError, NotFoundError, StaleAttemptError, WaitResult
from lightrail.store.base import MAX_ID_CHARS
from lightrail.types import (
    LLM,
    AttemptStatus,
    ErrorInfo,
    PromptTemplate,
    Resources,
    RetryPolicy,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanEvent,
    SpanStatus,
    StatusCode,
    Task,
    next_seq,
)


def specs(n: int, **kw) -> list[RolloutSpec]:
    return [RolloutSpec(task=Task(input={"q": i}), **kw) for i in range(n)]


def make_span(lease, i: int, **kw) -> Span:
    return Span(
        rollout_id=lease.rollout.rollout_id,
        attempt_id=lease.attempt.attempt_id,
        seq=kw.pop("seq", next_seq()),
        name=kw.pop("name", f"span-{i}"),
        attributes=kw.pop("attributes", {"i": i, "text": "x" * 100}),
        **kw,
    )


async def test_enqueue_is_idempotent_by_rollout_id(store):
    batch = specs(3)
    first = await store.enqueue(batch)
    again = await store.enqueue(batch)
    assert [r.rollout_id for r in first] == [s.rollout_id for s in batch]
    assert [r.status for r in first] == [RolloutStatus.QUEUED] * 3
    assert [r.rollout_id for r in again] == [r.rollout_id for r in first]
    assert (await store.counts())[RolloutStatus.QUEUED] == 3


async def test_lease_is_fifo_and_returns_none_when_empty(store):
    batch = specs(3)
    await store.enqueue(batch)
    leased = [await store.lease("w") for _ in range(3)]
    assert [lease.rollout.rollout_id for lease in leased] == [s.rollout_id for s in batch]
    assert all(lease.rollout.status is RolloutStatus.RUNNING for lease in leased)
    assert all(lease.attempt.index == 1 and lease.attempt.worker_id == "w" for lease in leased)
    assert await store.lease("w") is None


async def test_lease_with_same_attempt_id_returns_same_lease(store):
    await store.enqueue(specs(2))
    first = await store.lease("w", attempt_id="at-fixed")
    again = await store.lease("w", attempt_id="at-fixed")
    assert again.rollout.rollout_id == first.rollout.rollout_id
    assert again.attempt.attempt_id == "at-fixed"
    assert (await store.counts())[RolloutStatus.QUEUED] == 1  # the retry did not take a second rollout


async def test_a_waiting_lease_is_woken_by_the_enqueue(store):
    """Woken by the enqueue, not by its own 60 s wait running out (how fast: bench/store.py)."""
    waiter = asyncio.create_task(store.lease("w", wait_s=60))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    (rollout,) = await store.enqueue(specs(1))
    lease = await asyncio.wait_for(waiter, 30)
    assert lease.rollout.rollout_id == rollout.rollout_id


async def test_lease_wait_times_out_with_none(store):
    t0 = time.perf_counter()
    assert await asyncio.wait_for(store.lease("w", wait_s=0.2), 30) is None
    assert time.perf_counter() - t0 >= 0.15  # it did wait


async def test_finish_success_records_reward_and_ends_rollout(store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    attempt = await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=0.75)
    assert attempt.status is AttemptStatus.SUCCEEDED and attempt.reward == 0.75 and attempt.ended_at
    rollout = await store.get_rollout(lease.rollout.rollout_id)
    assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 0.75 and rollout.ended_at


async def test_repeated_identical_finish_is_accepted_but_contradicting_one_is_stale(store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    aid = lease.attempt.attempt_id
    await store.finish(aid, AttemptStatus.SUCCEEDED, reward=1.0)
    assert (await store.finish(aid, AttemptStatus.SUCCEEDED, reward=1.0)).status is AttemptStatus.SUCCEEDED
    with pytest.raises(StaleAttemptError):
        await store.finish(aid, AttemptStatus.FAILED)
    assert (await store.get_rollout(lease.rollout.rollout_id)).status is RolloutStatus.SUCCEEDED


async def test_agent_failure_is_final_and_keeps_the_error(store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    err = ErrorInfo(type="ValueError", message="bad answer format", traceback="Traceback ...")
    await store.finish(lease.attempt.attempt_id, AttemptStatus.FAILED, error=err)
    rollout = await store.get_rollout(lease.rollout.rollout_id)
    assert rollout.status is RolloutStatus.FAILED and rollout.reward is None
    (attempt,) = await store.query_attempts(rollout.rollout_id)
    assert attempt.error == err


async def test_infra_error_is_retried_then_marked_infra_error_never_a_reward(store):
    await store.enqueue(specs(1, policy=RetryPolicy(max_attempts=2)))
    first = await store.lease("w1")
    await store.finish(first.attempt.attempt_id, AttemptStatus.INFRA_ERROR)
    assert (await store.get_rollout(first.rollout.rollout_id)).status is RolloutStatus.QUEUED
    second = await store.lease("w2")
    assert second.rollout.rollout_id == first.rollout.rollout_id and second.attempt.index == 2
    await store.finish(second.attempt.attempt_id, AttemptStatus.INFRA_ERROR)
    rollout = await store.get_rollout(first.rollout.rollout_id)
    assert rollout.status is RolloutStatus.INFRA_ERROR and rollout.reward is None
    assert await store.lease("w3") is None


async def test_expired_lease_marks_attempt_lost_and_requeues(store):
    await store.enqueue(specs(1, policy=RetryPolicy(lease_s=0.3, max_attempts=2)))
    first = await store.lease("dead-runner")
    second = await store.lease("w2", wait_s=5)  # woken by the requeue when the first lease expires
    assert second is not None and second.rollout.rollout_id == first.rollout.rollout_id
    assert second.attempt.index == 2
    attempts = await store.query_attempts(first.rollout.rollout_id)
    assert [a.status for a in attempts] == [AttemptStatus.LOST, AttemptStatus.RUNNING]
    with pytest.raises(StaleAttemptError):  # the dead runner comes back too late
        await store.finish(first.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.finish(second.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=0.5)
    assert (await store.get_rollout(first.rollout.rollout_id)).reward == 0.5


async def test_heartbeat_keeps_lease_alive(store):
    await store.enqueue(specs(1, policy=RetryPolicy(lease_s=0.4)))
    lease = await store.lease("w")
    for _ in range(6):
        await asyncio.sleep(0.15)
        beat = await store.heartbeat(lease.attempt.attempt_id)
        assert beat.status is AttemptStatus.RUNNING
    assert beat.lease_expires_at > lease.attempt.lease_expires_at


async def test_lost_lease_without_retries_left_ends_as_infra_error(store):
    (rollout,) = await store.enqueue(specs(1, policy=RetryPolicy(lease_s=0.2, max_attempts=1)))
    await store.lease("w")
    done = await store.wait([rollout.rollout_id], timeout_s=5)
    assert [r.status for r in done] == [RolloutStatus.INFRA_ERROR]


async def test_timeout_is_terminal_and_sticky(store):
    (rollout,) = await store.enqueue(specs(1, policy=RetryPolicy(timeout_s=0.2, lease_s=30)))
    lease = await store.lease("w")
    (done,) = await store.wait([rollout.rollout_id], timeout_s=5)
    assert done.status is RolloutStatus.TIMEOUT
    assert (await store.heartbeat(lease.attempt.attempt_id)).status is AttemptStatus.TIMEOUT
    with pytest.raises(StaleAttemptError):
        await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.TIMEOUT


async def test_cancel_queued_and_running(store):
    first, second = await store.enqueue(specs(2))
    lease = await store.lease("w")
    assert lease.rollout.rollout_id == first.rollout_id
    # cancel both: the leased one (running) and the other (still queued)
    cancelled = await store.cancel([first.rollout_id, second.rollout_id])
    assert [r.status for r in cancelled] == [RolloutStatus.CANCELLED] * 2
    assert await store.lease("w") is None
    assert (await store.heartbeat(lease.attempt.attempt_id)).status is AttemptStatus.CANCELLED
    with pytest.raises(StaleAttemptError):
        await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)


async def test_spans_roundtrip_ordered_and_idempotent(store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    spans = [make_span(lease, i) for i in range(5)]
    spans[2] = make_span(
        lease,
        2,
        seq=spans[2].seq,
        parent_id=spans[0].span_id,
        end_time=123.5,
        attributes={"nested": {"ids": [1, 2, 3], "ok": True}, "text": "héllo ✓"},
        events=[SpanEvent(name="tick", time=1.5, attributes={"k": "v"})],
        status=SpanStatus(code=StatusCode.ERROR, message="boom"),
    )
    assert await store.add_spans(list(reversed(spans))) == 5
    assert await store.add_spans(spans[:3]) == 0
    got = await store.query_spans(lease.rollout.rollout_id)
    assert got == spans  # ordered by seq, every field preserved
    assert await store.query_spans(lease.rollout.rollout_id, lease.attempt.attempt_id) == spans


async def test_spans_of_each_attempt_stay_apart(store):
    await store.enqueue(specs(1, policy=RetryPolicy(max_attempts=2)))
    first = await store.lease("w")
    await store.add_spans([make_span(first, 0)])
    await store.finish(first.attempt.attempt_id, AttemptStatus.INFRA_ERROR)
    second = await store.lease("w")
    await store.add_spans([make_span(second, 1), make_span(second, 2)])
    rid = first.rollout.rollout_id
    assert [s.name for s in await store.query_spans(rid)] == ["span-0", "span-1", "span-2"]
    assert [s.name for s in await store.query_spans(rid, second.attempt.attempt_id)] == ["span-1", "span-2"]


async def test_spans_for_unknown_attempt_are_rejected_and_batch_stores_nothing(store):
    await store.enqueue(specs(1))
    lease = await store.lease("w")
    good = make_span(lease, 0)
    bad = Span(rollout_id=lease.rollout.rollout_id, attempt_id="at-nope", seq=1, name="x")
    with pytest.raises(NotFoundError):
        await store.add_spans([good, bad])
    assert await store.query_spans(lease.rollout.rollout_id) == []
    with pytest.raises(NotFoundError):
        await store.query_spans("ro-nope")


async def test_resources_versions(store):
    assert await store.get_resources() is None
    llm = LLM(endpoint="http://127.0.0.1:9/v1", model="tiny", sampling={"temperature": 0.7})
    v1 = await store.put_resources(Resources(items={"llm": llm}))
    v2 = await store.put_resources(Resources(items={"llm": llm, "prompt": PromptTemplate(template="Q: {q}")}))
    assert (v1.version, v2.version) == (1, 2)
    assert (await store.put_resources(v1)).version == 1  # a retried put is not a new version
    assert (await store.get_resources()).version == 2
    got = await store.get_resources(1)
    assert got.items == {"llm": llm} and got.resources_id == v1.resources_id
    assert isinstance((await store.get_resources(2)).items["prompt"], PromptTemplate)
    with pytest.raises(NotFoundError):
        await store.get_resources(99)
    (rollout,) = await store.enqueue(specs(1))
    assert rollout.resources_version == 2  # unspecified means latest at enqueue time
    (pinned,) = await store.enqueue(specs(1, resources_version=1))
    assert pinned.resources_version == 1


async def test_wait_returns_when_all_finish(store):
    rollouts = await store.enqueue(specs(3))
    ids = [r.rollout_id for r in rollouts]
    assert await store.wait(ids, timeout_s=0.05) == []

    async def work():
        for _ in ids:
            lease = await store.lease("w", wait_s=1)
            await asyncio.sleep(0.02)
            await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)

    worker = asyncio.create_task(work())
    done = await store.wait(ids, timeout_s=10)
    await worker
    assert sorted(r.rollout_id for r in done) == sorted(ids)
    assert all(r.status is RolloutStatus.SUCCEEDED for r in done)


async def test_wait_timeout_returns_finished_subset(store):
    a, b = await store.enqueue(specs(2))
    lease = await store.lease("w")
    await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    done = await store.wait([a.rollout_id, b.rollout_id], timeout_s=0.1)
    assert [r.rollout_id for r in done] == [a.rollout_id]


async def test_a_wait_that_times_out_answers_every_state_and_says_so(store):
    """At its timeout a wait still answers for every listed rollout: the terminal ones (the list, as always), the
    others' current states in ``pending``, and ``timed_out``; a wait that ends because all are done did not."""
    a, b, c = await store.enqueue(specs(3))
    lease = await store.lease("w")
    await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.lease("w")  # b runs, c stays queued
    started = time.monotonic()
    waited = await store.wait([c.rollout_id, a.rollout_id, b.rollout_id], timeout_s=0.3)
    assert 0.25 <= time.monotonic() - started < 10
    assert isinstance(waited, WaitResult) and waited.timed_out
    assert [(r.rollout_id, r.status) for r in waited] == [(a.rollout_id, RolloutStatus.SUCCEEDED)]
    assert [(r.rollout_id, r.status) for r in waited.pending] == [
        (c.rollout_id, RolloutStatus.QUEUED),
        (b.rollout_id, RolloutStatus.RUNNING),
    ]
    finished = await store.wait([a.rollout_id], timeout_s=5)
    assert not finished.timed_out and finished.pending == [] and [r.rollout_id for r in finished] == [a.rollout_id]


async def test_a_wait_on_unknown_ids_is_refused_naming_every_one(store):
    (known,) = await store.enqueue(specs(1))
    started = time.monotonic()
    with pytest.raises(NotFoundError, match="'ro-gone-1', 'ro-gone-2'"):
        await store.wait(["ro-gone-1", known.rollout_id, "ro-gone-2"], timeout_s=30)
    assert time.monotonic() - started < 10  # refused before any waiting


BAD_IDS = ["", "   ", "a\nb", "tab\there", "nul\x00", "x" * (MAX_ID_CHARS + 1)]


def refused(field: str):
    """``pytest.raises`` for `InvalidIdError` whose message starts with the field (every store, HTTP included)."""
    return pytest.raises(InvalidIdError, match=rf"^{re.escape(field)}: must be a non-blank string of at most")


async def test_malformed_ids_are_refused_at_enqueue_naming_the_field_and_nothing_is_stored(store):
    assert (await store.enqueue([RolloutSpec(task=Task(input=1), rollout_id="x" * MAX_ID_CHARS)]))[0].rollout_id
    for bad in BAD_IDS:
        with refused("specs[1].rollout_id"):
            await store.enqueue([*specs(1), RolloutSpec(task=Task(input=1), rollout_id=bad)])
        with refused("specs[0].task.task_id"):
            await store.enqueue([RolloutSpec(task=Task(input=1, task_id=bad))])
    assert sum((await store.counts()).values()) == 1  # a refused batch stored nothing, not even its good spec


async def test_malformed_ids_are_refused_by_every_call_that_takes_one(store):
    from lightrail.store.tokens import mint

    (rollout,) = await store.enqueue(specs(1))
    lease = await store.lease("w")
    rid, aid = rollout.rollout_id, lease.attempt.attempt_id
    for bad in BAD_IDS:
        with refused("worker_id"):
            await store.lease(bad)
        with refused("attempt_id"):
            await store.lease("w", attempt_id=bad)
        with refused("rollout_ids[1]"):
            await store.wait([rid, bad], timeout_s=0)
        with refused("rollout_ids[0]"):
            await store.cancel([bad])
        with refused("rollout_ids[0]"):
            await store.query_rollouts(rollout_ids=[bad])
        with refused("attempt_id"):
            await store.heartbeat(bad)
        with refused("attempt_id"):
            await store.finish(bad, AttemptStatus.SUCCEEDED)
        with refused("rollout_id"):
            await store.get_rollout(bad)
        with refused("rollout_id"):
            await store.query_attempts(bad)
        with refused("rollout_id"):
            await store.query_spans(bad)
        with refused("attempt_id"):
            await store.query_spans(rid, bad)
        for field in ("rollout_id", "attempt_id", "span_id", "trace_id", "parent_id"):
            span = msgspec.structs.replace(make_span(lease, 0), **{field: bad})
            with refused(f"spans[1].{field}"):
                await store.add_spans([make_span(lease, 1), span])
        with refused("resources_id"):
            await store.put_resources(Resources(items={}, resources_id=bad))
        with refused("spec.rollout_id"):
            await store.open_session(RolloutSpec(task=Task(input=1), mode="served", rollout_id=bad), attempt_id="a1")
        with refused("attempt_id"):
            await store.open_session(RolloutSpec(task=Task(input=1), mode="served"), attempt_id=bad)
        _, record = mint("runner", now=1.0)
        with refused("token_id"):
            await store.put_token(msgspec.structs.replace(record, token_id=bad))
        with refused("token_id"):
            await store.get_token(bad)
    assert await store.query_spans(rid) == []  # refused batches stored nothing
    assert (await store.heartbeat(aid)).status is AttemptStatus.RUNNING
    assert await store.get_resources() is None and await store.list_tokens() == []
    assert [r.rollout_id for r in await store.query_rollouts()] == [rid]  # no session was opened


async def test_queries_and_counts(store):
    rollouts = await store.enqueue(specs(4, mode="val"))
    lease = await store.lease("w")
    await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    await store.lease("w")
    counts = await store.counts()
    assert counts[RolloutStatus.SUCCEEDED] == 1 and counts[RolloutStatus.RUNNING] == 1
    assert counts[RolloutStatus.QUEUED] == 2 and sum(counts.values()) == 4
    queued = await store.query_rollouts(status=[RolloutStatus.QUEUED])
    assert sorted(r.rollout_id for r in queued) == sorted(r.rollout_id for r in rollouts[2:])
    picked = await store.query_rollouts(rollout_ids=[rollouts[0].rollout_id])
    assert picked[0].mode == "val" and picked[0].task.input == {"q": 0}
    with pytest.raises(NotFoundError):
        await store.get_rollout("ro-missing")
    with pytest.raises(NotFoundError):
        await store.heartbeat("at-missing")


async def test_rollouts_page_newest_first_filtered_with_a_cursor(store):
    """A page reads only what it shows: newest first, filters combined, ``total`` over every match, and
    ``next_before`` leads through the older pages without repeats or gaps, also while new rollouts arrive."""
    mine = await store.enqueue(
        [
            RolloutSpec(
                task=Task(input={"q": i}),
                mode="val" if i % 3 == 0 else "train",
                metadata={"run": "a" if i < 8 else "b", "n": i},
            )
            for i in range(12)
        ]  # fmt: skip
    )
    for _ in range(2):  # the two oldest succeed
        lease = await store.lease("w")
        await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
    ids = [r.rollout_id for r in mine]

    first = await store.query_rollouts_page(limit=5)
    assert [r.rollout_id for r in first.rollouts] == ids[::-1][:5] and first.total == 12
    seen, page = [], first
    while True:
        seen += [r.rollout_id for r in page.rollouts]
        if page.next_before is None:
            break
        if len(seen) == 5:  # a rollout enqueued between pages is newer than the cursor: not in the older pages
            await store.enqueue(specs(1))
        page = await store.query_rollouts_page(limit=5, before=page.next_before)
    assert seen == ids[::-1]

    offset = await store.query_rollouts_page(limit=2, offset=3, metadata={"run": "a"})
    assert [r.rollout_id for r in offset.rollouts] == [ids[4], ids[3]] and offset.total == 8
    val_a = await store.query_rollouts_page(mode="val", metadata={"run": "a"})
    assert [r.rollout_id for r in val_a.rollouts] == [ids[6], ids[3], ids[0]] and val_a.next_before is None
    done = await store.query_rollouts_page(status=[RolloutStatus.SUCCEEDED])
    assert [r.rollout_id for r in done.rollouts] == [ids[1], ids[0]] and done.rollouts[0].reward == 1.0
    queued_b = await store.query_rollouts_page(
        status=[RolloutStatus.QUEUED, RolloutStatus.RUNNING], metadata={"run": "b"}
    )
    assert queued_b.total == 4
    nothing = await store.query_rollouts_page(metadata={"run": "c"})
    assert nothing.rollouts == [] and nothing.total == 0 and nothing.next_before is None
    for bad in ({"limit": 0}, {"limit": 1001}, {"offset": -1}, {"before": 0}, {"metadata": {"a'b": "x"}}):
        with pytest.raises(ValueError):
            await store.query_rollouts_page(**bad)


async def test_cancel_with_an_unknown_id_cancels_nothing(store):
    (rollout,) = await store.enqueue(specs(1))
    with pytest.raises(NotFoundError):
        await store.cancel([rollout.rollout_id, "ro-unknown"])
    assert (await store.get_rollout(rollout.rollout_id)).status is RolloutStatus.QUEUED


async def test_scoped_tokens_are_stored_by_id_and_replaced_on_revocation(store):
    """Records go in by ``token_id`` (a second put replaces: how revocation is stored), come back whole, and list
    oldest first; the store never sees a secret."""
    from lightrail.store.tokens import mint

    assert await store.list_tokens() == [] and await store.get_token("000000000000") is None
    (bearer, runner), (_, ingest) = mint("runner", now=1.0), mint("ingest", attempts=["at-2", "at-1"], now=2.0)
    for record in (ingest, runner):
        await store.put_token(record)
    assert await store.get_token(runner.token_id) == runner and runner.valid(bearer.split("_", 2)[2], now=3.0)
    revoked = msgspec.structs.replace(runner, revoked_at=5.0)
    await store.put_token(revoked)
    assert await store.list_tokens() == [revoked, ingest]
    assert (await store.get_token(ingest.token_id)).attempts == ["at-1", "at-2"]
