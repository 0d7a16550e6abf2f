"""``lightrail learn`` (rounds of learning from rewarded served sessions), ``lightrail policies`` (what is served
and what was promoted) and ``lightrail rollback`` (serve the previous policy again).

Only argparse at import time; the handlers import the rest.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

__all__ = ["add_parser"]

_EXAMPLE = """\
example learn.yaml:
  store: prod.db                       # where `gateway serve --record` records sessions
  policies: policies                   # promoted versions + current.json (`gateway serve --policies` watches it)
  model: runs/calc/final               # version 0, when the policies folder is new
  agent: examples.calculator.agent:solve
  data: examples.calculator.data:make_splits   # its validation split is the gate's held-out set
  data_args: {n_train: 0, n_val: 64}
  min_sessions: 32                     # a round waits for this many newly rewarded sessions
  method: ppo                          # or sft (on sessions rewarded at least sft_min_reward)
  config: {lr: 1.0e-4}                 # UpdateConfig fields (lora, clip_low/high, kl_coef, ...)
  gate: {tolerance: 0.0}               # promote when candidate >= current - tolerance on the held-out set

a round: rewarded served sessions since the last round -> rows (reward - running mean baseline, the recorded
logprobs as the behaviour policy, PPO-clipped ratio) -> one candidate version -> the gate runs the held-out tasks
through real runners against the candidate and the current policy -> promoted (serving gateways swap it in,
in-flight requests finish on the old weights) or rejected (kept under policies/, not served).

examples:
  lightrail learn learn.yaml --once
  lightrail learn learn.yaml --set gate.tolerance=0.05
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``learn``, ``policies`` and ``rollback`` on the main CLI's subparsers."""
    learn = subparsers.add_parser(
        "learn",
        help="learn from rewarded production sessions, gate the candidate, promote it (a loop, or --once)",
        description="Take the served sessions rewarded since the last round, update the current policy off-policy "
        "(or SFT on the best sessions), evaluate the candidate on held-out tasks through real runners, and promote "
        "it unless it regresses. Without --once, repeats every `every_s` seconds until interrupted. One line of "
        "JSON per round goes to stdout and to POLICIES/metrics.jsonl.",
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    learn.add_argument(
        "config", metavar="CONFIG.yaml", help="learn settings (the example below; every field: docs/config.md)"
    )
    learn.add_argument("--once", action="store_true", help="run one round and exit (for cron)")
    learn.add_argument(
        "--force", action="store_true", help="run the round with fewer than min_sessions new sessions (at least one)"
    )
    learn.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field by dotted path, value read as YAML (repeatable), e.g. gate.tolerance=0.05",
    )
    learn.set_defaults(handler=_learn)

    policies = subparsers.add_parser(
        "policies",
        help="show the served policy and every promotion of a policies folder",
        description="Show the policy a policies folder serves now and every promotion and rollback before it.",
        epilog="example:\n  lightrail policies policies/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    policies.add_argument("dir", metavar="POLICIES_DIR", help="the folder `lightrail learn` promotes into")
    policies.set_defaults(handler=_policies)

    rollback = subparsers.add_parser(
        "rollback",
        help="serve the policy before the current one again (as a new version; gateways swap it in)",
        description="Promote the weights of the policy before the current one again, under a new version number "
        "(versions only grow, so every recorded call still names the weights that answered it).",
        epilog="example:\n  lightrail rollback policies/",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rollback.add_argument("dir", metavar="POLICIES_DIR", help="the folder `lightrail learn` promotes into")
    rollback.set_defaults(handler=_rollback)


def _learn(args: argparse.Namespace) -> int:
    import json

    from lightrail.continuous.learn import learn_round, load_learn_config
    from lightrail.trainer.config import ConfigError

    try:
        config = load_learn_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"lightrail learn: {exc}", file=sys.stderr)
        return 2
    console = _console()
    while True:
        try:
            metrics = learn_round(config, console=console, force=args.force)
        except (ValueError, FileNotFoundError) as exc:  # a config that cannot run (no model, no val tasks)
            print(f"lightrail learn: {exc}", file=sys.stderr)
            return 2
        except Exception:  # e.g. the store unreachable: the round is repeated next time (nothing was consumed)
            if args.once:
                raise
            console.print_exception()
            metrics = {"outcome": "error"}
        print(json.dumps(metrics), flush=True)
        if args.once:
            return 0
        try:
            time.sleep(config.every_s)
        except KeyboardInterrupt:
            return 0


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True)


def _policies(args: argparse.Namespace) -> int:
    from lightrail.engine.promotions import PolicyRegistry

    registry = PolicyRegistry(args.dir)
    current = registry.current()
    if current is None:
        print(f"lightrail policies: {registry.file} does not exist", file=sys.stderr)
        return 2
    print(f"serving v{current.version}: {current.path}")
    for policy in registry.history():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(policy.promoted_at))
        val = "-" if policy.val_success is None else f"{policy.val_success:.3f}"
        print(f"  v{policy.version:<4} {when}  {policy.kind:<8} val {val:>5}  {policy.note or policy.path}")
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from lightrail.engine.promotions import PolicyRegistry

    try:
        restored = PolicyRegistry(args.dir).rollback()
    except (FileNotFoundError, ValueError) as exc:
        print(f"lightrail rollback: {exc}", file=sys.stderr)
        return 2
    print(f"serving v{restored.version}: {restored.note}")
    return 0
