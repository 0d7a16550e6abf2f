"""`lightrail.agl`: Agent Lightning 0.3's names with the reference's meaning, run through lightrail's real store
server, runner processes and gateway. The "hosted" model is `lightrail gateway serve --fake`, a real
OpenAI-compatible server on 127.0.0.1 (the scripted fake backend echoes the prompt) standing in for a hosted API
this machine cannot reach."""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import agl_agents
import pytest
from rich.console import Console

import lightrail.agl as agl
from lightrail.adapters.selection import AgentFilter
from lightrail.store import open_store
from lightrail.types import Attr, RolloutStatus
from tests._served import free_port, served

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hosted(tmp_path_factory):
    """An OpenAI-compatible server on 127.0.0.1 in its own process, recording into a store of its own (not the
    run's): to the agent it is any hosted endpoint."""
    port = free_port()
    tmp = tmp_path_factory.mktemp("hosted")
    cmd = [sys.executable, "-m", "lightrail.cli", "gateway", "serve", "--fake", "--port", str(port),
           "--store", str(tmp / "hosted.db")]  # fmt: skip
    with served(cmd, port, tmp / "gateway.log", timeout_s=60) as server:
        yield server.url


def quiet() -> dict:
    return {"console": Console(file=io.StringIO(), width=200)}


def spans_of(report, rollout_id):
    async def go():
        store = open_store(report.store)
        try:
            return await store.query_spans(rollout_id)
        finally:
            await store.close()

    return asyncio.run(go())


def test_the_articles_agent_dry_runs_against_a_hosted_endpoint_with_its_calls_recorded(hosted, tmp_path):
    """``LLM(endpoint=<hosted>, sampling_parameters=...)`` in ``dev``: served through a gateway forwarding to it,
    so each call is a span of the attempt; ``dev`` on a train set runs mode ``train``; the dict reward trains on
    its ``primary_key``; objects, annotations and operations are spans of the attempt."""

    def main():  # the agent is built inside main(): it travels to the runners by value
        agent = agl_agents.EchoAgent()
        trainer = agl.Trainer(
            n_workers=1,
            initial_resources={
                "main_llm": agl.LLM(endpoint=hosted, model="gpt-4.1-nano", sampling_parameters={"temperature": 0.0}),
                "prompt": agl.PromptTemplate(template="Say {question}", engine="f-string"),
            },
            runs_dir=tmp_path, **quiet(),
        )  # fmt: skip
        return trainer.dev(agent, [{"id": "a", "question": "paris", "expect": "paris"},
                                   {"id": "b", "question": "rome", "expect": "oslo"}])  # fmt: skip

    report = main()
    print([row.error for row in report.rows])
    assert [row.status for row in report.rows] == [RolloutStatus.SUCCEEDED] * 2
    assert [row.reward for row in report.rows] == [1.0, 0.0]
    assert [row.llm_calls for row in report.rows] == [1, 1]
    spans = spans_of(report, report.rows[0].rollout_id)
    (call,) = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
    assert call.attributes[Attr.MODEL] == "gpt-4.1-nano"
    (reward,) = [s for s in spans if s.name == Attr.SPAN_REWARD]
    assert reward.attributes[Attr.REWARD] == 1.0 and reward.attributes["agl.reward.length"] == len("Say paris")
    assert agl.get_rewards_from_span(reward) == [{"name": "match", "value": 1.0},
                                                 {"name": "length", "value": 9.0}]  # fmt: skip
    assert agl.find_final_reward(spans) == 1.0
    (obj,) = [s for s in spans if agl.get_object_value(s) is not None]
    value = agl.get_object_value(obj)
    assert value["mode"] == "train" and value["input"]["id"] == "a" and value["attempt"].startswith("at")
    assert any(s.attributes.get("task.id") == "a" for s in spans)  # the annotation, flattened
    (op,) = [s for s in spans if s.name == "operation"]
    assert op.attributes["agl.operation.name"] == "record" and op.attributes["agl.operation.output"] == 9


def test_training_and_validation_methods_are_dispatched_as_agent_lightning_does(tmp_path):
    trainer = agl.Trainer(n_runners=1, runs_dir=tmp_path, **quiet())
    fit_in_dev = agl.Trainer(dev=True, n_runners=1, runs_dir=tmp_path, **quiet())
    assert fit_in_dev.fit(agl_agents.SyncSplitAgent(), [{"x": 1}]).rows[0].reward == 4.0  # no algorithm: a dev run
    for agent, expected in ((agl_agents.AsyncSplitAgent(), [1.0, 2.0]), (agl_agents.SyncSplitAgent(), [4.0, 5.0]),
                            (agl_agents.AsyncAgent(), [0.5, 0.25])):  # fmt: skip
        train = trainer.dev(agent, [{"x": 1}]).rows[0].reward
        val = trainer.dev(agent, val_dataset=[{"x": 1}]).rows[0].reward
        assert [train, val] == expected, type(agent).__name__


