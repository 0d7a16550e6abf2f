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


def test_llm_agent_segments_are_the_librarys_own_and_the_endpoints_path_is_kept():
    """A gateway behind a reverse proxy's ``/agents/gw`` prefix: the prefix is not an agent name."""
    proxied = LLM(endpoint="http://proxy/agents/gw/v1", model="m")
    routed = proxied.base_url("r1", "a1")
    assert routed == "http://proxy/agents/gw/rollouts/r1/attempts/a1/v1"
    assert proxied.endpoint_for("w") == "http://proxy/agents/gw/agents/w/v1"
    rollouts_prefix = LLM(endpoint="http://proxy/rollouts/gw/v1", model="m")  # a prefix, not an attempt's route
    assert rollouts_prefix.base_url("r1", "a1") == "http://proxy/rollouts/gw/rollouts/r1/attempts/a1/v1"
    assert (
        LLM(endpoint=routed, model="m").endpoint_for("w")
        == "http://proxy/agents/gw/rollouts/r1/attempts/a1/agents/w/v1"
    )
    named = LLM(endpoint="http://gw/v1", model="m", agent="Senior Critic")
    named_routed = named.base_url("r1", "a1")
    assert named_routed == "http://gw/rollouts/r1/attempts/a1/agents/Senior%20Critic/v1"
    handed = LLM(endpoint=named_routed, model="m", agent="Senior Critic")  # as the runner hands it to agents
    assert handed.base_url("r1", "a1") == named_routed  # idempotent
    assert handed.endpoint_for("w") == "http://gw/rollouts/r1/attempts/a1/agents/w/v1"  # replaces the agent
    with pytest.raises(ValueError, match="agent name"):
        LLM(endpoint="http://gw/v1", model="m", agent="padded ")


def test_bad_policies_and_spans_are_refused_at_decode():
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(msgspec.ValidationError, match=r"\$\.seq"):
        msgspec.json.decode(b'{"rollout_id": "r", "attempt_id": "a", "seq": "x", "name": "n"}', type=Span)


def test_next_seq_strictly_increases():
    seqs = [next_seq() for _ in range(1000)]
    assert seqs == sorted(set(seqs))


def test_endpoint_for_names_the_agent_last_in_any_endpoint():
    gateway = LLM(endpoint="http://gw:8900/v1", model="m")
    assert gateway.endpoint_for("writer") == "http://gw:8900/agents/writer/v1"
    routed = LLM(endpoint=gateway.base_url("ro-1", "at-1"), model="m")
    assert routed.endpoint_for("a b/c") == "http://gw:8900/rollouts/ro-1/attempts/at-1/agents/a%20b%2Fc/v1"
    named = LLM(endpoint="http://gw:8900/v1", model="m", agent="writer")  # a named endpoint in the resources
    assert named.base_url() == gateway.endpoint_for("writer")
    assert named.base_url("ro-1", "at-1") == "http://gw:8900/rollouts/ro-1/attempts/at-1/agents/writer/v1"
    assert named.endpoint_for("critic") == "http://gw:8900/agents/critic/v1"  # renamed, not nested
    external = LLM(endpoint="https://api.example.com/v1/", model="m", routed=False)
    assert external.endpoint_for("writer") == "https://api.example.com/v1"  # not a gateway: nothing to name
    for bad in ["", " writer", "x" * 201, "tab\there"]:
        with pytest.raises(ValueError, match="agent name"):
            gateway.endpoint_for(bad)
