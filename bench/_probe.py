"""What the showcase probes share (`bench/rag_probe.py`, `bench/crew_probe.py`): per kind of question, how often an
agent answers exactly on a model before any training, to choose a task set a recipe can learn from.

A probe module gives its kinds, its recipe's tokens per call, a function that returns each kind's first training
questions and an async function that runs them through the agent against a gateway URL; `main` parses the common
options, serves the model, runs the probe and prints one JSON line (`summary` per kind, the settings, the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence

from bench._util import SMOKE_HELP, log, python_loop_ms, served_engine

Probe = Callable[[str, list[dict], argparse.Namespace], Awaitable[list[tuple[dict, float]]]]
"""``(gateway URL, tasks, options) -> (task, reward) per try``."""


def summary(tries: list[tuple[dict, float]]) -> dict:
    """Per kind: exact answers (reward 1.0), mean reward, questions whose tries got different rewards."""
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    by_question: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for task, value in tries:
        by_kind[task["kind"]].append(value)
        by_question[task["kind"], task["question"]].append(value)
    exact = sum(value >= 1.0 for _, value in tries)
    return {
        "tries": len(tries),
        "exact_share": round(exact / max(1, len(tries)), 3),
        "kinds": {
            kind: {
                "exact": f"{sum(v >= 1.0 for v in values)}/{len(values)}",
                "reward_mean": round(sum(values) / len(values), 3),
                "mixed": sum(1 for (k, _), v in by_question.items() if k == kind and len(set(v)) > 1),
            }
            for kind, values in sorted(by_kind.items())
        },
    }


def main(
    doc: str,
    kinds: Sequence[str],
    max_tokens: int,
    questions: Callable[[str, int], list[dict]],
    probe: Probe,
) -> None:
    """The probe's command: ``--questions`` training questions of each kind (``questions(kind, n)``), ``--tries``
    each at ``--temperature``, through ``probe`` against the model served here."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=24, help="training questions per kind (default 24)")
    parser.add_argument("--tries", type=int, default=1, help="tries per question (default 1)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--max-tokens", type=int, default=max_tokens,
                        help=f"tokens per call (default {max_tokens}, the recipe's)")  # fmt: skip
    parser.add_argument("--kinds", nargs="+", default=list(kinds), choices=kinds, help="kinds (default: all)")
    parser.add_argument("--concurrency", type=int, default=16, help="rollouts at once (default 16)")
    parser.add_argument("--model", default="smollm2", help="a model name prepare_model knows, or a local folder")
    parser.add_argument("--zero-shot", action="store_true", help="no worked examples (the showcase's plain agent)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the tiny random model, 1 question)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.tries, args.model, args.max_tokens = 1, 1, "tiny", 16
    facts = {"python_loop_ms": python_loop_ms(), "load_1min": round(os.getloadavg()[0], 2)}
    log(f"probing {args.questions} questions x {args.tries} per kind at T {args.temperature}: {args.kinds}")
    settings = {k: getattr(args, k) for k in ("temperature", "max_tokens", "zero_shot", "model")}

    async def run() -> dict:
        tasks = [task for kind in sorted(args.kinds) for task in questions(kind, args.questions)]
        async with served_engine(args.model) as (url, _):
            t0 = time.perf_counter()
            tries = await probe(url, tasks, args)
        return {**summary(tries), "minutes": round((time.perf_counter() - t0) / 60, 1)}

    print(json.dumps({**asyncio.run(run()), **settings, **facts}))
