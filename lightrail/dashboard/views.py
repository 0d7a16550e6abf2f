"""What the dashboard's pages show, read from a `Store` and shaped for the templates (no HTML here but the charts).

Every read goes through the store API, so the dashboard works on any store: a SQLite file, PostgreSQL, or another
store server over HTTP. A page costs what its reads cost: the rollouts table is one `Store.query_rollouts_page`
call (paged and filtered by the store), a rollout is its attempts plus one attempt's spans. Only the runs pages
read every rollout (runs are derived from rollout metadata, `lightrail.inspection.runs.derive_runs`).
"""

from __future__ import annotations

import difflib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup

from lightrail._errors import counted
from lightrail.dashboard.charts import line_chart
from lightrail.inspection.runs import Run, ordered_spans, span_children
from lightrail.types import LLM, Attr, PromptTemplate, Resources, Rollout, RolloutStatus, Span, call_agent_name

__all__ = ["CallView", "SpanRow", "call_views", "run_charts", "timeline"]


def when(t: float | None) -> str:
    return "" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def took(start: float | None, end: float | None) -> str:
    if start is None or end is None:
        return ""
    seconds = end - start
    return f"{1000 * seconds:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


# -- runs -------------------------------------------------------------------------------------------------------


def find_run(all_runs: Sequence[Run], key: str) -> Run | None:
    return next((r for r in all_runs if str(r.number) == key or r.tag == key), None)


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def run_charts(run: Run, metrics_file: Path | None) -> list[Markup]:
    """The run's curves: from the store, mean reward per resources version for each mode (what every algorithm's
    rollouts carry); from the run's ``metrics.jsonl`` when the dashboard can read it (the run tag is the
    algorithm's ``out_dir``), reward, success, validation success, KL, loss and exclusions per step."""
    by_mode: dict[str, dict[int, list[float]]] = {}
    for r in run.rollouts:
        if r.reward is not None and r.resources_version is not None:
            by_mode.setdefault(r.mode, {}).setdefault(r.resources_version, []).append(r.reward)
    charts = [
        line_chart(
            "mean reward per resources version (store)",
            {mode: [(v, _mean(rs)) for v, rs in sorted(versions.items())] for mode, versions in by_mode.items()},
            x_label="resources version",
        )
    ]
    records = read_metrics(metrics_file) if metrics_file is not None else []
    if not records:
        return charts
    step = "round" if any("round" in m for m in records) else "step"

    def series(kind: str, key: str) -> list[tuple[float, float]]:
        return [(float(m[step]), float(m[key])) for m in records
                if m.get("kind") == kind and isinstance(m.get(key), int | float) and step in m]  # fmt: skip

    charts.append(line_chart("reward and success", {
        "train reward": series("train", "reward_mean"), "train success": series("train", "success_rate"),
        "val success": series("val", "val_success"),
    }, x_label=step))  # fmt: skip
    charts.append(
        line_chart("KL and loss", {"kl": series("train", "kl"), "loss": series("train", "loss")}, x_label=step)
    )
    charts.append(line_chart("excluded rollouts", {"excluded": series("train", "excluded")}, x_label=step))
    if any("mismatch_kl_mean" in m for m in records):  # GRPO: the sampler's logprobs vs the trainer's, per update
        charts.append(line_chart("train–inference mismatch (k3 KL before each update)", {
            "mean": series("train", "mismatch_kl_mean"), "worst row": series("train", "mismatch_kl_max"),
            "rows flagged": series("train", "mismatch_rows_flagged"),
        }, x_label=step))  # fmt: skip
    for stop in (m for m in records if m.get("kind") == "stop"):
        charts.append(Markup('<p class="stop" role="alert">training stopped at {} {}: {}</p>').format(
            step, stop.get(step, "?"), stop.get("cause", "")))  # fmt: skip
    return charts


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl`` (a line cut short by a writer mid-append is skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def metrics_file(run: Run) -> Path | None:
    """The run's ``metrics.jsonl`` if its tag is a folder this process can read."""
    if not run.tag:
        return None
    path = Path(run.tag) / "metrics.jsonl"
    try:
        return path if path.is_file() else None
    except OSError:
        return None


# -- one rollout ------------------------------------------------------------------------------------------------


@dataclass
class SpanRow:
    """One span of the timeline: its depth in the tree and where its bar sits (percent of the attempt)."""

    span: Span
    depth: int
    left: float
    width: float
    kind: str
    label: str
    detail: str
    number: int | None = None
    """The LLM call's number (1, 2, ...), linking the row to its call below."""


def _kind(span: Span) -> str:
    if span.name == Attr.SPAN_LLM_CALL:
        return "llm"
    if span.name in (
        Attr.SPAN_REWARD,
        Attr.SPAN_EVENT,
        Attr.SPAN_MESSAGE,
        Attr.SPAN_EXCEPTION,
        Attr.SPAN_ROLLOUT,
        Attr.SPAN_TRAINING,
    ):
        return span.name.rsplit(".", 1)[-1]
    return str(span.attributes.get(Attr.KIND) or "other")


def _describe(span: Span) -> tuple[str, str]:
    """A span's label and a one-line detail."""
    a = span.attributes
    if span.name == Attr.SPAN_LLM_CALL:
        named = call_agent_name(a)
        agent = f" ({named})" if named else ""
        version = f", policy v{a[Attr.POLICY_VERSION]}" if a.get(Attr.POLICY_VERSION) is not None else ""
        return f"llm call{agent}", f"model {a.get(Attr.MODEL)}{version}"
    if span.name == Attr.SPAN_REWARD:
        kind = "final" if a.get(Attr.REWARD_FINAL, True) else "intermediate"
        return f"reward {a.get(Attr.REWARD_NAME, 'reward')}", f"{a.get(Attr.REWARD)} ({kind})"
    if span.name == Attr.SPAN_EVENT:
        rest = {k: v for k, v in a.items() if k != Attr.EVENT_NAME}
        return f"event {a.get(Attr.EVENT_NAME, '')}", short(rest, 120) if rest else ""
    if span.name == Attr.SPAN_MESSAGE:
        return "message", short(str(a.get(Attr.MESSAGE_BODY, "")), 160)
    if span.name == Attr.SPAN_EXCEPTION:
        return f"exception {a.get(Attr.EXCEPTION_TYPE, '')}", short(str(a.get(Attr.EXCEPTION_MESSAGE, "")), 160)
    if span.name == Attr.SPAN_ROLLOUT:
        return "rollout", f"attempt {a.get('lightrail.attempt.index')} on {a.get('lightrail.worker_id')}"
    if span.name == Attr.SPAN_TRAINING:
        calls = a.get(Attr.TRAINING_CALLS)
        return f"trained ({a.get(Attr.TRAINING_ALGORITHM)} step {a.get(Attr.TRAINING_STEP)})", (
            counted(len(calls) if isinstance(calls, list) else 0, "call")
        )
    who = a.get(Attr.TOOL_NAME) or a.get(Attr.AGENT_NAME) or a.get("langgraph.node") or ""
    return span.name, str(who)


def timeline(spans: Sequence[Span]) -> list[SpanRow]:
    """The attempt's spans in tree order (depth first, children by start time), each placed on the attempt's time
    axis."""
    if not spans:
        return []
    timed = [s for s in spans if s.name != Attr.SPAN_TRAINING] or spans  # annotations written after the attempt
    start = min(s.start_time for s in timed)
    end = max(max(s.end_time or s.start_time for s in timed), start + 1e-6)
    roots, children = span_children(spans)
    rows: list[SpanRow] = []
    seen: set[str] = set()
    calls = 0
    # depth first without recursion (agents nest deeply); spans caught in a parent cycle, which no root reaches,
    # are shown as roots of their own afterwards
    for top in [*roots, *ordered_spans(spans)]:
        stack = [(top, 0)]
        while stack:
            span, depth = stack.pop()
            if span.span_id in seen:
                continue
            seen.add(span.span_id)
            left = min(100 * (span.start_time - start) / (end - start), 99.6)
            width = min(100 * ((span.end_time or span.start_time) - span.start_time) / (end - start), 100 - left)
            label, detail = _describe(span)
            call_number = None
            if span.name == Attr.SPAN_LLM_CALL:
                calls += 1
                call_number = calls
            rows.append(SpanRow(span, depth, round(left, 2), round(max(width, 0.4), 2), _kind(span), label, detail,
                                call_number))  # fmt: skip
            stack.extend((child, depth + 1) for child in reversed(children.get(span.span_id, [])))
    return rows


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (span attributes come from agents: anything can be there)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@dataclass
class Token:
    text: str
    logprob: float | None

    @property
    def shade(self) -> int:
        """0 (certain) .. 4 (unlikely): the background class the response text shows the token with."""
        if self.logprob is None:
            return 0
        p = math.exp(min(self.logprob, 0.0))
        return 0 if p > 0.9 else 1 if p > 0.6 else 2 if p > 0.3 else 3 if p > 0.1 else 4


@dataclass
class ToolCall:
    name: str
    arguments: str
    call_id: str


@dataclass
class Message:
    """A chat message as recorded, reduced to what the page shows (every field a string)."""

    role: str
    text: str
    name: str = ""
    tool_call_id: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""
    """A reasoning model's thinking (``reasoning_content``, or vLLM's newer ``reasoning``), shown folded."""

    def said(self) -> tuple[str, str, list[tuple[str, str]]]:
        """What the message says, for telling whether a request repeats the history (the recorded answer carries
        fields the agent drops when it sends the answer back)."""
        return (self.role, self.text, [(c.name, c.arguments) for c in self.tool_calls])


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value, default=str)


