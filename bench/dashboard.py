"""The dashboard on a big store: the rollouts page, one rollout's page, and the first paint in headless Chromium.

The store is filled as `bench/inspection.py` fills it (100,000 rollouts in 10 tagged runs; 30,000 attempts, a tenth
failed; 2,000,000 LLM-call spans, a few attempts with exactly 50), served by a `lightrail store serve` process,
whose ``/ui`` pages read it in-process. Measured over HTTP (medians):

* ``rollouts_page_ms_p50``: ``GET /ui/rollouts?status=failed``: the first 50 failed rollouts, newest first, with
  the total and each one's last error, rendered; next to it, in the same run, the JSON API's page of the same
  rollouts (``api_page_ms_p50``, what the HTML costs on top) and reading every failed rollout
  (``full_read_ms_p50``, what a dashboard that loaded everything and paged in the browser would pay first);
* ``rollout_detail_ms_p50``: ``GET /ui/rollouts/ID`` of a rollout with 50 spans (attempts, timeline, calls),
  next to the API's three reads of the same (``api_detail_ms_p50``);
* ``first_paint_ms``: headless Chromium (Debian's, through Playwright) opens the failed-rollouts page, signed in:
  the first contentful paint from navigation start (median of 10 fresh page loads); ``runs_page_ms`` is the runs
  page, which derives runs from every rollout (reported, no target).

    .venv/bin/python bench/dashboard.py            # 100,000 rollouts, 2,000,000 spans (~4 min to fill)
    .venv/bin/python bench/dashboard.py --quick    # 10,000 rollouts, 200,000 spans
    .venv/bin/python bench/dashboard.py --smoke    # 2,000 rollouts, 3 requests; the first paint only with Chromium

Targets (issue 15): page ≤ 100 ms, detail ≤ 50 ms, first paint ≤ 1,500 ms. Progress goes to stderr; one JSON object
is the last line of stdout.
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

import httpx  # noqa: E402

from bench._util import SMOKE_HELP, ServerProcess, log, machine_facts  # noqa: E402
from bench.inspection import fill  # noqa: E402

TOKEN = "dashboard-bench"
CHROMIUM = "/usr/bin/chromium"
KEYS = ("rollouts_page_ms_p50", "api_page_ms_p50", "full_read_ms_p50", "rollout_detail_ms_p50", "api_detail_ms_p50",
        "runs_page_ms", "fill_s", "targets_met")  # fmt: skip
NEEDS = {"chromium": ("first_paint_ms", "first_paint_ms_max")}


def timed(work, reps: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1000, 2), result


def measure_http(url: str, fifty: list[str], reps: int) -> dict:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as http:
        http.get("/health")

        def page() -> httpx.Response:
            answer = http.get("/ui/rollouts", params={"status": "failed"})
            assert answer.status_code == 200, answer.status_code
            return answer

        page_ms, html = timed(page, reps)
        shown = html.text.count('<td><a href="/ui/rollouts/')
        assert shown == 50, shown
        api_ms, _ = timed(lambda: http.post("/v1/rollouts/page", json={"status": ["failed"], "limit": 50}), reps)
        full_ms, _ = timed(lambda: http.post("/v1/rollouts/query", json={"status": ["failed"]}), max(reps // 5, 3))

        picks = iter(fifty * reps)

        def detail() -> httpx.Response:
            answer = http.get(f"/ui/rollouts/{next(picks)}")
            assert answer.status_code == 200 and answer.text.count('<li class="span') == 50
            return answer

        detail_ms, _ = timed(detail, reps)
        picks = iter(fifty * reps)

        def api_detail() -> None:
            rollout_id = next(picks)
            http.get(f"/v1/rollouts/{rollout_id}")
            http.get(f"/v1/rollouts/{rollout_id}/attempts")
            spans = http.get(f"/v1/rollouts/{rollout_id}/spans")
            assert spans.status_code == 200 and len(spans.json()["spans"]) == 50

        api_detail_ms, _ = timed(api_detail, reps)
        runs_ms, _ = timed(lambda: http.get("/ui/"), 3)
    return {
        "rollouts_page_ms_p50": page_ms,
        "api_page_ms_p50": api_ms,
        "full_read_ms_p50": full_ms,
        "page_speedup_vs_full_read": round(full_ms / page_ms, 1),
        "rollout_detail_ms_p50": detail_ms,
        "api_detail_ms_p50": api_detail_ms,
        "runs_page_ms": runs_ms,
    }


def measure_paint(url: str, loads: int) -> dict:
    from playwright.sync_api import sync_playwright

    paints = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        try:
            for _ in range(loads + 1):  # the first load warms the server's template cache and the browser
                context = browser.new_context()
                context.set_extra_http_headers({"Authorization": f"Bearer {TOKEN}"})
                page = context.new_page()
                page.goto(f"{url}/ui/rollouts?status=failed", wait_until="load")
                paint = page.evaluate(
                    "() => new Promise(done => { const find = () => { const p = performance"
                    ".getEntriesByName('first-contentful-paint')[0]; p ? done(p.startTime) : setTimeout(find, 10); };"
                    " find(); })"
                )
                paints.append(float(paint))
                context.close()
        finally:
            browser.close()
    return {"first_paint_ms": round(statistics.median(paints[1:]), 1), "first_paint_ms_max": round(max(paints[1:]), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 rollouts and 200,000 spans")
    parser.add_argument("--reps", type=int, default=30, help="requests per measurement (median kept)")
    parser.add_argument("--loads", type=int, default=10, help="page loads for the first paint (median kept)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the first paint only with Chromium)")
    args = parser.parse_args()
    rollouts, spans = (2_000, 3_000) if args.smoke else (10_000, 200_000) if args.quick else (100_000, 2_000_000)
    if args.smoke:
        args.reps, args.loads = 3, 2
    out: dict = {"quick": args.quick, **machine_facts(), "rollouts": rollouts, "spans": spans}
    log(f"machine: {out}")
    work = Path(tempfile.mkdtemp(prefix="lightrail-dashboard-"))
    db = work / "store.db"
    t0 = time.perf_counter()
    fifty = asyncio.run(fill(db, rollouts, spans))
    out["fill_s"] = round(time.perf_counter() - t0, 1)
    server = ServerProcess(db, token=TOKEN).start()
    try:
        out.update(measure_http(server.url, fifty, args.reps))
        log(f"http: {out}")
        if args.smoke and not Path(CHROMIUM).is_file():
            log(f"first paint left out: no Chromium at {CHROMIUM}")
        else:
            out.update(measure_paint(server.url, args.loads))
    finally:
        server.stop()
        shutil.rmtree(work)  # gigabytes at full size
    out["load_1m_after"] = machine_facts()["load_1m"]
    out["targets_met"] = {
        "rollouts_page_ms_p50<=100": out["rollouts_page_ms_p50"] <= 100,
        "rollout_detail_ms_p50<=50": out["rollout_detail_ms_p50"] <= 50,
        **({"first_paint_ms<=1500": out["first_paint_ms"] <= 1500} if "first_paint_ms" in out else {}),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
