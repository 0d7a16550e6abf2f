"""Spans of one attempt → an `Episode`: its LLM calls in turn order, its final and intermediate rewards.

One pass over the spans, dispatching on the span name; attribute values are read by key and never copied.
LLM calls are ordered by ``seq`` among themselves (they all come from the gateway, one process), rewards by
``seq`` among themselves (the runner); the two sources are never ordered against each other — a reward reaches
a call only through the call's response id.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

from lightrail.adapters.credit import split_linked
from lightrail.adapters.records import AdapterReport, Episode, IntermediateReward, LLMCall
from lightrail.adapters.rewards import ToolRewardRule, is_tool_span, tool_rewards
from lightrail.types import Attr, Span, call_agent_name, normalize_agent_name

__all__ = ["AGENT_NAME_KEYS", "agent_name_of", "build_episode"]

AGENT_NAME_KEYS: tuple[str, ...] = ("gen_ai.agent.name", "agent.name", "graph.node.id", "langgraph.node")
"""Attributes that name the agent (or graph node) a span belongs to, most specific convention first."""

_OI_KIND = "openinference.span.kind"
_GENAI_OP = "gen_ai.operation.name"
_AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent"})
_seq = attrgetter("seq")


def agent_name_of(span: Span | None, by_id: dict[str, Span], keys: Sequence[str] = AGENT_NAME_KEYS) -> str | None:
    """The agent name of ``span``: its own name attribute, else the nearest ancestor's (by ``parent_id``).

    An OpenInference ``AGENT`` span without a name attribute names its agent by the span name. A GenAI span of an
    operation that is not an agent (``chat``, ``execute_tool``: `lightrail.tracing.semconv.names_its_agent` is
    False) names one only when no ancestor does: instrumentations copy, or default, ``gen_ai.agent.name`` onto
    them. Every name is read through `lightrail.types.normalize_agent_name` (a name with surrounding whitespace
    is the name without; a value that names no agent is skipped), as the runner's header stamps read it, so a
    call is trained under one name whether its header or its spans named it. ``by_id`` maps span ids to the
    attempt's spans; None (a parent outside the attempt) has no name.
    """
    node = span
    fallback: str | None = None
    for _ in range(len(by_id) + 1):  # bounded: a corrupt parent chain may loop
        if node is None:
            break
        a = node.attributes
        for key in keys:
            name = normalize_agent_name(a.get(key))
            if name is not None:
                if _names_its_agent(a):
                    return name
                fallback = fallback or name
                break
        else:
            if a.get(_OI_KIND) == "AGENT" and (name := normalize_agent_name(node.name)) is not None:
                return name
        node = by_id.get(node.parent_id) if node.parent_id is not None else None
    return fallback


def _names_its_agent(attributes: dict) -> bool:
    # `lightrail.tracing.semconv.names_its_agent`, restated: adapters import nothing of tracing
    op = attributes.get(_GENAI_OP)
    return op is None or op in _AGENT_OPERATIONS or _OI_KIND in attributes


def build_episode(
    spans: Sequence[Span],
    *,
    tool_rewards_rule: ToolRewardRule | None = None,
    agent_name_keys: Sequence[str] = AGENT_NAME_KEYS,
    rollout_id: str | None = None,
    attempt_id: str | None = None,
) -> Episode:
    """Read the spans of one attempt (any order) into an `Episode`.

    * every `Attr.SPAN_LLM_CALL` span is a call; ``turn`` = rank by ``seq``. Its prompt ids are None when
      `Attr.TOKEN_IDS_AVAILABLE` is False or `Attr.PROMPT_IDS` is missing. A call the client abandoned
      (`Attr.ABANDONED`: it disconnected before the answer, e.g. timed out and retried) is no call of the episode:
      it is counted in `AdapterReport.abandoned`, takes no turn and is never trained on.
    * agent name: `Attr.AGENT_NAME` on the call span, else the agent the call named when it was made
      (`Attr.CALLER_AGENT`: the gateway's ``/agents/<name>`` route, `lightrail.as_agent`, a runner's OpenTelemetry
      guess — the name that picked the call's policy), else the nearest ancestor (by ``parent_id``, the call
      span itself excluded) carrying one of ``agent_name_keys`` (see `agent_name_of`), else — for frameworks
      whose spans are not the current OpenTelemetry context during the HTTP call, so no ``traceparent`` links
      them — the agent of the framework's own LLM span of the same call (same ``gen_ai.response.id``).
    * `Attr.SPAN_REWARD` spans: final when `Attr.REWARD_FINAL` is true — or, if the flag is absent, when the
      reward links to no call; the last final reward by ``seq`` is the episode's. Others are intermediate,
      linked by `Attr.LINKED_RESPONSE_ID`.
    * with ``tool_rewards_rule``, tool outcomes become more intermediate rewards (`lightrail.adapters.rewards`).

    ``rollout_id``/``attempt_id`` are needed only for an attempt without spans. Raises ValueError if the spans
    belong to more than one attempt.
    """
    if spans:
        rollout_id = spans[0].rollout_id
        attempt_id = spans[0].attempt_id
    elif rollout_id is None or attempt_id is None:
        raise ValueError("no spans: pass rollout_id and attempt_id")
    report = AdapterReport()
    call_spans: list[Span] = []
    reward_spans: list[Span] = []
    tool_spans: list[Span] = []
    want_tools = tool_rewards_rule is not None and tool_rewards_rule.from_spans
    # framework spans by the response id they recorded (several frameworks may record one call: the LangChain
    # span and the openai client's span under it)
    by_response: dict[str, list[Span]] = {}
    genai_rid = Attr.GENAI_RESPONSE_ID
    llm_name, reward_name, exc_name = Attr.SPAN_LLM_CALL, Attr.SPAN_REWARD, Attr.SPAN_EXCEPTION
    abandoned = Attr.ABANDONED
    for s in spans:
        if s.attempt_id != attempt_id:
            raise ValueError(f"spans of several attempts ({attempt_id!r}, {s.attempt_id!r}): pass one attempt")
        name = s.name
        if name == llm_name:
            if s.attributes.get(abandoned) is True:  # the agent never received it: not a turn it took
                report.abandoned += 1
            else:
                call_spans.append(s)
        elif name == reward_name:
            reward_spans.append(s)
        elif name == exc_name:
            report.exceptions += 1
        else:
            if want_tools and is_tool_span(s):
                tool_spans.append(s)
            twin_id = s.attributes.get(genai_rid)
            if type(twin_id) is str:  # any JSON can arrive over OTLP
                by_response.setdefault(twin_id, []).append(s)
    call_spans.sort(key=_seq)  # already sorted when read from a store: timsort makes that one linear pass

    calls: list[LLMCall] = []
    by_id: dict[str, Span] | None = None
    inherited: dict[str, str | None] = {}  # parent span id -> agent name: sibling calls share their parent
    n_choices = 0
    k_prompt, k_avail = Attr.PROMPT_IDS, Attr.TOKEN_IDS_AVAILABLE
    k_choices, k_version, k_rid = Attr.CHOICES, Attr.POLICY_VERSION, Attr.RESPONSE_ID
    for turn, s in enumerate(call_spans):
        a = s.attributes
        agent = call_agent_name(a)
        parent = s.parent_id
        if agent is None and parent is not None:
            if parent in inherited:
                agent = inherited[parent]
            else:
                if by_id is None:  # built once, only when some call needs its ancestors
                    by_id = {x.span_id: x for x in spans}
                agent = inherited[parent] = agent_name_of(by_id.get(parent), by_id, agent_name_keys)
        response_id = a.get(k_rid)
        if agent is None and by_response and isinstance(response_id, str):
            for twin in by_response.get(response_id, ()):
                if by_id is None:
                    by_id = {x.span_id: x for x in spans}
                agent = agent_name_of(twin, by_id, agent_name_keys)
                if agent is not None:
                    break
        prompt = a.get(k_prompt)
        if a.get(k_avail) is False:
            prompt = None
        choices = a.get(k_choices) or []
        n_choices += len(choices)
        calls.append(
            LLMCall(
                span=s,
                turn=turn,
                response_id=a.get(k_rid),
                agent_name=agent,
                prompt_ids=prompt,
                choices=choices,
                policy_version=a.get(k_version),
            )
        )
    report.calls = len(calls)
    report.choices = n_choices

    final: float | None = None
    intermediate: list[IntermediateReward] = []
    if reward_spans:
        reward_spans.sort(key=_seq)
        k_value, k_final, k_link, k_name = Attr.REWARD, Attr.REWARD_FINAL, Attr.LINKED_RESPONSE_ID, Attr.REWARD_NAME
        for s in reward_spans:
            a = s.attributes
            value = a.get(k_value)
            if value is None:
                continue
            link = a.get(k_link)
            is_final = a.get(k_final)
            if is_final is None:
                is_final = link is None
            if is_final:
                final = float(value)
                report.final_rewards += 1
            else:
                intermediate.append(IntermediateReward(value=float(value), response_id=link, name=a.get(k_name)))
    if final is None:
        report.no_final_reward += 1
    if tool_rewards_rule is not None:
        intermediate.extend(tool_rewards(calls, tool_spans, tool_rewards_rule, report))
    if intermediate:
        report.intermediate_rewards = len(intermediate)
        report.unlinked_rewards = len(split_linked(calls, intermediate)[1])
    return Episode(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        calls=calls,
        final_reward=final,
        intermediate=intermediate,
        report=report,
    )
