"""The scripted imperfect teacher (`teacher.py`) as an OpenAI-compatible endpoint, for distillation demos and tests.

A gateway with a `ScriptedBackend` whose script plays `teacher.demonstration`: to a question it answers the way the
teacher would (skip the tool with a slipped digit, or call the calculator, sometimes on a wrong expression); to a
tool result it answers ``Answer: <result>``. The k-th time a question is asked the teacher draws from its own
seeded RNG, so repeated samples differ and a run is reproducible. Nothing is recorded unless a store is given
(``store_url``): then the calls of routed rollouts are recorded there like a policy's (the teacher's traces);
otherwise the student's trainer records the calls in its own gateway.

    with TeacherServer(problems) as teacher:
        llm = teacher.llm()        # LLM(endpoint=..., model="teacher", api_key=...)
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import threading
from collections.abc import Callable
from typing import Any

from examples.calculator.teacher import demonstration
from lightrail.gateway.fake import ScriptedBackend, ScriptedReply
from lightrail.types import LLM

__all__ = ["TeacherServer", "teacher_backend", "teacher_script"]


def teacher_backend(problems: list[dict], *, seed: int = 0, **rates: float) -> ScriptedBackend:
    """A `ScriptedBackend` answering the calculator agent's calls as the imperfect teacher (``rates``: see
    `teacher.demonstration`). Questions it was not given are answered ``Answer: 0``."""
    return ScriptedBackend(teacher_script(problems, seed=seed, **rates), model="teacher")


def teacher_script(problems: list[dict], *, seed: int = 0, **rates: float) -> Callable[[Any], str | ScriptedReply]:
    """The script of `teacher_backend`: a request in, the teacher's reply out (the question is the request's last
    user message; a tool result is answered ``Answer: <result>``)."""
    by_question = {p["question"]: p for p in problems}
    asked: dict[str, int] = {}

    def script(request: Any) -> str | ScriptedReply:
        messages = request.messages
        last = messages[-1]
        if last.get("role") == "tool":
            return f"Answer: {last.get('content')}"
        question = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
        problem = by_question.get(question)
        if problem is None:
            return "Answer: 0"
        k = asked[question] = asked.get(question, 0) + 1
        turn = demonstration(problem, random.Random(f"{seed}:{question}:{k}"), **rates)[2]
        if turn.get("tool_calls"):
            fn = turn["tool_calls"][0]["function"]
            return ScriptedReply(tool_calls=[(fn["name"], json.loads(fn["arguments"]))])
        return turn["content"]

    return script


class TeacherServer:
    """`teacher_backend` served by a gateway on 127.0.0.1 in a background thread (its own event loop), so
    blocking code (``lightrail train``, ``Trainer.fit``) can use it. A context manager; `llm` is its `LLM`."""

    def __init__(
        self,
        problems: list[dict],
        *,
        seed: int = 0,
        store_url: str | None = None,
        store_token: str | None = None,
        **rates: float,
    ) -> None:
        self.backend = teacher_backend(problems, seed=seed, **rates)
        self.store_url, self.store_token = store_url, store_token
        self.token = secrets.token_urlsafe(12)
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="teacher-gateway")
        self._server: Any = None

    def __enter__(self) -> TeacherServer:
        from lightrail.gateway.server import GatewayServer
        from lightrail.store import MemoryStore

        self._thread.start()

        async def start() -> Any:
            # with a store: the calls of routed rollouts are recorded there, as a policy's are (teacher traces)
            store: Any = MemoryStore()
            if self.store_url is not None:
                from lightrail.store.client import StoreClient

                store = StoreClient(self.store_url, token=self.store_token)
            return await GatewayServer(self.backend, store, token=self.token).start()

        self._server = asyncio.run_coroutine_threadsafe(start(), self._loop).result(30)
        self.url = self._server.url
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def llm(self, **sampling: Any) -> LLM:
        """The teacher as an `LLM` resource (``max_tokens`` must leave room for a tool call: 200 by default)."""
        return LLM(endpoint=self.url, model="teacher", sampling={"max_tokens": 200, **sampling}, api_key=self.token)
