"""An agent and held-out tasks for the gate tests: one call through the gateway, reward 1 when the reply is exactly
the task's ``target`` (the initial tiny model's greedy reply), so the initial policy scores 1.0 on its own held-out
set and a candidate that moved its greedy replies scores less."""

from __future__ import annotations

import json
from pathlib import Path

from openai import OpenAI

from lightrail import rollout

QUESTIONS = [f"Is {a} less than {a + b}?" for a, b in zip(range(3, 40, 3), range(1, 14), strict=False)]


@rollout
def echo_agent(task, llm):
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], **llm.sampling
    )
    return 1.0 if (reply.choices[0].message.content or "") == task["target"] else 0.0


def held_out(path: str) -> tuple[list[dict], list[dict]]:
    """``(train, val)`` with the val tasks written by the test to ``path``."""
    return [], json.loads(Path(path).read_text())
