"""The agent of `bench/mismatch.py`: one real LLM call through the gateway and a reward that varies with the sampled
text (the parity of its length), so a random-weight model's groups carry a learning signal and every step updates."""

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
