"""One policy per agent: several models trained side by side behind one gateway, each agent's calls served by its own.

``GRPO(policies={"write": ["write_query"], "rewrite": ["rewrite_query"]})`` trains one copy of the model per policy
(with a LoRA config: one adapter each, on the same base weights), each with its own optimizer and its own updates
from its agents' calls. The agent stays unmodified and keeps calling one model name; each call names the agent that
makes it (`lightrail.types.AGENT_HEADER`: set by `lightrail.as_agent`, or by a runner with OpenTelemetry on from the
LangGraph node or the agent's span; or the ``/agents/<name>`` route of `lightrail.types.LLM.endpoint_for`), and the
gateway's backend, a `PolicyRouter`, sends the call to that agent's policy. Calls of agents in no policy (a fixed
checker, an unnamed call) are served by the model the run started from, which never changes; the router warns at
the first such call of each agent (and at the first unnamed call) with its cause, since a policy whose agent's
name never arrives is never trained.

Each policy's engine answers to its own model name, ``<served_name>-<policy>``, recorded on every call's span as the
response model (on vLLM, one server for all: each policy is a LoRA adapter, ``<served_name>-<policy>-v<N>`` the name
vLLM echoes); a transition is trained only by the policy that served it (a call whose agent the runner could not
name was served by the start model and is counted as ``misrouted``, not trained; `GRPO` warns at the first one).

Concurrency model: `PolicyRouter` runs on the gateway's event loop; its set of agents already warned about is only
touched there.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from lightrail.adapters.selection import AgentFilter
from lightrail.types import AGENT_HEADER, ChatRequest, CompletionRequest, Generation, check_agent_name

__all__ = ["PolicyMap", "PolicyRouter", "check_policies_engine"]

log = logging.getLogger(__name__)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class PolicyMap:
    """``{policy: [agent, ...]}`` checked: at least one policy, names of letters, digits, ``_.-`` (they name model
    endpoints and checkpoint folders), every policy with at least one agent, every agent a name a call can carry
    (`lightrail.types.check_agent_name`: no surrounding whitespace, no control characters, at most 200
    characters), no agent in two policies."""

    def __init__(self, policies: Mapping[str, Sequence[str]]) -> None:
        if not isinstance(policies, Mapping) or not policies:
            raise ValueError(f"policies: expected a mapping of policy name to agent names, got {policies!r}")
        self.agents: dict[str, tuple[str, ...]] = {}
        self.by_agent: dict[str, str] = {}
        for name, agents in policies.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"policies: {name!r} is not a policy name (letters, digits, '_', '.', '-'; ≤ 64)")
            if isinstance(agents, str) or not isinstance(agents, Sequence) or not agents:
                raise ValueError(f"policies.{name}: expected a non-empty list of agent names, got {agents!r}")
            for agent in agents:
                try:
                    check_agent_name(agent)
                except ValueError as e:  # no call could carry it: the policy would never be routed to or trained
                    raise ValueError(f"policies.{name}: {agent!r} cannot name an agent: {e}") from None
                if agent in self.by_agent:
                    raise ValueError(f"policies: agent {agent!r} is in both {self.by_agent[agent]!r} and {name!r}")
                self.by_agent[agent] = name
            self.agents[name] = tuple(agents)

    @property
    def names(self) -> list[str]:
        return list(self.agents)

    def filter(self, policy: str | None = None) -> AgentFilter:
        """The agents ``policy`` trains (every policy's, for None)."""
        return AgentFilter(self.agents[policy] if policy is not None else self.by_agent)

    def __repr__(self) -> str:
        return f"PolicyMap({ {name: list(agents) for name, agents in self.agents.items()} })"


def check_policies_engine(rollout_engine: str, *, lora: bool) -> None:
    """Several policies on vLLM are LoRA adapters on one server (`lightrail.model.vllm_rollouts.PolicyAdapter`):
    refuse them with full weights, in one line."""
    if rollout_engine == "vllm" and not lora:
        raise ValueError(
            "grpo.policies: with rollout_engine vllm each policy is a LoRA adapter on one vLLM server: set "
            "grpo.config.lora (several full-weight policies need the embedded engine)"
        )


MAX_WARNED_AGENTS = 32
"""How many distinct unrouted agents `PolicyRouter` warns about, one warning each; one last warning says it stops."""


class PolicyRouter:
    """A gateway backend over one engine per policy and the start model: a request goes to the engine its ``model``
    names (``<served>-<policy>``, for a user who asks one policy directly), else to the policy of its ``agent``
    (`ChatRequest.agent`), else to ``base``, with a warning at the first such call of each agent (and at the first
    call that names none) saying why no policy serves it."""

    def __init__(self, engines: Mapping[str, Any], by_agent: Mapping[str, str], base: Any) -> None:
        self.engines = dict(engines)
        self.by_agent = dict(by_agent)
        self.base = base
        self._by_model = {model: engine for engine in (base, *self.engines.values()) for model in engine.model_names()}
        self._warned: set[str | None] = set()
        """Agents (None: unnamed calls) whose first call to the start model was warned about; at most
        `MAX_WARNED_AGENTS` (names come from clients: a client sending many names must not grow it, nor the log)."""

    def pick(self, request: ChatRequest | CompletionRequest) -> Any:
        engine = self._by_model.get(request.model)
        if engine is not None:
            return engine
        policy = self.by_agent.get(request.agent) if request.agent is not None else None
        if policy is not None:
            return self.engines[policy]
        if request.agent not in self._warned and len(self._warned) <= MAX_WARNED_AGENTS:
            self._warned.add(request.agent)
            cause = self.unrouted_cause(request.agent)
            if len(self._warned) > MAX_WARNED_AGENTS:
                cause = (
                    f"policies: calls of more than {MAX_WARNED_AGENTS} agents in no policy went to the start model; "
                    "no more of them are warned about"
                )
            log.warning("%s", cause)
        return self.base

    def unrouted_cause(self, agent: str | None) -> str:
        """Why a call of ``agent`` (None: a call naming no agent) goes to the start model, for the first warning."""
        base = self.base.model_names()[0]
        if agent is None:
            return (
                f"policies: a call named no agent (no {AGENT_HEADER} header, no /agents/<name> route): the start "
                f"model {base!r} serves it and no policy trains it. Turn OpenTelemetry on in the runners "
                "(trainer.otel) or name the caller (lightrail.as_agent, LLM.endpoint_for); warned once"
            )
        known = ", ".join(repr(a) for a in self.by_agent)
        return (
            f"policies: agent {agent!r} is in no policy (their agents: {known}): the start model {base!r} serves its "
            "calls and no policy trains them (meant for a fixed agent, e.g. a checker; else fix the name); warned "
            "once per agent"
        )

    async def chat(self, request: ChatRequest) -> Generation:
        generation: Generation = await self.pick(request).chat(request)
        return generation

    async def complete(self, request: CompletionRequest) -> Generation:
        generation: Generation = await self.pick(request).complete(request)
        return generation

    def model_names(self) -> list[str]:
        return list(self._by_model)
