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


@rollout
def two_call_agent(task, llm, rollout):
    """Two LLM calls, rewarded by the parity of the sample index (every group of two carries a signal). With
    ``LIGHTRAIL_TEST_MARKERS`` naming a folder, a rollout of step 2 or later touches ``first-<rollout id>`` there after
    its first call and makes its second only once ``synced`` exists (the test's GRPO writes it after its first weight
    sync): its two calls then straddle that sync."""
    import os
    import time
    from pathlib import Path

    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling)
    markers = os.environ.get("LIGHTRAIL_TEST_MARKERS")
    if markers and int(rollout.metadata.get("step", 1)) >= 2:
        Path(markers, f"first-{rollout.rollout_id}").touch()
        deadline = time.monotonic() + 60
        while not Path(markers, "synced").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling)
    return float(rollout.sample_index % 2)


@rollout
def unroutable_calls_agent(task, llm):
    """Four calls with ``policies={"write": ["writer"]}`` in mind: one the writer's policy serves, and three it cannot:
    the writer asking for the start model by name (misrouted), a call naming no agent, and one of an agent in no
    policy (a misspelt ``writer``). Rewarded by the parity of the first answer's length."""
    from lightrail import as_agent

    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]

    def ask(model: str = llm.model) -> str:
        reply = client.chat.completions.create(model=model, messages=messages, **llm.sampling)
        return reply.choices[0].message.content or ""

    with as_agent("writer"):
        first = ask()
        ask(f"{llm.model}-base")
    ask()
    with as_agent("writre"):
        ask()
    return float(len(first) % 2)


@rollout
def writer_checker_agent(task, llm, rollout):
    """Three calls with ``policies={"write": ["writer"], "check": ["checker"]}`` in mind: the writer's, the checker's
    (from step 2 on only: step 1 gives the check policy nothing to train) and one of a judge in no policy. Rewarded
    by the parity of the sample index (every group of two carries a signal)."""
    from lightrail import as_agent

    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    messages = [{"role": "user", "content": task["question"]}]
    for agent in ("writer", "checker", "judge"):
        if agent == "checker" and int(rollout.metadata.get("step", 1)) < 2:
            continue
        with as_agent(agent):
            client.chat.completions.create(model=llm.model, messages=messages, **llm.sampling)
    return float(rollout.sample_index % 2)
