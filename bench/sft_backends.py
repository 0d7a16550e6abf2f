"""LLaMA-Factory SFT vs lightrail SFT, held out, on the same rows: the calculator agent's small model distilled from
the scripted imperfect teacher, once by lightrail's own updater and once by LLaMA-Factory's trainer.

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sft_backends.py            # 600 steps of 8 rows each
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sft_backends.py --quick    # a short run, targets not expected
    .venv/bin/python bench/sft_backends.py --smoke    # tiny Llama, 2 steps of 4 rows on 8 problems, 1 runner

1. ``lightrail``: `SFT` with the teacher (`examples/calculator/teacher_server.py`) runs the agent on the training
   problems through 2 runner processes, keeps the right chats (reward 1), trains the ~6.6 M-parameter Llama ``--steps``
   steps of ``--batch`` rows (float32, AdamW, ``--lr`` after 10 warm-up steps) and validates on ``--n-val`` held-out
   problems (greedy), before (``val_before``) and after (``lightrail_val``).
2. ``llamafactory``: `SFT(backend="llamafactory")` on the same store, with the first run's ``traces.json``: the same
   kept rollouts, so the same rows (the teacher is not asked again) drawn in the same order (the run's seeded
   shuffle, read in sequence), the same steps, batch size and optimizer settings, trained by LLaMA-Factory's
   trainer in ``.venv-llamafactory`` (``$LIGHTRAIL_LLAMAFACTORY_PYTHON``, or built by
   ``scripts/_env_llamafactory.sh``); validated the same way (``llamafactory_val``).

The recipe is `bench/sft.py`'s (600 steps of 8 rows on the right chats of 1,000 teacher problems: 0.375 there).
Targets: both runs move the held-out score up from ``val_before`` by at least 0.2, and land within 0.15 of each
other. Progress on stderr; the last stdout line is one JSON object with the machine's facts next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import REPO, SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("val_before", "lightrail_val", "rows", "kept_rollouts", "lightrail_train_minutes", "lightrail_minutes")
NEEDS = {"llamafactory": ("llamafactory_val", "same_rows", "llamafactory_train_minutes", "llamafactory_minutes",
                          "targets_met")}  # fmt: skip
"""Without LLaMA-Factory's venv ``--smoke`` runs the lightrail arm alone (the venv is never built in a smoke run)."""

AGENT = "examples.calculator.train:calculator_agent"


