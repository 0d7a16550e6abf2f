"""Fuzz a server from its OpenAPI document with schemathesis: for every operation, valid requests (positive) and
requests that break the schema (negative), sent over HTTP to the real server; every answer must be below 500, and
every 4xx must say why (a JSON error with a message). Used by ``tests/fuzz`` (bounded) and ``bench/fuzz.py``."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

__all__ = ["FuzzResult", "fuzz"]

_LONG_POLLS = ("wait_s", "timeout_s")  # long-poll waits: capped at 60 s by the server; a fuzzer must not sit on them


@dataclass
class FuzzResult:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    """One line per bad answer: a 5xx, or a 4xx without a reason."""

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.by_status.items() if status >= 500)


def _reason(response: Any) -> str | None:
    """The message of an error answer, in the store's or OpenAI's or Anthropic's error format."""
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message.strip() else None


def _no_long_poll(case: Any) -> Any:
    if isinstance(case.body, dict):
        for key in _LONG_POLLS:
            if key in case.body:
                case.body[key] = 0
    return case


def fuzz(openapi_url: str, headers: dict[str, str], *, examples: int, seed: int = 0) -> FuzzResult:
    """Up to ``examples`` positive and ``examples`` negative cases per operation of the document at
    ``openapi_url``, sent with ``headers`` (the token) to the server that serves it."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(openapi_url, headers=headers)
    base_url = openapi_url.rsplit("/", 1)[0]
    result = FuzzResult()
    for loaded in schema.get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(loaded.ok(), mode, base_url, headers, examples, result)
    return result


def _fuzz_operation(operation: Any, mode: Any, base_url: str, headers: dict[str, str], examples: int,
                    result: FuzzResult) -> None:  # fmt: skip
    strategy = operation.as_strategy(generation_mode=mode).map(_no_long_poll)

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(case: Any) -> None:
        response = case.call(base_url=base_url, headers=headers, timeout=30)
        result.cases += 1
        status = response.status_code
        result.by_status[status] = result.by_status.get(status, 0) + 1
        if status >= 500 or (400 <= status < 500 and _reason(response) is None):
            body = case.body if not isinstance(case.body, bytes) else case.body[:200]
            result.failures.append(
                f"{operation.method.upper()} {case.formatted_path} ({mode.value}) -> {status}: "
                f"{response.text[:300]!r}; body={str(body)[:300]}"
            )

    with contextlib.suppress(Unsatisfiable):  # nothing to generate in this mode (no inputs to break)
        one()
