"""The framework showcases learning, measured: each one's `lightrail train examples/NAME/config.yaml`, end to end.

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/showcases.py --only calc_agent
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/showcases.py --only calc_agent --set grpo.steps=10   # shorter
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/showcases.py --only sql_agent --seeds 3   # a spread over seeds
    .venv/bin/python bench/showcases.py --smoke     # calc_agent, the tests' SHORT_RECIPE (tiny model, 2 + 1 steps)

Each showcase's config is its recipe (a small model distilled from an imperfect teacher through the agent's own
framework, then GRPO through real runners, the gateway and the framework); this script runs it as
``lightrail train`` would, one showcase after the other, and reads the run's report:

* ``NAME_val_before`` / ``NAME_val_after``: held-out success at the GRPO stage's start (after the warm start) and
  at its end (greedy, the config's ``n_val`` held-out tasks);
* ``NAME_minutes``: the GRPO stage (its validations included); ``NAME_wall_minutes``: the whole command (model
  build, teacher rollouts, SFT, GRPO);
* ``NAME_sft_val`` / ``NAME_sft_minutes``: the warm start's own figures, when the recipe has one;
* ``sql_agent_two_policies_val_before`` / ``_val_after`` / ``_minutes``: the SQL showcase's GRPO stage again from
  the same warm-started model with the same budget, but with one policy for the writer and one for the rewriter
  (``grpo.policies``) instead of one shared policy (``--no-two-policies`` skips it).

With ``--seeds N`` each showcase runs N times with ``seed=0..N-1`` (the top-level seed: model build, warm start,
task order, sampling; the held-out tasks stay the same) and reports ``NAME_gain_mean`` / ``_gain_min`` /
``_gain_max`` (GRPO's gain over the start measured in the same run), ``NAME_minutes_max`` and each seed's figures
under ``NAME_seeds``; the targets then hold for the mean, and the smallest gain must be above 0.

Target per showcase: ``val_after - val_before >= 0.10`` with ``NAME_minutes <= 30`` (the SQL showcase: 0.15).
Every showcase's config is a CPU recipe (``RECIPES``: calc_agent, crew_agent, rag_agent, sk_agent, sql_agent). Progress on
stderr; the last stdout line is one JSON object with the machine's facts next to the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import REPO, SMOKE_HELP, log, machine_facts, spread  # noqa: E402

KEYS = ()
NEEDS = {"autogen": ("calc_agent_val_before", "calc_agent_val_after", "calc_agent_minutes", "calc_agent_wall_minutes",
                     "calc_agent_sft_val", "targets_met")}  # fmt: skip
"""``--smoke`` runs calc_agent, AutoGen's showcase: every figure needs AutoGen."""

RECIPES = {"calc_agent": 0.10, "crew_agent": 0.10, "rag_agent": 0.10, "sk_agent": 0.10, "sql_agent": 0.15}
"""Showcases with a CPU recipe in their config.yaml, and the gain each must reach."""
MAX_GRPO_MINUTES = 30
TWO_POLICIES = {"sql_agent": "{write: [write_query], rewrite: [rewrite_query]}"}
"""Showcases measured again with one policy per group of agents (``grpo.policies``) from the same warm start."""


def run_showcase(name: str, out: Path, overrides: list[str]) -> dict:
    """Train ``examples/NAME/config.yaml`` into ``out/NAME`` and return its figures, keys prefixed by ``name``."""
    from lightrail.trainer.config import load_config, train

    t0 = time.monotonic()
    config = load_config(REPO / "examples" / name / "config.yaml", [f"out_dir={out / name}", *overrides])
    report = train(config).report
    wall = (time.monotonic() - t0) / 60
    figures = {
        "val_before": report["val_before"],
        "val_after": report["val_after"],
        "minutes": round(report["train_minutes"], 2),
        "wall_minutes": round(wall, 2),
        "grpo_steps": report["steps"],
    }
    sft = report.get("stages", {}).get("sft")
    if sft is not None:
        figures.update(
            sft_val=sft["val_after"], sft_minutes=round(sft["minutes"], 2), sft_rows=sft["rows"], sft_model=sft["model"]
        )
    return {f"{name}_{key}": value for key, value in figures.items()}


