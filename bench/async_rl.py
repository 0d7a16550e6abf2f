"""Asynchronous against synchronous GRPO on the calculator demo whose tool calls take a heavy-tailed delay.

    python bench/async_rl.py            # small Llama, SFT warm start, 2 x 48 GRPO steps, max_staleness 2
    python bench/async_rl.py --quick    # tiny Llama, short warm start, 2 x 8 steps (what a busy machine allows)
    python bench/async_rl.py --smoke    # tiny Llama, 2 SFT steps, 2 x 2 steps of 2 x 2 rollouts, short delays

One warm start (the demo's model and SFT pass), then two GRPO runs from it in the same process, same seed, same task
order and the same sample budget (steps x tasks x samples): sync and async (``async_={"max_staleness": ...}``). Every calculator
call of a training rollout sleeps ``min(scale * Pareto(alpha), cap)`` seconds, keyed by (question, sample, call) so
a rollout waits the same in both arms (`bench/_async_agent.py`). Every ``val_every`` steps the bench copies the
policy's weights with the training time so far; the copies are scored after the arm (greedy, on the held-out tasks,
undelayed), so the clock never stops for a validation. (Validating inside the run, as an earlier version of this
bench did, stops the clock while an async arm's next batch keeps sampling: free rollout time for async only.)

Settings of the full variant, and why: 48 steps, because "time to reach sync's final" only measures speed once sync
nears its plateau (over 24 steps sync was often still climbing, and the figure became a coin flip between two noisy
final scores); ``max_staleness`` 2 (``ahead`` 2, prime-rl's default ``async_level``), because a step whose slowest
rollout takes L seconds and whose update takes U settles at about (U + L) / (1 + ahead) seconds: with L ~ 8 s and
U ~ 2-4 s here, ahead 1 leaves async waiting on the tail and ahead 2 makes it update-bound (RESULTS.md has both).

The last stdout line is one JSON object:

* ``async_speedup``: training time for sync to reach its final held-out success ÷ time for async to first reach it
  (None when async never does); ``train_time_ratio``: sync's whole training time ÷ async's (same budget);
* ``async_final_gap_pts``: (sync final − async final) held-out success, in points;
* ``staleness_max``: the largest staleness of any trained call in the async arm (``max_staleness`` bounds it), and
  ``rows_stale_dropped`` (calls dropped for it);
* ``long_rollout_share_ratio``: the share of trained calls that belong to the slowest decile of the arm's rollouts
  (by wall time), async ÷ sync (1: async trains long rollouts as much as sync does);
* ``is_weight_mean``, ``is_clipped_frac`` (async, mean over steps), each arm's curve, and the machine's facts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._util import SMOKE_HELP, fit_arm, log, machine_facts  # noqa: E402

KEYS = ("async_speedup", "train_time_ratio", "async_final_gap_pts", "staleness_max", "max_staleness",
        "rows_stale_dropped", "long_rollout_share_ratio", "is_weight_mean", "is_clipped_frac", "sync", "async",
        "settings", "wall_minutes")  # fmt: skip

AGENT = "bench._async_agent:delayed_calculator_agent"


def _timed_grpo_class() -> type:
    from lightrail.algorithms.grpo import GRPO

    class TimedGRPO(GRPO):
        """`GRPO` whose validations are weight snapshots: at each one it copies the policy's weights with the training
        time so far (the copy's own time excluded) and counts the calls each rollout had trained. The snapshots are
        scored after the run (`ScoreSnapshots`), so no validation runs while an async arm's rollouts sample."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.started = 0.0
            self.paused = 0.0
            self.snapshots: dict[int, tuple[float, dict[str, Any]]] = {}  # step -> (train seconds, weights)
            self.trained_calls: Counter[str] = Counter()

        async def run(self, ctx: Any) -> None:
            self.started = time.monotonic()
            await super().run(ctx)

        def train_seconds(self) -> float:
            return time.monotonic() - self.started - self.paused

        async def _validate(self, ctx: Any) -> float | None:
            at = self.train_seconds()
            t0 = time.monotonic()
            weights = self._slots[0].updater.state_dict_for_serving()
            self.snapshots.setdefault(self.step, (at, {k: v.clone() for k, v in weights.items()}))
            self.paused += time.monotonic() - t0
            return None

        async def _update(self, slot: Any, transitions: Any) -> Any:
            metrics, trained = await super()._update(slot, transitions)
            self.trained_calls.update(t.rollout_id for t in trained)
            return metrics, trained

    return TimedGRPO


class ScoreSnapshots:
    """An `Algorithm` that scores weight snapshots on the held-out tasks, one after another, on one embedded engine
    behind a gateway: greedy, undelayed, through the same runner process as training."""

    def __init__(self, model: Path, snapshots: dict[int, tuple[float, dict[str, Any]]], grpo: Any) -> None:
        self.model, self.snapshots = model, snapshots
        self.sampling, self.threshold = grpo.val_sampling, grpo.success_threshold  # the arm's own validation
        self.scores: dict[int, float] = {}
        self._served: Any = None

    async def setup(self, ctx: Any) -> None:
        from lightrail.algorithms.run.policy import ServedPolicy

        self._served = await ServedPolicy.embedded(self.model, ctx.store)

    async def run(self, ctx: Any) -> None:
        from lightrail.algorithms.run.policy import validate

        engine = self._served.engine.engine
        llm = self._served.llm(self.sampling)
        for version, (step, (_, weights)) in enumerate(sorted(self.snapshots.items()), start=1):
            await engine.update_weights(weights, version=version)
            self.scores[step] = (await validate(ctx, ctx.val_tasks, llm, self.threshold)).success
            log(f"snapshot at step {step}: held out {self.scores[step]:.3f}")

    async def close(self) -> None:
        if self._served is not None:
            await self._served.close()


def run_arm(mode: str, model: Path, args: argparse.Namespace, train: list, val: list, out: Path) -> dict[str, Any]:
    from rich.console import Console

    from lightrail import Trainer
    from lightrail.adapters import ToolRewardRule
    from lightrail.model import UpdateConfig

    durations = out / f"{mode}-durations.jsonl"
    durations.unlink(missing_ok=True)
    os.environ["LIGHTRAIL_BENCH_DURATIONS"] = str(durations)
    grpo = _timed_grpo_class()(
        model,
        config=UpdateConfig(lr=args.lr, warmup_steps=2, kl_coef=0.05, seed=args.seed),
        steps=args.steps,
        tasks_per_step=args.tasks_per_step,
        n_samples=args.n_samples,
        sampling={"temperature": 1.0, "max_tokens": 48},
        val_sampling={"temperature": 0.0, "max_tokens": 48},
        val_every=args.val_every,
        tool_rewards=ToolRewardRule(success=0.1, error=-0.1),
        merge_calls=True,
        checkpoint_every=0,
        out_dir=out / mode,
        seed=args.seed,
        **({"async_": {"max_staleness": args.max_staleness}} if mode == "async" else {}),
    )
    steps = fit_arm(grpo, AGENT, train, val, store=out / f"{mode}-store.db", concurrency=args.concurrency)
    scoring = ScoreSnapshots(model, grpo.snapshots, grpo)
    Trainer(n_runners=1, concurrency=args.concurrency, store=str(out / f"{mode}-scores.db"), algorithm=scoring,
            console=Console(stderr=True)).fit(AGENT, [], val)  # fmt: skip
    curve = [(grpo.snapshots[step][0], scoring.scores[step]) for step in sorted(grpo.snapshots)]
    seconds = {}
    for line in durations.read_text().splitlines():
        d = json.loads(line)
        seconds[d["rollout_id"]] = d["seconds"]  # (a retried rollout: its last attempt)
    slowest = sorted(seconds, key=seconds.get, reverse=True)[: max(1, len(seconds) // 10)]
    trained = sum(grpo.trained_calls.values())
    return {
        "curve": [(round(t, 1), s) for t, s in curve],
        "final": curve[-1][1],
        "train_s": curve[-1][0],
        "rollouts": len(seconds),
        "slowest_decile_s": min(seconds[r] for r in slowest) if seconds else None,
        "long_share": sum(grpo.trained_calls[r] for r in slowest) / trained if trained else 0.0,
        "staleness_max": max((m.get("staleness_max", 0) for m in steps), default=0),
        "rows_stale_dropped": sum(m.get("dropped_stale", 0) for m in steps),
        "is_weight_mean": statistics.fmean(m["is_weight_mean"] for m in steps) if mode == "async" else None,
        "is_clipped_frac": statistics.fmean(m["is_clipped_frac"] for m in steps) if mode == "async" else None,
        "rollout_s": sum(m["rollout_s"] for m in steps),
        "update_s": sum(m["update_s"] for m in steps),
    }


def time_to_reach(curve: list[tuple[float, float | None]], target: float) -> float | None:
    """The training time of the first validation at or above ``target`` (None: never)."""
    return next((t for t, s in curve if s is not None and s >= target - 1e-9), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--delay", default="0.1,1.0,6.0", help="scale,alpha,cap of the tool delay (seconds)")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs") / time.strftime("async-rl-%Y%m%d-%H%M%S"))
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    quick = dict(model="tiny", n_train=400, n_val=60, sft_steps=60, steps=8, tasks_per_step=4, n_samples=4,
                 val_every=2, concurrency=32, lr=1e-4)  # fmt: skip
    full = dict(model="small", n_train=2000, n_val=200, sft_steps=300, steps=48, tasks_per_step=8, n_samples=8,
                val_every=4, concurrency=64, lr=1e-4)  # fmt: skip
    smoke = dict(model="tiny", n_train=16, n_val=2, sft_steps=2, steps=2, tasks_per_step=2, n_samples=2,
                 val_every=1, concurrency=4, lr=1e-4)  # fmt: skip
    for key, value in (smoke if args.smoke else quick if args.quick else full).items():
        setattr(args, key, value)
    if args.smoke:
        args.delay = "0.01,1.0,0.05"
    os.environ["LIGHTRAIL_BENCH_DELAY"] = args.delay
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    from rich.console import Console

    from lightrail.demos.calculator.data import make_splits
    from lightrail.demos.calculator.demo import DemoSettings, build_model, warm_start

    args.out.mkdir(parents=True, exist_ok=True)
    settings = DemoSettings(model=args.model, n_train=args.n_train, n_val=args.n_val, sft_steps=args.sft_steps,
                            seed=args.seed, out=args.out)  # fmt: skip
    console = Console(stderr=True)
    train, val = make_splits(settings.n_train, settings.n_val, seed=args.seed)
    started = time.monotonic()
    model = warm_start(settings, build_model(settings, train, console), train, console)
    log(f"warm start done in {time.monotonic() - started:.0f} s")
    arms = {}
    for mode in ("sync", "async"):
        arms[mode] = run_arm(mode, model, args, train, val, args.out)
        log(mode, json.dumps(arms[mode]))
    sync, asyn = arms["sync"], arms["async"]
    t_sync = time_to_reach(sync["curve"], sync["final"])
    t_async = time_to_reach(asyn["curve"], sync["final"])
    result = {
        # None also when sync's final success was already reached before training (nothing to time)
        "async_speedup": round(t_sync / t_async, 2) if t_sync and t_async and t_sync > 1 and t_async > 1 else None,
        "train_time_ratio": round(sync["train_s"] / asyn["train_s"], 2),
        "async_final_gap_pts": round((sync["final"] - asyn["final"]) * 100, 1),
        "staleness_max": asyn["staleness_max"],
        "max_staleness": args.max_staleness,
        "rows_stale_dropped": asyn["rows_stale_dropped"],
        "long_rollout_share_ratio": round(asyn["long_share"] / sync["long_share"], 3) if sync["long_share"] else None,
        "is_weight_mean": asyn["is_weight_mean"],
        "is_clipped_frac": asyn["is_clipped_frac"],
        "sync": sync,
        "async": asyn,
        "settings": {k: getattr(args, k) for k in (*quick, "delay", "seed")},
        "wall_minutes": round((time.monotonic() - started) / 60, 1),
        **machine_facts(),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
