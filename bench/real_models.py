"""Real model families' tool calls, measured end to end: do they round-trip through each engine?

    .venv/bin/python bench/real_models.py                    # embedded engine, every family
    .venv/bin/python bench/real_models.py --vllm             # ... and vLLM's CPU build for Hermes and Llama 3 JSON
                                                             #     (needs .venv-vllm: tests/gateway/test_gateway_vllm.py)
    .venv/bin/python bench/real_models.py --smoke            # the first family only (vLLM too when its venv exists)
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/real_models.py --showcases sql_agent --seeds 3
                                                             # SmolLM2 learning showcases instead (bench/_smollm2_showcases.py)

For each family (`tests/engine/families.py`: Qwen2.5 and Qwen3 Hermes, Llama 3.2 JSON, Mistral v0.3, Llama 3.2
pythonic; each its published chat template on a random ~0.1 M-parameter model with the family's special tokens) the
model is overfit for a few seconds to answer a weather question with a call to ``get_weather`` written in its
family's markup. Then an agent (the real ``openai`` client) asks through a lightrail gateway with the tools on
offer (``tool_choice: auto``: nothing forces the markup): the round trip holds when the agent receives exactly that
call as an OpenAI tool call. The engine renders the prompt with the family's template and parses the answer; with
``--vllm``, vLLM is started by `VLLMRollouts` with the parser flags the family's formats give, and vLLM's own parser
reads the answer.

Numbers (issue "Real models learn"): ``tool_format_families`` (distinct tool-call formats covered, target >= 4) and
``tool_format_roundtrip`` (fraction of families x engines whose calls round-trip, target 1.0). The last stdout line
is one JSON object with the machine's facts next to the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("tool_format_families", "tool_format_roundtrip", "roundtrips", "seconds")
NEEDS: dict[str, tuple[str, ...]] = {"vllm": ()}
"""With vLLM's venv, ``--smoke`` also round-trips the first family through vLLM (into ``roundtrips``)."""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris, in Celsius?"}]
CALL = {"name": "get_weather", "arguments": {"city": "Paris", "metric": True}}
VLLM_FAMILIES = ("qwen2.5", "llama3.2")  # Hermes and Llama 3 JSON: the seeds' model families


def trained_family_model(name: str, folder: Path) -> Path:
    """The family's random model, overfit to answer `ASK` with `CALL` in its own markup."""
    from families import FAMILIES, build_family_model, overfit

    from lightrail.engine.formats import formats_of

    path = build_family_model(FAMILIES[name], folder / name)
    reply = formats_of(path).tool.render([CALL])
    overfit(path, ASK, [WEATHER], reply)
    return path


async def agent_call(backend, *, model: str = "m") -> tuple[str, dict] | None:
    """Ask through a real gateway in front of ``backend``; the (name, arguments) of the tool call the agent got."""
    import openai

    from lightrail.gateway import GatewayServer
    from lightrail.store import MemoryStore
    from lightrail.types import RolloutSpec, Task

    store = MemoryStore()
    await store.enqueue([RolloutSpec(task=Task(input="q"))])
    lease = await store.lease("bench")
    assert lease is not None
    try:
        async with GatewayServer(backend, store, token="t") as gateway:
            root = gateway.url.removesuffix("/v1")
            base = f"{root}/rollouts/{lease.rollout.rollout_id}/attempts/{lease.attempt.attempt_id}/v1"
            async with openai.AsyncOpenAI(base_url=base, api_key="t", max_retries=0, timeout=120) as client:
                reply = await client.chat.completions.create(
                    model=model, messages=ASK, tools=[WEATHER], max_tokens=48, temperature=0
                )
    finally:
        await store.close()
    calls = reply.choices[0].message.tool_calls or []
    if len(calls) != 1:
        log(f"  no single tool call: {reply.choices[0].message.content!r}")
        return None
    return calls[0].function.name, json.loads(calls[0].function.arguments)


async def embedded_round_trip(path: Path) -> bool:
    from lightrail.engine import Engine

    engine = Engine.from_pretrained(path)
    try:
        return await agent_call(engine) == (CALL["name"], CALL["arguments"])
    finally:
        await engine.close()


async def vllm_round_trip(path: Path, python: str, workdir: Path) -> bool:
    from lightrail.model.vllm_rollouts import VLLMRollouts

    rollouts = VLLMRollouts(
        path, served_name="policy", workdir=workdir, python=python, startup_timeout_s=600,
        args=["--enforce-eager", "--max-model-len", "2048", "--dtype", "float32"],
        env={"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
    )  # fmt: skip
    workdir.mkdir(parents=True, exist_ok=True)
    await rollouts.start()
    try:
        return await agent_call(rollouts.backend, model="policy") == (CALL["name"], CALL["arguments"])
    finally:
        await rollouts.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm", action="store_true", help="also through vLLM's CPU build (Hermes, Llama 3 JSON)")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--showcases", nargs="+", metavar="NAME", help="instead: train SmolLM2 on these showcases")
    parser.add_argument("--seeds", type=int, default=3, help="with --showcases: seeds 0..N-1 per showcase (default 3)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="K",
                        help="with --showcases: seeds K..K+N-1 instead (a seed at a time across sittings)")  # fmt: skip
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
                        help="with --showcases: a config override for every run (as lightrail train --set)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / time.strftime("bench-smollm2-%Y%m%d-%H%M%S"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.vllm_python = os.environ.get("LIGHTRAIL_VLLM_PYTHON") or args.vllm_python
        args.vllm = Path(args.vllm_python).is_file()
    if args.showcases:
        from bench._smollm2_showcases import RECIPES, measure

        unknown = sorted(set(args.showcases) - set(RECIPES))
        if unknown:
            parser.error(f"no SmolLM2 recipe for {unknown}; known: {sorted(RECIPES)}")
        facts = machine_facts()
        log(f"machine: {facts}")
        figures = await asyncio.to_thread(
            measure, args.showcases, range(args.first_seed, args.first_seed + args.seeds), args.out, args.overrides
        )  # trains in its own loop
        print(
            json.dumps({**figures, **facts, "overrides": args.overrides, "load_1m_after": machine_facts()["load_1m"]})
        )
        return
    from families import FAMILIES

    from lightrail.engine import configure_threads
    from lightrail.engine.formats import formats_of

    configure_threads()  # $LIGHTRAIL_TORCH_THREADS for the overfitting too (2 spinning threads crawl on a busy box)

    start = time.monotonic()
    results: dict[str, bool] = {}
    formats = set()
    with tempfile.TemporaryDirectory() as tmp:
        for name in list(FAMILIES)[:1] if args.smoke else FAMILIES:
            t0 = time.monotonic()
            path = trained_family_model(name, Path(tmp))
            formats.add(formats_of(path).tool.name)
            results[f"{name}/embedded"] = await embedded_round_trip(path)
            log(f"{name}: embedded {'ok' if results[f'{name}/embedded'] else 'FAILED'} ({time.monotonic() - t0:.0f} s)")
            if args.vllm and (name in VLLM_FAMILIES or args.smoke):
                t0 = time.monotonic()
                results[f"{name}/vllm"] = await vllm_round_trip(path, args.vllm_python, Path(tmp) / f"vllm-{name}")
                log(f"{name}: vllm {'ok' if results[f'{name}/vllm'] else 'FAILED'} ({time.monotonic() - t0:.0f} s)")
    out = {
        "tool_format_families": len(formats),
        "tool_format_roundtrip": round(sum(results.values()) / len(results), 3),
        "roundtrips": results,
        "seconds": round(time.monotonic() - start, 1),
        **machine_facts(),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main())
