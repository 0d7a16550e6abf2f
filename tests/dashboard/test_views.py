"""The pure parts of the dashboard: the span timeline and the SVG charts."""

from __future__ import annotations

import re

from lightrail.dashboard.charts import line_chart
from lightrail.dashboard.views import timeline
from lightrail.types import Attr, Span


def _span(name: str, start: float, end: float | None, parent: str | None = None, **attributes) -> Span:
    return Span(rollout_id="ro-1", attempt_id="at-1", seq=int(start * 10), name=name, span_id=f"s{start}",
                parent_id=parent, start_time=start, end_time=end, attributes=attributes)  # fmt: skip


def test_the_timeline_places_spans_on_the_attempts_time_axis_in_tree_order():
    root = _span(Attr.SPAN_ROLLOUT, 100.0, 110.0)
    call = _span(Attr.SPAN_LLM_CALL, 102.0, 107.0, parent=root.span_id)
    tool = _span("search", 107.5, 108.0, parent=root.span_id, **{Attr.KIND: "tool", Attr.TOOL_NAME: "search"})
    annotation = {Attr.TRAINING_STEP: 3, Attr.TRAINING_ALGORITHM: "grpo", Attr.TRAINING_CALLS: [{}]}
    trained = _span(Attr.SPAN_TRAINING, 500.0, None, **annotation)
    rows = timeline([tool, trained, call, root])
    assert [(r.span.span_id, r.depth) for r in rows] == [
        (root.span_id, 0), (call.span_id, 1), (tool.span_id, 1), (trained.span_id, 1)
    ]  # fmt: skip
    assert (rows[0].left, rows[0].width) == (0.0, 100.0)  # the annotation written later does not stretch the axis
    assert (rows[1].left, rows[1].width) == (20.0, 50.0)
    assert rows[1].number == 1 and rows[2].label == "search" and rows[2].detail == "search"
    assert (rows[3].label, rows[3].detail, rows[3].kind) == ("trained (grpo step 3)", "1 call", "training")


def test_a_chart_spans_its_points_and_says_its_last_values():
    svg = str(line_chart("reward <b>", {"train": [(0, 0.1), (2, 0.55)], "val": [(0, 0.0), (2, 0.5)]}))
    assert 'aria-label="reward &lt;b&gt;: train 0.55 at step 2; val 0.5 at step 2"' in svg
    ticks = [float(t) for t in re.findall(r'class="tick" text-anchor="end">([-\d.e]+)<', svg)]
    assert min(ticks) <= 0.0 and max(ticks) >= 0.55  # the y axis ends on a tick at or above the highest point
    ys = [float(y) for points in re.findall(r'points="([^"]+)"', svg) for y in re.findall(r",([\d.]+)", points)]
    assert all(38 <= y <= 134 for y in ys)  # every point inside the plot area
    assert "nothing recorded yet" in str(line_chart("kl", {"kl": []}))


def test_deep_and_cyclic_span_trees_are_shown_whole():
    chain = [_span("step", float(i), float(i) + 0.5, parent=f"s{float(i - 1)}" if i else None) for i in range(3000)]
    rows = timeline(chain)
    assert [r.depth for r in rows] == list(range(3000))  # no recursion limit
    a = Span(rollout_id="ro-1", attempt_id="at-1", seq=1, name="a", span_id="a", parent_id="b", start_time=1.0)
    b = Span(rollout_id="ro-1", attempt_id="at-1", seq=2, name="b", span_id="b", parent_id="a", start_time=2.0)
    assert sorted(r.span.span_id for r in timeline([a, b])) == ["a", "b"]  # a parent cycle drops nothing


