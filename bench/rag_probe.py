"""Probe a model's start on the RAG showcase before choosing its task set: per kind of question, how often the Agents
SDK workflow answers exactly (reward 1.0: the ``Answer:`` line with F1 1 against an accepted answer), its mean
reward, and on how many questions its tries disagree (what GRPO's groups can learn from).

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/rag_probe.py [--questions 24] [--tries 1] [--temperature 0]
                                                                   [--kinds ...] [--model smollm2] [--zero-shot]

The agent is the SmolLM2 recipe's (`examples.rag_agent.agent.answer` with its one-shot examples, the real Agents
SDK, MiniLM retrieval over the country passages; ``--zero-shot``: without them) against the embedded engine behind
a lightrail gateway, on the first ``--questions`` training questions of each kind (`examples.rag_agent.data.splits`
of that kind alone, seed 0; a question's split does not depend on the kinds asked for), ``--tries`` each at ``--temperature`` (0: greedy, as held-out validation
samples; 1 try is then enough). Last stdout line: one JSON object with ``kinds`` (per kind: ``exact`` as
``k/n``, ``reward_mean``, ``mixed``), ``exact_share`` overall, ``python_loop_ms`` (the machine's speed) and the
1-minute load at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import SMOKE_HELP, log, python_loop_ms, served_engine  # noqa: E402

KEYS = ()
NEEDS = {"agents_sdk": ("kinds", "exact_share", "minutes", "tries", "temperature", "python_loop_ms")}
"""The agent is the OpenAI Agents SDK's: every figure needs it."""


async def probe(url: str, tasks: list[dict], args: argparse.Namespace) -> list[tuple[dict, float]]:
    """Each task ``args.tries`` times, ``args.concurrency`` at once: (task, reward) per try."""
    from examples.rag_agent.agent import EDITOR_ONE_SHOT, ONE_SHOT, answer
    from examples.rag_agent.reward import reward
    from examples.rag_agent.train import corpus_of

    gate = asyncio.Semaphore(args.concurrency)
    examples = {} if args.zero_shot else {"examples": ONE_SHOT, "editor_examples": EDITOR_ONE_SHOT}

    async def one(task: dict) -> tuple[dict, float]:
        async with gate:
            reply = await answer(
                task["question"], base_url=url, model="policy", api_key="none", world=task.get("world", 0),
                corpus=corpus_of(task), temperature=args.temperature, max_tokens=args.max_tokens, **examples,
            )  # fmt: skip
        return task, reward(reply, task["answers"])

    return list(await asyncio.gather(*(one(task) for task in tasks for _ in range(args.tries))))


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


async def main_async(args: argparse.Namespace) -> dict:
    from examples.rag_agent.data import splits

    # each kind's first training questions in seed 0's order (a kind alone: the held-out ones are never probed)
    tasks = [task for kind in sorted(args.kinds) for task in splits(seed=0, n_train=args.questions, n_val=0,
                                                                  kinds=[kind])[0]]  # fmt: skip
    async with served_engine(args.model) as (url, _):
        t0 = time.perf_counter()
        tries = await probe(url, tasks, args)
    return {**summary(tries), "minutes": round((time.perf_counter() - t0) / 60, 1)}


def main() -> None:
    from examples.rag_agent.data import KINDS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=24, help="training questions per kind (default 24)")
    parser.add_argument("--tries", type=int, default=1, help="tries per question (default 1)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per call (default 128, the recipe's)")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="kinds (default: all)")
    parser.add_argument("--concurrency", type=int, default=16, help="rollouts at once (default 16)")
    parser.add_argument("--model", default="smollm2", help="a model name prepare_model knows, or a local folder")
    parser.add_argument("--zero-shot", action="store_true", help="no worked examples (the plain rag_agent)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the tiny random model, 1 question)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.tries, args.model, args.max_tokens = 1, 1, "tiny", 16
    facts = {"python_loop_ms": python_loop_ms(), "load_1min": round(os.getloadavg()[0], 2)}
    log(f"probing {args.questions} questions x {args.tries} per kind at T {args.temperature}: {args.kinds}")
    settings = {k: getattr(args, k) for k in ("temperature", "max_tokens", "zero_shot", "model")}
    print(json.dumps({**asyncio.run(main_async(args)), **settings, **facts}))


if __name__ == "__main__":
    main()
