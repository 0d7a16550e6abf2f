"""API dialects: how one HTTP API (OpenAI chat completions, legacy completions, the Responses API, Anthropic
Messages) maps onto the gateway's one backend interface.

Every dialect turns a decoded request body into an `Exchange`: the backend request (`ChatRequest` or
`CompletionRequest`), whether to stream, and how to turn the backend's `Generation` into the body (or event
stream) the agent expects. The gateway app (`lightrail.gateway.app`) does everything else the same way for all
dialects: auth, attempt checks, body limits, calling the backend, error mapping and recording one span per call.

What the span records is chat-completions shaped for every chat dialect (`Exchange.recorded`): ``Attr.REQUEST``
holds the equivalent chat request (the whole conversation, ``previous_response_id`` history included) and
``Attr.RESPONSE`` the equivalent ``chat.completion``, so adapters (messages, tool rewards, credit assignment) read
every dialect the same way; the bodies as sent and received are kept beside them (``Attr.DIALECT_REQUEST`` /
``Attr.DIALECT_RESPONSE``). ``Attr.RESPONSE_ID`` is the id the agent saw (``resp_...``, ``msg_...``), which is
what framework spans and rewards link calls by.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from lightrail.types import Attr, ChatRequest, CompletionRequest, Generation

__all__ = ["Dialect", "Exchange"]

JSON = Any


class Exchange(ABC):
    """One validated request of some dialect: what the backend is asked, and how its answer goes back.

    Subclasses set ``request`` and ``stream`` in ``__init__`` (raising `lightrail.gateway.openai_api.
    InvalidRequest` for bad input) and implement `respond` and `events`.
    """

    endpoint: ClassVar[str]
    """Recorded as ``Attr.ENDPOINT``: ``chat.completions``, ``completions``, ``responses``, ``messages``."""
    id_prefix: ClassVar[str]
    """Response ids are ``<id_prefix><24 hex digits>`` (``chatcmpl-``, ``resp_``, ``msg_``)."""

    request: ChatRequest | CompletionRequest
    stream: bool

    @abstractmethod
    def __init__(self, data: dict[str, JSON]) -> None:
        """Validate the request body ``data`` and set ``request`` and ``stream``."""

    @abstractmethod
    def respond(self, generation: Generation, response_id: str) -> dict[str, JSON]:
        """The response body the agent receives (and, for a stream, the object its events replay)."""

    @abstractmethod
    def events(self, response: dict[str, JSON], generation: Generation, chunk_chars: int) -> bytes:
        """All server-sent events of a streamed answer, replayed from the complete ``response``."""

    def recorded(self, data: dict[str, JSON], response: dict[str, JSON] | None) -> dict[str, JSON]:
        """Span attributes for the request and response (see the module docstring). Chat completions and legacy
        completions record the bodies as they are; other dialects override this."""
        return {Attr.REQUEST: data, Attr.RESPONSE: response}

    def answered(self, response: dict[str, JSON]) -> None:  # noqa: B027 (optional hook, empty by default)
        """Called once the agent's answer is built (e.g. to remember a conversation for a later turn)."""


@dataclass(frozen=True)
class Dialect:
    """An API the gateway serves: its path under ``/v1``, how a body becomes an `Exchange`, its error envelope."""

    path: str
    """Path after ``/v1``, e.g. ``/chat/completions``."""
    exchange: type[Exchange]
    """Constructed from a decoded JSON body; raises `InvalidRequest` naming the bad field."""
    error_body: Callable[..., dict[str, JSON]]
    """``error_body(message, *, type, param, code, status)``: the body of an error response."""

    @property
    def endpoint(self) -> str:
        return self.exchange.endpoint
