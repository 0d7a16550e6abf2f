"""Agents for the trainer tests, importable by spawned runner processes as ``dev_agents:<name>``."""

from __future__ import annotations

from lightrail import emit_event, emit_reward, rollout


@rollout
def grader(task, prompt_template):
    """Answers ``task["a"] + task["b"]``, wrongly when told to; fails loudly on bad input."""
    emit_event("prompt", text=prompt_template.format(a=task["a"], b=task.get("b", 0)))
    if task.get("missing"):
        raise KeyError(f"no such file '{task['missing']}'")
    if task.get("b", 0) < 0:
        raise ValueError(f"negative operand {task['b']} in task {task['a']}")
    answer = task["a"] + task["b"] + task.get("off_by", 0)
    emit_reward(1.0 if answer == task["a"] + task["b"] else 0.0)


@rollout
def env_key_agent(task, llm):
    """Builds its client from the environment's key, as Agent Lightning's walkthroughs do (no api_key argument)."""
    from openai import OpenAI

    client = OpenAI(base_url=llm.endpoint, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
    return float(bool(reply.choices[0].message.content))


@rollout
def dummy_key_agent(task, llm):
    """Sends the usual placeholder key and swallows the error, as agents that retry or fall back do."""
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=llm.endpoint, api_key="dummy", max_retries=0)
    try:
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
    except AuthenticationError:
        return 0.0
    return 1.0
