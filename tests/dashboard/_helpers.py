"""Constants and the store reader the dashboard tests share (fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from lightrail.store.sqlite import SQLiteStore

ADMIN_TOKEN = "dashboard-admin-token"
CHROMIUM = "/usr/bin/chromium"
XSS = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">1+1"
TRAIN = [{"question": "1+1"}, {"question": "2+2"}]
VAL = [{"question": "3+3"}, {"question": "4+4", "fail": 7}, {"question": XSS}, {"question": "6+6", "fail": 9}]


def read_store(path: Path, reader):
    """``await reader(store)`` on the SQLite store at ``path``, on a thread of its own (Playwright's sync API keeps
    an event loop running on the test's thread)."""

    async def run():
        store = SQLiteStore(path)
        try:
            return await reader(store)
        finally:
            await store.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()