def run_two_policies(name: str, model: str, out: Path, overrides: list[str]) -> dict:
    """The showcase's GRPO stage from ``model`` (its warm start) with `TWO_POLICIES` instead of one shared policy."""
    from lightrail.trainer.config import load_config, train

    policies = [f"model={model}", "algorithm=grpo", "grpo.agents=null", f"grpo.policies={TWO_POLICIES[name]}"]
    config = load_config(
        REPO / "examples" / name / "config.yaml", [f"out_dir={out / (name + '-two-policies')}", *overrides, *policies]
    )
    report = train(config).report
    figures = {"val_before": report["val_before"], "val_after": report["val_after"], "minutes": report["train_minutes"]}
    return {f"{name}_two_policies_{key}": round(value, 4) for key, value in figures.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(RECIPES), action="append", help="run this showcase (repeatable)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="PATH=VALUE",
        help="a config override for every showcase run (as lightrail train --set)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("bench-showcases-%Y%m%d-%H%M%S"))
    parser.add_argument(
        "--two-policies", action=argparse.BooleanOptionalAction, default=True,
        help="also run the SQL showcase's GRPO stage with one policy per agent group (default: yes)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=int, default=1, help="runs per showcase, seeds 0..N-1 (default: 1)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:  # the showcase tests' shortened recipe (tests/examples/one_step.py), one showcase
        sys.path.insert(0, str(REPO / "tests" / "examples"))
        from one_step import SHORT_RECIPE

        args.only, args.two_policies = ["calc_agent"], False
        args.overrides = [*SHORT_RECIPE, "data_args.n_train=8", "data_args.n_val=2", *args.overrides]
    if args.seeds > 1:
        return main_seeds(args)
    out: dict = {**machine_facts(), "overrides": args.overrides}
    log(f"machine: {out}")
    targets = {}
    for name in args.only or sorted(RECIPES):
        log(f"-- {name}: lightrail train examples/{name}/config.yaml")
        figures = run_showcase(name, args.out, args.overrides)
        out.update(figures)
        gain = figures[f"{name}_val_after"] - figures[f"{name}_val_before"]
        targets[f"{name}_gain>={RECIPES[name]}"] = gain >= RECIPES[name]
        targets[f"{name}_minutes<={MAX_GRPO_MINUTES}"] = figures[f"{name}_minutes"] <= MAX_GRPO_MINUTES
        log(f"   {name}: {json.dumps(figures)}")
        if args.two_policies and name in TWO_POLICIES and f"{name}_sft_model" in figures:
            log(f"-- {name}: the GRPO stage again with grpo.policies={TWO_POLICIES[name]}")
            two = run_two_policies(name, figures[f"{name}_sft_model"], args.out, args.overrides)
            out.update(two)
            log(f"   {name} two policies: {json.dumps(two)}")
    out["load_1m_after"] = machine_facts()["load_1m"]
    out["targets_met"] = targets
    print(json.dumps(out))


def main_seeds(args: argparse.Namespace) -> None:
    """Each showcase ``--seeds`` times: the gain's mean, min and max over seeds, and the slowest GRPO stage."""
    out: dict = {**machine_facts(), "overrides": args.overrides, "seeds": args.seeds}
    targets = {}
    for name in args.only or sorted(RECIPES):
        runs = []
        for seed in range(args.seeds):
            log(f"-- {name}, seed {seed}: lightrail train examples/{name}/config.yaml --set seed={seed}")
            figures = run_showcase(name, args.out / f"seed-{seed}", [*args.overrides, f"seed={seed}"])
            runs.append({key.removeprefix(f"{name}_"): value for key, value in figures.items()})
            log(f"   {name}, seed {seed}: {json.dumps(runs[-1])}")
        gains = [r["val_after"] - r["val_before"] for r in runs]
        for key, value in spread(gains).items():
            out[f"{name}_gain_{key}"] = value
        out[f"{name}_minutes_max"] = max(r["minutes"] for r in runs)
        out[f"{name}_seeds"] = runs
        targets[f"{name}_gain_mean>={RECIPES[name]}"] = out[f"{name}_gain_mean"] >= RECIPES[name]
        targets[f"{name}_gain_min>0"] = out[f"{name}_gain_min"] > 0
        targets[f"{name}_minutes_max<={MAX_GRPO_MINUTES}"] = out[f"{name}_minutes_max"] <= MAX_GRPO_MINUTES
    out["load_1m_after"] = machine_facts()["load_1m"]
    out["targets_met"] = targets
    print(json.dumps(out))


if __name__ == "__main__":
    main()
