"""Probe a model's start on the SQL showcase's basic tier before choosing a task set: per template, how often its tries
succeed, and on how many questions its tries disagree (what GRPO's groups and rejection sampling can learn from).

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sql_probe.py [--questions 48] [--tries 4] [--temperature 0.7]
                                                                   [--top-p 0.8] [--model smollm2]

The agent is the SmolLM2 recipe's (`examples.sql_agent.agent.answer` with `ONE_SHOT_BASIC`, one rewrite, 64 tokens
per call) against the embedded engine behind a lightrail gateway, on the first ``--questions`` training questions of
the basic tier (seed 0), ``--tries`` each. Per template: exact successes (execution match) and the mean of
`reward.condition_credit`. Overall: ``mixed_exact`` (questions whose tries differ in execution match) and
``mixed_credit`` (questions whose tries differ in condition credit). Last stdout line: one JSON object, with
``python_loop_ms`` (the machine's speed) and the 1-minute load at the start.

Measured on SmolLM2-135M-Instruct, 2026-11-28, 48 x 4 at 0.7 / 0.8: exact 11 of 192 (carrier to destination 9/16, the
other five templates 2/176), ``mixed_exact`` 5 of 48 (examples/sql_agent/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import SMOKE_HELP, log, served_engine  # noqa: E402
from bench.showcase_rollouts import python_loop_ms  # noqa: E402

KEYS = ()
NEEDS = {"langgraph": ("mixed_exact", "mixed_credit", "minutes", "tries", "temperature", "python_loop_ms")}
"""The agent is LangGraph's (langchain_core): every figure needs it."""


def probe(url: str, tasks: list[dict], args: argparse.Namespace) -> list[tuple[dict, float, float]]:
    """Each task ``args.tries`` times: (task, execution match, condition credit) per try."""
    from examples.sql_agent.agent import ONE_SHOT_BASIC, answer
    from examples.sql_agent.database import connect, database_path
    from examples.sql_agent.reward import condition_credit, execution_match
    from examples.sql_agent.train import example_selector

    lock = threading.Lock()

    def one(task: dict) -> tuple[dict, float, float]:
        conn = connect(database_path())
        state = answer(
            task["question"], base_url=url, model="policy", api_key="none", max_turns=2,
            examples=example_selector(args.tier) if args.nearest else [tuple(args.example)] if args.example
            else ONE_SHOT_BASIC,
            conn=conn, temperature=args.temperature, top_p=args.top_p, max_tokens=64,
        )  # fmt: skip
        sql = state.get("sql")
        exact, credit = execution_match(conn, sql, task["sql"]), condition_credit(conn, sql, task["sql"])
        if args.dump:
            with lock, args.dump.open("a") as f:
                f.write(json.dumps({"question": task["question"], "gold": task["sql"], "sql": sql, "exact": exact,
                                    "credit": credit}) + "\n")  # fmt: skip
        return task, exact, credit

    with ThreadPoolExecutor(args.concurrency) as pool:
        return list(pool.map(one, [task for task in tasks for _ in range(args.tries)]))


def summary(tries: list[tuple[dict, float, float]]) -> dict:
    """Per-template exact successes and mean credit; questions whose tries disagree, in exact match and in credit."""
    by_template: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    by_question: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for task, exact, credit in tries:
        by_template[task["template"]].append((exact, credit))
        by_question[task["question"]].append((exact, credit))
    return {
        "tries": len(tries),
        "exact": sum(exact for _, exact, _ in tries),
        "mixed_exact": sum(1 for v in by_question.values() if len({e for e, _ in v}) > 1),
        "mixed_credit": sum(1 for v in by_question.values() if len({c for _, c in v}) > 1),
        "questions": len(by_question),
        "templates": {
            name: {
                "exact": f"{sum(e for e, _ in v):.0f}/{len(v)}",
                "credit_mean": round(sum(c for _, c in v) / len(v), 3),
            }
            for name, v in sorted(by_template.items())
        },
    }


async def main_async(args: argparse.Namespace) -> dict:
    from examples.sql_agent.data import splits

    train, val = splits(seed=0, n_train=400, n_val=48, tier=args.tier)
    tasks = (val if args.split == "val" else train)[: args.questions]
    async with served_engine(args.model) as (url, _):
        t0 = time.perf_counter()
        tries = await asyncio.to_thread(probe, url, tasks, args)
    return {**summary(tries), "minutes": round((time.perf_counter() - t0) / 60, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=48, help="training questions of the basic tier (default 48)")
    parser.add_argument("--tries", type=int, default=4, help="tries per question (default 4)")
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    parser.add_argument("--top-p", type=float, default=0.8, help="nucleus sampling (default 0.8)")
    parser.add_argument("--concurrency", type=int, default=16, help="rollouts at once (default 16)")
    parser.add_argument("--model", default="smollm2", help="a model name prepare_model knows, or a local folder")
    parser.add_argument("--example", nargs=2, metavar=("QUESTION", "SQL"),
                        help="another worked example for the writer and rewriter (default: agent.ONE_SHOT_BASIC)")  # fmt: skip
    parser.add_argument(
        "--nearest",
        action="store_true",
        help="dynamic few-shot: the most similar training question's SQL (train.example_selector)",
    )
    parser.add_argument("--tier", default="basic", choices=["basic", "full"], help="question tier (default basic)")
    parser.add_argument("--split", default="train", choices=["train", "val"],
                        help="train questions (default) or the recipe's 48 held-out ones")  # fmt: skip
    parser.add_argument("--dump", type=Path, help="append each try's question, gold SQL, SQL and scores (JSON lines)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the tiny random model, 2 questions)")
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.tries, args.model = 2, 1, "tiny"
    facts = {"python_loop_ms": python_loop_ms(), "load_1min": round(os.getloadavg()[0], 2)}
    log(f"probing {args.questions} questions x {args.tries} at T {args.temperature} / top-p {args.top_p}")
    settings = {k: getattr(args, k) for k in ("tier", "split", "nearest", "example", "temperature", "tries")}
    print(json.dumps({**asyncio.run(main_async(args)), **settings, **facts}))


if __name__ == "__main__":
    main()
