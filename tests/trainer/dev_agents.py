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
