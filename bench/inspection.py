"""Reading a big store as `lightrail rollouts` / `lightrail show` (and a dashboard) do: a page of rollouts and one
rollout's detail, over HTTP from a `lightrail store serve` process on SQLite.

The store is filled through the store API first (100,000 rollouts in 10 tagged runs, train and val; 30,000 of them
leased and finished, a tenth failed; 2,000,000 spans over those attempts, a few rollouts with exactly 50), then:

* ``rollouts_page_ms_p50``: the first page (50) of failed rollouts, newest first, filtered by the store
  (`Store.query_rollouts_page`), with the total; the baseline ``full_read_page_ms_p50`` is what `rollouts_page` did
  before the store could page: every failed rollout read, then sliced (same run, same server);
* ``unfiltered_page_ms_p50``: the newest 50 of all, against reading all 100,000 and slicing
  (``unfiltered_full_read_ms_p50``, what ``lightrail rollouts`` without filters did);
* ``tagged_page_ms_p50``: a run's val rollouts (metadata and mode filters), first page;
* ``deep_page_ms_p50``: the 20th page through the ``next_before`` cursor;
* ``rollout_detail_ms_p50``: one rollout with 50 spans: the rollout, its attempts, its spans.

    .venv/bin/python bench/inspection.py            # 100,000 rollouts, 2,000,000 spans
    .venv/bin/python bench/inspection.py --quick    # 10,000 rollouts, 200,000 spans
    .venv/bin/python bench/inspection.py --smoke    # 2,000 rollouts, 3,000 spans, 3 requests per figure

Targets (issue 15's numbers for these reads): first page ≤ 100 ms, detail ≤ 50 ms. Progress goes to stderr; one JSON
object is the last line of stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ when run from a checkout

from bench._util import SMOKE_HELP, ServerProcess, llm_call_span, log, machine_facts  # noqa: E402
from lightrail.store import SQLiteStore, StoreClient  # noqa: E402
from lightrail.types import AttemptStatus, ErrorInfo, RolloutSpec, RolloutStatus, Task  # noqa: E402

KEYS = ("rollouts_page_ms_p50", "full_read_page_ms_p50", "unfiltered_page_ms_p50", "unfiltered_full_read_ms_p50",
        "tagged_page_ms_p50", "deep_page_ms_p50", "rollout_detail_ms_p50", "fill_s", "targets_met")  # fmt: skip
TOKEN = "inspection-bench"
RUNS = 10


async def fill(db: Path, rollouts: int, spans: int) -> list[str]:
    """Fill the store through its API; returns rollouts whose (only) attempt holds exactly 50 spans."""
    store = SQLiteStore(db)
    t0 = time.perf_counter()
    per_run = rollouts // RUNS
    for start in range(0, rollouts, 1000):
        await store.enqueue(
            [
                RolloutSpec(
                    task=Task(input={"q": i, "text": "how many apples " * 4}),
                    mode="val" if i % 5 == 0 else "train",
                    metadata={"run": f"runs/exp-{i // per_run}"},
                )
                for i in range(start, min(start + 1000, rollouts))
            ]  # fmt: skip
        )
    log(f"{rollouts} rollouts enqueued in {time.perf_counter() - t0:.0f} s")
    finished = rollouts * 3 // 10
    attempts = []
    for i in range(finished):
        lease = await store.lease("bench")
        assert lease is not None
        if i % 10 == 0:
            error = ErrorInfo(type="ValueError", message="no answer in the reply")
            await store.finish(lease.attempt.attempt_id, AttemptStatus.FAILED, error=error)
        else:
            await store.finish(lease.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
        attempts.append((lease.rollout.rollout_id, lease.attempt.attempt_id))
    log(f"{finished} attempts finished in {time.perf_counter() - t0:.0f} s")
    per_attempt = spans // finished
    fifty = [rollout_id for rollout_id, _ in attempts[:20]]
    batch = []
    written = 0
    for k, (rollout_id, attempt_id) in enumerate(attempts):
        n = 50 if k < 20 else per_attempt
        batch += [llm_call_span(rollout_id, attempt_id, seq, seq) for seq in range(n)]
        if len(batch) >= 5000 or k == len(attempts) - 1:
            written += await store.add_spans(batch)
            batch = []
    log(f"{written} spans written in {time.perf_counter() - t0:.0f} s")
    await store.close()
    return fifty


async def timed(work, reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = await work()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 2), result


async def measure(url: str, fifty: list[str], reps: int) -> dict:
    client = StoreClient(url, token=TOKEN)
    failed = [RolloutStatus.FAILED]
    try:
        await client.counts()  # connection open
        page_ms, page = await timed(lambda: client.query_rollouts_page(status=failed, limit=50), reps)

        async def full_read() -> list:
            return (await client.query_rollouts(status=failed))[::-1][:50]

        full_ms, sliced = await timed(full_read, max(reps // 5, 3))
        assert [r.rollout_id for r in page.rollouts] == [r.rollout_id for r in sliced]  # same answer

        all_ms, first_all = await timed(lambda: client.query_rollouts_page(limit=50), reps)

        async def full_read_all() -> list:
            return (await client.query_rollouts())[::-1][:50]

        all_full_ms, sliced_all = await timed(full_read_all, 3)
        assert [r.rollout_id for r in first_all.rollouts] == [r.rollout_id for r in sliced_all]

        async def tagged():
            return await client.query_rollouts_page(mode="val", metadata={"run": "runs/exp-3"}, limit=50)

        tagged_ms, tagged_page = await timed(tagged, reps)
        assert tagged_page.rollouts and all(r.mode == "val" for r in tagged_page.rollouts)

        cursors = [None]
        for _ in range(19):
            cursors.append((await client.query_rollouts_page(limit=50, before=cursors[-1])).next_before)
        deep_ms, _ = await timed(lambda: client.query_rollouts_page(limit=50, before=cursors[-1]), reps)

        picks = iter(fifty * reps)

        async def detail():
            rollout_id = next(picks)
            rollout = await client.get_rollout(rollout_id)
            attempts = await client.query_attempts(rollout_id)
            spans = await client.query_spans(rollout_id)
            assert len(spans) == 50, len(spans)
            return rollout, attempts, spans

        detail_ms, _ = await timed(detail, reps)
    finally:
        await client.close()
    return {
        "rollouts_page_ms_p50": page_ms,
        "failed_total": page.total,
        "full_read_page_ms_p50": full_ms,
        "page_speedup_vs_full_read": round(full_ms / page_ms, 1),
        "unfiltered_page_ms_p50": all_ms,
        "unfiltered_full_read_ms_p50": all_full_ms,
        "unfiltered_speedup_vs_full_read": round(all_full_ms / all_ms, 1),
        "tagged_page_ms_p50": tagged_ms,
        "deep_page_ms_p50": deep_ms,
        "rollout_detail_ms_p50": detail_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 rollouts and 200,000 spans")
    parser.add_argument("--reps", type=int, default=50, help="requests per measurement (median kept)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    rollouts, spans = (2_000, 3_000) if args.smoke else (10_000, 200_000) if args.quick else (100_000, 2_000_000)
    args.reps = 3 if args.smoke else args.reps
    out: dict = {"quick": args.quick, **machine_facts(), "rollouts": rollouts, "spans": spans}
    log(f"machine: {out}")
    work = Path(tempfile.mkdtemp(prefix="lightrail-inspection-"))
    db = work / "store.db"
    t0 = time.perf_counter()
    fifty = asyncio.run(fill(db, rollouts, spans))
    out["fill_s"] = round(time.perf_counter() - t0, 1)
    out["db_mb"] = round(db.stat().st_size / 1e6, 1)
    server = ServerProcess(db, token=TOKEN).start()
    try:
        out.update(asyncio.run(measure(server.url, fifty, args.reps)))
    finally:
        server.stop()
        shutil.rmtree(work)  # gigabytes at full size
    out["targets_met"] = {
        "rollouts_page_ms_p50<=100": out["rollouts_page_ms_p50"] <= 100,
        "rollout_detail_ms_p50<=50": out["rollout_detail_ms_p50"] <= 50,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
