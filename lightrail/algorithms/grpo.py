"""`GRPO`: the reinforcement-learning `Algorithm` — rollouts through the real loop, group advantages, policy
updates, new weights served, repeat.

One step::

    tasks ──run_rollouts(n samples each)──► runners ──► gateway ──► rollout engine (current weights)
      spans of each rollout's final attempt ──build_episode──► select_trainable ──group_advantages──► to_rows
      PolicyUpdater.step (GRPO loss, in a worker thread) ──RolloutEngine.sync──► (policy version + 1)
      ──► publish a new resources version ──► next step

The rollout engine (`lightrail.model.rollout_engines`) is the embedded `Engine` in this process (default) or a
``vllm serve`` process (``rollout_engine="vllm"``, LoRA or full weights synced after each update); the gateway runs
inside the trainer process and records, on every call, the policy version that answered it. Runners are separate
processes that reach the gateway over HTTP, exactly as a user's agent on another machine would.

Two modes. Sync (the default): collect, then update, so every sample is on-policy. Async (``async_=True``, a
config's ``grpo.async``, `AsyncSection`): a pipeline of ``ahead`` steps' rollouts keeps the runners sampling on the current weights while a step waits for its
slowest rollouts and while the update runs::

    step s:  enqueue step s+ahead's tasks (served version s-1) ──wait for step s's rollouts (all of them)──►
             update on them (trainer version s-1) ──sync──► version s        [steps s+1..s+ahead keep sampling]

* Staleness is per call: the gateway records, on every call, the version that answered it, so a rollout that spans a
  weight sync has early calls of the old version and later ones of the new (its earlier calls are kept, never
  re-sampled). A call's staleness is the trainer's version at its update minus that recorded version; the pipeline
  bounds it by ``ahead`` (a batch enqueued at step s is trained at step s+ahead), and calls older than
  ``max_staleness`` are dropped before the update and counted (``dropped_stale``).
* Stale tokens are corrected by truncated importance sampling against the logprobs recorded at sampling (TIS, Yao et
  al. 2025; formula in `lightrail.model._loss`, cap ``config.is_cap``).
* Admission does not favour short rollouts: steps take their batches in the order they were enqueued, and a step
  trains only when every rollout of its batch is terminal; a group is never replaced by one that finished sooner.
* A checkpoint records the task indices of the batches in flight; a resumed run enqueues those again first (fresh
  samples of the same tasks, the earlier session's rollouts being cancelled), so the task order is the uninterrupted
  run's.

Concurrency model: coroutines on the trainer's event loop; the engine's forward passes and the policy update each
run in their own worker thread, so the loop keeps serving HTTP while either computes.

Outputs under ``out_dir``: ``metrics.jsonl`` (one line per step and per validation; the trainer's experiment
trackers mirror each line: TensorBoard events in ``tb/`` by default), ``reward_curve.png`` at the end, checkpoints in ``checkpoints/step-N`` (updater + loop state; `GRPO` with
``resume=True`` continues from the newest one), and ``report.json``. A fresh run in an ``out_dir`` that holds an
earlier run moves that run's metrics and checkpoints to ``earlier/<UTC time>/`` first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from lightrail.adapters import (
    AgentFilter,
    CreditAssignment,
    ToolRewardRule,
    build_episode,
    group_advantages,
    select_trainable,
    to_rows,
)
from lightrail.adapters.selection import scored_reward
from lightrail.adapters.transitions import training_spans
from lightrail.algorithms.policies import PolicyMap, PolicyRouter
from lightrail.algorithms.run.folder import RunFolder
from lightrail.algorithms.run.guard import (
    RunGuard,
    RunStopped,
    describe_selection,
    informative_groups,
    step_health,
)
from lightrail.algorithms.run.loop import run_steps
from lightrail.algorithms.run.policy import (
    ServedPolicy,
    last_attempt_spans,
    policy_resources,
    success_rate,
    validate,
)
from lightrail.algorithms.settings import (
    DEFAULT_IS_CAP,
    GRPOSection,
    agents_argument,
    credit_argument,
    resolve_loss_agg,
    tool_rewards_argument,
)
from lightrail.engine.models import check_model_dir, resolve_model
from lightrail.model.mismatch import MismatchError, stop_cause, summarize, unserved_cause
from lightrail.types import AGENT_HEADER, LLM, Attr, Rollout, Span, Task, Transition

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lightrail.adapters.advantages import GroupReport
    from lightrail.adapters.selection import Exclusions
    from lightrail.algorithms.protocol import TrainerContext
    from lightrail.gateway.server import GatewaySettings
    from lightrail.model.update_config import UpdateConfig

__all__ = ["GRPO"]


class GRPO:
    """Group Relative Policy Optimization over real agent rollouts.

    ``model`` is a name or a folder as a config's ``model:`` takes it (``tiny``, ``small``, ``smollm2``, a local
    Hugging Face directory: `lightrail.engine.models.resolve_model`). Each step samples
    ``tasks_per_step`` training tasks and runs ``n_samples`` rollouts of each (a GRPO group), with the engine
    sampling by ``sampling`` (OpenAI parameters handed to the agent through its `LLM` resource). Validation runs
    every val task once with ``val_sampling`` (greedy by default) before training, every ``val_every`` steps and
    at the end; a rollout counts as a success when its reward is at least ``success_threshold``. ``epochs`` counts
    the run in passes over the training tasks instead of ``steps`` (verl's ``total_epochs``: ``epochs`` times
    ``len(train_tasks) // tasks_per_step`` steps, at least one, fixed when the run starts); ``validate_before=False``
    skips the opening validation (the report's ``val_before`` is then None).

    ``filter_groups`` is DAPO's dynamic sampling: a group whose transitions all have advantage 0 (every sample
    scored the same, no tool reward told them apart) teaches nothing but dilutes the token-mean loss, so it is left
    out of the update, and more tasks are sampled until ``tasks_per_step`` informative groups are in hand: up to
    ``filter_groups.max_rounds`` rounds of rollouts per step (`FilterGroupsSection`, its fields as a mapping, or True
    for its defaults), each of at most ``tasks_per_step`` tasks, sized by the share
    of informative groups so far. Useful when a sharply warm-started student agrees with itself on most tasks; each
    step then costs more rollouts.

    ``advantage`` picks the outcome-advantage estimator (`lightrail.adapters.advantages.ADVANTAGE_ESTIMATORS`: ``grpo``
    (default), ``rloo``, ``dr_grpo``, ``reinforce_pp``, ``reinforce_pp_baseline``; formulas and sources in that
    module), or ``gae``: PPO with a critic (`lightrail.model.ppo`: a value head on the policy, GAE over each
    call's tokens from the call's return, a clipped value loss; its settings ``config.critic``; one policy, one
    update process, calls not merged) and ``loss_agg`` the loss aggregation (``token_mean``, ``seq_mean_token_mean``,
    ``seq_mean_token_sum_norm``, or a `LossNorm` name such as ``rollout``). ``loss_agg=None`` means: a
    ``config.loss_norm`` other than the default ``token`` if one was set, else the estimator's natural aggregation
    (``seq_mean_token_sum_norm`` for ``dr_grpo``, with L = the sampling ``max_tokens`` unless
    ``config.loss_norm_tokens`` says otherwise; ``token_mean`` for the others). A ``loss_agg`` that contradicts a
    non-default ``config.loss_norm`` is an error.

    The gateway binds 127.0.0.1 by default; ``gateway=GatewaySettings(host="0.0.0.0", port=8900,
    advertise_url="http://trainer-host:8900/v1")`` serves runners on other machines (the advertised URL is what
    the published `LLM` resource carries; the gateway always has a random token, published with it).

    ``rollout_engine="vllm"`` samples from vLLM instead of the embedded engine: ``vllm={"python": ...}`` starts
    ``vllm serve`` with that interpreter, ``vllm={"url": ...}`` attaches to a running one (options: see
    `lightrail.model.vllm_rollouts.VLLMRollouts`); with a LoRA config the adapter is synced, otherwise the full weights.

    ``policies={"write": ["write_query"], "rewrite": ["rewrite_query"]}`` trains one policy per group of agents
    instead of one shared policy (`lightrail.algorithms.policies`): a model copy (with LoRA: an adapter) each, its own
    optimizer, updates from its own agents' calls only; the gateway routes each call by the agent the runner names,
    and calls of agents in no policy are served by the start model, unchanged (the gateway warns at the first call of
    each, and at the first call naming no agent). Needs OTel on in the runners; with ``rollout_engine="vllm"`` a LoRA
    config (one adapter per policy on one vLLM server, `lightrail.model.vllm_rollouts.PolicyAdapter`). Metrics of an
    update are then per policy (``write/loss``...) plus ``misrouted`` (a policy agent's calls another engine served:
    not trained, the first warned about with its cause); checkpoints hold one folder per policy.

    Every update measures the train–inference mismatch (`lightrail.model.mismatch`): the k3 KL between the
    logprobs the sampler recorded and the trainer's own for the same tokens, before the optimizer step. Metrics
    ``mismatch_kl_mean``, ``mismatch_kl_max``, ``mismatch_rows_flagged`` (rows whose mean exceeds ``mismatch_flag``)
    and per policy version and per agent (``mismatch_by_version``, ``mismatch_by_agent``). The run stops with a
    `MismatchError` naming the cause when a version's rows exceed ``mismatch_stop`` (None: never) or when the engine
    does not serve the version it was just synced to; the cause is also the step's ``kind: stop`` line in
    ``metrics.jsonl``.

    ``async_`` (`AsyncSection`, its fields as a mapping, or True for its defaults) keeps ``ahead`` steps of rollouts
    sampling on the current weights while a step waits and updates (module docstring): calls more than
    ``max_staleness`` versions older than the trainer's are dropped, stale tokens are weighted by truncated importance
    sampling capped at ``config.is_cap`` (2.0 unless set); metrics ``staleness_mean``, ``staleness_max``,
    ``is_weight_mean``, ``is_clipped_frac``.

        >>> grpo = GRPO("runs/warm", config=UpdateConfig(lr=5e-4), steps=60)                # doctest: +SKIP
        >>> Trainer(n_runners=2, concurrency=8, algorithm=grpo).fit(agent, train, val)  # doctest: +SKIP
        >>> grpo.report["val_after"]                                                      # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | Path,
        section: GRPOSection | None = None,
        *,
        config: UpdateConfig | None = None,
        credit: CreditAssignment | str | None = None,
        tool_rewards: ToolRewardRule | bool | dict[str, Any] | None = None,
        agents: AgentFilter | Sequence[str] | str | None = None,
        gateway: GatewaySettings | None = None,
        **settings: Any,
    ) -> None:
        """``section`` (a config's ``grpo:`` section) or ``settings``, its fields as keyword arguments (both: the
        keywords win), hold every plain setting, its default and its check (`GRPOSection`); the keywords above take
        the objects a config names: ``config`` (else the section's ``config``), ``credit`` (else ``credit`` and
        ``credit_args``), ``tool_rewards`` (else the section's), ``agents`` (else ``agents`` and
        ``agents_pattern``). ``credit`` also takes a scheme's name (``"identical"``, made with ``credit_args``),
        ``agents`` an agent's name or a list of names, ``tool_rewards`` true or a mapping of its fields; any other
        kind is a one-line error here, before any rollout (`lightrail.algorithms.settings.credit_argument`...)."""
        if isinstance(credit, str):  # a scheme's name is the section's setting, checked there with credit_args
            settings["credit"], credit = credit, None
        if removed := sorted(set(settings) & set(GRPOSection._removed)):
            raise TypeError(f"{removed[0]}: no longer a GRPO setting: {GRPOSection._removed[removed[0]]}")
        base = msgspec.structs.asdict(section) if section is not None else {}
        s = GRPOSection(**{**base, **settings})
        config = config if config is not None else s.update_config()
        s.check_update(config)
        selection: Callable[[str | None], bool] | None = (
            agents_argument(agents) if agents is not None else s.agent_filter()
        )
        self.policies = PolicyMap(s.policies) if s.policies is not None else None
        if self.policies is not None:
            if selection is not None:
                raise ValueError("give agents or policies, not both: the policies name the agents they train")
            selection = self.policies.filter()
        self.folder = RunFolder(s.out_dir, "GRPO", keep_checkpoints=s.keep_checkpoints, seed=s.seed)
        self.settings = s
        """The checked ``grpo:`` section: the plain settings are read from it, never copied."""
        self.steps = s.step_count if s.step_count is not None else 0
        """The step count: ``steps`` (default 50), or with ``epochs`` counted from the training tasks when the run
        starts (0 until then)."""
        self.model = resolve_model(model)
        self.config = config
        if s.epochs is None:  # else said when the run starts and the step count is known
            self._say_schedule_mismatch()
        self.sampling = s.training_sampling()
        self.val_sampling = s.validation_sampling()
        self.credit = credit_argument(credit, s.credit_args) if credit is not None else s.credit_scheme()
        self.tool_rewards = tool_rewards_argument(tool_rewards) if tool_rewards is not None else s.tool_rule()
        self.agents = selection
        self.gateway = gateway
        # what a `Chain` reads of its stages: their folder, resuming, whether a stage's val_after is this one's start
        self.out_dir = Path(s.out_dir)
        self.resume = s.resume
        self.success_threshold = s.success_threshold
        self.engine_options = s.engine_options or {}
        self.rollout_engine = s.rollout_engine
        self.vllm = dict(s.vllm or {})
        if s.rollout_engine == "vllm":
            from lightrail.model.vllm_rollouts import check_vllm_sampling

            check_vllm_sampling(self.sampling)
        self.asynchronous = s.async_settings
        """Async mode's settings (None: sync)."""
        self._collect: Callable[[TrainerContext], Awaitable[_Collected]] = (
            self._collect_async if self.asynchronous is not None
            else self._collect_filtered if s.filtering is not None
            else self._collect_on_policy
        )  # fmt: skip
        """Where each step's batch comes from: the async pipeline, rounds until enough groups carry a signal, or one
        on-policy round."""
        self._unwatch: list[Callable[[], None]] = []
        """Stop watching the processes handed to the trainer in `setup` (`TrainerContext.watch_child`)."""
        self._guard = RunGuard(
            s.guard, selection=describe_selection(selection), success_threshold=self.success_threshold
        )
        self._pipeline: list[_Batch] = []
        """Async mode: the batches enqueued for the next steps, oldest first."""
        self._pending: list[list[int]] = []
        """Async mode, resumed run: task indices of the batches the checkpoint had in flight, enqueued first."""
        self.report: dict[str, Any] = {}
        self.val_before: float | None = None
        """Held-out success already measured on ``model`` (same val tasks, ``val_sampling``, ``success_threshold``,
        embedded engine): set by a `Chain` from its previous stage, the opening validation is then not run again."""
        self._rollouts: Any = None
        """The shared policy's rollout engine (the start model's, with several policies)."""
        self._updater: Any = None
        """The shared policy's updater (None with several policies)."""
        self._slots: list[_Slot] = []
        self._warned_misrouted = False
        """With several policies: whether the run's first misrouted call was warned about."""
        self._served: ServedPolicy | None = None
        self._llm: LLM | None = None

    def _say_schedule_mismatch(self) -> None:
        """Warn when the run's steps miss the config's learning-rate decay (`UpdateConfig.schedule_mismatch`)."""
        if self.config is not None and (
            mismatch := self.config.schedule_mismatch(self.steps * self.config.mini_batches)
        ):
            log.warning("GRPO: %s", mismatch)

    @property
    def step(self) -> int:
        """Training steps done (a resumed run's included)."""
        return self.folder.step

    # -- Algorithm protocol ------------------------------------------------------------------------------------

    async def setup(self, ctx: TrainerContext) -> None:
        """Start the rollout engine and load the updater, resume from the newest checkpoint if asked, start the
        gateway and publish the policy's endpoint."""
        from lightrail.model.rollout_engines import make_rollout_engine
        from lightrail.model.updater import PolicyUpdater, UpdateConfig

        check_model_dir(self.model)  # a missing folder is one line, not a minute of model hub retries
        self.out_dir.mkdir(parents=True, exist_ok=True)  # (before the engine: vLLM's files go in it)
        config = self.config or UpdateConfig()
        if "temperature" in self.sampling and self.sampling["temperature"] > 0:
            # The engine reports logprobs of the temperature-scaled distribution; the ratio must use the same one.
            config = dataclasses.replace(config, temperature=float(self.sampling["temperature"]))
        config = self._loss_config(config)
        if self.asynchronous is not None and config.is_cap is None:
            config = dataclasses.replace(config, is_cap=DEFAULT_IS_CAP)
        if self.policies is None:
            self._rollouts = make_rollout_engine(
                self.rollout_engine, self.model, served_name=self.settings.served_name, out_dir=self.out_dir,
                lora_rank=config.lora.r if config.lora else None, engine_options=self.engine_options, vllm=self.vllm,
            )  # fmt: skip
            await self._rollouts.start()
            config = sampler_correction(
                config, self.asynchronous is not None, getattr(self._rollouts, "sampling_dtype", None)
            )
            updater: type[PolicyUpdater] = PolicyUpdater
            if self.settings.critic:  # PPO: the policy with a value head, GAE advantages
                from lightrail.model.ppo import PPOUpdater as updater
            elif config.ranks > 1:  # data-parallel update: this process is rank 0, the other ranks are worker processes
                from lightrail.model.distributed import DistributedPolicyUpdater as updater
            self._updater = await asyncio.to_thread(updater, str(self.model), config)
            self._slots = [_Slot("", self._rollouts, self._updater)]
            backend = self._rollouts.backend
        else:
            backend = await self._start_policies(config)
        checkpoint, state = self.folder.start(resume=self.resume, track=ctx.track)
        self._pending = [list(b) for b in state.get("pending", [])] if self.asynchronous is not None else []
        self._guard.learned = any(m["kind"] == "train" and m.get("groups_with_spread") for m in self.folder.history)
        if checkpoint is not None:
            versions = state.get("policy_versions") or {"": state["policy_version"]}
            for slot in self._slots:
                await asyncio.to_thread(slot.updater.load, checkpoint / slot.name if slot.name else checkpoint)
                if versions[slot.name] > slot.rollouts.policy_version:  # 0: every update so far was skipped
                    await self._sync(slot, versions[slot.name])
                if slot.stop:
                    raise MismatchError(slot.stop)
        self._served = await ServedPolicy.start(backend, ctx.store, self.gateway, name=self.settings.served_name)
        # an update rank or a vLLM server that exits on its own stops the run in seconds, naming it
        parts = [self._rollouts, *(part for slot in self._slots for part in (slot.updater, slot.rollouts))]
        children = {name: exitcode for part in parts if part is not None for name, exitcode in part.children()}
        self._unwatch = [ctx.watch_child(name, exitcode) for name, exitcode in children.items()]
        self._llm = self._served.llm(self.sampling)

    async def _start_policies(self, config: UpdateConfig) -> PolicyRouter:
        """An engine and an updater per policy, the start model's engine for every other call, and the router."""
        from lightrail.model.rollout_engines import EmbeddedRollouts, make_rollout_engine
        from lightrail.model.updater import PolicyUpdater

        assert self.policies is not None
        base = f"{self.settings.served_name}-base"
        vllm = self.rollout_engine == "vllm"
        if vllm:  # one server: the start model under `base`, one LoRA adapter per policy (`PolicyAdapter`)
            self._rollouts = make_rollout_engine(
                "vllm", self.model, served_name=base, out_dir=self.out_dir, lora_rank=config.lora.r if config.lora
                else None, engine_options=self.engine_options, vllm=self.vllm, adapters=len(self.policies.names),
            )  # fmt: skip
        else:
            self._rollouts = EmbeddedRollouts(self.model, **{**self.engine_options, "name": base})
        await self._rollouts.start()
        config = sampler_correction(
            config, self.asynchronous is not None, getattr(self._rollouts, "sampling_dtype", None)
        )
        for name in self.policies.names:
            served = f"{self.settings.served_name}-{name}"
            updater = await asyncio.to_thread(PolicyUpdater, str(self.model), config)
            if vllm:
                rollouts = self._rollouts.policy(served, updater)
            else:
                rollouts = EmbeddedRollouts(self.model, **{**self.engine_options, "name": served})
            self._slots.append(_Slot(name, rollouts, updater, self.policies.filter(name), served))
            await rollouts.start()  # (an adapter's start loads its updater's start adapter as version 0)
        engines = {slot.name: slot.rollouts.backend for slot in self._slots}
        return PolicyRouter(engines, self.policies.by_agent, self._rollouts.backend)

    @property
    def llm(self) -> LLM:
        """The policy's endpoint (the gateway this run started); set by setup, before any step."""
        if self._llm is None:
            raise RuntimeError("GRPO.llm is known once the run has started its gateway")
        return self._llm

    def _loss_config(self, config: UpdateConfig) -> UpdateConfig:
        """``config`` with the loss aggregation `GRPO`'s ``advantage``/``loss_agg`` resolve to (class docstring)."""
        norm = resolve_loss_agg(self.settings.advantage, self.settings.loss_agg, config)
        tokens = config.loss_norm_tokens
        if norm == "sequence_sum_norm" and tokens is None:
            tokens = self.sampling.get("max_tokens")
            if not isinstance(tokens, int) or tokens < 1:
                raise ValueError(
                    "loss_agg seq_mean_token_sum_norm divides by a constant length: set sampling max_tokens or "
                    "config.loss_norm_tokens"
                )
        return dataclasses.replace(config, loss_norm=norm, loss_norm_tokens=tokens)

    async def run(self, ctx: TrainerContext) -> None:
        """Validate, train for ``steps`` steps (validating every ``val_every``), validate again, write the report."""
        if not ctx.train_tasks:
            raise ValueError("GRPO needs training tasks")
        started = time.monotonic()
        if self.settings.epochs is not None:  # the same count on a resumed run: it depends only on the tasks
            self.steps = self.settings.epochs * max(1, len(ctx.train_tasks) // self.settings.tasks_per_step)
            self._say_schedule_mismatch()
        val_before: float | None = None
        if self.step:
            val_before = self.folder.first_val()
        elif self.settings.validate_before and self.val_before is not None:
            val_before = self.val_before
            self.folder.record(
                {"kind": "val", "step": 0, "policy_version": 0, "val_success": val_before, "reused": True}
            )
        elif self.settings.validate_before:
            val_before = await self._validate(ctx)
        await run_steps(
            self.folder, self.steps, train_step=lambda: self._train_step(ctx), validate=lambda: self._validate(ctx),
            checkpoint=self._checkpoint, val_every=self.settings.val_every,
            checkpoint_every=self.settings.checkpoint_every,
        )  # fmt: skip
        val_after = await self._validate(ctx)
        checkpoint = await self._checkpoint()
        self.report = {
            "val_before": val_before,
            "val_after": val_after,
            "steps": self.step,
            "advantage": self.settings.advantage,
            "loss_norm": self._slots[0].updater.config.loss_norm,
            "train_minutes": (time.monotonic() - started) / 60,
            "checkpoint": str(checkpoint),
            **({"policies": {s.name: str(checkpoint / s.name) for s in self._slots}} if self.policies else {}),
            "reward_curve": str(_plot(self.folder.history, self.out_dir / "reward_curve.png")),
            "metrics": str(self.out_dir / "metrics.jsonl"),
        }
        self.folder.write_report(self.report)

    async def close(self) -> None:
        for forget in self._unwatch:  # stopped on purpose from here (a `Chain` closes a stage while the run goes on)
            forget()
        self._unwatch = []
        if self._served is not None:
            await self._served.close()
            self._served = None
        for slot in self._slots:
            if slot.rollouts is not self._rollouts:
                await slot.rollouts.close()
            await asyncio.to_thread(slot.updater.close)
        self._slots = []
        if self._rollouts is not None:
            await self._rollouts.close()
            self._rollouts = None

    # -- steps -----------------------------------------------------------------------------------------------

    async def _train_step(self, ctx: TrainerContext) -> str:
        """One GRPO step (rollouts, advantages, update, new weights served); its status for the step bar."""
        t0 = time.monotonic()
        got = await self._collect(ctx)  # on-policy, filtered groups or the async pipeline: chosen in __init__
        t_rollouts = time.monotonic() - t0
        if self.policies is None:
            update, trained = await self._update(self._slots[0], got.transitions)
        else:
            update, trained = await self._update_policies(got.transitions, got.episodes)
        t_update = time.monotonic() - t0 - t_rollouts
        self.folder.step += 1
        if trained:  # what this step trained on, next to the calls (the dashboard shows it per call)
            await ctx.store.add_spans(training_spans(trained, step=self.step, algorithm="grpo"))
        failure_reward = self.settings.guard.failure_reward
        rewards = [reward for r in got.trainable if (reward := scored_reward(r, failure_reward)) is not None]
        advantages = [t.advantage for t in got.transitions if t.advantage is not None]
        t_guard = time.monotonic()
        health = step_health(
            self.step, got.rollouts, got.episodes, got.trainable, got.excluded, got.transitions, agents=self.agents,
            groups=got.groups.groups,
            update=update, trained=len(trained), failure_reward=failure_reward, keys_refused=got.keys_refused,
            kl_term=bool(self._slots[0].updater.config.kl_coef) and not self.settings.critic,
        )  # fmt: skip
        metrics = {
            "kind": "train",
            "step": self.step,
            "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
            "success_rate": success_rate(got.rollouts, self.success_threshold),
            "rollouts": len(got.rollouts),
            "excluded": got.excluded.total,
            **{f"excluded_{reason}": n for reason, n in got.excluded.counts.items()},
            "zero_std_groups": got.groups.zero_std_groups,
            **({"sample_rounds": got.rounds, "groups_filtered": got.filtered} if self.settings.filtering else {}),
            "adv_mean": statistics.fmean(advantages) if advantages else 0.0,
            "adv_std": statistics.pstdev(advantages) if len(advantages) > 1 else 0.0,
            "adv_abs_max": max((abs(a) for a in advantages), default=0.0),
            **update,
            **health.metrics(),
            "rollout_s": t_rollouts,
            "update_s": t_update,
            "step_s": time.monotonic() - t0,
        }
        try:
            await self._guard.check(ctx.store, health, got.rollouts, stage="GRPO step")
        except RunStopped as stop:
            self.folder.record(metrics)
            self.folder.append({"kind": "stop", "step": self.step, "cause": str(stop)})
            raise
        metrics["guard_s"] = time.monotonic() - t_guard  # the health record and its rules: what the guard costs
        self.folder.record(metrics)
        causes = [slot.stop for slot in self._slots if slot.stop]
        if causes:
            from lightrail.inspection.report import print_failure_digest

            self.folder.append({"kind": "stop", "step": self.step, "cause": causes[0]})
            await print_failure_digest(
                ctx.store,
                got.rollouts,
                title=f"step {self.step}: failure digest",
                stopped=f"at step {self.step}: {causes[0]}",
            )
            raise MismatchError(causes[0])
        return f"reward {metrics['reward_mean']:.3f}  success {metrics['success_rate']:.0%}  {health.line()}"

    # -- where a step's batch comes from: one of three, chosen once (`__init__`) ------------------------------------

    async def _collect_on_policy(self, ctx: TrainerContext) -> _Collected:
        """Sync: ``tasks_per_step`` tasks, ``n_samples`` rollouts each, sampled on the weights published now."""
        version = await ctx.publish(policy_resources(self.llm, self.settings.llm_name))
        return await self._scored(ctx, await self._sample(ctx, self.settings.tasks_per_step, version.version))

    async def _collect_filtered(self, ctx: TrainerContext) -> _Collected:
        """Sync with ``filter_groups`` (DAPO's dynamic sampling): rounds of more tasks on the same weights until
        ``tasks_per_step`` groups carry a learning signal or ``filter_groups.max_rounds`` ran; the groups without one
        are left out of the update (``groups_filtered``)."""
        s = self.settings
        assert s.filtering is not None
        max_rounds = s.filtering.max_rounds
        version = await ctx.publish(policy_resources(self.llm, s.llm_name))
        n_tasks, got = s.tasks_per_step, None
        for rounds in range(1, max_rounds + 1):
            got = await self._scored(ctx, await self._sample(ctx, n_tasks, version.version), got)
            informative = informative_groups(got.transitions)
            if len(informative) >= s.tasks_per_step or rounds == max_rounds:
                break
            share = max(len(informative) / max(got.groups.groups, 1), 0.25)
            n_tasks = min(math.ceil((s.tasks_per_step - len(informative)) / share), s.tasks_per_step)
        assert got is not None
        got.rounds, got.filtered = rounds, got.groups.groups - len(informative)
        got.transitions = [t for t in got.transitions if t.metadata.get("group_id") in informative]
        return got

    async def _collect_async(self, ctx: TrainerContext) -> _Collected:
        """Async: this step's batch from the pipeline (sampled on weights up to ``ahead`` versions old), the later
        steps' batches still sampling (`_next_batch`)."""
        return await self._scored(ctx, await self._next_batch(ctx))

    async def _sample(self, ctx: TrainerContext, n_tasks: int, version: int) -> list[Rollout]:
        return await ctx.run_rollouts(
            self._next_tasks(ctx.train_tasks, n_tasks), mode="train", n_samples=self.settings.n_samples,
            resources_version=version, metadata={"step": self.step + 1},
        )  # fmt: skip

    async def _scored(self, ctx: TrainerContext, batch: list[Rollout], before: _Collected | None = None) -> _Collected:
        """``batch`` (with the rollouts of ``before``, an earlier round of the step) read into episodes, the trainable
        ones chosen (`select_trainable`) and turned into transitions with group advantages."""
        rollouts = [*(before.rollouts if before else ()), *batch]
        episodes = dict(before.episodes) if before else {}
        keys_refused = before.keys_refused if before else 0
        for r, spans in zip(batch, await last_attempt_spans(ctx.store, batch), strict=True):
            episodes[r.rollout_id] = build_episode(spans, tool_rewards_rule=self.tool_rewards)
            keys_refused += any(span.name == Attr.SPAN_KEY_REFUSED for span in spans)
        failure_reward = self.settings.guard.failure_reward
        trainable, excluded = select_trainable(rollouts, episodes, failure_reward=failure_reward)
        transitions, groups = group_advantages(
            ((r, episodes[r.rollout_id]) for r in trainable),
            self.credit,
            agents=self.agents,
            failure_reward=failure_reward,
            estimator=self.settings.advantage,
        )  # fmt: skip  (a critic's (gae) group advantages are only reported; its update uses returns)
        return _Collected(rollouts, episodes, trainable, excluded, transitions, groups, keys_refused)

    async def _next_batch(self, ctx: TrainerContext) -> list[Rollout]:
        """Async mode: top the pipeline up to step ``step + 1 + ahead`` (not past the run's last step), then wait
        until every rollout of the oldest batch (this step's) is terminal and return them, in enqueue order."""
        assert self.asynchronous is not None
        while (nxt := (self._pipeline[-1].step if self._pipeline else self.step) + 1) <= min(
            self.step + 1 + self.asynchronous.steps_ahead, self.steps
        ):
            if self._pending:
                indices = self._pending.pop(0)
            else:
                indices = self.folder.next_indices(self.settings.tasks_per_step, len(ctx.train_tasks))
            version = await ctx.publish(policy_resources(self.llm, self.settings.llm_name))
            ids = await ctx.enqueue_rollouts(
                [ctx.train_tasks[i] for i in indices], mode="train", n_samples=self.settings.n_samples,
                resources_version=version.version, metadata={"step": nxt},
            )  # fmt: skip
            self._pipeline.append(_Batch(nxt, indices, ids))
        batch = self._pipeline.pop(0)
        assert batch.step == self.step + 1, (batch.step, self.step)
        return await ctx.wait_for(batch.rollout_ids)

    async def _update(self, slot: _Slot, transitions: list[Transition]) -> tuple[dict[str, Any], list[Transition]]:
        """One update of ``slot``'s policy on ``transitions``, its new weights served; its metrics and the
        transitions it trained on (none when the update was skipped). Async mode first drops the calls more than
        ``max_staleness`` versions older than the trainer's and measures the mismatch on the on-policy rows only (a
        stale row's gap to the trainer is the updates since it was sampled, not a fault)."""
        from lightrail.model.ppo import VALUE_METRICS, returns_as_rows  # (the updater has loaded torch by now)
        from lightrail.model.updater import drop_stale_rows

        current = slot.rollouts.policy_version
        n_stale = 0
        if self.asynchronous is not None:
            transitions, n_stale = drop_stale_rows(transitions, current, self.asynchronous.max_staleness)
        ages = [age for age in call_staleness(transitions, current) if age is not None]
        # a critic's (gae): each call's return goes to the update, which turns it into GAE advantages
        if self.settings.critic:
            rows, drift = to_rows(returns_as_rows(transitions), merge=False)
        else:
            rows, drift = to_rows(transitions, merge=self.settings.merge_calls)
        update = await asyncio.to_thread(slot.updater.step, rows)  # stale calls were dropped above
        measured = slot.updater.last_mismatch
        if self.asynchronous is not None:
            measured = [m for m in measured if m.row.policy_version in (None, current)]
        mismatch = summarize(measured, self.settings.mismatch_flag)
        slot.stop = stop_cause(measured, self.settings.mismatch_stop, synced=slot.synced)
        if not update["skipped"] and slot.stop is None:  # a run that stops serves nothing more
            await self._sync(slot, slot.rollouts.policy_version + 1)
        metrics = {
            "policy_version": slot.rollouts.policy_version,
            "transitions": len(transitions),
            "drift_breaks": sum(d.breaks for d in drift),
            "loss": update["loss"],
            "kl": update["approx_kl"],
            "kl_ref": update["kl_ref"],
            "entropy": update["entropy"],
            "clip_frac": update["clip_frac"],
            "grad_norm": update["grad_norm"],
            "update_tokens_per_s": update["tokens_per_s"],
            "dropped_stale": n_stale + update["rows_stale_dropped"],
            "staleness_mean": statistics.fmean(ages) if ages else 0.0,
            "staleness_max": max(ages, default=0),
            **(
                {"is_weight_mean": update["is_weight_mean"], "is_clipped_frac": update["is_clipped_frac"]}
                if self.asynchronous is not None
                else {}
            ),  # fmt: skip
            "skipped": bool(update["skipped"]),
            **{key: update[key] for key in VALUE_METRICS if key in update},  # advantage gae: the critic's
            **mismatch,
        }
        return metrics, [] if update["skipped"] else transitions

    async def _sync(self, slot: _Slot, version: int) -> None:
        """Serve ``slot``'s updated weights as ``version`` and check the engine says so (``slot.stop`` when not)."""
        await slot.rollouts.sync(slot.updater, version)
        slot.synced = version
        slot.stop = unserved_cause(slot.rollouts.policy_version, version)

    async def _update_policies(
        self, transitions: list[Transition], episodes: dict[str, Any]
    ) -> tuple[dict[str, Any], list[Transition]]:
        """`_update` per policy, each on the calls of its agents that its engine served (the response model on the
        call's span); metrics prefixed with the policy's name, plus ``misrouted``: calls of a policy's agent another
        engine served (the runner could not name the agent), left out, with a warning at the run's first. Each
        trained transition carries its policy's name (``metadata["policy"]``, on the step's training spans)."""
        calls = {c.response_id: c.span for e in episodes.values() for c in e.calls}
        metrics: dict[str, Any] = {"transitions": 0, "misrouted": 0}
        trained: list[Transition] = []
        for slot in self._slots:
            assert slot.agents is not None
            mine = [t for t in transitions if slot.agents(t.agent_name)]
            routed: list[Transition] = []
            misrouted: list[Transition] = []
            for t in mine:
                span = calls.get(t.metadata.get("response_id"))
                served = span.attributes.get(Attr.RESPONSE_MODEL) if span is not None else None
                (routed if slot.answers_as(served) else misrouted).append(t)
            if misrouted and not self._warned_misrouted:
                self._warned_misrouted = True
                first = misrouted[0]
                log.warning("GRPO: %s", misrouted_cause(first, calls.get(first.metadata.get("response_id")), slot))
            for t in routed:
                t.metadata["policy"] = slot.name
            update, done = await self._update(slot, routed)
            metrics.update({f"{slot.name}/{key}": value for key, value in update.items()})
            metrics["transitions"] += len(routed)
            metrics["misrouted"] += len(misrouted)
            trained += done
        return metrics, trained

    def _policy_version(self) -> int:
        """The shared policy's version; with several policies, the number of updates made over all of them."""
        if self.policies is None:
            return int(self._rollouts.policy_version)
        return sum(slot.rollouts.policy_version for slot in self._slots)

    async def _validate(self, ctx: TrainerContext) -> float | None:
        if not ctx.val_tasks:
            return None
        llm = msgspec.structs.replace(self.llm, sampling=self.val_sampling)  # same endpoint, greedy by default
        val = await validate(
            ctx, ctx.val_tasks, llm, self.success_threshold, metadata={"step": self.step}, name=self.settings.llm_name
        )
        from lightrail.inspection.report import print_failure_digest

        await print_failure_digest(ctx.store, val.rollouts, title=f"{val.line('GRPO', self.step)}; failure digest")
        self.folder.record(val.metrics(self.step, policy_version=self._policy_version()))
        return val.success

    def _next_tasks(self, tasks: Sequence[Task], n: int) -> list[Task]:
        """The next ``n`` tasks of the run's seeded shuffle (`RunFolder.next_indices`)."""
        return [tasks[i] for i in self.folder.next_indices(n, len(tasks))]

    async def _checkpoint(self) -> Path:
        state: dict[str, Any] = {"policy_version": self._policy_version()}
        if self.asynchronous is not None:  # the batches in flight, enqueued again first by a resumed run
            state["pending"] = [b.indices for b in self._pipeline] + self._pending
        if self.policies is not None:
            state["policy_versions"] = {slot.name: slot.rollouts.policy_version for slot in self._slots}

        def save(path: Path) -> None:  # one updater checkpoint, or one folder per policy
            for slot in self._slots:
                slot.updater.save(path / slot.name if slot.name else path)

        return await self.folder.checkpoint(save, **state)


# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Slot:
    """One trained policy: its rollout engine and updater; with several policies, its name, agents and the model
    name its engine answers to."""

    name: str
    """"" for the one shared policy."""
    rollouts: Any
    updater: Any
    agents: AgentFilter | None = None
    served: str = ""
    synced: int | None = None
    """The version this run last synced the engine to (None before its first update)."""
    stop: str | None = None
    """Why the run must stop after this step (`lightrail.model.mismatch`), or None."""

    def answers_as(self, model: str | None) -> bool:
        """Whether the response model a call recorded is this policy's: its engine's name, or on a shared vLLM
        server one of its adapters' names (``<served>-v<N>``)."""
        answers_as = getattr(self.rollouts, "answers_as", None)
        return bool(answers_as(model)) if answers_as is not None else model == self.served


@dataclasses.dataclass
class _Collected:
    """A step's rollouts as its update and its health record need them."""

    rollouts: list[Rollout]
    episodes: dict[str, Any]
    """Rollout id -> its `Episode` (`build_episode` over its last attempt's spans)."""
    trainable: list[Rollout]
    excluded: Exclusions
    """The rollouts left out and why (`select_trainable`)."""
    transitions: list[Transition]
    groups: GroupReport
    """`group_advantages`'s report (groups, zero-spread groups)."""
    keys_refused: int
    """Rollouts whose agent's key the gateway refused (a 401/403 span)."""
    rounds: int = 1
    filtered: int = 0
    """With ``filter_groups``: sampling rounds, and groups left out for carrying no signal."""


@dataclasses.dataclass
class _Batch:
    """Async mode: the rollouts enqueued for one training step, and the task indices they sample."""

    step: int
    indices: list[int]
    rollout_ids: list[str]


def misrouted_cause(transition: Transition, span: Span | None, slot: _Slot) -> str:
    """Why a call of ``slot``'s agent was served by another engine (and so is not trained), from its call span."""
    agent = transition.agent_name
    head = f"a call of agent {agent!r} (policy {slot.name!r}, served as {slot.served!r})"
    if span is None:
        return f"{head} has no call span: it is not trained (misrouted)"
    served = span.attributes.get(Attr.RESPONSE_MODEL)
    named = span.attributes.get(Attr.CALLER_AGENT)
    request = span.attributes.get(Attr.REQUEST)
    asked = (json.loads(request) if isinstance(request, str) else request or {}).get("model")
    if named is None:
        why = (
            "the request named no agent when it was made (the runner named it afterwards, from the framework's "
            f"spans): name the agent before its LLM call ({AGENT_HEADER}, lightrail.as_agent)"
        )
    elif named != agent:
        why = f"the request named agent {named!r}"
    else:
        why = f"the request asked for model {asked!r} by name"
    return f"{head} was served by {served!r}: {why}. Such calls are counted as misrouted and not trained; warned once"


def call_staleness(transitions: Sequence[Transition], current_version: int) -> list[int | None]:
    """Each transition's (call's) staleness: ``current_version`` minus the policy version the gateway recorded on
    the call (None when the backend reported none).

        >>> from lightrail.types import Transition
        >>> calls = [Transition(rollout_id="r", attempt_id="a", prompt_ids=[1], response_ids=[2], policy_version=v)
        ...          for v in (3, 4)]
        >>> call_staleness(calls, 4)
        [1, 0]
    """
    return [None if t.policy_version is None else current_version - t.policy_version for t in transitions]


def sampler_correction(config: UpdateConfig, asynchronous: bool, sampling_dtype: str | None) -> UpdateConfig:
    """``config`` for a run whose rollout engine samples in ``sampling_dtype`` (None: not known, e.g. vLLM).

    A sync run whose embedded engine samples below float32 (``engine_options: {dtype: bfloat16}``, or a GPU's default)
    records logprobs that differ from the trainer's float32 ones by the precision gap, not by rounding: the PPO ratio
    against them would clip tokens for numerics. Such a run weighs each token by truncated importance sampling
    against the sampler's logprobs instead, as async mode does (`lightrail.model._loss`, ``is_cap`` =
    `DEFAULT_IS_CAP`); the mismatch metrics (``mismatch_kl_mean``) and ``is_weight_mean`` report the gap. Unchanged
    for float32 engines, async runs (already corrected) and a config that sets ``is_cap`` itself. With
    ``mini_batches > 1`` (the correction needs one optimizer step per update) it is left off and a warning says so.
    """
    if asynchronous or config.is_cap is not None or sampling_dtype in (None, "float32", "float64"):
        return config
    if config.mini_batches != 1:
        log.warning("GRPO: the engine samples in %s but config.mini_batches is %d: no truncated-IS correction of the "
                    "sampler-trainer gap (it needs mini_batches 1)", sampling_dtype, config.mini_batches)  # fmt: skip
        return config
    return dataclasses.replace(config, is_cap=DEFAULT_IS_CAP)


def _plot(history: list[dict[str, Any]], path: Path) -> Path:
    """Reward and success per training step, with validation success on top: the curve people look at."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [m for m in history if m["kind"] == "train"]
    val = [m for m in history if m["kind"] == "val"]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot([m["step"] for m in train], [m["reward_mean"] for m in train], label="train reward (mean)", alpha=0.6)
        if any(m["success_rate"] != m["reward_mean"] for m in train):  # same curve when reward is 0/1
            ax.plot([m["step"] for m in train], [m["success_rate"] for m in train], label="train success", alpha=0.6)
    if val:
        ax.plot(
            [m["step"] for m in val],
            [m["val_success"] for m in val],
            "o-",
            label="held-out success (greedy)",
            linewidth=2,
        )
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("GRPO step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no 0.5 ticks on a short run
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    # the legend above the axes, never over the curves (a curve ending bottom-right sat under "lower right")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), ncol=3, frameon=False, fontsize="small")
    ax.set_title("lightrail GRPO", pad=24)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