def llamafactory_python() -> str:
    """LLaMA-Factory's interpreter: ``$LIGHTRAIL_LLAMAFACTORY_PYTHON`` when it names a file, else the venv
    ``scripts/_env_llamafactory.sh`` builds (or finds already built); a build that fails raises."""
    python = os.environ.get("LIGHTRAIL_LLAMAFACTORY_PYTHON")
    if python and Path(python).is_file():
        return python
    built = subprocess.run(
        ["bash", str(REPO / "scripts" / "_env_llamafactory.sh")], check=True, capture_output=True, text=True
    )
    return built.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps of each run (default 600; quick 20)")
    parser.add_argument("--batch", type=int, default=8, help="rows per step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--n-train", type=int, default=None, help="training problems (default 1000; quick 60)")
    parser.add_argument("--n-val", type=int, default=None, help="held-out problems (default 200; quick 20)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("bench-sft-backends-%Y%m%d-%H%M%S"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    args.out = args.out.resolve()  # LLaMA-Factory's process runs elsewhere: its train.yaml path must be absolute
    if args.smoke:
        args.steps, args.batch, args.n_train, args.n_val = 2, 4, 8, 2
    steps = args.steps or (20 if args.quick else 600)
    n_train = args.n_train or (60 if args.quick else 1000)
    n_val = args.n_val or (20 if args.quick else 200)
    out: dict = {"quick": args.quick, **machine_facts()}
    log(f"machine: {out}")

    from rich.console import Console

    from examples.calculator.data import make_splits
    from examples.calculator.demo import DemoSettings, build_model
    from examples.calculator.teacher_server import TeacherServer
    from lightrail import Trainer
    from lightrail.algorithms import SFT
    from lightrail.model import UpdateConfig
    from lightrail.store.sqlite import SQLiteStore

    python: str | None
    if args.smoke:  # never builds the venv: without one, the lightrail arm runs alone
        python = os.environ.get("LIGHTRAIL_LLAMAFACTORY_PYTHON") or str(REPO / ".venv-llamafactory" / "bin" / "python")
        if not Path(python).is_file():
            log(f"LLaMA-Factory arm left out: no interpreter at {python} (set LIGHTRAIL_LLAMAFACTORY_PYTHON)")
            python = None
    else:
        python = llamafactory_python()
    train_tasks, val_tasks = make_splits(n_train, n_val, seed=args.seed)
    size = "tiny" if args.smoke else "small"
    model = build_model(DemoSettings(model=size, seed=args.seed, out=args.out), train_tasks, Console(stderr=True))
    store_path = args.out / "store.db"
    settings = dict(
        n_samples=1, min_reward=1.0, steps=steps, batch_size=args.batch, max_len=500,
        config=UpdateConfig(lr=args.lr, warmup_steps=10, seed=args.seed), val_sampling={"temperature": 0.0,
        "max_tokens": 48}, checkpoint_every=0, seed=args.seed,
    )  # fmt: skip
    reports = {}
    runners = 1 if args.smoke else 2
    with TeacherServer(train_tasks + val_tasks, seed=args.seed) as teacher:
        log("-- lightrail SFT (distillation from the scripted teacher)")
        sft = SFT(model, teacher=teacher.llm(), validate_before=True, out_dir=args.out / "lightrail", **settings)
        t0 = time.monotonic()
        Trainer(n_runners=runners, concurrency=24, store=SQLiteStore(store_path), algorithm=sft).fit(
            AGENT, train_tasks, val_tasks
        )
        reports["lightrail"] = {**sft.report, "wall_minutes": (time.monotonic() - t0) / 60}
        log(f"   {reports['lightrail']['val_before']} -> {reports['lightrail']['val_after']}")
        if python is not None:
            reports["llamafactory"] = _llamafactory_arm(
                model, teacher, python, settings, args, runners, (train_tasks, val_tasks)
            )
    lightrail = reports["lightrail"]
    out.update(
        val_before=lightrail["val_before"],
        lightrail_val=lightrail["val_after"],
        rows=lightrail["rows"],
        kept_rollouts=lightrail["kept_rollouts"],
        lightrail_train_minutes=round(lightrail["train_minutes"], 2),
        lightrail_loss_first_last=[round(lightrail["loss_first"], 3), round(lightrail["loss_last"], 3)],
        lightrail_minutes=round(lightrail["wall_minutes"], 2),
        steps=steps,
        batch=args.batch,
        lr=args.lr,
        n_train=n_train,
        n_val=n_val,
        load_1m_after=machine_facts()["load_1m"],
    )
    if "llamafactory" in reports:
        llamafactory = reports["llamafactory"]
        out.update(
            llamafactory_val=llamafactory["val_after"],
            same_rows=lightrail["rows"] == llamafactory["rows"],
            llamafactory_train_minutes=round(llamafactory["train_minutes"], 2),
            llamafactory_loss_first_last=[round(llamafactory["loss_first"], 3), round(llamafactory["loss_last"], 3)],
            llamafactory_minutes=round(llamafactory["wall_minutes"], 2),
        )
        before = out["val_before"] or 0.0
        out["targets_met"] = {
            "lightrail_val>=val_before+0.2": out["lightrail_val"] >= before + 0.2,
            "llamafactory_val>=val_before+0.2": out["llamafactory_val"] >= before + 0.2,
            "|llamafactory_val-lightrail_val|<=0.15": abs(out["llamafactory_val"] - out["lightrail_val"]) <= 0.15,
        }
    print(json.dumps(out))


def _llamafactory_arm(
    model, teacher, python: str, settings: dict, args: argparse.Namespace, runners: int, tasks: tuple[list, list]
) -> dict:
    """`SFT(backend="llamafactory")` on the lightrail arm's store and kept rollouts (its ``traces.json``)."""
    from lightrail import Trainer
    from lightrail.algorithms import SFT
    from lightrail.model.llamafactory import LlamaFactorySettings
    from lightrail.store.sqlite import SQLiteStore

    train_tasks, val_tasks = tasks
    log("-- LLaMA-Factory SFT on the same kept rollouts (the first run's traces.json)")
    (args.out / "llamafactory").mkdir(parents=True, exist_ok=True)
    shutil.copy(args.out / "lightrail" / "traces.json", args.out / "llamafactory" / "traces.json")
    sft = SFT(
        model, teacher=teacher.llm(), resume=True, out_dir=args.out / "llamafactory", backend="llamafactory",
        llamafactory=LlamaFactorySettings(python=python), **settings,
    )  # fmt: skip
    t0 = time.monotonic()
    Trainer(n_runners=runners, concurrency=24, store=SQLiteStore(args.out / "store.db"), algorithm=sft).fit(
        AGENT, train_tasks, val_tasks
    )
    return {**sft.report, "wall_minutes": (time.monotonic() - t0) / 60}


if __name__ == "__main__":
    main()
