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
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _probe  # noqa: E402

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


def questions(kind: str, n: int) -> list[dict]:
    """The first ``n`` training questions of ``kind`` in seed 0's order (a kind alone: held-out ones are never
    probed)."""
    from examples.rag_agent.data import splits

    return splits(seed=0, n_train=n, n_val=0, kinds=[kind])[0]


def main() -> None:
    from examples.rag_agent.data import KINDS

    _probe.main(__doc__ or "", KINDS, 128, questions, probe)


if __name__ == "__main__":
    main()
