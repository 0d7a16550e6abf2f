"""The dashboard's page handlers: read the store (`views`), render a template. Each is ``handler(request, store,
render)``; `lightrail.dashboard.app` wraps them with sign-in and turns NotFoundError into a 404 page and ValueError
(a bad query parameter) into a 400 page."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from lightrail.dashboard import views
from lightrail.inspection.report import may_have_failed
from lightrail.inspection.runs import (
    Run,
    derive_runs,
    failure_digest,
    last_error,
    rollout_details,
    rollouts_page,
    run_tag,
    training_stop,
)
from lightrail.store.base import MAX_PAGE, NotFoundError, Store

Render = Any

PAGE = 50
RESOURCE_PAGE = 20
SLOW_LIVE_MS = 15_000
"""How often an open tab refreshes the pages that read every rollout (runs, a run, the failure digest)."""


def _int(request: Request, name: str, default: int, *, low: int = 0, high: int = 2**62) -> int:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(raw) if len(raw) <= 30 else None
    except ValueError:
        value = None
    if value is None:
        raise ValueError(f"{name} must be a whole number, got {raw[:40]!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value


_RUNS_TTL_S = 5.0
_runs_cache: list[tuple[Store, float, list[Run]]] = []


async def _runs(store: Store) -> list[Run]:
    """The store's runs, newest first. Deriving them reads every rollout (0.7 s at 100,000), so pages share one
    result for a few seconds (an open tab polls), and the grouping runs off the event loop the store serves on."""
    if _runs_cache and _runs_cache[0][0] is store and time.monotonic() - _runs_cache[0][1] < _RUNS_TTL_S:
        return _runs_cache[0][2]
    rollouts = await store.query_rollouts()
    runs = (await asyncio.to_thread(derive_runs, rollouts))[::-1]
    _runs_cache[:] = [(store, time.monotonic(), runs)]  # the newest store's only (one store per app)
    return runs


async def runs(request: Request, store: Store, render: Render) -> Response:
    all_runs = await _runs(store)
    return render(request, "runs.html", title="Runs", runs=all_runs, counts=await store.counts(),
                  live_period_ms=SLOW_LIVE_MS)  # fmt: skip


async def run(request: Request, store: Store, render: Render) -> Response:
    key = request.path_params["run"]
    all_runs = await _runs(store)
    chosen = views.find_run(all_runs, key)
    if chosen is None:
        raise NotFoundError(f"no run {key!r} in this store")
    charts = await asyncio.to_thread(views.run_charts, chosen, views.metrics_file(chosen))
    newest = chosen.rollouts[-10:][::-1]
    return render(request, "run.html", title=f"Run {chosen.number}", run=chosen, charts=charts, newest=newest,
                  has_metrics=views.metrics_file(chosen) is not None, run_key=chosen.tag or str(chosen.number),
                  live_period_ms=SLOW_LIVE_MS)  # fmt: skip


async def rollouts(request: Request, store: Store, render: Render) -> Response:
    q = request.query_params
    search = q.get("q", "").strip()
    if search:  # a rollout id: open it
        try:
            await store.get_rollout(search)
        except NotFoundError:
            pass
        else:
            return RedirectResponse(f"{request.url.path}/{quote(search, safe='')}", 303)
    status = views.parse_statuses(q.getlist("status"))
    mode = q.get("mode") or None
    run_key = q.get("run") or None
    limit = _int(request, "limit", PAGE, low=1, high=MAX_PAGE)
    offset = _int(request, "offset", 0)
    page, total = await rollouts_page(store, status=status, mode=mode, run=run_key, limit=limit, offset=offset)
    errors: dict[str, str] = {}
    failed = [r for r in page if may_have_failed(r)]
    for r, attempts in zip(failed, await asyncio.gather(*(store.query_attempts(r.rollout_id) for r in failed)),
                           strict=True):  # fmt: skip
        errors[r.rollout_id] = last_error(attempts)

    def link(**change: Any) -> str:
        params = [(k, v) for k, v in q.multi_items() if k not in change and k != "q"]
        params += [(k, str(v)) for k, v in change.items() if v is not None]
        return f"{request.url.path}?{urlencode(params)}"

    return render(
        request, "rollouts.html", title="Rollouts", rollouts=page, total=total, offset=offset, limit=limit,
        status=[s.value for s in status or ()], mode=mode or "", run_key=run_key or "", search=search,
        missing=search, errors=errors, duration=views.duration,
        prev_link=link(offset=max(offset - limit, 0)) if offset else None,
        next_link=link(offset=offset + limit) if offset + limit < total else None,
    )  # fmt: skip


async def rollout(request: Request, store: Store, render: Render, decode: views.Decode | None = None) -> Response:
    rollout_id = request.path_params["rollout_id"]
    index = _int(request, "attempt", 0, low=1) if request.query_params.get("attempt") else None
    try:
        details = await rollout_details(store, rollout_id, index)
    except NotFoundError:  # no such rollout
        raise
    except LookupError as exc:  # no attempt with that index
        raise NotFoundError(str(exc)) from None
    chosen, attempts, attempt, spans = details.rollout, details.attempts, details.attempt, details.spans
    # with a tokenizer, off the loop: the first page loads it, and decoding is per token
    calls = await asyncio.to_thread(views.call_views, spans, decode) if decode else views.call_views(spans)
    return render(
        request, "rollout.html", title=f"Rollout {rollout_id}", rollout=chosen, attempts=attempts, attempt=attempt,
        spans=spans, rows=views.timeline(spans), calls=calls, rewards=views.rewards(spans),
        duration=views.duration(chosen), run_tag=run_tag(chosen),
    )  # fmt: skip


async def resources(request: Request, store: Store, render: Render) -> Response:
    latest = await store.get_resources()
    newest = latest.version if latest is not None else 0
    before = _int(request, "before", newest + 1, low=1)
    top = min(before - 1, newest)
    numbers = list(range(top, max(top - RESOURCE_PAGE, 0), -1))
    wanted = sorted({n for n in numbers} | {n - 1 for n in numbers if n > 1}, reverse=True)
    loaded = dict(zip(wanted, await asyncio.gather(*(store.get_resources(n) for n in wanted)), strict=True))
    versions = [
        (loaded[n], views.resource_items(loaded[n], loaded.get(n - 1)))  # type: ignore[arg-type]
        for n in numbers
        if loaded.get(n) is not None
    ]
    older = numbers[-1] if numbers and numbers[-1] > 1 else None
    return render(request, "resources.html", title="Resources", versions=versions, older=older, newest=newest)


async def failures(request: Request, store: Store, render: Render) -> Response:
    run_key = request.query_params.get("run") or None
    limit = _int(request, "limit", 500, low=1, high=10_000)
    minutes = _int(request, "minutes", 0, low=0, high=10**8)
    since = time.time() - 60 * minutes if minutes else None
    try:
        groups, read, candidates = await failure_digest(store, run=run_key, limit=limit, since=since)
    except LookupError as exc:
        raise NotFoundError(str(exc)) from None
    chosen = views.find_run(await _runs(store), run_key) if run_key else None
    stopped = await asyncio.to_thread(training_stop, chosen) if chosen is not None else None
    return render(request, "failures.html", title="Failures", groups=groups, read=read, candidates=candidates,
                  stopped=stopped,
                  run_key=run_key or "", limit=limit, minutes=minutes or "", live_period_ms=SLOW_LIVE_MS)  # fmt: skip
