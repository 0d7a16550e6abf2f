"""Rows: transition mode, trajectory merge with environment tokens masked, prefix drift detection."""

from __future__ import annotations

import pytest
from adapter_spans import llm_call, reward

from lightrail.adapters import PerTurn, build_episode, episode_transitions, spans_to_transitions, to_rows
from lightrail.types import TrainingRow


def with_advantages(spans, advantages, group_id=None):
    e = build_episode(spans)
    return episode_transitions(e, PerTurn()(e.calls, 1.0, e.intermediate), advantages, group_id=group_id)


def test_transition_mode_masks_the_prompt():
    ts = with_advantages([llm_call("a", [1, 2], [3, 4]), llm_call("b", [1, 2, 3, 4, 9], [5])], [0.5, -1.0], "task-7")
    rows, drift = to_rows(ts)
    assert all(isinstance(r, TrainingRow) for r in rows)
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4], [1, 2, 3, 4, 9, 5]]
    assert rows[0].loss_mask == [0, 0, 1, 1]
    assert rows[0].old_logprobs == [0.0, 0.0, -0.5, -0.5]
    assert rows[0].advantages == [0.0, 0.0, 0.5, 0.5]
    assert rows[1].advantages == [0.0] * 5 + [-1.0]
    assert (rows[0].rollout_id, rows[0].group_id, rows[0].policy_version) == ("ro-1", "task-7", 1)
    assert rows[0].metadata == {
        "attempt_id": "at-1",
        "turns": [0],
        "policy_versions": [1],
        "prompt_len": 2,
        "agent_name": None,
    }
    assert drift[0].breaks == 0 and drift[0].rows == 2


def test_merge_appends_environment_tokens_masked():
    spans = [
        llm_call("a", [1, 2], [3, 4], logprobs=[[-0.1, -0.2]], version=2),
        # tool result (7, 8) between a's response and b's response
        llm_call("b", [1, 2, 3, 4, 7, 8], [5], logprobs=[[-0.3]], version=1),
        llm_call("c", [1, 2, 3, 4, 7, 8, 5], [6], logprobs=[[-0.4]], version=3),  # no gap at all
        reward(1.0),
    ]
    ts = with_advantages(spans, [0.1, 0.2, 0.3])
    rows, drift = to_rows(ts, merge=True)
    (row,) = rows
    assert row.input_ids == [1, 2, 3, 4, 7, 8, 5, 6]
    assert row.loss_mask == [0, 0, 1, 1, 0, 0, 1, 1]
    assert row.old_logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3, -0.4]
    assert row.advantages == [0.0, 0.0, 0.1, 0.1, 0.0, 0.0, 0.2, 0.3]
    assert row.policy_version == 1  # the oldest call: staleness checks must see it
    assert row.metadata["turns"] == [0, 1, 2] and row.metadata["policy_versions"] == [2, 1, 3]
    assert (drift[0].merged, drift[0].rows, drift[0].breaks) == (2, 1, 0)
    # the span's lists are untouched
    assert spans[0].attributes["lightrail.prompt_ids"] == [1, 2]


def test_drift_starts_a_new_row_and_reports_first_mismatch():
    spans = [
        llm_call("a", [1, 2], [3, 4]),
        # the template re-rendered a's answer: 3 became 30 → diverges at position 2
        llm_call("b", [1, 2, 30, 4, 7], [5]),
        llm_call("c", [1, 2, 30, 4, 7, 5, 8], [6]),  # extends b's row
        llm_call("d", [1], [9]),  # shorter than the previous row: mismatch at its end
    ]
    rows, (drift,) = to_rows(with_advantages(spans, [1.0] * 4), merge=True)
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4], [1, 2, 30, 4, 7, 5, 8, 6], [1, 9]]
    assert rows[1].loss_mask == [0, 0, 0, 0, 0, 1, 0, 1]
    assert drift.breaks == 2 and drift.merged == 1 and drift.rows == 3
    assert [(b.turn, b.position, b.previous_len, b.prompt_len) for b in drift.details] == [
        (1, 2, 4, 5),
        (3, 1, 8, 1),
    ]


def test_interleaved_branches_each_extend_their_own_row():
    spans = [
        llm_call("a", [1], [2]),
        llm_call("s", [50], [51]),  # a sub-agent with its own conversation
        llm_call("b", [1, 2, 3], [4]),  # back to the main conversation
        llm_call("t", [50, 51, 52], [53]),
    ]
    rows, (drift,) = to_rows(with_advantages(spans, [0.0] * 4), merge=True)
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4], [50, 51, 52, 53]]
    assert [r.metadata["turns"] for r in rows] == [[0, 2], [1, 3]]
    # s extends nothing (a break against a's sequence); b and t find their own rows again
    assert [(b.turn, b.position) for b in drift.details] == [(1, 0)]
    assert drift.merged == 2


def test_sibling_choices_are_rows_not_drift():
    rows, (drift,) = to_rows(with_advantages([llm_call("a", [1], [2], [3]), llm_call("b", [1, 2, 5], [6])], [1, 2]))
    assert [r.input_ids for r in rows] == [[1, 2], [1, 3], [1, 2, 5, 6]]
    rows, (drift,) = to_rows(
        with_advantages([llm_call("a", [1], [2], [3]), llm_call("b", [1, 2, 5], [6])], [1, 2]), merge=True
    )
    assert [r.input_ids for r in rows] == [[1, 2, 5, 6], [1, 3]]
    assert drift.breaks == 0


def test_call_without_logprobs_is_left_out_and_becomes_context():
    spans = [
        llm_call("a", [1], [2]),
        llm_call("b", [1, 2, 3], [4], logprobs=[None]),
        llm_call("c", [1, 2, 3, 4, 5], [6]),
    ]
    rows, (drift,) = to_rows(with_advantages(spans, [1.0, 2.0, 3.0]), merge=True)
    (row,) = rows
    assert row.input_ids == [1, 2, 3, 4, 5, 6]
    assert row.loss_mask == [0, 1, 0, 0, 0, 1]  # b's answer (4) is context, not trained
    assert row.advantages == [0.0, 1.0, 0.0, 0.0, 0.0, 3.0]
    assert drift.no_logprobs == 1 and drift.breaks == 0


def test_advantage_is_required():
    transitions, _ = spans_to_transitions([llm_call("a", [1], [2])])
    with pytest.raises(ValueError, match="group_advantages"):
        to_rows(transitions)


def test_rows_are_per_attempt():
    ts = with_advantages([llm_call("a", [1], [2])], [0.0]) + with_advantages(
        [llm_call("b", [1, 2], [3], rollout_id="ro-2", attempt_id="at-2")], [0.0]
    )
    rows, drift = to_rows(ts, merge=True)
    assert [(r.rollout_id, r.input_ids) for r in rows] == [("ro-1", [1, 2]), ("ro-2", [1, 2, 3])]
    assert [(d.rollout_id, d.breaks) for d in drift] == [("ro-1", 0), ("ro-2", 0)]
