"""The calculator showcases on Calc-X as Agent Lightning ships it (`examples.calculator.calcx`): its parquet read
from a fixture in the exact layout (columns ``id``, ``question``, ``chain``, ``result``, ``source``); every field
the showcases read; a missing file or column refused in one line naming it; Agent Lightning's numeric-answer
reward on fractions, decimals and option letters; and the AutoGen team scored on a Calc-X result through real
runner processes and the gateway."""

from __future__ import annotations

from pathlib import Path

import pytest
from published_data import CALCX_TEST, CALCX_TRAIN, write_calcx

from examples.calculator.calcx import CalcXFormatError, answer_text, load, numeric_reward, same_result, value
from tests._frameworks import needs_autogen

pytest.importorskip("pyarrow", reason="Calc-X's parquet needs pyarrow: pip install 'lightrail[autogen]'")


@pytest.fixture
def calcx(tmp_path) -> Path:
    return write_calcx(tmp_path / "calc_x")


def _tasks(rows) -> list[dict]:
    return [{"id": i, "question": q, "result": r} for i, q, _, r in rows]


def test_both_showcases_read_question_and_result_with_their_run_settings(calcx):
    from examples.calc_agent.data import calcx as calc_agent_calcx
    from examples.sk_agent.data import calcx as sk_agent_calcx

    train, val = calc_agent_calcx(str(calcx), tools="mcp", max_turns=2)
    assert train == [{**t, "tools": "mcp", "max_turns": 2, "one_shot": False} for t in _tasks(CALCX_TRAIN)]
    assert val == [{**t, "tools": "mcp", "max_turns": 2, "one_shot": False} for t in _tasks(CALCX_TEST)]
    train, val = sk_agent_calcx(str(calcx), one_shot=True, n_train=2, n_val=0, seed=4)
    assert len(train) == 2 and val == [] and all(t["max_tool_rounds"] == 2 and t["one_shot"] for t in train)
    assert train == sk_agent_calcx(str(calcx), one_shot=True, n_train=2, n_val=0, seed=4)[0]
    assert {t["id"] for t in train} <= {r[0] for r in CALCX_TRAIN}


def test_a_missing_file_or_column_is_refused_naming_it(calcx):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from examples.calc_agent.data import calcx as calc_agent_calcx

    with pytest.raises(CalcXFormatError) as exc:
        calc_agent_calcx(str(calcx), val="test_mini.parquet")
    assert str(exc.value) == f"{calcx.resolve() / 'test_mini.parquet'}: no such file"
    pq.write_table(pa.table({"id": ["a"], "question": ["1+1?"], "answer": ["2"]}), calcx / "other.parquet")
    with pytest.raises(CalcXFormatError) as exc:
        load(calcx / "other.parquet")
    assert "\n" not in str(exc.value) and "other.parquet: no column 'result'" in str(exc.value)
    with pytest.raises(ValueError, match="n_val=3, but val has 2 problems"):
        calc_agent_calcx(str(calcx), n_val=3)


@pytest.mark.parametrize(
    ("reply", "result", "expected"),
    [
        ("Answer: 2/3", "2/3", 1.0),  # the same text
        ("x = 1/(3/2)\nAnswer: 0.667", "2/3", 1.0),  # |0.667 - 0.6667| / 0.667 < 1 %
        ("Answer: 0.65", "2/3", 0.0),  # 2.5 % off
        ("Answer: 4/6", "2/3", 1.0),
        ("Answer: 7.5", "7.5", 1.0),
        ("Answer: 15/2", "7.5", 1.0),
        ("Answer: 7.6", "7.5", 0.0),  # 1.3 % off
        ("Answer: (C)", "C", 1.0),  # an option letter: spaces and parentheses ignored
        ("Answer: C) 6", "C", 0.0),  # Agent Lightning compares the letter alone
        ("Answer: B", "C", 0.0),
        ("Answer: 12 times", "12", 0.0),  # not a number (as sympy would not make one of it either)
        ("Answer: 12\nthanks", "12", 1.0),  # the Answer: line, wherever it is
        ("Answer: 3\nAnswer: 12", "12", 1.0),  # the last one
        ("It is 12.", "12", 0.0),
        (None, "12", 0.0),
        ("Answer: __import__('os')", "12", 0.0),  # never evaluated
    ],
)
def test_numeric_reward_as_agent_lightning_compares_results(reply, result, expected):
    assert numeric_reward(reply, result) == expected


def test_values_are_read_as_calc_x_writes_them():
    assert value("3/2 = around 1.5") == 1.5 and value("-(2**3)") == -8.0 and value("1e3") == 1000.0
    for bad in ("1/0", "x", "2**1000", "sqrt(4)", ""):
        with pytest.raises(ValueError):
            value(bad)
    assert answer_text("answer:  42 ") == "42" and answer_text("no") is None
    assert same_result(" 15 ", "15") and not same_result(None, "15")


@needs_autogen
def test_the_autogen_team_is_scored_on_a_calc_x_result(calcx, tmp_path):
    """The solver answers without the tool (its calculator has no division), the checker approves: the first
    problem's ``2/3`` is right as ``0.667``, the second's ``15`` wrong as ``16``."""
    from test_calc_agent import _ScriptedGateway

    from examples.calc_agent.agent import CHECKER_SYSTEM
    from examples.calc_agent.data import calcx as calc_agent_calcx
    from lightrail.trainer import Trainer
    from lightrail.trainer.trainer import StoreServerProcess
    from lightrail.types import LLM

    train, _ = calc_agent_calcx(str(calcx), n_val=0)
    replies = {train[0]["question"]: "1/(3/2) is about 0.667.\nAnswer: 0.667", train[1]["question"]: "Answer: 16"}

    def script(request):
        messages = request.messages
        if CHECKER_SYSTEM in messages[0]["content"]:
            return "CORRECT"
        return replies[[m["content"] for m in messages if m["role"] == "user"][-1]]

    store = StoreServerProcess(tmp_path / "store.db")
    try:
        with _ScriptedGateway(script, store.url, store.token) as gateway:
            trainer = Trainer(n_runners=1, store=store.url, token=store.token, concurrency=2)
            llm = LLM(endpoint=f"{gateway.url}/v1", model=gateway.backend.model, sampling={"max_tokens": 200})
            report = trainer.dev("examples.calc_agent.train:calc_agent", train[:2], {"llm": llm})
    finally:
        store.stop()
    assert [row.reward for row in report.rows] == [1.0, 0.0]
