"""Agents and the runner that executes them.

* `LitAgent` / `rollout`: how a user's agent is written (a class, or a function with parameters injected by
  name).
* `Runner`: leases rollouts from a store and runs many of them concurrently in one process.
* `run_runners`: N runner processes (spawn-safe) against a store server.

See `lightrail.agent.runner` for the runner's concurrency model and failure semantics.
"""

from lightrail.agent.agent import FunctionAgent, LitAgent, agent_reference, load_agent, rollout, route_resources
from lightrail.agent.errors import is_infra_error
from lightrail.agent.processes import RunnerProcesses, run_runners
from lightrail.agent.runner import Runner, RunnerStats

__all__ = [
    "FunctionAgent",
    "LitAgent",
    "Runner",
    "RunnerProcesses",
    "RunnerStats",
    "agent_reference",
    "is_infra_error",
    "load_agent",
    "rollout",
    "route_resources",
    "run_runners",
]
