"""Fuzz a server from its OpenAPI document with schemathesis: for every operation, valid requests (positive) and
requests that break the schema (negative), sent over HTTP to the real server; every answer must be below 500, and
every 4xx must say why (a JSON error with a message). Then valid requests with every id blanked (``blank-ids``):
each must be refused with a 4xx that says why (the store's one id rule, `lightrail.store.base.check_id`), never
accepted. Used by ``tests/fuzz`` (bounded), ``bench/fuzz.py`` and ``bench/soak.py``.

Deterministic: cases are derandomized, long polls are asked for no wait (``timeout_s``/``wait_s`` 0, set even when
the case leaves it out, since the server's default is its cap), and the client's read timeout is above every
server-side cap (`READ_TIMEOUT_S`), so a slow answer is a slow answer, never a client-side failure.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from lightrail.store._wire import MAX_WAIT_S

__all__ = ["READ_TIMEOUT_S", "FuzzResult", "fuzz"]

READ_TIMEOUT_S = MAX_WAIT_S + 30.0
"""The fuzzer's read timeout: above every documented server cap (the store's long polls, `lease` and `wait`,
answer within `MAX_WAIT_S`; the gateway over its scripted backend has no longer wait), plus room for a loaded
machine. A fuzz case must never fail because the client gave up first."""

_LONG_POLLS = {"/v1/rollouts/wait": "timeout_s", "/v1/lease": "wait_s"}
"""Long-poll routes and their wait: set to 0 in every case (absent, the server waits its cap)."""

_ID_FIELDS = frozenset({"rollout_id", "task_id", "attempt_id", "span_id", "trace_id", "parent_id", "resources_id",
                        "token_id", "worker_id", "feedback_id", "session_id", "response_id"})  # fmt: skip
"""Fields ``check_id`` governs, by name (bodies, path and query parameters); ``rollout_ids`` lists them."""

BLANK_ID = " "
"""What ``blank-ids`` cases put in every id: blank, so a path parameter still reaches its route (``""`` would not)."""


@dataclass
class FuzzResult:
    cases: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    """One line per bad answer: a 5xx, a 4xx without a reason, or a blanked id accepted."""
    id_refusals: int = 0
    """``blank-ids`` cases refused with a 4xx that says why (as they must be)."""

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
    key = _LONG_POLLS.get(case.path)
    if key is not None and isinstance(case.body, dict):
        case.body[key] = 0
    return case


def _blank(value: Any) -> tuple[Any, bool]:
    """``value`` with every id field (`_ID_FIELDS`, and the items of ``rollout_ids``) set to `BLANK_ID`, and whether
    there was one."""
    if isinstance(value, list):
        out = [_blank(item) for item in value]
        return [v for v, _ in out], any(c for _, c in out)
    if not isinstance(value, dict):
        return value, False
    changed, blanked = False, {}
    for key, item in value.items():
        if key in _ID_FIELDS and isinstance(item, str):
            blanked[key], changed = BLANK_ID, True
        elif key == "rollout_ids" and isinstance(item, list) and item:
            blanked[key], changed = [BLANK_ID] * len(item), True
        else:
            blanked[key], sub = _blank(item)
            changed = changed or sub
    return blanked, changed


def _blank_ids(case: Any) -> tuple[Any, bool]:
    case.body, changed = _blank(case.body)
    for params in (case.path_parameters, case.query):
        for key in list(params or {}):
            if key in _ID_FIELDS:
                params[key], changed = BLANK_ID, True
    return case, changed


def fuzz(openapi_url: str, headers: dict[str, str], *, examples: int, seed: int = 0) -> FuzzResult:
    """Up to ``examples`` positive and ``examples`` negative cases per operation of the document at
    ``openapi_url``, sent with ``headers`` (the token) to the server that serves it, then up to ``examples // 5``
    (at least 3) positive cases with their ids blanked."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(openapi_url, headers=headers, timeout=READ_TIMEOUT_S)
    base_url = openapi_url.rsplit("/", 1)[0]
    result = FuzzResult()
    for loaded in schema.get_all_operations():
        operation = loaded.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_operation(operation, mode, base_url, headers, examples, result)
        _fuzz_operation(operation, GenerationMode.POSITIVE, base_url, headers, max(examples // 5, 3), result,
                        blank_ids=True)  # fmt: skip
    return result


def _fuzz_operation(operation: Any, mode: Any, base_url: str, headers: dict[str, str], examples: int,
                    result: FuzzResult, *, blank_ids: bool = False) -> None:  # fmt: skip
    strategy = operation.as_strategy(generation_mode=mode).map(_no_long_poll)
    strategy = strategy.map(_blank_ids) if blank_ids else strategy.map(lambda case: (case, False))
    label = "blank-ids" if blank_ids else mode.value

    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def one(drawn: tuple[Any, bool]) -> None:
        case, blanked = drawn
        if blank_ids and not blanked:
            return  # this case carries no id (an empty list of spans, say): nothing to refuse
        response = case.call(base_url=base_url, headers=headers, timeout=READ_TIMEOUT_S)
        result.cases += 1
        status = response.status_code
        result.by_status[status] = result.by_status.get(status, 0) + 1
        explained = 400 <= status < 500 and _reason(response) is not None
        if blanked and explained:
            result.id_refusals += 1
        if status >= 500 or (400 <= status < 500 and not explained) or (blanked and not explained):
            body = case.body if not isinstance(case.body, bytes) else case.body[:200]
            result.failures.append(
                f"{operation.method.upper()} {case.formatted_path} ({label}) -> {status}: "
                f"{response.text[:300]!r}; body={str(body)[:300]}"
            )

    with contextlib.suppress(Unsatisfiable):  # nothing to generate in this mode (no inputs to break)
        one()
