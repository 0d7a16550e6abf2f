"""The adapters' public surface, pinned so it changes on purpose, and their purity (no I/O stack imported)."""

from __future__ import annotations

import subprocess
import sys

import lightrail.adapters


def test_all_is_pinned():
    assert sorted(lightrail.adapters.__all__) == [
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
    for name in lightrail.adapters.__all__:
        assert getattr(lightrail.adapters, name).__doc__ or name == "AGENT_NAME_KEYS", name


def test_imports_only_types():
    code = (
        "import sys, lightrail.adapters;"
        "print(sorted(m for m in sys.modules if m.startswith('lightrail') and not m.startswith('lightrail.adapters')));"
        "print(sorted(m for m in ('httpx', 'starlette', 'torch', 'opentelemetry', 'sqlite3') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "['lightrail', 'lightrail._lazy', 'lightrail.types']"  # (_lazy: the package face's helper)
    assert out[1] == "[]"
