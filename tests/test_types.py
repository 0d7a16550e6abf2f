"""The data contract's own rules: lifecycle transitions and LLM routing."""

from __future__ import annotations

import msgspec
import pytest

from lightrail.types import (
    LLM,
    AttemptStatus,
    IllegalTransitionError,
    RetryPolicy,
    RolloutStatus,
    Span,
    check_attempt_transition,
    check_rollout_transition,
    next_seq,
)


def test_terminal_rollout_states_are_sticky():
    for terminal in [s for s in RolloutStatus if s.terminal]:
        for target in RolloutStatus:
            with pytest.raises(IllegalTransitionError):
                check_rollout_transition(terminal, target)
    check_rollout_transition(RolloutStatus.RUNNING, RolloutStatus.QUEUED)  # a retry
    with pytest.raises(IllegalTransitionError):
        check_rollout_transition(RolloutStatus.QUEUED, RolloutStatus.SUCCEEDED)  # never ran


def test_attempts_end_once():
    check_attempt_transition(AttemptStatus.RUNNING, AttemptStatus.LOST)
    with pytest.raises(IllegalTransitionError):
        check_attempt_transition(AttemptStatus.TIMEOUT, AttemptStatus.SUCCEEDED)
    with pytest.raises(IllegalTransitionError):
        check_attempt_transition(AttemptStatus.RUNNING, AttemptStatus.RUNNING)


def test_llm_routing_is_idempotent_and_skips_external_endpoints():
    llm = LLM(endpoint="http://127.0.0.1:8000/v1", model="m")
    routed = llm.base_url("ro-1", "at-1")
    assert routed == "http://127.0.0.1:8000/rollouts/ro-1/attempts/at-1/v1"
    assert LLM(endpoint=routed, model="m").base_url("ro-1", "at-1") == routed
    assert llm.base_url() == "http://127.0.0.1:8000/v1"
    judge = LLM(endpoint="https://api.example.com/v1", model="judge", routed=False)
    assert judge.base_url("ro-1", "at-1") == "https://api.example.com/v1"


def test_bad_policies_and_spans_are_refused_at_decode():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(msgspec.ValidationError, match=r"\$\.seq"):
        msgspec.json.decode(b'{"rollout_id": "r", "attempt_id": "a", "seq": "x", "name": "n"}', type=Span)


def test_next_seq_strictly_increases():
    seqs = [next_seq() for _ in range(1000)]
    assert seqs == sorted(set(seqs))
