"""Fuzz both servers from their OpenAPI documents (``tests/_fuzz.py``): the store server on SQLite and the gateway
over the scripted backend, each a real server on 127.0.0.1 with a token; positive and schema-breaking cases for
every operation.

    .venv/bin/python bench/fuzz.py                 # 50 cases per operation and mode
    .venv/bin/python bench/fuzz.py --examples 200
    .venv/bin/python bench/fuzz.py --smoke          # 2 cases per operation and mode

Progress and the first failures go to stderr; one JSON object is the last line of stdout: ``fuzz_cases`` (target
>= 2,000 across both servers), ``fuzz_5xx`` (target 0), ``fuzz_unexplained_4xx`` (4xx without a reason, or a
blanked id accepted; target 0), ``fuzz_id_refusals`` (valid requests with their ids blanked, each refused with a 4xx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402
from tests._fuzz import FuzzResult, fuzz  # noqa: E402

TOKEN = {"authorization": "Bearer fuzz"}
KEYS = ("store_cases", "gateway_cases", "fuzz_cases", "fuzz_5xx", "fuzz_unexplained_4xx", "targets_met")


def fuzz_store(examples: int) -> FuzzResult:
    from lightrail.store.server import serve_in_thread

    server = serve_in_thread(Path(tempfile.mkdtemp()) / "store.db", token="fuzz")
    try:
        return fuzz(f"{server.url}/openapi.json", TOKEN, examples=examples)
    finally:
        server.stop()


async def fuzz_gateway(examples: int) -> FuzzResult:
    from lightrail.gateway import GatewayServer, ScriptedBackend
    from lightrail.store import MemoryStore

    gateway = await GatewayServer(ScriptedBackend(), MemoryStore(), token="fuzz").start()
    try:
        root = gateway.url.removesuffix("/").removesuffix("/v1")
        return await asyncio.to_thread(fuzz, f"{root}/openapi.json", TOKEN, examples=examples)
    finally:
        await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=50, help="cases per operation and mode (default: 50)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.examples = 2
    out: dict = {"examples": args.examples, **machine_facts()}
    log(f"machine: {out}")
    started = time.monotonic()
    results = {"store": fuzz_store(args.examples), "gateway": asyncio.run(fuzz_gateway(args.examples))}
    for name, result in results.items():
        log(f"{name}: {result.cases} cases, by status {dict(sorted(result.by_status.items()))}")
        for line in result.failures[:10]:
            log(f"  {line}")
        out[f"{name}_cases"] = result.cases
        out[f"{name}_by_status"] = {str(k): v for k, v in sorted(result.by_status.items())}
    out["fuzz_cases"] = sum(r.cases for r in results.values())
    out["fuzz_5xx"] = sum(r.server_errors for r in results.values())
    out["fuzz_unexplained_4xx"] = sum(len(r.failures) for r in results.values()) - out["fuzz_5xx"]
    out["fuzz_id_refusals"] = sum(r.id_refusals for r in results.values())  # blanked ids, each refused with a 4xx
    out["minutes"] = round((time.monotonic() - started) / 60, 2)
    out["targets_met"] = {
        "fuzz_cases>=2000": out["fuzz_cases"] >= 2000,
        "fuzz_5xx==0": out["fuzz_5xx"] == 0,
        "fuzz_unexplained_4xx==0": out["fuzz_unexplained_4xx"] == 0,
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
