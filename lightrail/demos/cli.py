"""``lightrail demo``: train the bundled calculator agent on this machine's CPU (`lightrail.demos.calculator.demo`).

Everything it runs ships in the package: it never imports the repository's ``examples/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="train the bundled calculator agent with GRPO on the CPU (the README's main command)",
        description=(
            "Build a small model (or load SmolLM2-135M-Instruct), warm-start it on an imperfect teacher, then train "
            "it with GRPO through real runner processes, the gateway, the embedded engine and a SQLite store. "
            "Prints held-out success before and after, and where the reward curve and checkpoint are."
        ),
        epilog="examples:\n  lightrail demo\n  lightrail demo --quick\n  lightrail demo --model smollm2",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", choices=["small", "tiny", "smollm2"], default="small",
                        help="small: ~6M-parameter Llama built here (default); smollm2: packaged SmolLM2-135M with LoRA")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a minutes-long variant (what the end-to-end test runs)")
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: 40, quick: 16, smollm2: 12)")
    parser.add_argument(
        "--sft-steps", type=int, default=None, help="supervised warm-start steps (default: 300; smollm2: none)"
    )
    parser.add_argument("--runners", type=int, default=2, help="runner processes (default: 2)")
    parser.add_argument(
        "-k",
        "--concurrency",
        type=int,
        default=None,
        help="rollouts at once per runner (default: 24, tuned for the demo's small model; smollm2: 8)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data, the model and sampling (default: 0)")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: runs/demo-<time>)")
    parser.set_defaults(handler=_demo)


def _demo(args: argparse.Namespace) -> int:
    try:
        from lightrail.demos.calculator.demo import DemoSettings, run_demo
        from lightrail.demos.calculator.train import calculator_agent  # noqa: F401 - the agent needs openai
    except ModuleNotFoundError as exc:
        raise SystemExit(
            f"lightrail demo needs the training and agent dependencies ({exc}): pip install 'lightrail[train,openai]'"
        ) from None
    settings = DemoSettings.choose(
        args.model,
        quick=args.quick,
        grpo_steps=args.steps,
        sft_steps=args.sft_steps,
        out=args.out,
        seed=args.seed,
        runners=args.runners,
        concurrency=args.concurrency,
    )
    run_demo(settings)
    return 0
