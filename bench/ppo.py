"""PPO with a critic (`advantage: gae`) against GRPO on the calculator demo: same start, same tasks, same budget.

    python bench/ppo.py                  # small Llama, 300-step SFT warm start, 2 x 24 steps x 8 tasks x 8 samples
    python bench/ppo.py --quick          # tiny Llama, shorter warm start and runs (what a busy 2-core machine allows)
    python bench/ppo.py --quick --seeds 3
    python bench/ppo.py --smoke          # tiny Llama, 2 SFT steps, 2 x 2 steps of 2 x 2 rollouts
    python bench/ppo.py --warm runs/ppo/seed-0/warm   # reuse a warm start saved by an earlier run of the same seed

Per seed: one warm start (the demo's model and its SFT pass on the imperfect teacher, so held-out success starts above
0), then two runs from it in the same process with the same seed, the same task split and order and the same sample
budget (steps x tasks x samples): GRPO (group advantages, the default) and PPO (``advantage="gae"``: a value head,
GAE over each call's tokens). Calls are not merged in either arm (PPO cannot merge them yet), so the rows differ only
in their advantages. Held-out success is measured greedily on the same validation problems before (once: the start
model is the same, greedy decoding) and after each arm.

The last stdout line is one JSON object: ``grpo_val_before``, ``grpo_val_after``, ``ppo_val_after``,
``ppo_minus_grpo_pts`` ((ppo - grpo) after, in points), ``ppo_value_loss_first`` / ``_last``, ``grpo_minutes`` /
``ppo_minutes`` (each arm's whole run), ``target_met`` (``ppo_val_after >= grpo_val_after - 0.05``; None when the start solves no held-out problem), and the
machine's facts; with ``--seeds N`` each seed's report under ``seeds`` and mean/min/max of the figures per arm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._util import SMOKE_HELP, fit_arm, log, machine_facts, spread  # noqa: E402

KEYS = ("grpo_val_before", "grpo_val_after", "ppo_val_after", "ppo_minus_grpo_pts", "ppo_value_loss_first",
        "ppo_value_loss_last", "grpo_minutes", "ppo_minutes", "start_above_zero", "target_met", "wall_minutes")  # fmt: skip

QUICK = dict(model="tiny", n_train=400, n_val=60, sft_steps=150, steps=8, tasks_per_step=4, n_samples=4,
             concurrency=16, lr=1e-4)  # fmt: skip
SMOKE = dict(model="tiny", n_train=16, n_val=2, sft_steps=2, steps=2, tasks_per_step=2, n_samples=2, concurrency=4,
             lr=1e-4)  # fmt: skip
FULL = dict(model="small", n_train=2000, n_val=200, sft_steps=300, steps=24, tasks_per_step=8, n_samples=8,
            concurrency=24, lr=1e-4)  # fmt: skip


def run_arm(arm: str, model: Path, args: argparse.Namespace, seed: int, train: list, val: list, out: Path) -> dict:
    from lightrail.adapters import ToolRewardRule
    from lightrail.algorithms import GRPO
    from lightrail.demos.calculator.demo import AGENT
    from lightrail.model import UpdateConfig

    started = time.monotonic()
    grpo = GRPO(
        model,
        config=UpdateConfig(lr=args.lr, warmup_steps=2, kl_coef=0.05, seed=seed),
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        n_samples=args.n_samples,
        sampling={"temperature": 1.0, "max_tokens": 48},
        val_sampling={"temperature": 0.0, "max_tokens": 48},
        val_every=0,
        validate_before=arm == "grpo",  # the same start model, greedy: measured once
        advantage="gae" if arm == "ppo" else "grpo",
        tool_rewards=ToolRewardRule(success=0.1, error=-0.1),
        checkpoint_every=0,
        out_dir=out / arm,
        seed=seed,
    )
    steps = fit_arm(grpo, AGENT, train, val, store=out / f"{arm}-store.db", concurrency=args.concurrency)
    report = grpo.report
    return {
        "val_before": report["val_before"],
        "val_after": report["val_after"],
        "reward_curve": [round(m["reward_mean"], 3) for m in steps if "reward_mean" in m],
        "value_loss": [round(m["value_loss"], 4) for m in steps if "value_loss" in m],
        "rollouts": sum(m.get("rollouts", 0) for m in steps) or None,
        "minutes": round((time.monotonic() - started) / 60, 2),
    }


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from rich.console import Console

    from lightrail.demos.calculator.data import make_splits
    from lightrail.demos.calculator.demo import DemoSettings, build_model, warm_start

    out = args.out / f"seed-{seed}"
    out.mkdir(parents=True, exist_ok=True)
    settings = DemoSettings(model=args.model, n_train=args.n_train, n_val=args.n_val, sft_steps=args.sft_steps,
                            seed=seed, out=out)  # fmt: skip
    console = Console(stderr=True)
    train, val = make_splits(settings.n_train, settings.n_val, seed=seed)
    started = time.monotonic()
    if args.warm is not None:
        model = args.warm
    else:
        model = warm_start(settings, build_model(settings, train, console), train, console)
    warm_minutes = round((time.monotonic() - started) / 60, 2)
    log(f"seed {seed}: warm start {model} in {warm_minutes} min")
    grpo = run_arm("grpo", model, args, seed, train, val, out)
    log("grpo", json.dumps(grpo))
    ppo = run_arm("ppo", model, args, seed, train, val, out)
    log("ppo", json.dumps(ppo))
    if not grpo["val_before"]:
        log(f"seed {seed}: the start solves no held-out problem: this seed measures nothing")
    return {
        "seed": seed,
        "grpo_val_before": grpo["val_before"],
        "grpo_val_after": grpo["val_after"],
        "ppo_val_after": ppo["val_after"],
        "ppo_minus_grpo_pts": round((ppo["val_after"] - grpo["val_after"]) * 100, 1),
        "ppo_value_loss_first": ppo["value_loss"][0] if ppo["value_loss"] else None,
        "ppo_value_loss_last": ppo["value_loss"][-1] if ppo["value_loss"] else None,
        "grpo_minutes": grpo["minutes"],
        "ppo_minutes": ppo["minutes"],
        "warm_minutes": warm_minutes,
        "grpo": grpo,
        "ppo": ppo,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1, help="runs with seeds SEED..SEED+N-1 (default: 1)")
    parser.add_argument("--warm", type=Path, default=None, help="a saved warm start to use instead (one seed only)")
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("ppo-%Y%m%d-%H%M%S"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.warm is not None and args.seeds != 1:
        parser.error("--warm: with one seed only (a warm start belongs to its seed)")
    for key, value in (SMOKE if args.smoke else QUICK if args.quick else FULL).items():
        setattr(args, key, value)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    started = time.monotonic()
    reports = [run_seed(args, seed) for seed in range(args.seed, args.seed + args.seeds)]
    result: dict[str, Any] = {"quick": args.quick, "settings": {k: getattr(args, k) for k in QUICK}}
    if args.seeds == 1:
        result.update(reports[0])
    else:
        result["seeds"] = reports
        for key in ("grpo_val_before", "grpo_val_after", "ppo_val_after", "ppo_minus_grpo_pts"):
            for stat, value in spread([r[key] for r in reports]).items():
                result[f"{key}_{stat}"] = value
    after = [(r["grpo_val_after"], r["ppo_val_after"]) for r in reports]
    result["start_above_zero"] = all(r["grpo_val_before"] > 0 for r in reports)
    # None when a start solves nothing held out: both arms at 0 would "meet" the target and measure nothing
    result["target_met"] = all(p >= g - 0.05 for g, p in after) if result["start_above_zero"] else None
    result["wall_minutes"] = round((time.monotonic() - started) / 60, 1)
    result.update(machine_facts())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
