"""Agents for the inspection and dashboard tests, importable by spawned runner processes as
``tests.inspection.inspect_agents:<name>``."""

from __future__ import annotations

from openai import OpenAI

from lightrail import emit_event, emit_reward, rollout


@rollout
def chatty(task, llm, rollout):
    """Two turns with the policy through the gateway (the second resends the history), an event, a reward (the
    sample's parity: every GRPO group has a spread, so every step trains); tasks with a ``fail`` key raise after
    both calls, so failed rollouts have spans and messages too. Also the dashboard tests' agent."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    messages = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": task["question"]}]
    first = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling)
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "Are you sure?"},
    ]
    second = client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling)
    emit_event("answered", question=task["question"])
    if "fail" in task:
        raise ValueError(f"bad question {task['fail']} in {task['question']!r}")
    assert second.choices
    emit_reward(float(rollout.sample_index % 2))
