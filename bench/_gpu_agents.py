"""The agent `bench/gpu_check.py` trains: one chat call through the real ``openai`` client, rewarded by the parity of
the reply's length, so a random-weight model's groups always hold different rewards and every GRPO step updates."""

from __future__ import annotations

from openai import OpenAI

from lightrail import rollout


@rollout
def parity_agent(task, llm):
    """1.0 when the reply has an even number of characters, else 0.0."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["prompt"]}], **llm.sampling
    )
    return float(len(reply.choices[0].message.content or "") % 2 == 0)
