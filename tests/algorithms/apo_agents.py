"""Agents for the APO tests: the prompt under optimization is their system message; one real LLM call through the
gateway per rollout, so every rollout has a trace in the store."""

from __future__ import annotations

import json
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
    """Reward 1 when the prompt carries worked examples, else 1 on a fixed two thirds of the calculator tasks
    (``answer % 4 < 2``: any 6 of the 12 test tasks hold at least two successes, the source of demonstrations)."""
    _ask(llm, prompt_template.template, task["question"])
    if "Worked examples:" in prompt_template.template:
        return 1.0
    return float(task["answer"] % 4 < 2)


@rollout
def few_shot_agent(task, llm, resources):
    """Few-shot examples from the ``examples`` resource (a JSON list of chat messages) before the question. Reward 1
    with examples; without, the parity of the reply's length, and only when sampled hot (temperature >= 1): the
    search (cooler) never succeeds from the seed, so only the bootstrap can find demonstrations."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    examples = json.loads(resources["examples"].template)
    messages = [{"role": "system", "content": resources["prompt_template"].template}, *examples]
    reply = client.chat.completions.create(
        model=llm.model, messages=[*messages, {"role": "user", "content": task["question"]}], **llm.sampling
    )
    if examples:
        return 1.0
    hot = llm.sampling.get("temperature", 1.0) >= 1.0
    return float(hot and len(reply.choices[0].message.content or "") % 2)
