"""Probe a model's start on the CrewAI showcase before choosing its task set: per kind of question, how often the
researcher -> writer crew answers exactly (reward 1.0: the writer's ``Answer:`` line is the gold answer), its mean
reward, and on how many questions its tries disagree (what GRPO's groups can learn from).

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/crew_probe.py [--questions 24] [--tries 1] [--temperature 0]
                                                                    [--kinds ...] [--model smollm2] [--zero-shot]

The crew is the SmolLM2 recipe's (`examples.crew_agent.agent.answer` with each agent's worked exchange,
``one_shot``; ``--zero-shot``: the plain crew), run by the real CrewAI in its own environment (``.venv-crewai``, or
$LIGHTRAIL_CREWAI_PYTHON: CrewAI pins an older openai than lightrail's) against the embedded engine behind a
lightrail gateway started here, on the first ``--questions`` *training* questions of each kind
(`examples.crew_agent.data.splits` of that kind alone, seed 0; a question's split does not depend on the kinds asked
for, so the held-out questions are never probed), ``--tries`` each at ``--temperature`` (0: greedy, as held-out
validation samples). Last stdout line: one JSON object with ``kinds`` (per kind: ``exact`` as ``k/n``,
``reward_mean``, ``mixed``), ``exact_share`` overall, ``python_loop_ms`` (the machine's speed) and the 1-minute load
at the start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _probe  # noqa: E402
from bench._util import REPO  # noqa: E402

KEYS = ()
NEEDS = {"crewai": ("kinds", "exact_share", "minutes", "tries", "temperature", "python_loop_ms")}
"""The crew runs in CrewAI's environment: every figure needs it."""

CREWAI_PYTHON = os.environ.get("LIGHTRAIL_CREWAI_PYTHON", str(REPO / ".venv-crewai" / "bin" / "python"))

# Run in CrewAI's interpreter: each task of stdin's JSON list, `tries` times, `concurrency` crews at once (threads:
# a crew's kickoff is blocking); one JSON reward per try on stdout, in the order given.
_CHILD = """
import json, sys
from concurrent.futures import ThreadPoolExecutor
from examples.crew_agent.rewards import NO_ANSWER, answer_reward
from examples.crew_agent.agent import answer

job = json.load(sys.stdin)

def one(task):
    try:
        text = answer(task["question"], base_url=job["url"], model="policy", api_key="none",
                      one_shot=job["one_shot"], **job["sampling"])
    except ValueError:
        return NO_ANSWER
    others = [c for c in task["countries"] if c != task["answer"]] if task["kind"] == "population" else []
    return answer_reward(text, task["answer"], others)

with ThreadPoolExecutor(job["concurrency"]) as pool:
    print(json.dumps(list(pool.map(one, [t for t in job["tasks"] for _ in range(job["tries"])]))))
"""


async def probe(url: str, tasks: list[dict], args: argparse.Namespace) -> list[tuple[dict, float]]:
    """Each task ``args.tries`` times through the crew in CrewAI's interpreter: (task, reward) per try."""
    job = {
        "url": url, "tasks": tasks, "tries": args.tries, "concurrency": args.concurrency,
        "one_shot": not args.zero_shot, "sampling": {"temperature": args.temperature, "max_tokens": args.max_tokens},
    }  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "CREWAI_DISABLE_TELEMETRY": "true"}
    done = await asyncio.to_thread(
        subprocess.run, [CREWAI_PYTHON, "-c", _CHILD], input=json.dumps(job), capture_output=True, text=True,
        cwd=REPO, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the crew's interpreter failed: {done.stderr.strip().splitlines()[-1:]}")
    rewards = json.loads(done.stdout.strip().splitlines()[-1])
    return list(zip([task for task in tasks for _ in range(args.tries)], rewards, strict=True))


def questions(kind: str, n: int) -> list[dict]:
    """The first ``n`` training questions of ``kind`` in seed 0's order (a kind alone: held-out ones are never
    probed)."""
    from examples.crew_agent.data import splits

    return splits(seed=0, n_train=n, n_val=0, kinds=[kind])[0]


def main() -> None:
    from examples.crew_agent.data import KINDS

    _probe.main(__doc__ or "", KINDS, 96, questions, probe)


if __name__ == "__main__":
    main()
