"""The one retry schedule (`lightrail._retry.Retry`): full jitter under an exponential cap, a budget in tries and
in time (a fake clock: no test waits), and the store client spending exactly its budget against a real port where
nothing listens."""

from __future__ import annotations

import random

import pytest

from lightrail._retry import Retry
from lightrail.store import StoreUnavailableError, SyncStoreClient
from tests._served import free_port


def test_waits_are_jittered_under_a_doubling_cap():
    retry = Retry(tries=None, base_s=0.1, cap_s=1.0)
    runs = [list(zip(range(8), retry.delays(rng=random.Random(seed)), strict=False)) for seed in range(200)]
    for n in range(8):
        cap = min(1.0, 0.1 * 2**n)
        waits = [run[n][1] for run in runs]
        assert all(0.0 <= w <= cap for w in waits)  # full jitter: anywhere from 0 to the cap
        assert max(waits) > 0.8 * cap and min(waits) < 0.2 * cap  # spread over the window, not in lockstep
    assert len({run[5][1] for run in runs}) == 200  # no two clients wait alike


def test_the_budget_in_tries_counts_the_first_try():
    assert len(list(Retry(tries=4).delays())) == 3
    assert list(Retry(tries=1).delays()) == []
    with pytest.raises(ValueError, match="tries"):
        Retry(tries=0)


def test_the_budget_in_time_stops_before_a_wait_would_overrun_it():
    now = [100.0]

    def clock() -> float:
        return now[0]

    delays = Retry(tries=None, budget_s=1.0, base_s=0.3, cap_s=0.3).delays(rng=random.Random(0), clock=clock)
    spent = 0.0
    for delay in delays:  # the caller sleeps each wait: here the fake clock moves instead
        spent += delay
        now[0] += delay
        assert spent <= 1.0
    assert spent > 0.7  # it used the budget: the next 0..0.3 s wait would have gone past 1 s


def test_the_store_client_gives_up_after_its_tries():
    """No server on the port: the client makes exactly ``retries + 1`` tries, then says so."""
    url = f"http://127.0.0.1:{free_port()}"
    client = SyncStoreClient(url, retries=3, backoff_s=0.01, max_backoff_s=0.04)
    with client, pytest.raises(StoreUnavailableError, match=r"after 4 tries: .*ConnectError"):
        client.counts()