def test_a_rollout_function_gets_its_prompt_template_formatted_by_its_engine_and_hooks_run_around_it(tmp_path):
    trainer = agl.Trainer(
        n_runners=1,
        runs_dir=tmp_path,
        **quiet(),
        initial_resources={"prompt_template": agl.PromptTemplate(template="{{ a }} and {{ b|upper }}", engine="jinja")},
        hooks=[agl_agents.MarkHook()],
    )
    report = trainer.dev(agl_agents.prompt_agent, dev_dataset=[{"a": "x", "b": "y"}])
    assert report.rows[0].reward == 1.0
    spans = spans_of(report, report.rows[0].rollout_id)
    (message,) = [agl.get_message_value(s) for s in spans if agl.get_message_value(s) is not None]
    assert message == "x and Y"
    marks = [s.attributes["hook"] for s in sorted(spans, key=lambda s: s.seq) if "hook" in s.attributes]
    assert marks == ["start", "end"]
    assert {s.attributes["rollout"] for s in spans if "hook" in s.attributes} == {report.rows[0].rollout_id}


def test_prompt_templates_format_in_both_engines_and_refuse_poml():
    assert agl.PromptTemplate(template="{a}-{b}", engine="f-string").format(a=1, b=2) == "1-2"
    assert (
        agl.PromptTemplate(template="{% for x in xs %}{{ x }};{% endfor %}", engine="jinja").format(xs=[1, 2]) == "1;2;"
    )
    with pytest.raises(Exception, match="'b' is undefined"):
        agl.PromptTemplate(template="{{ a }}{{ b }}", engine="jinja").format(a=1)
    with pytest.raises(ValueError, match="poml"):
        agl.PromptTemplate(template="<poml/>", engine="poml")


def test_a_script_without_a_main_guard_runs_its_agent_once_per_task(tmp_path):
    """The published walkthrough's shape: the agent class, its instance and ``trainer.dev`` at the top of a
    script, no ``if __name__ == "__main__":``. The runners get the agent by value; the script runs once."""
    script = tmp_path / "walkthrough.py"
    script.write_text(
        textwrap.dedent(f"""
        import lightrail.agl as agl

        class Counter(agl.LitAgent[dict]):
            def rollout(self, task, resources, rollout):
                return float(task["n"]) * SCALE

        SCALE = 2.0
        print("script body ran")
        agent = Counter()
        trainer = agl.Trainer(n_runners=1, runs_dir={str(tmp_path)!r})
        report = trainer.dev(agent, [{{"n": 1}}, {{"n": 3}}])
        print("rewards", [row.reward for row in report.rows])
    """)
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240,
                         cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rewards [2.0, 6.0]" in out.stdout
    assert out.stdout.count("script body ran") == 1


def test_an_agent_that_cannot_be_sent_is_one_line_naming_it(tmp_path):
    agent = agl_agents.AsyncAgent()
    agent.lock = threading.Lock()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"cannot send the agent AsyncAgent to the runner processes: .*lock"):
        agl.Trainer(n_runners=1, runs_dir=tmp_path, **quiet()).dev(agent, [{"x": 1}])


def test_agent_match_is_a_search_as_in_agent_lightning():
    selected = AgentFilter((), agl._trainer.search_pattern("write|rewrite"))
    assert [selected(n) for n in ("write_query", "rewrite_query", "check_query", None)] == [True, True, False, False]
    anchored = AgentFilter((), agl._trainer.search_pattern("^write"))
    assert [anchored(n) for n in ("write_query", "rewrite_query")] == [True, False]


def test_verl_defaults_to_identical_credit_and_fit_applies_agent_match(tmp_path):
    from lightrail.adapters.credit import credit_by_name

    config = {"actor_rollout_ref": {"model": {"path": str(tmp_path)}}, "data": {"train_batch_size": 2}}
    grpo = agl.VERL(config, out_dir=tmp_path / "run")
    assert type(grpo.credit) is type(credit_by_name("identical"))
    assert type(lightrail_verl(config, tmp_path).credit) is not type(grpo.credit)  # lightrail's own default differs


def lightrail_verl(config, tmp_path):
    import lightrail

    return lightrail.VERL(config, out_dir=tmp_path / "own")


def test_trainer_arguments_with_no_meaning_here_are_accepted_or_refused_in_one_line():
    agl.Trainer(tracer=agl.AgentOpsTracer(), store=agl.InMemoryLightningStore(), strategy="cs",
                adapter=agl.TracerTraceToTriplet(agent_match="write"), hooks=[agl.Hook()])  # fmt: skip
    for kwargs, words in (({"llm_proxy": object()}, "gateway"), ({"runner": object()}, "runner processes"),
                          ({"store": object()}, "durable store"), ({"adapter": {"foo": 1}}, "'foo'")):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(words)) as info:
            agl.Trainer(**kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(AttributeError, match=r"^agl.LightningStoreServer is not in lightrail: .*open_store"):
        agl.LightningStoreServer  # noqa: B018
    with pytest.raises(ValueError, match="needs an algorithm"):
        agl.Trainer().fit(agl_agents.AsyncAgent(), [1])


def test_emitters_outside_a_rollout_write_nothing_and_dict_rewards_need_a_primary_key():
    assert agl.emit_reward(1.0) is None
    with pytest.raises(ValueError, match="primary_key"):
        agl.emit_reward({"a": 1.0, "b": 0.0})

    @agl.reward
    def score(x):
        return x * 2

    assert score(2) == 4
