"""Agents of the fault drills (imported by ``lightrail runner`` processes from this folder)."""

from __future__ import annotations

from openai import OpenAI

from lightrail import emit_event, rollout


@rollout
def three_calls(task, llm):
    """Three chat calls in a row, then the response ids it received as an event: what the agent saw, to compare
    with what the gateway recorded. The client retries long enough to outlast a gateway restart."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=10)
    seen = []
    for turn in range(3):
        reply = client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": f"{task['n']} {turn}"}], max_tokens=4
        )
        seen.append(reply.id)
    emit_event("seen", response_ids=seen)
    return 1.0
