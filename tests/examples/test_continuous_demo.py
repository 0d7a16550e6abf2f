"""The continuous-learning demo end to end (slow: ~12 minutes on 2 cores): a store server, `gateway serve
--policies --record`, `lightrail learn` and simulated users as real processes and threads. Nothing is lost on the
way: every served session answered, every feedback stored, promotions swapped in, every recorded call versioned
consistently. Whether served success rises enough is bench/continuous.py's figure, not asserted here."""

from __future__ import annotations

import pytest

from bench.continuous import misversioned
from examples.continuous.demo import ContinuousSettings, run


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_quick_continuous_demo_serves_learns_and_swaps_without_losing_anything(tmp_path):
    from lightrail.engine.promotions import PolicyRegistry

    settings = ContinuousSettings.quick(out=tmp_path / "continuous")
    report = run(settings)
    assert report["served_sessions"] > 100 and report["failed_requests"] == 0, report["errors"]
    assert report["feedback_sent"] == report["served_sessions"] and not report["feedback_errors"]
    assert report["rounds"] >= 2, report  # learn rounds ran as feedback accumulated (promoted or not: the gate says)
    promoted = {p.version for p in PolicyRegistry(settings.out / "policies").history()}
    bad, calls = misversioned(settings.out / "served.db", promoted)
    assert calls >= report["served_sessions"] and bad == 0
    assert (settings.out / "served_success.png").stat().st_size > 0
