"""Spans → chat conversations: each chat call's request messages followed by the message it got back.

For supervised fine-tuning and prompt optimisation, which work on text. (RL trains on token ids, never on
these.) Text-completion calls (`Attr.ENDPOINT` ``completions``) have no messages and are left out.

Example::

    for sample in spans_to_messages(spans):
        print(sample.turn, sample.messages[-1]["content"])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from lightrail.adapters.episode import build_episode
from lightrail.adapters.records import Episode
from lightrail.types import Attr, Span

__all__ = ["ChatSample", "episode_messages", "spans_to_messages"]

# what a chat message is made of; the response's message may carry more (refusal, annotations, audio)
_MESSAGE_KEYS = ("role", "content", "tool_calls", "reasoning_content", "name")


class ChatSample(msgspec.Struct, kw_only=True):
    """The conversation of one choice of one chat call: ``messages[-1]`` is the assistant's answer."""

    rollout_id: str
    attempt_id: str
    turn: int
    choice: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    agent_name: str | None = None
    response_id: str | None = None
    finish_reason: str | None = None


def _clean(message: dict[str, Any]) -> dict[str, Any]:
    # content stays even when null: OpenAI sends ``"content": null`` next to tool calls
    return {k: message[k] for k in _MESSAGE_KEYS if message.get(k) is not None or (k == "content" and k in message)}


def episode_messages(episode: Episode) -> list[ChatSample]:
    """One `ChatSample` per choice of every chat call of ``episode``, in turn order.

    The request's messages are shared with the span (not copied); only the list holding them is new.
    """
    out: list[ChatSample] = []
    for call in episode.calls:
        a = call.span.attributes
        request, response = a.get(Attr.REQUEST), a.get(Attr.RESPONSE)
        if not isinstance(request, dict) or not isinstance(response, dict) or "messages" not in request:
            continue
        history = list(request["messages"])
        for i, choice in enumerate(response.get("choices") or ()):
            message = choice.get("message")
            if message is None:
                continue
            out.append(
                ChatSample(
                    rollout_id=episode.rollout_id,
                    attempt_id=episode.attempt_id,
                    turn=call.turn,
                    choice=choice.get("index", i),
                    messages=[*history, _clean(message)],
                    tools=request.get("tools"),
                    agent_name=call.agent_name,
                    response_id=call.response_id,
                    finish_reason=choice.get("finish_reason"),
                )
            )
    return out


def spans_to_messages(spans: Sequence[Span]) -> list[ChatSample]:
    """The chat conversations of one attempt's spans (see `episode_messages`)."""
    return episode_messages(build_episode(spans))