def test_resource_diffs_are_by_line_and_json_templates_are_indented():
    from lightrail.dashboard.views import resource_items
    from lightrail.types import LLM, PromptTemplate, Resources

    old = Resources(version=1, items={
        "examples": PromptTemplate(template='[{"role": "user", "content": "2+2"}]'),
        "llm": LLM(endpoint="http://x/v1", model="m", api_key="sk-secret"),
        "prompt": PromptTemplate(template="Solve it.\nShow work."),
    })  # fmt: skip
    new = Resources(version=2, items={
        "examples": PromptTemplate(template='[{"role": "user", "content": "3+3"}]'),
        "llm": LLM(endpoint="http://x/v1", model="m", api_key="sk-other"),
        "prompt": PromptTemplate(template="Solve it carefully.\nShow work."),
        "extra": PromptTemplate(template="{not json"),
    })  # fmt: skip
    items = {item.name: item for item in resource_items(new, old)}
    assert items["examples"].diff == [("ctx", "@@ -2,5 +2,5 @@"), ("ctx", "   {"), ("ctx", '     "role": "user",'),
                                      ("del", '-    "content": "2+2"'), ("add", '+    "content": "3+3"'),
                                      ("ctx", "   }"), ("ctx", " ]")]  # fmt: skip
    assert items["prompt"].status == "changed" and ("add", "+Solve it carefully.") in items["prompt"].diff
    assert items["llm"].status == "" and items["llm"].diff is None and "sk-" not in items["llm"].text
    assert (items["extra"].status, items["extra"].text) == ("new", "{not json")


def test_a_call_shows_the_agent_name_training_reads():
    """A name set on the call span with a trailing newline is shown as training selects it (`build_episode`), the
    name the call carried when the span sets none."""
    root = _span(Attr.SPAN_ROLLOUT, 100.0, 110.0)
    own = _span(Attr.SPAN_LLM_CALL, 101.0, 102.0, parent=root.span_id, **{Attr.AGENT_NAME: "Researcher\n"})
    carried = _span(Attr.SPAN_LLM_CALL, 103.0, 104.0, parent=root.span_id, **{Attr.CALLER_AGENT: "writer"})
    blank = {Attr.AGENT_NAME: "  ", Attr.CALLER_AGENT: "critic"}
    overruled = _span(Attr.SPAN_LLM_CALL, 105.0, 106.0, parent=root.span_id, **blank)
    labels = [r.label for r in timeline([root, own, carried, overruled])[1:]]
    assert labels == ["llm call (Researcher)", "llm call (writer)", "llm call (critic)"]


def test_a_grpo_run_shows_its_mismatch_per_step_and_why_it_stopped(tmp_path):
    """The run page charts the train–inference mismatch of each step, and a run stopped by a sync that did not take
    says so there, on the failures page (`training_stop`) and first in the printed failure digest."""
    import io
    import json

    from rich.console import Console

    from lightrail.dashboard.views import run_charts
    from lightrail.inspection.report import render_digest
    from lightrail.inspection.runs import Run, training_stop

    cause = "the rollout engine still serves policy version 0 after update 1: the weight sync did not take"
    records = [
        {"kind": "train", "step": 1, "mismatch_kl_mean": 1e-13, "mismatch_kl_max": 2e-13, "mismatch_rows_flagged": 0},
        {"kind": "train", "step": 2, "mismatch_kl_mean": 0.3, "mismatch_kl_max": 0.5, "mismatch_rows_flagged": 8},
        {"kind": "stop", "step": 2, "cause": cause},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    run = Run(number=1, tag=str(tmp_path))
    html = "".join(run_charts(run, tmp_path / "metrics.jsonl"))
    assert "train–inference mismatch" in html and "rows flagged" in html
    assert f"training stopped at step 2: {cause}" in html
    assert training_stop(run) == f"at step 2: {cause}"
    assert training_stop(Run(number=2, tag=str(tmp_path / "elsewhere"))) is None
    out = io.StringIO()
    render_digest([], Console(file=out, width=300), stopped=training_stop(run))
    assert out.getvalue().splitlines()[0] == f"training stopped at step 2: {cause}"
