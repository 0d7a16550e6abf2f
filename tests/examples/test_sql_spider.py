"""examples/sql_agent on Spider as published (`examples.sql_agent.spider`): Spider 1.0's JSON files and Agent
Lightning's parquet read from a fixture in their exact layout (several databases); every field the showcase reads;
a missing file, column, field or database refused in one line naming it; the agent, through real runner processes
and the gateway, executing each question on its own database, chosen by ``db_id``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from published_data import DATABASES, SPIDER_DEV, SPIDER_TRAIN, write_spider

from examples.sql_agent.spider import SpiderFormatError, load, schema_of_sqlite, splits
from tests._frameworks import needs_langgraph

AGENT = "examples.sql_agent.train:sql_agent"

pytest.importorskip("pyarrow", reason="the parquet layout needs pyarrow: pip install 'lightrail[langchain]'")


@pytest.fixture
def spider(tmp_path) -> Path:
    return write_spider(tmp_path / "spider")


def _schema(db_id: str) -> str:
    """The schema text the prompts must show, restated from the fixture's tables."""
    return "\n".join(f"{t}({', '.join(n for n, _ in cols)})" for t, (cols, _) in DATABASES[db_id].items())


def _expected(rows, root: Path) -> list[dict]:
    return [
        {"question": q, "sql": sql, "db_id": db, "database": str(root / "database" / db / f"{db}.sqlite"),
         "schema": _schema(db)}
        for db, q, sql in rows
    ]  # fmt: skip


def test_spider_json_layout_gives_every_question_its_database_and_schema(spider):
    train, val = splits(str(spider))
    assert train == _expected(SPIDER_TRAIN, spider.resolve())
    assert val == _expected(SPIDER_DEV, spider.resolve())
    assert json.loads(json.dumps(train + val)) == train + val  # tasks travel through the store as JSON
    # the schema is tables.json's original names, one line per table, Spider's "*" left out
    assert train[0]["schema"] == "stadium(Stadium_ID, Location, Name, Capacity)\nsinger(Singer_ID, Name, Country, Age)"
    # every gold query runs on its own database (and the two "singers" questions differ only by database)
    answers = [sqlite3.connect(t["database"]).execute(t["sql"]).fetchall() for t in train + val]
    assert answers[0] == [(4,)] and answers[2] == [(7,)] and answers[4] == [(2,)]


def test_agent_lightning_parquet_layout_reads_the_same_tasks(spider):
    train, val = splits(str(spider), train="train_spider.parquet", val="test_dev_500.parquet")
    assert train == _expected(SPIDER_TRAIN, spider.resolve())  # schema read from the SQLite file: the same text
    assert val == _expected(SPIDER_DEV, spider.resolve())
    assert schema_of_sqlite(Path(val[0]["database"])) == _schema("pets_1")


def test_samples_are_seeded_and_sized(spider):
    train, val = splits(str(spider), n_train=2, n_val=1, seed=3)
    assert (len(train), len(val)) == (2, 1)
    assert (train, val) == splits(str(spider), n_train=2, n_val=1, seed=3)
    assert splits(str(spider), n_val=0)[1] == []
    with pytest.raises(ValueError, match="n_train=5, but train has 4 questions"):
        splits(str(spider), n_train=5)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_missing_files_fields_columns_and_databases_are_refused_naming_them(spider):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with pytest.raises(SpiderFormatError) as exc:
        splits(str(spider), val="test.json")
    assert _one_line(exc) == f"{spider.resolve() / 'test.json'}: no such file"

    questions = json.loads((spider / "dev.json").read_text())
    del questions[1]["query"]
    (spider / "dev.json").write_text(json.dumps(questions))
    with pytest.raises(SpiderFormatError) as exc:
        load(spider, "dev.json")
    assert _one_line(exc).endswith("dev.json: question 1 has no field 'query'")

    pq.write_table(pa.table({"question": ["q"], "query": ["SELECT 1"]}), spider / "no_db_id.parquet")
    with pytest.raises(SpiderFormatError) as exc:
        load(spider, "no_db_id.parquet")
    assert "no_db_id.parquet: no column 'db_id'" in _one_line(exc)

    (spider / "database" / "singer" / "singer.sqlite").unlink()
    with pytest.raises(SpiderFormatError) as exc:
        load(spider, "train_spider.json")
    assert "db_id 'singer' has no database" in _one_line(exc) and "database/singer/singer.sqlite" in str(exc.value)

    tables = [t for t in json.loads((spider / "tables.json").read_text()) if t["db_id"] != "concert_singer"]
    (spider / "tables.json").write_text(json.dumps(tables))
    with pytest.raises(SpiderFormatError) as exc:
        load(spider, "train_spider.json")
    assert _one_line(exc).endswith("tables.json: no entry for db_id 'concert_singer'")

    (spider / "tables.json").unlink()
    with pytest.raises(SpiderFormatError) as exc:
        load(spider, "train_spider.json")
    assert "tables.json: no such file" in _one_line(exc)


def _db_scripted_model(answers: dict[str, tuple[str, str]]):
    """A model that, as the writer, checks the schema its prompt shows and replies with ``answers[question]``:
    (the schema it must see, the SQL it writes); a prompt showing another schema gets a reply with no SQL."""
    from examples.sql_agent.agent import WRITE
    from lightrail.gateway import ScriptedReply

    def reply(request):
        system, user = request.messages[0]["content"], request.messages[-1]["content"]
        if not system.startswith(WRITE.split("{schema}")[0]):
            return "CORRECT"  # the checker
        question = user.removeprefix("Question: ")
        schema, sql = answers[question]
        return ScriptedReply(text=f"```sql\n{sql}\n```" if f"Tables:\n{schema}\nReply" in system else "no idea")

    return reply


@needs_langgraph
async def test_the_agent_runs_each_question_on_the_database_its_db_id_names(spider, tmp_path):
    """Real runner processes and the gateway: the writer sees its question's schema and the query and the gold
    query run on its question's database. ``SELECT 4`` is right for the concert_singer question (4 singers) and
    wrong for the singer one (7), though both gold queries are ``SELECT count(*) FROM singer``; a query naming
    ``song`` runs only on the singer database."""
    from lightrail import LLM, Trainer
    from lightrail.gateway import GatewayServer, ScriptedBackend
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    train, _ = splits(str(spider), n_val=0)
    concert, _, singer, songs = train
    answers = {
        concert["question"]: (_schema("concert_singer"), "SELECT 4"),
        singer["question"]: (_schema("singer"), "SELECT 4"),  # 7 singers there: wrong
        songs["question"]: (_schema("singer"), "SELECT Title FROM song WHERE Singer_ID = 1"),
    }
    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(ScriptedBackend(_db_scripted_model(answers)), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=3, store=server.url, token=server.token)
            resources = {"llm": LLM(endpoint=gateway.url, model="scripted", sampling={"max_tokens": 128})}
            report = await trainer.dev_async(AGENT, [concert, singer, songs], resources, timeout_s=120)
    finally:
        await store.close()
        server.stop()
    assert [r.reward for r in report.rows] == [1.0, 0.0, 1.0]


def test_lightrail_train_refuses_a_missing_file_in_one_line(spider, tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "lightrail.cli", "train", str(root / "examples/sql_agent/config.yaml"),
         "--set", "data=examples.sql_agent.spider:splits", "--set", f"data_args={{path: {spider}, val: test.json}}",
         "--out", str(tmp_path / "run")],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"lightrail train: data examples.sql_agent.spider:splits: {spider.resolve() / 'test.json'}: no such file"
    ]
