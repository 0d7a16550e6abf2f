"""Agents with one fault planted each, for the run guard's drills: every one makes a real LLM call through the
gateway (so the run has calls, token ids and a policy to train) and then goes wrong the way a user's agent does."""

from __future__ import annotations

from openai import OpenAI

from lightrail import LitAgent, as_agent, rollout


def _ask(llm, task) -> str:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], **llm.sampling
    )
    return reply.choices[0].message.content or ""


@rollout
def raising_agent(task, llm):
    """The reward line raises (a name the author renamed): every rollout fails after its call."""
    answer = _ask(llm, task)
    return float(answer == expected_answer)  # noqa: F821 - the planted fault


@rollout
def constant_agent(task, llm):
    """Every rollout scores the same: no group ever has a learning signal."""
    _ask(llm, task)
    return 0.5


@rollout
def nan_agent(task, llm):
    """A reward computed as 0/0 somewhere: NaN."""
    _ask(llm, task)
    return float("nan")


@rollout
def parity_agent(task, llm):
    """A healthy agent: the parity of the answer's length varies within a group."""
    return float(len(_ask(llm, task)) % 2)


@rollout
def writer_agent(task, llm):
    """Names its call ``write_query`` (as the SQL showcase's LangGraph node does); healthy otherwise."""
    with as_agent("write_query"):
        answer = _ask(llm, task)
    return float(len(answer) % 2)


class MainLLMAgent(LitAgent):
    """Written the way Agent Lightning's walkthrough writes it: the policy read as ``resources["main_llm"]``."""

    def rollout(self, task, resources, rollout):
        return float(len(_ask(resources["main_llm"], task)) % 2)


class JudgeAgent(LitAgent):
    """Asks for a resource nobody published (``judge``)."""

    def rollout(self, task, resources, rollout):
        _ask(resources["llm"], task)
        _ask(resources["judge"], task)
        return 1.0
