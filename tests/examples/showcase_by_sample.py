"""Test-only wrappers of the AutoGen, Agents SDK and CrewAI showcases for the per-agent-policy tests: the real agent
(every one of its agents calls the model through the gateway), scored by the parity of the rollout's sample index.
The tiny random model never answers right, so the showcases' own rewards would give every sample of a group the same
score and GRPO no advantage; with this one every group of two samples carries one, so every policy updates in the
step. It measures nothing about the tasks. The showcases are imported inside each rollout: a runner imports only its
own framework (CrewAI's runners run in their own environment)."""

from __future__ import annotations

from lightrail import rollout


@rollout
async def calc_agent_by_sample(task, llm, rollout):
    from examples.calc_agent.train import calc_agent

    await calc_agent(task, llm)
    return float(rollout.sample_index % 2)


@rollout
async def rag_agent_by_sample(task, llm, rollout):
    from examples.rag_agent.train import rag_agent

    await rag_agent(task, llm)
    return float(rollout.sample_index % 2)


@rollout
def crew_agent_by_sample(task, llm, rollout):
    from examples.crew_agent.train import crew_agent

    crew_agent(task, llm)
    return float(rollout.sample_index % 2)
