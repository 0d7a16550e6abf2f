"""False alarms of the run guard on healthy full-size runs: the CPU demo and a showcase, over seeds.

The guard (`lightrail.algorithms.run.guard`) prints ``GRPO step N trained nothing: <cause>`` at a step that trains
nothing and stops a run after ``guard.max_empty_steps`` such steps in a row (exit code 3). On a healthy run either is
a false alarm. This runs each healthy run as a user runs it and counts, from what it printed:

* ``false_alarms``: lines saying a step trained nothing, plus runs the guard stopped (exit code 3);
* ``solved_notes``: steps where every sample of every group succeeded after the run had learned (the guard says
  "nothing left to learn from these tasks" and goes on: not an alarm);
* each run's held-out success before and after GRPO, its exit code and minutes.

    python bench/false_alarms.py --demo-seeds 0 1 2                       # lightrail demo --seed S, one after another
    python bench/false_alarms.py --showcase calc_agent --showcase-seeds 0 1 2
    python bench/false_alarms.py --logs run0.log run1.log                 # count in outputs captured already
    python bench/false_alarms.py --smoke      # a 1-step quick demo: the script runs (its model is barely warm-started,
                                              # so the guard rightly says its step trained nothing: not a healthy run)

Progress on stderr; the last stdout line is one JSON object: ``runs`` (each run's figures), ``false_alarms``,
``solved_notes``, ``load_1m``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._util import log  # noqa: E402

KEYS = ("runs", "false_alarms", "solved_notes", "load_1m")

_HELD_OUT = re.compile(r"held-out success[^\n]*?([0-9.]+)%?\s*(?:->|→)\s*(?:after\s+)?([0-9.]+)%?")
"""``held-out success: 0.61 -> 0.98`` (`lightrail train`) or ``held-out success (200 problems, greedy): before GRPO
61.0% → after 98.5% (+37.5 points)`` (`lightrail demo`)."""


def count(output: str, returncode: int) -> dict[str, object]:
    """What one run's output says: alarms (``trained nothing`` lines, a stop by the guard), solved notes, held-out
    success before and after (the last ``held-out success: A -> B`` line; percentages as fractions)."""
    alarms = len(re.findall(r"trained nothing", output))
    stopped = returncode == 3
    found = _HELD_OUT.findall(output)
    before = after = None
    if found:
        a, b = (float(x) for x in found[-1])
        scale = 100.0 if max(a, b) > 1.0 else 1.0
        before, after = a / scale, b / scale
    return {
        "false_alarms": alarms + (stopped and alarms == 0),
        "solved_notes": len(re.findall(r"nothing left to learn", output)),
        "stopped_by_guard": stopped,
        "returncode": returncode,
        "val_before": before,
        "val_after": after,
    }


def _run(command: list[str], log_path: Path) -> dict[str, object]:
    log(f"running {' '.join(command)} (output: {log_path})")
    started = time.monotonic()
    with log_path.open("w") as out:
        done = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False)
    result = count(log_path.read_text(errors="replace"), done.returncode)
    result["minutes"] = round((time.monotonic() - started) / 60, 1)
    log(f"  -> {result}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo-seeds", type=int, nargs="*", default=[], help="run `lightrail demo --seed S`")
    parser.add_argument("--showcase", default=None, help="a showcase under examples/ (calc_agent, sql_agent...)")
    parser.add_argument("--showcase-seeds", type=int, nargs="*", default=[], help="its seeds")
    parser.add_argument("--logs", type=Path, nargs="*", default=[], help="outputs of runs done already")
    parser.add_argument("--out", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--smoke", action="store_true", help="one quick demo of 1 GRPO step (not a healthy run)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="lightrail-false-alarms-"))
    out.mkdir(parents=True, exist_ok=True)
    lightrail = [sys.executable, "-m", "lightrail"]
    runs: list[dict[str, object]] = []
    if args.smoke:
        quick = [*lightrail, "demo", "--quick", "--steps", "1", "--sft-steps", "10", "--out", str(out / "smoke")]
        runs.append({"run": "demo --quick (smoke)", **_run(quick, out / "smoke.log")})
    for seed in args.demo_seeds:
        command = [*lightrail, "demo", "--seed", str(seed), "--out", str(out / f"demo-{seed}")]
        runs.append({"run": f"demo seed {seed}", **_run(command, out / f"demo-{seed}.log")})
    for seed in args.showcase_seeds:
        config = ROOT / "examples" / str(args.showcase) / "config.yaml"
        command = [*lightrail, "train", str(config), "--set", f"seed={seed}", "--out", str(out / f"showcase-{seed}")]
        runs.append({"run": f"{args.showcase} seed {seed}", **_run(command, out / f"showcase-{seed}.log")})
    for path in args.logs:
        text = path.read_text(errors="replace")
        code = 3 if re.search(r"in a row trained nothing", text) else 0
        runs.append({"run": str(path), **count(text, code)})
    print(
        json.dumps(
            {
                "runs": runs,
                "false_alarms": sum(int(r["false_alarms"]) for r in runs),  # type: ignore[call-overload]
                "solved_notes": sum(int(r["solved_notes"]) for r in runs),  # type: ignore[call-overload]
                "load_1m": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
