"""APO on the calculator agent with SmolLM2-135M-Instruct, from a zero-shot prompt (no worked example).

    python bench/apo.py                      # demonstrations path only (no optimizer LLM)
    python bench/apo.py --optimizer self     # + textual gradients written by SmolLM2 itself (reported, no target)
    python bench/apo.py --quick              # fewer rounds and held-out problems

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

from bench._util import log, machine_facts  # noqa: E402
from examples.calculator.agent import SYSTEM  # noqa: E402
from examples.calculator.data import make_splits  # noqa: E402

AGENT = str(Path(__file__).resolve().parent / "_apo_agent.py") + ":calculator_prompted"


def _bootstrap(out: Path) -> dict | None:
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "bootstrap":
            return {"rollouts": record["rollouts"], "successes": record["successes"]}
    return None


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
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
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
    model = prepare_model("smollm2")
    apo = APO(
        model,
        prompts={"prompt_template": SYSTEM, "examples": "[]"},  # zero-shot: no worked example
        demo_format="messages",
        demo_template="examples",
        bootstrap_rollouts=args.bootstrap,
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
    Trainer(n_runners=2, concurrency=8, store=str(out / "store.db"), algorithm=apo).fit(AGENT, train, val)
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
