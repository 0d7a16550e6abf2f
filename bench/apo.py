"""APO on the calculator agent with SmolLM2-135M-Instruct, from a zero-shot prompt (no worked example).

    python bench/apo.py                      # demonstrations path only (no optimizer LLM)
    python bench/apo.py --optimizer self     # + textual gradients written by SmolLM2 itself (reported, no target)
    python bench/apo.py --quick              # fewer rounds and held-out problems
    python bench/apo.py --smoke              # the tiny random model, one round of 2 tasks, 1 runner (seconds)
    python bench/apo.py --teacher-traces 64  # demonstrations from the scripted teacher's recorded runs (demo_traces)

Everything runs through the real loop: runner processes, the gateway, the embedded engine, a SQLite store.
Held-out success (greedy) of the seed prompt and of the best prompt found; target: ``val_after - val_before`` ≥ 0.15
within 20 minutes. Progress on stderr; the last stdout line is one JSON object (``val_before``, ``val_after``,
``minutes``, the search's counts, the best prompt, and the machine's facts from ``bench/_util.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402
from examples.calculator.agent import SYSTEM  # noqa: E402
from examples.calculator.data import make_splits  # noqa: E402

KEYS = ("val_before", "val_after", "gain", "minutes", "rounds", "candidates", "search_rollouts", "val_rollouts",
        "optimizer_calls", "best_score", "best_prompt", "targets_met")  # fmt: skip
AGENT = str(Path(__file__).resolve().parent / "_apo_agent.py") + ":calculator_prompted"


def _bootstrap(out: Path) -> dict | None:
    record = _record(out, "bootstrap")
    return None if record is None else {"rollouts": record["rollouts"], "successes": record["successes"]}


def _record(out: Path, kind: str) -> dict | None:
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == kind:
            return record
    return None


def _teacher_traces(out: Path, train: list[dict], args: argparse.Namespace):
    """The teacher's runs of the same agent on the last N training problems, recorded through a gateway in front of
    the teacher into ``out/teacher.db`` (as production traffic or a stronger model's runs would be); returns the
    `TraceFilter` that gives them to APO."""
    import secrets

    from examples.calculator.teacher_server import TeacherServer
    from lightrail import Trainer
    from lightrail.algorithms.rejection import TraceFilter
    from lightrail.store.server import serve_in_thread
    from lightrail.types import PromptTemplate

    t0 = time.monotonic()
    token = secrets.token_urlsafe(12)
    out.mkdir(parents=True, exist_ok=True)
    server = serve_in_thread(out / "teacher.db", token=token)
    try:
        with TeacherServer(train, seed=args.seed, store_url=server.url, store_token=token) as teacher:
            resources = {"llm": teacher.llm(), "prompt_template": PromptTemplate(template=SYSTEM),
                         "examples": PromptTemplate(template="[]")}  # fmt: skip
            report = Trainer(n_runners=2, concurrency=8, store=server.url, token=token).dev(
                AGENT, train[-args.teacher_traces :], resources
            )
    finally:
        server.stop()
    solved = sum(1 for row in report.rows if row.reward == 1.0)
    log(f"teacher traces: {solved} of {len(report.rows)} solved in {time.monotonic() - t0:.0f} s")
    return TraceFilter(store=str(out / "teacher.db"), modes=("val",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optimizer", choices=["none", "self"], default="none")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--n-val", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-demos", action="store_true", help="textual gradients only (with --optimizer self)")
    parser.add_argument("--bootstrap", type=int, default=64, help="rollouts at temperature 1 to find first successes")
    parser.add_argument(
        "--teacher-traces", type=int, default=0, metavar="N",
        help="first run the agent with the scripted imperfect teacher on N training problems, recorded in a store, "
        "and give APO those traces (demo_traces) instead of bootstrapping",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.batch, args.n_val, args.bootstrap = 1, 2, 2, 4
    facts = machine_facts()
    log(f"machine: {facts}")

    from lightrail import Trainer
    from lightrail.algorithms import APO
    from lightrail.engine.models import prepare_model

    rounds = args.rounds if args.rounds is not None else (2 if args.quick else 3)
    batch = args.batch or (8 if args.quick else 16)
    n_val = args.n_val or (30 if args.quick else 60)
    out = args.out or Path("runs") / time.strftime(f"apo-{args.optimizer}-%Y%m%d-%H%M%S")
    train, val = make_splits(200, n_val, seed=args.seed)
    started = time.monotonic()
    model = prepare_model("tiny" if args.smoke else "smollm2")
    traces = _teacher_traces(out, train, args) if args.teacher_traces else None
    apo = APO(
        model,
        prompts={"prompt_template": SYSTEM, "examples": "[]"},  # zero-shot: no worked example
        demo_format="messages",
        demo_template="examples",
        bootstrap_rollouts=0 if traces else args.bootstrap,
        demo_traces=traces,
        optimizer="self" if args.optimizer == "self" else None,
        rounds=rounds,
        beam_width=2,
        demonstrations=not args.no_demos,
        demo_children=2,
        gradient_children=1,
        demo_k=2,
        batch_size=batch,
        sampling={"temperature": 0.7, "max_tokens": 96},
        val_sampling={"temperature": 0.0, "max_tokens": 96},
        optimizer_sampling={"temperature": 0.7, "max_tokens": 256},
        out_dir=out,
        seed=args.seed,
    )
    Trainer(n_runners=1 if args.smoke else 2, concurrency=8, store=str(out / "store.db"), algorithm=apo).fit(
        AGENT, train, val
    )
    report = apo.report
    result = {
        "optimizer": args.optimizer,
        "demonstrations": not args.no_demos,
        "val_before": report["val_before"],
        "val_after": report["val_after"],
        "gain": round(report["val_after"] - report["val_before"], 3),
        "minutes": round((time.monotonic() - started) / 60, 2),
        "n_val": n_val,
        "rounds": report["rounds"],
        "candidates": report["candidates"],
        "search_rollouts": report["rollouts"],
        "val_rollouts": report["val_rollouts"],
        "optimizer_calls": report["optimizer_calls"],
        "bootstrap": _bootstrap(out),
        "teacher_traces": _record(out, "demo_traces"),
        "best_candidate": report["best_candidate"],
        "best_score": report["best_score"],
        "best_prompt": report["best_prompt"]["prompt_template"],
        "best_examples": len(json.loads(report["best_prompt"]["examples"])),
        "out": str(out),
        **facts,
        "load_1m_end": round(__import__("os").getloadavg()[0], 2),
    }
    result["targets_met"] = {"gain_ge_0.15": result["gain"] >= 0.15, "minutes_le_20": result["minutes"] <= 20}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
