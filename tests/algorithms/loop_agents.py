"""Agents for the GRPO loop test: one real LLM call through the gateway, a reward that varies with the sampled
text, so groups have a learning signal even with a random-weight model."""

from __future__ import annotations

from openai import OpenAI

from lightrail import rollout


@rollout
def parity_agent(task, llm):
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], **llm.sampling
    )
    return float(len(reply.choices[0].message.content or "") % 2)


@rollout
def half_constant_agent(task, llm):
    """`parity_agent` on tasks with an odd answer; on the others every sample scores 1 (a group with no signal)."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], **llm.sampling
    )
    return float(len(reply.choices[0].message.content or "") % 2) if task["answer"] % 2 else 1.0
