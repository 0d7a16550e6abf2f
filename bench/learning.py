"""The demo's measurement: held-out success of the calculator agent before and after GRPO, and the wall time.

    python bench/learning.py                   # default demo: small Llama, SFT warm start, GRPO
    python bench/learning.py --model smollm2   # SmolLM2-135M-Instruct with LoRA, no warm start
    python bench/learning.py --quick           # the short variant the end-to-end test runs
    python bench/learning.py --seeds 3         # seeds 0, 1, 2: the gain's mean, min and max
    python bench/learning.py --smoke           # tiny Llama, 2 SFT steps, 2 GRPO steps of 2 x 2 rollouts, 2 seeds

Progress on stderr; the last stdout line is one JSON object with ``val_before``, ``val_after``, ``gain_points``,
``train_minutes`` (GRPO only) and ``wall_minutes`` (everything, warm start included); with ``--seeds N``, each
seed's report under ``seeds`` and ``gain_points_mean`` / ``_min`` / ``_max`` (each gain over the start measured in
the same run) and ``train_minutes_max``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ when run from a checkout

from bench._util import SMOKE_HELP, machine_facts, spread  # noqa: E402
from examples.calculator.demo import DemoSettings, run_demo  # noqa: E402

KEYS = ("seeds", "gain_points_mean", "gain_points_min", "gain_points_max", "train_minutes_max")
"""With ``--seeds N`` (N > 1; ``--smoke`` runs 2); one seed prints that run's report (``val_before``, ``val_after``,
``gain_points``, ``train_minutes``, ``wall_minutes``)."""
SMOKE = dict(model="tiny", n_train=16, n_val=2, sft_steps=2, grpo_steps=2, tasks_per_step=2, n_samples=2,
             val_every=0, runners=1, concurrency=4)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small", "tiny", "smollm2"], default="small")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seeds", type=int, default=1, help="runs with seeds SEED..SEED+N-1 (default: 1)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.seeds = 2
    from rich.console import Console

    reports = []
    for seed in range(args.seed, args.seed + args.seeds):
        out = args.out / f"seed-{seed}" if args.out is not None and args.seeds > 1 else args.out
        if args.smoke:
            settings = DemoSettings(**SMOKE, seed=seed, out=out or Path("runs") / f"learning-smoke-{seed}")
        else:
            settings = DemoSettings.choose(args.model, quick=args.quick, seed=seed, grpo_steps=args.steps, out=out)
        report = run_demo(settings, console=Console(stderr=True))
        report["gain_points"] = round((report["val_after"] - report["val_before"]) * 100, 1)
        report["n_val"] = settings.n_val
        report["seed"] = seed
        reports.append(report)
    if args.seeds == 1:
        print(json.dumps(reports[0]))
        return
    summary: dict = {"seeds": reports, **machine_facts()}
    for key, value in spread([r["gain_points"] for r in reports], digits=1).items():
        summary[f"gain_points_{key}"] = value
    summary["train_minutes_max"] = max(r["train_minutes"] for r in reports)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
