"""Nothing fails silently: the run guard's drills, and what the guard costs a healthy run.

Each drill is a real GRPO run on the tiny model (built here) through a SQLite store server, a runner process, the
gateway and the embedded engine, with one fault planted: an agent that raises; a typo in the sampling settings; a
resource asked for by another name; a selection matching nothing; a refused key; an upstream that returns no token
ids; a constant reward; a NaN reward; a broken weight sync; a request field the model's template would drop (an
image part to a text model); a client that disconnects mid-call (a 0.5 s timeout on a long answer, then a patient retry). A drill is
caught when the run stops (or refuses to start) with a one-line cause naming the fault (the disconnect: when its
abandoned calls are counted at step 1 and only the retries are calls of the episodes), and ``steps_to_catch`` is the
first step whose output names it (0: the settings were refused before any rollout). The healthy runs (a varying reward, 3 seeds) count false alarms: any step
the guard says trained nothing, or a stop. ``guard_overhead_ratio`` is their step time with the guard's own time (the
health record and its rules, ``guard_s``) over the step time without it, from the same steps.

    python bench/silent.py            # all drills, 3 healthy seeds of 4 steps
    python bench/silent.py --smoke    # the same drills, each stopped at its first empty step; 1 healthy step

Prints progress on stderr and one JSON line on stdout: ``drills_caught`` (of ``drills``), ``steps_to_catch_max``,
``causes`` (each drill's one line), ``false_alarms``, ``guard_overhead_ratio``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._util import log  # noqa: E402

TASKS = [{"question": f"{a} + {b} = ?", "answer": a + b} for a in range(1, 5) for b in range(1, 5)]
KEYS = ("drills", "drills_caught", "steps_to_catch_max", "causes", "false_alarms", "guard_overhead_ratio")


def _grpo(model: Path, out: Path, steps: int, seed: int = 0, *, empty: int = 2, **overrides):
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO

    settings = dict(
        config=UpdateConfig(lr=1e-3), steps=steps, tasks_per_step=2, n_samples=8, validate_before=False, seed=seed,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        val_every=0, checkpoint_every=0, out_dir=out, guard={"max_empty_steps": empty},
    )  # fmt: skip
    return GRPO(model, **{**settings, **overrides})


def _run(store: tuple[str, str], agent: str, make_grpo) -> tuple[str | None, str, list[dict]]:
    """Run one drill; returns (the stop's one-line cause or None, what the run printed, its train metrics)."""
    from lightrail import Trainer
    from lightrail.algorithms.run.guard import RunStopped
    from lightrail.model.mismatch import MismatchError

    printed = io.StringIO()
    cause = None
    try:
        grpo = make_grpo()
    except ValueError as exc:  # settings refused before anything ran
        return f"refused at construction: {exc}", "", []
    url, token = store
    with contextlib.redirect_stdout(printed):
        try:
            Trainer(n_runners=1, concurrency=8, store=url, token=token, algorithm=grpo).fit(
                f"bench._silent_agents:{agent}", TASKS, []
            )
        except (RunStopped, MismatchError) as exc:
            cause = str(exc)
    metrics = grpo.out_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
    return cause, printed.getvalue(), [m for m in lines if m["kind"] == "train"]


def _first_step(cause: str | None, printed: str) -> int | None:
    """The first step the run's output names as trained-nothing or stopped (0: refused before any step)."""
    if cause is not None and cause.startswith("refused at construction"):
        return 0
    steps = [int(n) for n in re.findall(r"step (\d+) trained nothing", printed)]
    if cause is not None:
        steps += [int(n) for n in re.findall(r"step (\d+)", cause)[:1]]
        steps += [int(n) for n in re.findall(r"update (\d+)", cause)[:1]]  # a sync that did not take
    return min(steps) if steps else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="stop each drill at its first empty step, 1 healthy step")
    parser.add_argument("--seeds", type=int, default=3, help="healthy runs (false alarms, overhead)")
    parser.add_argument("--steps", type=int, default=4, help="steps of each healthy run")
    args = parser.parse_args()
    # smoke: the same drills, each stopped at its first empty step (the rule is the same at 1 as at 2)
    seeds, healthy_steps, empty = (1, 1, 1) if args.smoke else (args.seeds, args.steps, 2)

    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from lightrail.engine.models import build_tiny_model
    from lightrail.gateway.backends import OpenAIUpstream
    from lightrail.gateway.fake import ScriptedBackend
    from lightrail.gateway.server import GatewayServer
    from lightrail.model.rollout_engines import EmbeddedRollouts
    from lightrail.store import MemoryStore
    from lightrail.store.client import StoreClient
    from lightrail.trainer.trainer import StoreServerProcess

    work = Path(tempfile.mkdtemp(prefix="lightrail-silent-"))
    model = build_tiny_model(work / "model", size="tiny", seed=0)
    server = StoreServerProcess(work / "store.db")
    store = (server.url, server.token)
    drills: dict[str, tuple[str, dict]] = {
        "agent_raises": ("raises", {}),
        "sampling_typo": ("passes_sampling", {"sampling": {"temperature": 1.0, "max_token": 8}}),
        "resource_name": ("OtherResourceName", {}),
        "selection_matches_nothing": ("named_writer", {"agents_pattern": "write|rewrite"}),
        "refused_key": ("placeholder_key", {}),
        "no_token_ids": ("no_token_ids", {}),
        "constant_reward": ("constant", {}),
        "nan_reward": ("nan", {}),
        "broken_weight_sync": ("healthy", {}),
        "field_the_template_drops": ("image_part", {}),
        "client_disconnects": ("impatient", {}),
    }
    results: dict[str, dict] = {}
    import asyncio

    async def upstream_gateway() -> tuple[GatewayServer, GatewayServer, StoreClient]:
        """A hosted model's stand-in (a named fake at the boundary we cannot reach: the gateway over a scripted
        backend) behind a lightrail gateway that records into the run's store and asks for no token ids."""
        hosted = await GatewayServer(ScriptedBackend(["a reply"]), MemoryStore(), token="hosted").start()
        client = StoreClient(store[0], token=store[1])
        front = await GatewayServer(
            OpenAIUpstream(hosted.url, api_key="hosted", request_token_ids=False), client, token="front"
        ).start()
        return hosted, front, client

    loop = asyncio.new_event_loop()
    hosted, front, client = loop.run_until_complete(upstream_gateway())
    import threading

    threading.Thread(target=loop.run_forever, daemon=True).start()
    os.environ["LIGHTRAIL_DRILL_UPSTREAM"], os.environ["LIGHTRAIL_DRILL_KEY"] = front.url, "front"
    from transformers import AutoTokenizer

    os.environ["LIGHTRAIL_DRILL_EOS"] = str(AutoTokenizer.from_pretrained(model).eos_token_id)
    original_sync = EmbeddedRollouts.sync
    try:
        for name, (agent, overrides) in drills.items():
            t0 = time.monotonic()
            if name == "broken_weight_sync":  # the planted fault: the sync returns without reaching the engine

                async def skipped(self, updater, version):
                    return None

                EmbeddedRollouts.sync = skipped  # type: ignore[method-assign]
            try:
                cause, printed, steps = _run(
                    store,
                    agent,
                    lambda: _grpo(model, work / name, 3, empty=empty, **overrides),  # noqa: B023
                )
            finally:
                EmbeddedRollouts.sync = original_sync  # type: ignore[method-assign]
            at = _first_step(cause, printed)
            caught = cause is not None and at is not None and "\n" not in cause
            if name == "client_disconnects":  # caught when every abandoned call is counted and none is trained
                first = steps[0] if steps else {}
                abandoned, received = first.get("calls_abandoned", 0), first.get("calls", 0)
                caught = cause is None and abandoned > 0 and received == first.get("rollouts", -1)
                at, cause = (1, f"{abandoned} abandoned calls counted, not trained") if caught else (None, cause)
            results[name] = {"caught": caught, "step": at, "cause": cause, "seconds": round(time.monotonic() - t0, 1)}
            log(f"{name}: {'caught' if caught else 'MISSED'} at step {at} ({results[name]['seconds']}s): {cause}")
        alarms, step_s, guard_s = 0, [], []
        for seed in range(seeds):
            cause, printed, steps = _run(
                store,
                "healthy",
                lambda: _grpo(model, work / f"healthy-{seed}", healthy_steps, seed=seed),  # noqa: B023
            )
            alarms += len(re.findall(r"trained nothing", printed)) + (cause is not None)
            step_s += [m["step_s"] for m in steps]
            guard_s += [m["guard_s"] for m in steps]
            log(f"healthy seed {seed}: {len(steps)} steps, alarms so far {alarms}, cause {cause}")
    finally:

        async def close() -> None:
            await front.stop()
            await hosted.stop()
            await client.close()

        asyncio.run_coroutine_threadsafe(close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        server.stop()
    mean_step = sum(step_s) / max(len(step_s), 1)
    mean_guard = sum(guard_s) / max(len(guard_s), 1)
    line = {
        "drills": len(drills),
        "drills_caught": sum(r["caught"] for r in results.values()),
        "steps_to_catch_max": max((r["step"] for r in results.values() if r["step"] is not None), default=None),
        "causes": {name: r["cause"] for name, r in results.items()},
        "false_alarms": alarms,
        "healthy_steps": len(step_s),
        "step_s_mean": round(mean_step, 3),
        "guard_s_mean": round(mean_guard, 5),
        "guard_overhead_ratio": round((mean_step + mean_guard) / mean_step, 4) if mean_step else None,
        "load_1m": os.getloadavg()[0],
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
