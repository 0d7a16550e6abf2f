"""``lightrail learn CONFIG``: learn from rewarded production sessions, gate the result, promote it.

One round::

    store: served sessions rewarded since the last round (mode served, status succeeded: feedback arrived)
      ──build_episode──► calls sampled at the learning temperature, by a policy at most max_staleness versions old
      ──advantages (reward − running baseline), credit per call──► rows (recorded token ids and logprobs)
      ──PolicyUpdater.step (PPO-clipped ratio against the recorded logprobs; or SFT on the best sessions)──►
      candidate v(N+1) exported as a servable folder
      ──gate: the candidate and the current policy on fixed held-out tasks through real runners──►
      promoted (policies/current.json names it; serving gateways swap it in) or rejected (kept, not served)

**Why a running mean baseline.** GRPO's baseline is the mean reward of other samples of the same prompt; served
traffic has one sample per prompt, so there is no group. Clustering similar prompts would need an embedding model
and a similarity threshold that no default fits every agent. The running mean of rewards over earlier rounds (an
exponential moving average, ``baseline_decay``) is what REINFORCE with a baseline uses: it is independent of the
round's own samples, so the advantage estimate stays unbiased, and it needs nothing but the rewards. The first
round, with no history, uses its own batch mean. Advantages are not divided by a standard deviation (sparse 0/1
rewards give tiny deviations early and huge advantages with them).

**Off-policy.** Sessions were sampled by the policy that served them, which may be older than the one being
updated: every row carries its recorded logprobs and policy version, the loss is the PPO-clipped importance ratio
against them (`UpdateConfig.clip_low`/``clip_high``), and rows more than ``max_staleness`` versions behind are
dropped (counted). Calls sampled at another temperature than ``temperature`` (greedy calls among them) have logprobs
of another distribution and are left out (counted).

**Nothing is consumed twice or lost.** The round's cursor (the newest feedback time it read) is saved only after the
round ends (promoted or rejected); a crash mid-round repeats the round. A session without feedback is never read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import msgspec

from lightrail.algorithms.run.folder import RunFolder
from lightrail.algorithms.run.guard import update_health
from lightrail.algorithms.run.policy import ServedPolicy, validate
from lightrail.engine.promotions import PolicyRegistry
from lightrail.trainer.learn_config import GateSettings, LearnConfig
from lightrail.types import Attr, Rollout, RolloutStatus

__all__ = ["GateSettings", "LearnConfig", "LearnState", "learn_round", "served_rows"]


class LearnState(msgspec.Struct, kw_only=True):
    """What the rounds have consumed (``learn_state.json`` in the policies folder)."""

    cursor: float = 0.0
    """Sessions whose feedback ended them at or before this time were read by an earlier round."""
    seen_at_cursor: list[str] = msgspec.field(default_factory=list)
    """Sessions ended exactly at ``cursor`` that were read (ties of the time stamp)."""
    baseline: float | None = None
    rounds: int = 0


# -- rows from sessions ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RowsReport:
    sessions: int = 0
    calls: int = 0
    temperature_excluded: int = 0
    rows: int = 0
    reward_mean: float = 0.0
    baseline: float | None = None


def served_rows(
    sessions: list[tuple[Rollout, Any]],
    *,
    baseline: float | None,
    temperature: float,
    credit: Any,
    agents: Any = None,
    method: str = "ppo",
    sft_min_reward: float = 1.0,
) -> tuple[list[Any], RowsReport]:
    """Training rows of rewarded sessions (``(rollout, episode)`` pairs): advantage = reward − ``baseline`` (the
    round's mean when None) spread over calls by ``credit``; for ``sft`` only sessions rewarded at least
    ``sft_min_reward``, every call weighted 1."""
    from lightrail.adapters import episode_transitions, to_rows

    report = RowsReport(sessions=len(sessions))
    outcomes = [_outcome(r, e) for r, e in sessions]
    report.reward_mean = statistics.fmean(outcomes) if outcomes else 0.0
    base = report.reward_mean if baseline is None else baseline
    report.baseline = base
    transitions = []
    for (rollout, episode), outcome in zip(sessions, outcomes, strict=True):
        calls = episode.calls
        report.calls += len(calls)
        off = [c for c in calls if _temperature(c) != temperature]
        if off:  # logprobs of another distribution: the whole session is left out (its credit spans its calls)
            report.temperature_excluded += len(calls)
            continue
        if method == "sft":
            if outcome < sft_min_reward:
                continue
            ones = [1.0] * len(calls)
            transitions += episode_transitions(episode, ones, ones, agents=agents, group_id=rollout.rollout_id)
            continue
        returns = credit(calls, outcome, episode.intermediate)
        advantages = credit(calls, outcome - base, episode.intermediate)
        transitions += episode_transitions(episode, returns, advantages, agents=agents, group_id=rollout.rollout_id)
    rows, _ = to_rows(transitions)
    report.rows = len(rows)
    return rows, report


def _outcome(rollout: Rollout, episode: Any) -> float:
    if episode.final_reward is not None:
        return float(episode.final_reward)
    return float(rollout.reward or 0.0)


def _temperature(call: Any) -> float:
    request = call.span.attributes.get(Attr.REQUEST)
    value = request.get("temperature") if isinstance(request, dict) else None
    return 1.0 if value is None else float(value)  # OpenAI's default


# -- one round ---------------------------------------------------------------------------------------------------


async def _rewarded_sessions(config: LearnConfig, state: LearnState) -> list[tuple[Rollout, list[Any]]]:
    from lightrail.store import open_store

    store = open_store(config.store)
    try:
        rollouts = await store.query_rollouts(status=[RolloutStatus.SUCCEEDED])
        seen = set(state.seen_at_cursor)
        fresh = [
            r
            for r in rollouts
            if r.mode == "served"
            and r.ended_at is not None
            and (r.ended_at > state.cursor or (r.ended_at == state.cursor and r.rollout_id not in seen))
        ]
        fresh.sort(key=lambda r: (r.ended_at, r.rollout_id))
        fresh = fresh[: config.max_sessions]
        return [(r, await store.query_spans(r.rollout_id)) for r in fresh]
    finally:
        await store.close()


def learn_round(config: LearnConfig, *, console: Any = None, force: bool = False) -> dict[str, Any]:
    """Run one round (see the module docstring); returns its metrics (also appended to ``metrics.jsonl``).

    ``force`` runs the round with fewer than ``min_sessions`` new sessions (at least one)."""
    from lightrail.adapters import AgentFilter, build_episode, credit_by_name
    from lightrail.engine.models import prepare_model
    from lightrail.model.updater import PolicyUpdater
    from lightrail.trainer.config import checked_update_config

    started = time.time()
    registry = PolicyRegistry(config.policies)
    if registry.current() is None:
        if config.model is None:
            raise ValueError(f"{config.policies} has no policies yet: set model (the initial policy)")
        registry.init(prepare_model(config.model))
    current = registry.current()
    assert current is not None
    state_file = registry.root / "learn_state.json"
    state = msgspec.json.decode(state_file.read_bytes(), type=LearnState) if state_file.exists() else LearnState()

    sessions = asyncio.run(_rewarded_sessions(config, state))
    metrics: dict[str, Any] = {"round": state.rounds + 1, "policy_version": current.version, "sessions": len(sessions)}
    if not sessions or (len(sessions) < config.min_sessions and not force):
        metrics["outcome"] = "waiting"
        return metrics
    pairs = [(rollout, build_episode(spans)) for rollout, spans in sessions]
    agents = AgentFilter(names=tuple(config.agents)) if config.agents else None
    rows, report = served_rows(
        pairs,
        baseline=state.baseline,
        temperature=config.temperature,
        credit=credit_by_name(config.credit),
        agents=agents,
        method=config.method,
        sft_min_reward=config.sft_min_reward,
    )
    metrics.update(dataclasses.asdict(report))
    version, folder = registry.reserve()
    metrics["candidate"] = version
    settings = checked_update_config({"temperature": config.temperature, **config.config}, "config")
    update: dict[str, Any] = {"skipped": 1, "rows_stale_dropped": 0}
    if rows:
        updater = PolicyUpdater(current.path, settings)
        try:
            objective: Literal["grpo", "sft"] = "sft" if config.method == "sft" else "grpo"
            for _ in range(config.updates):
                update = updater.step(
                    rows, current_version=current.version, max_staleness=config.max_staleness, objective=objective
                )
            if not update.get("skipped", 1):
                _export(updater, folder)
        finally:
            updater.close()
    metrics.update(
        {
            "loss": update.get("loss"),
            "kl": update.get("approx_kl"),
            "clip_frac": update.get("clip_frac"),
            "rows_stale_dropped": update.get("rows_stale_dropped", 0),
            "updated": not update.get("skipped", 1),
        }
    )
    if metrics["updated"]:
        gate = _gate(config, registry, current, folder, console)
        metrics.update(gate)
        latest = registry.current()
        if latest is not None and latest.version != current.version:
            metrics["outcome"] = "superseded"  # promoted or rolled back meanwhile: trained from another policy
        elif gate["promote"]:
            registry.promote(version, folder, val_success=gate["val_candidate"], note=f"learn round {metrics['round']}")
            metrics["outcome"] = "promoted"
        else:
            metrics["outcome"] = "rejected"
            if not config.keep_rejected:
                shutil.rmtree(folder, ignore_errors=True)
    else:
        metrics["outcome"] = "nothing_to_learn"
        # the round's health: said at the round, not left to a reader of learn.jsonl
        health = update_health(int(metrics["round"]), update, 0)
        why = health.problem() if rows else (
            f"no trainable row from {report.sessions} sessions ({report.calls} calls, "
            f"{report.temperature_excluded} left out for their sampling temperature)"
        )  # fmt: skip
        metrics["cause"] = why
        from rich import get_console
        from rich.markup import escape

        (console or get_console()).print(
            f"[bold yellow]learn round {metrics['round']} trained nothing[/bold yellow]: {escape(str(why))}"
        )
    # the round is done: its sessions are consumed whatever the gate said, and the baseline moves
    last = sessions[-1][0].ended_at or state.cursor
    state.seen_at_cursor = [r.rollout_id for r, _ in sessions if r.ended_at == last] + (
        state.seen_at_cursor if last == state.cursor else []
    )
    state.cursor = last
    decay = config.baseline_decay
    batch = report.reward_mean
    state.baseline = batch if state.baseline is None else decay * state.baseline + (1 - decay) * batch
    state.rounds += 1
    metrics["minutes"] = (time.time() - started) / 60
    metrics["finished_at"] = time.time()
    _save_state(state_file, state)
    RunFolder(registry.root, "learn").append(metrics)
    return metrics


def _save_state(path: Path, state: LearnState) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(msgspec.json.encode(state))
    tmp.replace(path)


def _export(updater: Any, folder: Path) -> None:
    from lightrail.model.export import export_checkpoint

    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".ckpt-") as tmp:
        checkpoint = updater.save(Path(tmp) / "checkpoint")
        export_checkpoint(checkpoint, folder, merge=True, force=True)


# -- the gate ----------------------------------------------------------------------------------------------------


def _gate(config: LearnConfig, registry: PolicyRegistry, current: Any, candidate: Path, console: Any) -> dict[str, Any]:
    from lightrail.trainer.config import resolve_reference

    _, val_tasks = resolve_reference(config.data, "data")(**config.data_args)
    if not val_tasks:
        raise ValueError(f"data {config.data}: the gate needs validation tasks, got none")
    val_current = current.val_success
    if val_current is None:
        val_current = evaluate(config, current.path, val_tasks, console=console)
        registry.record_val(current.version, val_current)
    val_candidate = evaluate(config, candidate, val_tasks, console=console)
    return {
        "val_current": val_current,
        "val_candidate": val_candidate,
        "promote": val_candidate >= val_current - config.gate.tolerance,
    }


class _Evaluate:
    """An `Algorithm` that only measures: serve ``model`` (embedded engine behind a gateway), run the val tasks."""

    def __init__(self, model: str | Path, sampling: dict[str, Any], success_threshold: float) -> None:
        self.model = model
        self.sampling = sampling
        self.success_threshold = success_threshold
        self.success: float | None = None
        self._served: ServedPolicy | None = None

    async def setup(self, ctx: Any) -> None:
        self._served = await ServedPolicy.embedded(self.model, ctx.store)

    async def run(self, ctx: Any) -> None:
        assert self._served is not None
        llm = self._served.llm(self.sampling)
        self.success = (await validate(ctx, ctx.val_tasks, llm, self.success_threshold)).success

    async def close(self) -> None:
        if self._served is not None:
            await self._served.close()


def evaluate(config: LearnConfig, model: str | Path, val_tasks: list[Any], *, console: Any = None) -> float:
    """Held-out success of ``model`` on ``val_tasks`` through real runner processes (the gate's measurement)."""
    from lightrail.trainer.trainer import Trainer

    gate = config.gate
    algorithm = _Evaluate(model, gate.sampling, gate.success_threshold)
    store = Path(config.policies) / "gate.db"  # the gate's rollouts stay inspectable (lightrail rollouts --store)
    options: dict[str, Any] = {"runner_python": gate.runner_python} if gate.runner_python else {}
    trainer = Trainer(
        n_runners=gate.n_runners,
        concurrency=gate.concurrency,
        store=str(store),
        algorithm=algorithm,
        console=console,
        **options,
    )
    trainer.fit(config.agent, [], val_tasks, summary=False)  # a round reports its gate, not a training summary
    assert algorithm.success is not None
    return algorithm.success


def load_learn_config(path: str, overrides: list[str] | tuple[str, ...] = ()) -> LearnConfig:
    """Read and check a ``lightrail learn`` YAML config (``--set dotted.path=value`` overrides applied first)."""
    from lightrail.trainer.config import ConfigError, check_store_field, checked_update_config, read_yaml_config

    config = read_yaml_config(path, overrides, LearnConfig)
    check_store_field(path, config.store)
    checked_update_config(config.config, f"{path}: config")
    if config.config.get("critic") is not None:
        raise ConfigError(f"{path}: config.critic: PPO's critic settings (grpo with advantage gae): lightrail learn's "
                          "update has no critic")  # fmt: skip
    given = config.config.get("temperature", config.temperature)
    if given != config.temperature:  # one setting: the update divides logits by the temperature the calls had
        raise ConfigError(
            f"{path}: config.temperature: the update divides logits by the calls' sampling temperature "
            f"(temperature, here {config.temperature}), not by {given}; set temperature instead"
        )
    if config.min_sessions < 1 or config.max_sessions < config.min_sessions or config.updates < 1:
        raise ConfigError(f"{path}: need 1 <= min_sessions <= max_sessions and updates >= 1")
    if not 0 <= config.baseline_decay < 1 or config.temperature <= 0 or not math.isfinite(config.every_s):
        raise ConfigError(f"{path}: need 0 <= baseline_decay < 1, temperature > 0, a finite every_s")
    from lightrail.adapters.credit import check_credit

    try:
        check_credit(config.credit)  # (here, not when the first round trains)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config
