"""The demo's measurement: held-out success of the calculator agent before and after GRPO, and the wall time.

    python bench/learning.py                   # default demo: small Llama, SFT warm start, GRPO
    python bench/learning.py --model smollm2   # SmolLM2-135M-Instruct with LoRA, no warm start
    python bench/learning.py --quick           # the short variant the end-to-end test runs

Progress on stderr; the last stdout line is one JSON object with ``val_before``, ``val_after``, ``gain_points``,
``train_minutes`` (GRPO only) and ``wall_minutes`` (everything, warm start included).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ when run from a checkout

from examples.calculator.demo import DemoSettings, run_demo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["small", "tiny", "smollm2"], default="small")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    settings = DemoSettings.choose(args.model, quick=args.quick, seed=args.seed, grpo_steps=args.steps, out=args.out)
    from rich.console import Console

    report = run_demo(settings, console=Console(stderr=True))
    report["gain_points"] = round((report["val_after"] - report["val_before"]) * 100, 1)
    report["n_val"] = settings.n_val
    print(json.dumps(report))


if __name__ == "__main__":
    main()
