"""Every field the gateway's table lists (`lightrail.gateway.fields`), sent to a real gateway over the tiny engine:
honoured and recorded fields answer 200 (message text the model is shown appears in the recorded prompt ids),
refused ones a 400 whose message names the field. The table covers every field of every API's request struct and
is the one in docs/gateway.md. `developer` reaches Qwen2.5's and Qwen3's templates as a system turn."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from lightrail.gateway.anthropic_api import MessagesBody
from lightrail.gateway.fields import FIELD_TABLES, MINIMAL, FieldRule, markdown_table
from lightrail.gateway.openai_api import ChatCompletionBody, CompletionBody
from lightrail.gateway.responses_api import ResponsesBody
from lightrail.types import Attr

pytest.importorskip("torch")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from lightrail.engine import Engine, prepare_model  # noqa: E402

TEMPLATES = Path(__file__).parents[1] / "engine" / "templates"
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def gateway(make_module_gateway):
    engine = Engine.from_pretrained(prepare_model("tiny"))
    server = make_module_gateway(engine, token="t")
    yield server, engine, server.lease()
    server.call(engine.close())


def _send(server, lease, path: str, body: dict) -> httpx.Response:
    url = server.base_url(lease) + path
    return httpx.post(url, json=body, headers={"authorization": "Bearer t"}, timeout=120)


def _previous(server, lease) -> str:
    answer = _send(server, lease, "/responses", MINIMAL["/responses"])
    assert answer.status_code == 200, answer.text
    return answer.json()["id"]


ROWS = [(path, rule) for path, rules in FIELD_TABLES.items() for rule in rules]


@pytest.mark.parametrize(("path", "rule"), ROWS, ids=[f"{p}:{r.field}" for p, r in ROWS])
def test_every_listed_field_is_honoured_or_refused_by_name(gateway, path: str, rule: FieldRule):
    server, engine, lease = gateway
    body = {**MINIMAL[path], **rule.send}
    if body.get("previous_response_id") == "$previous":
        body["previous_response_id"] = _previous(server, lease)
    answer = _send(server, lease, path, body)
    if rule.treatment == "refused":
        assert answer.status_code == 400, answer.text
        assert rule.named in answer.json()["error"]["message"]
        return
    assert answer.status_code == 200, answer.text
    if rule.shows:
        span = server.spans(lease)[-1]
        assert rule.shows in engine.decode(span.attributes[Attr.PROMPT_IDS])


STRUCTS = {
    "/chat/completions": ChatCompletionBody,
    "/completions": CompletionBody,
    "/responses": ResponsesBody,
    "/messages": MessagesBody,
}


@pytest.mark.parametrize("path", list(FIELD_TABLES))
def test_the_table_has_a_row_for_every_field_of_the_api(path: str):
    listed = {rule.field.split(" ")[0].split("[")[0].split(".")[0] for rule in FIELD_TABLES[path]}
    missing = set(STRUCTS[path].__struct_fields__) - listed
    assert not missing, f"{path}: fields without a row in lightrail/gateway/fields.py: {sorted(missing)}"


def test_the_docs_show_the_table():
    assert markdown_table() in (ROOT / "docs" / "gateway.md").read_text()


@pytest.fixture(params=["qwen2.5", "qwen3"])
def qwen_gateway(request, make_gateway):
    """The tiny model behind a published Qwen chat template (which skips any role it does not name)."""
    path = prepare_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = (TEMPLATES / f"{request.param}.jinja").read_text()
    engine = Engine(AutoModelForCausalLM.from_pretrained(path), tokenizer)
    server = make_gateway(engine, token="t")
    yield server, engine, server.lease()
    server.call(engine.close())


DEVELOPER = {"role": "developer", "content": "Answer in French."}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/chat/completions", {"messages": [DEVELOPER, {"role": "user", "content": "hi"}]}),
        ("/responses", {"input": [DEVELOPER, {"role": "user", "content": "hi"}]}),
    ],
)
def test_developer_reaches_the_model_as_a_system_turn(qwen_gateway, path, body):
    server, engine, lease = qwen_gateway
    answer = _send(server, lease, path, {**MINIMAL[path], **body})
    assert answer.status_code == 200, answer.text
    prompt = engine.decode(server.spans(lease)[-1].attributes[Attr.PROMPT_IDS])
    assert "system\nAnswer in French." in prompt
    assert "You are Qwen" not in prompt  # Qwen2.5's default system prompt did not take its place


def test_anthropic_has_no_developer_role(qwen_gateway):
    server, _, lease = qwen_gateway
    body = {**MINIMAL["/messages"], "messages": [DEVELOPER, {"role": "user", "content": "hi"}]}
    answer = _send(server, lease, "/messages", body)
    assert answer.status_code == 400 and "messages[0].role" in answer.json()["error"]["message"]