def _tool_calls(value: Any) -> list[ToolCall]:
    if value is None:
        return []
    if not isinstance(value, list):
        return [ToolCall(_text(value), "", "")]
    calls = []
    for call in value:
        function = call.get("function") if isinstance(call, dict) else call
        if isinstance(function, dict):
            name, arguments = _text(function.get("name")), _text(function.get("arguments"))
        else:
            name, arguments = _text(function), ""
        calls.append(ToolCall(name, arguments, _text(call.get("id")) if isinstance(call, dict) else ""))
    return calls


def message(value: Any, role: str = "?") -> Message:
    if not isinstance(value, dict):
        return Message(role=role, text=_text(value))
    return Message(
        role=_text(value.get("role")) or role, text=_display_text(value.get("content")), name=_text(value.get("name")),
        tool_call_id=_text(value.get("tool_call_id")), tool_calls=_tool_calls(value.get("tool_calls")),
        reasoning=_text(value.get("reasoning_content") or value.get("reasoning")),
    )  # fmt: skip


@dataclass
class Choice:
    message: Message
    tokens: list[Token]
    """The generated tokens with their logprobs (text from the response's logprobs when the agent asked for them,
    else from a tokenizer, else the token ids)."""
    finish_reason: str


@dataclass
class Trained:
    """What one update trained on a call (`Attr.SPAN_TRAINING`)."""

    step: Any
    choice: Any
    advantage: float | None
    returned: float | None


