"""Adapters: pure functions from an attempt's spans to training data. No I/O; imports only `lightrail.types`.

The path through this package, for one training step::

    spans of an attempt ──build_episode──► Episode (LLM calls in turn order, final + intermediate rewards)
                                             │  tool outcomes → intermediate rewards (ToolRewardRule)
    rollouts ──select_trainable──► trainable (infrastructure failures excluded and counted)
    (rollout, episode) pairs ──group_advantages(credit)──► Transitions (per call: ids, logprobs, return,
                                                           advantage)
    transitions ──to_rows(merge=...)──► lightrail.types.TrainingRow (ids, loss mask, old logprobs,
                                        per-token advantages, group id) + drift reports
    spans ──spans_to_messages──► ChatSamples (for SFT / prompt optimisation)

Example::

    from lightrail.adapters import (AgentFilter, PerTurn, ToolRewardRule, build_episode, group_advantages,
                                    select_trainable, to_rows)

    episodes = {r.rollout_id: build_episode(spans_of[r.rollout_id], tool_rewards_rule=ToolRewardRule())
                for r in finished}
    trainable, excluded = select_trainable(finished, episodes)
    transitions, groups = group_advantages(((r, episodes[r.rollout_id]) for r in trainable), PerTurn(),
                                           agents=AgentFilter(names={"solver"}))
    rows, drift = to_rows(transitions, merge=True)
"""

from lightrail.adapters.advantages import GroupReport, group_advantages, normalize_group
from lightrail.adapters.credit import (
    CreditAssignment,
    Discounted,
    Identical,
    PerTurn,
    credit_by_name,
    linked_rewards,
)
from lightrail.adapters.episode import AGENT_NAME_KEYS, agent_name_of, build_episode
from lightrail.adapters.messages import ChatSample, episode_messages, spans_to_messages
from lightrail.adapters.records import AdapterReport, Episode, IntermediateReward, LLMCall
from lightrail.adapters.rewards import ToolRewardRule, is_tool_span, looks_like_error, tool_rewards
from lightrail.adapters.selection import AgentFilter, Exclusions, select_trainable
from lightrail.adapters.trajectory import DriftReport, PrefixBreak, to_rows
from lightrail.adapters.transitions import episode_transitions, spans_to_transitions

__all__ = [
    "AGENT_NAME_KEYS",
    "AdapterReport",
    "AgentFilter",
    "ChatSample",
    "CreditAssignment",
    "Discounted",
    "DriftReport",
    "Episode",
    "Exclusions",
    "GroupReport",
    "Identical",
    "IntermediateReward",
    "LLMCall",
    "PerTurn",
    "PrefixBreak",
    "ToolRewardRule",
    "agent_name_of",
    "build_episode",
    "credit_by_name",
    "episode_messages",
    "episode_transitions",
    "group_advantages",
    "is_tool_span",
    "linked_rewards",
    "looks_like_error",
    "normalize_group",
    "select_trainable",
    "spans_to_messages",
    "spans_to_transitions",
    "to_rows",
    "tool_rewards",
]
