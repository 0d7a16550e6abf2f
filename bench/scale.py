"""Scale-out benchmark: the store and runners across processes and machines (PostgreSQL, Ray, remote runners).

Each part lives in its own module and is runnable alone; this script runs them in one go and prints one JSON
object as the last line of stdout (progress on stderr):

* ``bench/_scale_pg.py``: the store workload of ``bench/store.py`` over HTTP with 8 client workers against two
  store server processes sharing one PostgreSQL database (``pg_http_spans_per_s_c8``), next to the same workload
  against one server on SQLite in the same run (``sqlite_http_spans_per_s_c8``; target ratio >= 0.4), and rollouts
  leased twice under 8 concurrent lessees split across the servers (``pg_lease_duplicates``, target 0).
* ``bench/_scale_ray.py``: >= 64 rollouts on a two-node Ray cluster on this machine, one node stopped mid-run
  (``ray_rollouts_finished == ray_rollouts_total``, ``ray_rollouts_lost == 0``).
* ``bench/_scale_remote.py``: enqueue -> a ``lightrail runner`` started by hand with only a URL and a token has the
  lease (``remote_runner_pickup_ms_p50``, target < 50), next to an in-process client's pickup.

    .venv/bin/python bench/scale.py --quick     # < 3 minutes
    .venv/bin/python bench/scale.py             # larger workloads
    .venv/bin/python bench/scale.py --only pg   # one part (pg | ray | remote)
    .venv/bin/python bench/scale.py --smoke     # tiny workloads; PostgreSQL and Ray parts only where installed
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import run_parts  # noqa: E402

PARTS = {"pg": "bench._scale_pg", "ray": "bench._scale_ray", "remote": "bench._scale_remote"}
KEYS = ("remote_runner_pickup_ms_p50", "client_pickup_ms_p50", "remote_bench_s", "bench_s", "targets_met")
NEEDS = {
    "postgres": ("pg_http_spans_per_s_c8", "sqlite_http_spans_per_s_c8", "pg_lease_duplicates", "pg_bench_s"),
    "ray": ("ray_rollouts_total", "ray_rollouts_finished", "ray_rollouts_lost", "ray_bench_s"),
}


def targets(out: dict) -> dict[str, bool]:
    met = {}
    if "pg_http_spans_per_s_c8" in out:
        met["pg_c8>=0.4*sqlite_c8"] = out["pg_http_spans_per_s_c8"] >= 0.4 * out["sqlite_http_spans_per_s_c8"]
        met["pg_lease_duplicates==0"] = out["pg_lease_duplicates"] == 0
    if "ray_rollouts_total" in out:
        met["ray_total>=64"] = out["ray_rollouts_total"] >= 64
        met["ray_finished==total"] = out["ray_rollouts_finished"] == out["ray_rollouts_total"]
        met["ray_lost==0"] = out["ray_rollouts_lost"] == 0
    if "remote_runner_pickup_ms_p50" in out:
        met["remote_pickup_p50<50ms"] = out["remote_runner_pickup_ms_p50"] < 50
    return met


if __name__ == "__main__":
    run_parts(__doc__, PARTS, targets, needs={"pg": "postgres", "ray": "ray"})
