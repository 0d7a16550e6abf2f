"""SFT from traces, measured: the calculator agent's small model distilled from the scripted imperfect teacher, then
``algorithm: [sft, grpo]`` in one config.

    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sft.py              # sft then grpo, one config
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sft.py --quick      # fewer steps (a smoke run, targets not expected)
    LIGHTRAIL_TORCH_THREADS=2 .venv/bin/python bench/sft.py --only sft   # the distillation alone (algorithm: sft)
    ... bench/sft.py --sft-autocast none        # the SFT stage in float32 (the default on a CPU without AMX)
    ... bench/sft.py --smoke                    # 2 SFT steps of 4 rows, 1 GRPO step of 2 x 2, 1 runner

One `lightrail train` run with ``algorithm: [sft, grpo]``; its SFT stage gives the ``sft_*`` figures.

1. SFT stage: the teacher (`examples/calculator/teacher_server.py`: the
   demo's imperfect teacher as an OpenAI-compatible endpoint) runs the agent on the training problems through 2
   runner processes, behind the SFT's recording gateway; every teacher chat is kept (``--sft-min-reward 1`` keeps
   the right ones only), mistakes included, as the demo's warm start does: the student inherits the teacher's
   systematic habits, which GRPO then fixes; the ~6.6 M-parameter Llama is fine-tuned on them, 300 steps of 32
   rows, in bfloat16 mixed precision on a CPU with AMX (``--sft-autocast``); held-out success (greedy, ``n_val``
   problems) is ``sft_val``; ``sft_minutes`` is the whole stage (teacher rollouts, training, export, validation).
2. GRPO stage (the demo's recipe, each rollout's calls trained as one row; 50 steps) from the SFT stage's weights:
   ``chained_val_after`` (held-out success after GRPO) and ``chained_minutes`` (the whole run, SFT stage included).

Both stages run through 2 runner processes with ``--concurrency`` (24) rollouts each.

Targets: ``sft_val >= 0.35`` with ``sft_minutes <= 5``; ``chained_val_after >= sft_val + 0.3`` with
``chained_minutes <= 15``. Progress on stderr; the last stdout line is one JSON object with the machine's facts
(cores, load) next to the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import SMOKE_HELP, cpu_amx, log, machine_facts  # noqa: E402

KEYS = ("sft_val", "sft_minutes", "sft_rows", "sft_kept_rollouts", "sft_loss_first", "sft_loss_last",
        "chained_val_after", "chained_minutes", "targets_met")  # fmt: skip

AGENT = "examples.calculator.train:calculator_agent"


def _config(model: Path, out: Path, teacher_url: str, teacher_key: str, args: argparse.Namespace, chain: bool) -> str:
    sft = {
        "teacher": {
            "endpoint": teacher_url,
            "model": "teacher",
            "api_key": teacher_key,
            "sampling": {"max_tokens": 200},
        },
        "n_samples": 1,
        "min_reward": args.sft_min_reward,
        "steps": args.sft_steps,
        "batch_size": args.sft_batch,
        "max_len": 500,
        "val_sampling": {"temperature": 0.0, "max_tokens": 48},
        "val_every": args.sft_val_every,
        "checkpoint_every": 0,
        "config": {
            "lr": args.sft_lr,
            "warmup_steps": 10,
            **({"decay_steps": args.sft_steps} if args.sft_decay else {}),
            **({"autocast": args.sft_autocast} if args.sft_autocast else {}),
        },
    }
    config = {
        "name": "bench-sft",
        "agent": AGENT,
        "data": "examples.calculator.data:make_splits",
        "data_args": {"n_train": args.n_train, "n_val": args.n_val, "seed": args.seed},
        "model": str(model),
        "out_dir": str(out),
        "seed": args.seed,
        "trainer": {"n_runners": 1 if args.smoke else 2, "concurrency": args.concurrency},
        "algorithm": ["sft", "grpo"] if chain else "sft",
        "sft": sft,
    }
    if chain:
        config["grpo"] = {  # the demo's recipe (examples/calculator/demo.py)
            "steps": args.grpo_steps,
            "tasks_per_step": 2 if args.smoke else 12,
            "n_samples": 2 if args.smoke else 8,
            "val_every": 0,
            "checkpoint_every": 0,
            "sampling": {"temperature": args.grpo_temperature, "max_tokens": 48},
            "val_sampling": {"temperature": 0.0, "max_tokens": 48},
            "tool_rewards": {"success": 0.1, "error": -0.1},
            "filter_groups": args.grpo_filter_groups,
            "merge_calls": args.grpo_merge_calls,
            "config": {"lr": args.grpo_lr, "warmup_steps": 5, "kl_coef": 0.05},
        }
    path = out.with_suffix(".yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return str(path)


def _sft_figures(report: dict) -> dict:
    return {
        "sft_val": report["val_after"],
        "sft_minutes": round(report["minutes"], 2),
        "sft_collect_minutes": round(report["collect_minutes"], 2),
        "sft_train_minutes": round(report["train_minutes"], 2),
        "sft_rows": report["rows"],
        "sft_kept_rollouts": report["kept_rollouts"],
        "sft_dropped": report["dropped"],
        "sft_loss_first": round(report["loss_first"], 3),
        "sft_loss_last": round(report["loss_last"], 3),
        "load_1m_after_sft": machine_facts()["load_1m"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=["sft"], help="the SFT alone (algorithm: sft), no GRPO")
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--sft-batch", type=int, default=32, help="rows per SFT step")
    parser.add_argument(
        "--sft-decay", action="store_true", help="the SFT rate falls linearly to 0 at the last step (decay_steps)"
    )
    parser.add_argument(
        "--sft-autocast",
        choices=["auto", "bfloat16", "none"],
        default="auto",
        help="the SFT stage's mixed precision (UpdateConfig.autocast); auto: bfloat16 on a CPU with AMX (1.4x faster "
        "steps there), else none (float32)",
    )
    parser.add_argument(
        "--sft-val-every",
        type=int,
        default=0,
        help="also validate every N SFT steps (the learning curve in metrics.jsonl; adds to sft_minutes)",
    )
    parser.add_argument(
        "--sft-min-reward",
        type=lambda v: None if v == "none" else float(v),
        default=None,
        help="keep teacher rollouts with at least this reward (default 'none': keep every one, as the demo does)",
    )
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: 50; --quick: 4)")
    parser.add_argument("--grpo-lr", type=float, default=1e-4, help="the GRPO stage's learning rate (the demo's: 1e-4)")
    parser.add_argument(
        "--grpo-temperature", type=float, default=1.0, help="the GRPO stage's sampling temperature (the demo's: 1.0)"
    )
    parser.add_argument(
        "--grpo-filter-groups",
        action="store_true",
        help="the GRPO stage drops and replaces groups with no signal (DAPO)",
    )
    parser.add_argument(
        "--grpo-merge-calls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the GRPO stage trains each rollout's calls as one row (the same step, fewer tokens)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=24,
        help="rollouts in flight per runner process (2 runners): 24 fill up to 48 of the engine's 64 batch rows "
        "during validation and GRPO's groups (8: 16)",
    )
    parser.add_argument("--n-train", type=int, default=None)
    parser.add_argument("--n-val", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("bench-sft-%Y%m%d-%H%M%S"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.sft_steps, args.sft_batch, args.grpo_steps, args.n_train, args.n_val = 2, 4, 1, 8, 2
        args.sft_autocast, args.concurrency = "none", 4
    if args.sft_autocast == "auto":
        args.sft_autocast = "bfloat16" if cpu_amx() else "none"
    args.sft_autocast = None if args.sft_autocast == "none" else args.sft_autocast
    args.sft_steps = args.sft_steps or (60 if args.quick else 300)
    args.grpo_steps = args.grpo_steps or (4 if args.quick else 50)
    args.n_train = args.n_train or (300 if args.quick else 2000)
    args.n_val = args.n_val or (40 if args.quick else 200)
    out: dict = {"quick": args.quick, **machine_facts()}
    log(f"machine: {out}")

    from rich.console import Console

    from examples.calculator.data import make_splits
    from examples.calculator.demo import DemoSettings, build_model
    from examples.calculator.teacher_server import TeacherServer
    from lightrail.trainer.config import load_config, train

    train_tasks, val_tasks = make_splits(args.n_train, args.n_val, seed=args.seed)
    size = "tiny" if args.smoke else "small"
    model = build_model(DemoSettings(model=size, seed=args.seed, out=args.out), train_tasks, Console(stderr=True))
    with TeacherServer(train_tasks + val_tasks, seed=args.seed) as teacher:
        if args.only == "sft":
            log("-- sft alone (algorithm: sft, distillation from the scripted teacher)")
            path = _config(model, args.out / "sft", teacher.url, teacher.token, args, chain=False)
            out.update(_sft_figures(train(load_config(path)).report))
        else:
            log("-- sft then grpo (algorithm: [sft, grpo]); the SFT stage's figures are sft_*")
            t0 = time.monotonic()
            path = _config(model, args.out / "chained", teacher.url, teacher.token, args, chain=True)
            report = train(load_config(path)).report
            out.update(_sft_figures(report["stages"]["sft"]))
            out.update(
                chained_val_after=report["val_after"],
                chained_minutes=round((time.monotonic() - t0) / 60, 2),
                chained_grpo_minutes=round(report["train_minutes"], 2),
                load_1m_after=machine_facts()["load_1m"],
            )
    out.update(
        sft_steps=args.sft_steps,
        sft_batch=args.sft_batch,
        sft_min_reward=args.sft_min_reward,
        sft_decay=args.sft_decay,
        sft_autocast=args.sft_autocast,
        grpo_steps=args.grpo_steps,
        grpo_lr=args.grpo_lr,
        grpo_temperature=args.grpo_temperature,
        grpo_filter_groups=args.grpo_filter_groups,
        grpo_merge_calls=args.grpo_merge_calls,
        n_train=args.n_train,
        n_val=args.n_val,
        concurrency=args.concurrency,
    )
    targets = {}
    if "sft_val" in out:
        targets["sft_val>=0.35"] = out["sft_val"] >= 0.35
        targets["sft_minutes<=5"] = out["sft_minutes"] <= 5
    if "chained_val_after" in out:
        targets["chained_val_after>=sft_val+0.3"] = out["chained_val_after"] >= out["sft_val"] + 0.3
        targets["chained_minutes<=15"] = out["chained_minutes"] <= 15
    out["targets_met"] = targets
    print(json.dumps(out))


if __name__ == "__main__":
    main()
