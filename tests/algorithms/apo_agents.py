"""Agents for the APO tests: the prompt under optimization is their system message; one real LLM call through the
gateway per rollout, so every rollout has a trace in the store."""

from __future__ import annotations

import re

from openai import OpenAI

from lightrail import rollout


def _ask(llm, system: str, question: str) -> str:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        **llm.sampling,
    )
    return reply.choices[0].message.content or ""


@rollout
def level_agent(task, llm, prompt_template):
    """Reward = LEVEL-n / 10 read from the prompt: a candidate's score is known in advance, whatever the model says."""
    _ask(llm, prompt_template.template, task["question"])
    match = re.search(r"LEVEL-(\d+)", prompt_template.template)
    return int(match.group(1)) / 10 if match else 0.0


@rollout
def parity_or_examples_agent(task, llm, prompt_template):
    """Reward 1 when the prompt carries worked examples, else the parity of the reply's length (about half the
    seed prompt's runs succeed: the source of demonstrations)."""
    reply = _ask(llm, prompt_template.template, task["question"])
    if "Worked examples:" in prompt_template.template:
        return 1.0
    return float(len(reply) % 2)
