"""The ``lightrail learn`` config (`LearnConfig`, its ``gate`` section `GateSettings`): typed, documented field by
field, read by `lightrail.continuous.learn` and rendered into the config reference (`lightrail.trainer.config_reference`)
with the ``train`` sections, so the reference needs nothing from the package that runs it."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

__all__ = ["GateSettings", "LearnConfig"]


class GateSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a candidate is judged: held-out tasks (the config's ``data``'s validation split) run through real runners
    against the candidate and against the current policy."""

    tolerance: float = 0.0
    """Promote when the candidate's success is at least the current policy's minus this."""
    n_runners: int = 2
    """Runner processes the gate starts."""
    concurrency: int = 8
    """Rollouts each gate runner holds at once."""
    sampling: dict[str, Any] = msgspec.field(default_factory=lambda: {"temperature": 0.0, "max_tokens": 64})
    """Sampling parameters of the gate's calls (greedy by default, so both policies are judged alike)."""
    success_threshold: float = 1.0
    """A gate rollout counts as a success when its reward is at least this."""
    runner_python: str | None = None
    """Run the gate's runners under another interpreter (a framework in its own environment)."""


class LearnConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``lightrail learn`` settings, read from YAML (``lightrail learn --help`` shows an example)."""

    store: str
    """Where the gateway records served sessions (SQLite path, PostgreSQL URL or store server URL)."""
    policies: str
    """The policies folder (`PolicyRegistry`): promoted versions and ``current.json``, which serving gateways watch."""
    agent: str
    """The agent the gate runs, ``module:object`` (as in ``lightrail train``)."""
    data: str
    """``module:function`` returning ``(train_tasks, val_tasks)``; the gate runs the val tasks."""
    data_args: dict[str, Any] = msgspec.field(default_factory=dict)
    """Keyword arguments of ``data``."""
    model: str | None = None
    """The initial policy (version 0) when the policies folder is new: a model directory or ``smollm2``."""
    method: Literal["ppo", "sft"] = "ppo"
    """``ppo``: the clipped importance-ratio update on all rewarded sessions; ``sft``: fine-tune on the sessions
    rewarded at least ``sft_min_reward``."""
    min_sessions: int = 32
    """A round waits until this many rewarded sessions are new."""
    max_sessions: int = 1024
    """At most this many sessions per round (the oldest first; the rest wait for the next round)."""
    updates: int = 1
    """Optimizer steps per round (each over all the round's rows)."""
    temperature: float = 1.0
    """The sampling temperature of the calls learned from; calls at another temperature are left out."""
    max_staleness: int = 4
    """Rows sampled by a policy more than this many versions older than the current one are dropped."""
    baseline_decay: float = 0.8
    """Weight of the earlier rounds in the running mean reward that advantages are measured against."""
    sft_min_reward: float = 1.0
    """``method: sft``: sessions rewarded at least this are trained on."""
    credit: str = "per_turn"
    """How a session's advantage is spread over its calls (a credit estimator's name, as ``grpo.credit``)."""
    agents: list[str] | None = None
    """Train only these agents' calls (None: every call)."""
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    """`UpdateConfig` fields (lr, clip_low/high, kl_coef, lora, ...)."""
    gate: GateSettings = msgspec.field(default_factory=GateSettings)
    """How a candidate is judged before it is promoted (the ``gate`` section)."""
    every_s: float = 300.0
    """``lightrail learn`` without ``--once``: seconds between rounds."""
    keep_rejected: bool = True
    """Keep a rejected candidate's folder (for inspection); else delete it."""