@dataclass
class CallView:
    number: int
    span: Span
    messages: list[Message]
    new_from: int
    """Index of the first message the previous call did not already send (agents resend the history)."""
    choices: list[Choice]
    trainable: bool
    """Whether the call carries what training needs (the engine's prompt and generated token ids)."""
    training: list[Trained]
    agent: str | None
    error: str
    request_extra: dict[str, Any] = field(default_factory=dict)


def _display_text(content: Any) -> str:
    """A message's content for display: unlike `lightrail.types.content_text`, non-text parts show as ``<type>``
    placeholders and any other value as JSON, so nothing a call carried is silently hidden."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            _text(p.get("text", f"<{p.get('type')}>")) if isinstance(p, dict) else _text(p) for p in content
        )
    return json.dumps(content, default=str, ensure_ascii=False)


Decode = Callable[[list[int]], list[str]]
"""Token ids to the text of each token (a tokenizer's), for showing logprobs on the response text."""


def tokenizer_decoder(path: str) -> Decode:
    """Per-token text from the tokenizer of a model folder (``from_pretrained``, local files only; transformers is
    imported here, on first use)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return lambda ids: [tokenizer.decode([i]) for i in ids]


def _tokens(recorded: dict[str, Any], response_choice: dict[str, Any], decode: Decode | None) -> list[Token]:
    shown = response_choice.get("logprobs")
    content = shown.get("content") if isinstance(shown, dict) else None
    if isinstance(content, list) and content and all(isinstance(t, dict) and "token" in t for t in content):
        return [Token(_text(t["token"]), number(t.get("logprob"))) for t in content]
    ids = recorded.get("token_ids")
    if not isinstance(ids, list):
        return []
    logprobs = recorded.get("logprobs")
    logprobs = [number(v) for v in logprobs] if isinstance(logprobs, list) else []
    if decode is not None and ids and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        texts = decode(ids)
    else:
        texts = [f"#{tid}" for tid in ids]
    return [Token(text, logprobs[i] if i < len(logprobs) else None) for i, text in enumerate(texts)]


def _training(spans: Sequence[Span]) -> dict[str, list[Trained]]:
    """What the training annotations of an attempt say, by the response id of the call."""
    out: dict[str, list[Trained]] = {}
    for span in spans:
        calls = span.attributes.get(Attr.TRAINING_CALLS) if span.name == Attr.SPAN_TRAINING else None
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict) and isinstance(call.get("response_id"), str):
                out.setdefault(call["response_id"], []).append(Trained(
                    step=span.attributes.get(Attr.TRAINING_STEP), choice=call.get("choice"),
                    advantage=number(call.get("advantage")), returned=number(call.get("return")),
                ))  # fmt: skip
    return out


def call_views(spans: Sequence[Span], decode: Decode | None = None) -> list[CallView]:
    """Each LLM call of the attempt in order: the messages it sent, what came back, token logprobs (each token's
    text from the response's own logprobs when the agent asked for them, else from ``decode``, else its id), and
    what training did with it."""
    views: list[CallView] = []
    previous: list[Message] = []
    trained = _training(spans)
    count = 0
    for row in timeline(spans):
        span = row.span
        if span.name != Attr.SPAN_LLM_CALL:
            continue
        count += 1
        a = span.attributes
        request = a.get(Attr.REQUEST)
        if not isinstance(request, dict):
            request = {} if request is None else {"request": request}
        sent = request.get("messages")
        if not isinstance(sent, list):
            sent = [{"role": "prompt", "content": request.get("prompt", "")}] if "prompt" in request else []
        messages = [message(m) for m in sent]
        same = len(previous) <= len(messages) and all(
            m.said() == p.said() for m, p in zip(messages, previous, strict=False)
        )
        new_from = len(previous) if previous and same else 0
        response = a.get(Attr.RESPONSE)
        answers = response.get("choices") if isinstance(response, dict) else None
        recorded = a.get(Attr.CHOICES)
        recorded = [c if isinstance(c, dict) else {} for c in recorded] if isinstance(recorded, list) else []
        choices = []
        for i, choice in enumerate(answers if isinstance(answers, list) else []):
            if not isinstance(choice, dict):
                continue
            said = choice.get("message") or {"role": "completion", "content": choice.get("text", "")}
            choices.append(Choice(
                message=message(said, "assistant"),
                tokens=_tokens(recorded[i] if i < len(recorded) else {}, choice, decode),
                finish_reason=_text(choice.get("finish_reason")),
            ))  # fmt: skip
        trainable = isinstance(a.get(Attr.PROMPT_IDS), list) and any(r.get("token_ids") for r in recorded)
        response_id = a.get(Attr.RESPONSE_ID)
        views.append(CallView(
            number=count, span=span, messages=messages, new_from=new_from, choices=choices, trainable=trainable,
            training=trained.get(response_id, []) if isinstance(response_id, str) else [],
            agent=_text(named) if (named := call_agent_name(a)) else None,
            error=span.status.message if span.status.code == "error" else "",
            request_extra={k: v for k, v in request.items() if k not in ("messages", "prompt")},
        ))  # fmt: skip
        previous = [*messages, *([choices[0].message] if choices else [])]
    return views


def rewards(spans: Sequence[Span]) -> list[dict[str, Any]]:
    """The rewards the attempt gave, in order: name, value, final or intermediate, the call it was linked to."""
    out = []
    for span in ordered_spans(spans):
        if span.name == Attr.SPAN_REWARD:
            a = span.attributes
            out.append({
                "name": a.get(Attr.REWARD_NAME, "reward"), "value": a.get(Attr.REWARD),
                "final": bool(a.get(Attr.REWARD_FINAL, True)), "response_id": a.get(Attr.LINKED_RESPONSE_ID),
                "at": when(span.start_time),
            })  # fmt: skip
    return out


# -- resources --------------------------------------------------------------------------------------------------


@dataclass
class ItemView:
    name: str
    kind: str
    text: str
    """A prompt's template, or an LLM's endpoint, model and sampling (never its key)."""
    diff: list[tuple[str, str]] | None
    """Against the previous version's item of that name: (class, line) pairs; None when unchanged or new."""
    status: str


def item_text(item: LLM | PromptTemplate) -> str:
    """What a resource says, as lines worth diffing: a template as written, or indented when it is a JSON list or
    object (few-shot messages, e.g. APO's ``demo_format: messages``); an LLM without its key."""
    if isinstance(item, PromptTemplate):
        text = item.template
        if text[:1] in "[{":
            try:
                return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                pass
        return text
    sampling = json.dumps(item.sampling, sort_keys=True) if item.sampling else "{}"
    return f"endpoint {item.endpoint}\nmodel {item.model}\nsampling {sampling}\nrouted {item.routed}"


def resource_items(resources: Resources, previous: Resources | None) -> list[ItemView]:
    """The items of a resources version with what changed since ``previous``."""
    out = []
    before = previous.items if previous is not None else {}
    for name, item in sorted(resources.items.items()):
        text = item_text(item)
        old = before.get(name)
        diff = None
        status = "new" if previous is not None and old is None else ""
        if old is not None:
            old_text = item_text(old)
            if old_text != text:
                status = "changed"
                lines = difflib.unified_diff(old_text.splitlines(), text.splitlines(), lineterm="", n=2)
                diff = [("add" if ln[:1] == "+" else "del" if ln[:1] == "-" else "ctx", ln) for ln in list(lines)[2:]]
        out.append(ItemView(name, "prompt template" if isinstance(item, PromptTemplate) else "llm", text, diff, status))
    return out


STATUSES = [s.value for s in RolloutStatus]


def parse_statuses(values: Sequence[str]) -> list[RolloutStatus] | None:
    """Statuses from the query string; unknown ones raise ValueError naming the known ones."""
    wanted = [v for v in values if v]
    if not wanted:
        return None
    unknown = [v for v in wanted if v not in STATUSES]
    if unknown:
        raise ValueError(f"unknown status {', '.join(unknown)} (known: {', '.join(STATUSES)})")
    return [RolloutStatus(v) for v in wanted]


def duration(rollout: Rollout) -> str:
    return took(rollout.created_at, rollout.ended_at)
