"""The agents of `bench/silent.py`'s drills: each makes real LLM calls and goes wrong the way a user's agent does
(one fault each), or is healthy (the false-alarm runs). Importable by spawned runners as ``bench._silent_agents``."""

from __future__ import annotations

import contextlib
import os

from openai import AuthenticationError, OpenAI

from lightrail import LitAgent, as_agent, rollout
from lightrail.types import LLM


def _ask(llm: LLM, task: dict, **options) -> str:
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0, **options)
    reply = client.chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["question"]}], **llm.sampling
    )
    return reply.choices[0].message.content or ""


@rollout
def healthy(task, llm):
    """The parity of the answer's length: a reward that varies within a group."""
    return float(len(_ask(llm, task)) % 2)


@rollout
def raises(task, llm):
    answer = _ask(llm, task)
    return float(answer == expected)  # noqa: F821 - the planted fault: a name the author renamed


@rollout
def passes_sampling(task, llm):
    """Hands the configured sampling to its client as keyword arguments (what makes a typo there fatal)."""
    return float(len(_ask(llm, task)) % 2)


class OtherResourceName(LitAgent):
    """Reads its model under a name the trainer did not publish."""

    def rollout(self, task, resources, rollout):
        return float(len(_ask(resources["policy_llm"], task)) % 2)


@rollout
def named_writer(task, llm):
    """Its calls are named ``write_query`` (a LangGraph node's name)."""
    with as_agent("write_query"):
        return float(len(_ask(llm, task)) % 2)


@rollout
def placeholder_key(task, llm):
    """Sends the usual placeholder key and swallows the 401."""
    client = OpenAI(base_url=llm.endpoint, api_key="dummy", max_retries=0)
    try:
        client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task["question"]}])
    except AuthenticationError:
        return 0.0
    return 1.0


@rollout
def no_token_ids(task, llm, rollout, attempt):
    """Calls a gateway of the same store that forwards to an upstream returning no token ids (a hosted API), routed
    to its attempt, instead of the trainer's endpoint: the calls are recorded, none is trainable."""
    upstream = LLM(
        endpoint=os.environ["LIGHTRAIL_DRILL_UPSTREAM"], model="hosted", api_key=os.environ["LIGHTRAIL_DRILL_KEY"]
    )
    routed = LLM(endpoint=upstream.base_url(rollout.rollout_id, attempt.attempt_id), model="hosted",
                 api_key=upstream.api_key, sampling={"max_tokens": 8})  # fmt: skip
    return float(len(_ask(routed, task)) % 2)


@rollout
def constant(task, llm):
    _ask(llm, task)
    return 0.5


@rollout
def nan(task, llm):
    _ask(llm, task)
    return float("nan")


@rollout
def image_part(task, llm):
    """Sends an image part to a text-only model: the gateway refuses the field by name (the agent raises its 400)."""
    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    content = [{"type": "text", "text": task["question"]}, {"type": "image_url", "image_url": {"url": "data:,"}}]
    client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": content}], **llm.sampling)
    return 1.0


@rollout
def impatient(task, llm):
    """Gives up on a long first answer (a 0.5 s client timeout on 480 tokens, end-of-sequence banned), then asks
    again patiently: the first call was never received, so only the retry may be trained on."""
    from openai import APITimeoutError

    client = OpenAI(base_url=llm.endpoint, api_key=llm.api_key or "none", max_retries=0)
    eos = {os.environ["LIGHTRAIL_DRILL_EOS"]: -100}
    with contextlib.suppress(APITimeoutError):
        client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=480,
            logit_bias=eos, timeout=0.5,
        )  # fmt: skip
    return float(len(_ask(llm, task)) % 2)
