"""examples/rag_agent on MuSiQue as published (`examples.rag_agent.musique`): the jsonl read from a fixture in its
exact layout (multi-hop questions with decompositions, a paragraph shared by two questions, an unanswerable one);
every field the showcase reads; a missing file, field or line refused in one line naming it; the reward on a
hand-computed F1 over the answer and its aliases; the faiss index against an exact search; and the Agents SDK
workflow, through real runner processes and the gateway, searching each question's own paragraphs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from published_data import HAMLET, MUSIQUE_DEV, MUSIQUE_TRAIN, write_musique

from examples.rag_agent.musique import MusiqueFormatError, load, pooled_passages, splits
from examples.rag_agent.reward import reward, token_f1
from tests._frameworks import needs_agents_sdk

pytest.importorskip("faiss", reason="the rag_agent searches through faiss: pip install 'lightrail[openai-agents]'")

AGENT = "examples.rag_agent.train:rag_agent"


@pytest.fixture
def musique(tmp_path) -> Path:
    return write_musique(tmp_path / "musique")


def _passages(record) -> list[str]:
    return [f"{p['title']}: {p['paragraph_text']}" for p in sorted(record["paragraphs"], key=lambda p: p["idx"])]


def test_each_question_gets_its_answers_decomposition_and_own_paragraphs(musique):
    train, val = splits(str(musique))
    assert [t["id"] for t in train] == ["2hop__1001_2002", "3hop1__1001_3003_4004"]
    assert [t["id"] for t in val] == ["2hop__5005_6006"]  # the unanswerable question is left out
    first, dev = train[0], val[0]
    assert first == {
        "id": "2hop__1001_2002",
        "question": "Where was the director of the 1948 film Hamlet born?",
        "answers": ["Dorking", "Dorking, Surrey"],
        "hops": 2,
        "decomposition": [
            ["Who directed the 1948 film Hamlet?", "Laurence Olivier"],
            ["Where was #1 born?", "Dorking"],
        ],
        "supporting": _passages(MUSIQUE_TRAIN[0])[:2],
        "passages": _passages(MUSIQUE_TRAIN[0]),  # in idx order, whatever the file's order
    }
    assert first["passages"][0] == "Hamlet (1948 film): " + HAMLET["paragraph_text"]
    assert train[1]["hops"] == 3 and train[1]["answers"] == ["River Thames", "Thames", "the Thames"]
    assert dev["answers"] == ["Nepalese rupee", "NPR", "rupee"]
    assert json.loads(json.dumps(train + val)) == train + val


def test_pooled_tasks_search_every_distinct_paragraph_of_both_files(musique):
    train, val = splits(str(musique), corpus="pooled")
    files = [
        str(musique.resolve() / "musique_ans_v1.0_train.jsonl"),
        str(musique.resolve() / "musique_ans_v1.0_dev.jsonl"),
    ]
    assert all(t["corpus"] == {"files": files} and "passages" not in t for t in train + val)
    pooled = pooled_passages(tuple(files))
    every = [p for r in MUSIQUE_TRAIN + MUSIQUE_DEV for p in _passages(r)]
    # Hamlet (1948) and Lima are each in two questions: once each
    assert len(pooled) == len(set(every)) == len(every) - 2
    assert set(pooled) == set(every)


def test_samples_are_seeded_and_sized(musique):
    assert splits(str(musique), n_train=1, n_val=0, seed=1) == splits(str(musique), n_train=1, n_val=0, seed=1)
    assert len(splits(str(musique), n_train=1)[0]) == 1
    with pytest.raises(ValueError, match="n_val=2, but val has 1 answerable questions"):
        splits(str(musique), n_val=2)
    with pytest.raises(ValueError, match="corpus must be one of"):
        splits(str(musique), corpus="wiki")


def test_missing_files_fields_and_broken_lines_are_refused_naming_them(musique):
    train_file = musique.resolve() / "musique_ans_v1.0_train.jsonl"

    def rewrite(change) -> None:
        records = [json.loads(line) for line in train_file.read_text().splitlines()]
        change(records)
        train_file.write_text("".join(json.dumps(r) + "\n" for r in records))

    def refused() -> str:
        with pytest.raises(MusiqueFormatError) as exc:
            load(train_file)
        assert "\n" not in str(exc.value)
        return str(exc.value)

    with pytest.raises(MusiqueFormatError, match=r"musique_ans_v1.0_test.jsonl: no such file$"):
        splits(str(musique), val="musique_ans_v1.0_test.jsonl")
    rewrite(lambda r: r[1].pop("answer_aliases"))
    assert refused() == f"{train_file}:2: no field 'answer_aliases'"
    rewrite(lambda r: r[1].update(answer_aliases=[]) or r[0]["paragraphs"][3].pop("paragraph_text"))
    assert refused() == f"{train_file}:1: paragraphs[3] has no field 'paragraph_text'"
    rewrite(
        lambda r: r[0]["paragraphs"][3].update(paragraph_text="x") or r[1]["question_decomposition"][2].pop("answer")
    )
    assert refused() == f"{train_file}:2: question_decomposition[2] has no field 'answer'"
    rewrite(lambda r: r[1]["question_decomposition"][2].update(answer="River Thames"))
    assert len(load(train_file)) == 2  # whole again
    train_file.write_text(train_file.read_text() + "{not json\n")
    assert refused().startswith(f"{train_file}:3: not JSON")


def test_the_reward_is_format_plus_the_best_f1_over_answer_and_aliases(musique):
    _, (dev,) = splits(str(musique))  # answers: "Nepalese rupee", "NPR", "rupee"
    # "the rupee of Nepal" -> [rupee, of, nepal]; against "nepalese rupee": 1 common, P 1/3, R 1/2, F1 0.4;
    # against "rupee": 1 common, P 1/3, R 1, F1 0.5; against "npr": 0. Best: 0.5
    assert reward("Notes.\nAnswer: the rupee of Nepal", dev["answers"]) == pytest.approx(0.1 + 0.9 * 0.5)
    # "Nepalese rupees": P 1/2 R 1/2 against "nepalese rupee" (rupees != rupee): F1 0.5
    assert reward("Answer: Nepalese rupees", dev["answers"]) == pytest.approx(0.1 + 0.9 * 0.5)
    assert reward("Answer: N.P.R.", dev["answers"]) == 1.0  # SQuAD deletes punctuation: "npr"
    assert reward("It is the rupee.", dev["answers"]) == 0.0  # no Answer: line, no answer
    # Agent Lightning's (HotpotQA's) yes/no rule: a bare "no" scores nothing against another answer
    assert token_f1("no", "no way") == 0.0 and token_f1("yes", "yes") == 1.0 and token_f1("no way", "no way") == 1.0


def test_a_questions_search_returns_its_supporting_paragraph_for_each_hop(musique):
    from examples.rag_agent.retrieval import pooled_index, question_index

    train, _ = splits(str(musique))
    for task in train:
        index = question_index(tuple(task["passages"]))
        for step, support in zip(task["decomposition"], task["supporting"], strict=False):
            sub_question = step[0].replace("#1", "Laurence Olivier").replace("#2", "Royal National Theatre")
            assert index.search(sub_question, 1) == [support]
    files = tuple(splits(str(musique), corpus="pooled")[0][0]["corpus"]["files"])
    pooled = pooled_index(files)
    assert pooled.search("What is the currency of Nepal?", 1) == [
        "Nepalese rupee: " + MUSIQUE_DEV[0]["paragraphs"][1]["paragraph_text"]
    ]


def test_the_vector_index_is_exact_when_small_and_hnsw_keeps_recall_when_large():
    from examples.rag_agent.retrieval import VectorIndex

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((40, 384)).astype(np.float32)
    vectors = centres[rng.integers(0, 40, 4000)] + rng.standard_normal((4000, 384)).astype(np.float32) * 0.1
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    queries = vectors[:50] + rng.standard_normal((50, 384)).astype(np.float32) * 0.05
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    truth = np.argsort(-(queries @ vectors.T), axis=1, kind="stable")[:, :10]
    exact = VectorIndex(vectors)
    assert not exact.hnsw and np.array_equal(exact.search(queries, 10), truth)
    hnsw = VectorIndex(vectors, exact_below=1000)
    assert hnsw.hnsw
    found = hnsw.search(queries, 10)
    recall = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    assert recall >= 0.95
    assert exact.search(queries[0], 5000).shape == (1, 4000)  # k past the corpus: every vector, once


def _scripted(hops: dict[str, list[str]], answers: dict[str, str]):
    """The researcher searches each of its question's sub-questions (``hops``) and passes on every result; the
    editor answers ``answers[question]`` only if the notes hold the final hop's supporting paragraph, else
    "unknown"."""
    from lightrail.gateway import ScriptedReply

    def text(message) -> str:
        content = message.get("content") or ""
        return content if isinstance(content, str) else " ".join(part.get("text", "") for part in content)

    def reply(request):
        messages = request.messages
        if not request.tools:  # the editor
            brief = text(messages[-1])
            question = re.search(r"Question: (.+)", brief).group(1)
            support, answer = answers[question]
            return f"Answer: {answer}" if support in brief else "Answer: unknown"
        question = text(messages[1])
        results = [text(m) for m in messages if m["role"] == "tool"]
        if len(results) < len(hops[question]):
            return ScriptedReply(tool_calls=[("search", {"query": hops[question][len(results)]})])
        return "Notes: " + " ".join(results)

    return reply


@needs_agents_sdk
async def test_the_workflow_searches_each_questions_own_paragraphs(musique, tmp_path):
    from lightrail import LLM, Trainer
    from lightrail.gateway import GatewayServer, ScriptedBackend
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    (olivier, theatre), (rupee,) = splits(str(musique))
    hops = {
        olivier["question"]: ["Who directed the 1948 film Hamlet?", "Where was Laurence Olivier born?"],
        rupee["question"]: ["Kathmandu is the capital of which country?", "What is the currency of Nepal?"],
    }
    answers = {olivier["question"]: (olivier["supporting"][1], "Dorking"),
               rupee["question"]: (rupee["supporting"][1], "the rupee of Nepal")}  # fmt: skip
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(_scripted(hops, answers)), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=2, store=server.url, token=server.token)
            # the notes quote every search result: room for them (a reply cut by max_tokens is an incomplete
            # response, which the Agents SDK logs as "Error getting response" and raises: no notes)
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 4096})}
            report = await trainer.dev_async(AGENT, [olivier, rupee], resources, timeout_s=180)
    finally:
        await store.close()
        server.stop()
    # right, and the hand-computed F1 of "the rupee of Nepal" (0.5, above): both found their supporting paragraph
    assert [r.reward for r in report.rows] == [1.0, pytest.approx(0.1 + 0.9 * 0.5)]
