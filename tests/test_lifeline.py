"""Children started by lightrail do not outlive a parent killed hard: the store server a Trainer starts and the
runner processes of `run_runners` stop by themselves (real processes, a real ``kill -9``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

PARENT = textwrap.dedent(
    """
    import sys, time
    from lightrail.agent.processes import run_runners
    from lightrail.trainer.trainer import StoreServerProcess

    server = StoreServerProcess(sys.argv[1])
    runners = run_runners(server.url, "lightrail.tracing:emit_event", 2, 1, server.token)
    print(server.process.pid, *runners.pids, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie waiting for its reaper counts as gone
        return f.read().split(")")[-1].split()[0] != "Z"


def test_store_server_and_runners_stop_when_their_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "store.db")], stdout=subprocess.PIPE)
    try:
        children = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(children) == 3 and all(_alive(pid) for pid in children)
        time.sleep(1.0)  # runners up and leasing
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [pid for pid in children if _alive(pid)] == []
    finally:
        parent.kill()
        for pid in children if "children" in locals() else ():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
