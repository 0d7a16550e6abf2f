"""Train–inference mismatch, measured and enforced: does a healthy GRPO run see (almost) none, and is a run whose
weight sync is deliberately broken stopped within one step?

    .venv/bin/python bench/mismatch.py [--steps N]
    .venv/bin/python bench/mismatch.py --smoke     # 2 steps: the fewest that still show the broken run stopped

Two GRPO runs through the real trainer, gateway, embedded engine (float32) and one runner, on the tiny random Llama
(`build_tiny_model`, seed 0), 2 tasks x 4 samples per step, lr 1e-2, the GRPO loop tests' `parity_agent`
(tests/algorithms/loop_agents.py):

* ``healthy``: ``steps`` steps; ``mismatch_kl_mean`` is the largest per-step token mean of the k3 KL between the
  logprobs the engine recorded and the trainer's own for the same tokens (`lightrail.model.mismatch`), next to
  ``approx_kl_float32_max`` (the update's own float32 ``approx_kl`` of the same steps: the baseline the float64
  measurement replaces; it rounds a healthy gap to 0 or to float32 noise).
* ``broken``: the same run with the engine's weight loading skipped (it bumps its version and keeps the start
  weights: a sync that did not take). ``broken_sync_detected`` is 1 when the run stopped with `MismatchError` at the
  step after its first update (within one step); ``broken_stop_kl`` is the KL that tripped `GRPO`'s default
  ``mismatch_stop`` (the size of the update the engine missed: it must stay above the threshold, which is why the
  bench trains at lr 1e-2), ``broken_stop_cause`` the one-line cause.

Progress goes to stderr; the LAST stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ and bench/ when run from a checkout

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("mismatch_stop", "healthy_steps", "mismatch_kl_mean", "mismatch_kl_max", "approx_kl_float32_max",
        "broken_sync_detected", "broken_stop_kl", "broken_stop_cause")  # fmt: skip
AGENT = str(Path(__file__).resolve().parents[1] / "tests" / "algorithms" / "loop_agents.py") + ":parity_agent"


def run(model: Path, out: Path, steps: int) -> tuple[list[dict], str | None]:
    """One GRPO run; its metrics.jsonl records and the cause it stopped with (None when it ran to the end)."""
    from examples.calculator.data import make_splits
    from lightrail import MemoryStore, Trainer
    from lightrail.algorithms.grpo import GRPO
    from lightrail.model import UpdateConfig
    from lightrail.model.mismatch import MismatchError

    train, val = make_splits(16, 2, seed=1)
    grpo = GRPO(
        model, config=UpdateConfig(lr=1e-2), steps=steps, tasks_per_step=2, n_samples=4,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        val_every=0, checkpoint_every=0, out_dir=out,
    )  # fmt: skip
    cause = None
    try:
        Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo).fit(AGENT, train, val)
    except MismatchError as exc:
        cause = str(exc)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], cause


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args()
    if args.smoke:
        args.steps = 2
    from lightrail.algorithms.settings import GRPOSection
    from lightrail.engine import Engine, build_tiny_model

    stop = GRPOSection().mismatch_stop
    result: dict = {**machine_facts(), "steps": args.steps, "mismatch_stop": stop}
    log(f"machine: {result}")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", size="tiny", seed=0)
        records, cause = run(model, Path(tmp) / "healthy", args.steps)
        train = [m for m in records if m["kind"] == "train"]
        log(f"healthy: {[(m['step'], m['mismatch_kl_mean'], m['skipped']) for m in train]}")
        result.update(
            healthy_steps=len(train),
            healthy_stopped=cause,
            mismatch_kl_mean=max(m["mismatch_kl_mean"] for m in train),
            mismatch_kl_max=max(m["mismatch_kl_max"] for m in train),
            mismatch_rows=sum(m["mismatch_rows"] for m in train),
            mismatch_rows_flagged=sum(m["mismatch_rows_flagged"] for m in train),
            approx_kl_float32_max=max(m["kl"] for m in train),
        )
        load_state = Engine._load_state
        Engine._load_state = lambda self, state: None  # the fault: the version advances, the weights stay
        try:
            records, cause = run(model, Path(tmp) / "broken", args.steps)
        finally:
            Engine._load_state = load_state
        train = [m for m in records if m["kind"] == "train"]
        first_update = next((m["step"] for m in train if not m["skipped"]), None)
        stop = next((m for m in records if m["kind"] == "stop"), None)
        log(f"broken: {[(m['step'], m['mismatch_kl_mean'], m['skipped']) for m in train]} stop={stop}")
        result.update(
            broken_sync_detected=int(
                cause is not None and stop is not None and first_update is not None and stop["step"] == first_update + 1
            ),
            broken_stop_step=stop["step"] if stop else None,
            broken_first_update_step=first_update,
            broken_stop_kl=train[-1]["mismatch_kl_mean"] if stop else None,
            broken_stop_cause=cause,
        )
    result["bench_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
