"""The gateway in front of the embedded engine with the tiny random-weight model: the recorded token ids are
the engine's and decode to exactly the text the client received, streamed or not."""

from __future__ import annotations

import openai
import pytest

from lightrail.types import Attr

pytest.importorskip("torch")
from lightrail.engine import Engine, prepare_model  # noqa: E402  (after the torch check)

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to five."}]


@pytest.fixture
def engine_gateway(make_gateway):
    engine = Engine.from_pretrained(prepare_model("tiny"))
    server = make_gateway(engine, token="t")
    yield server, engine
    server.call(engine.close())


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_ids_decode_to_the_text_and_stream_records_the_same_ids(engine_gateway, temperature):
    server, engine = engine_gateway
    lease = server.lease()
    client = openai.OpenAI(base_url=server.base_url(lease), api_key="t", max_retries=0)
    params = {"model": "tiny", "messages": MESSAGES, "temperature": temperature, "seed": 1234, "max_tokens": 24}

    plain = client.chat.completions.create(**params, logprobs=True)
    chunks = list(client.chat.completions.create(**params, stream=True))
    streamed_text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    text = plain.choices[0].message.content
    assert streamed_text == text
    s_plain, s_stream = server.spans(lease)
    for span in (s_plain, s_stream):
        [choice] = span.attributes[Attr.CHOICES]
        assert span.attributes[Attr.TOKEN_IDS_AVAILABLE] is True
        assert engine.decode(choice["token_ids"]) == text
        assert len(choice["logprobs"]) == len(choice["token_ids"])
        assert span.attributes[Attr.POLICY_VERSION] == engine.policy_version
    assert s_stream.attributes[Attr.CHOICES] == s_plain.attributes[Attr.CHOICES]
    assert s_stream.attributes[Attr.PROMPT_IDS] == s_plain.attributes[Attr.PROMPT_IDS]
    assert plain.usage.prompt_tokens == len(s_plain.attributes[Attr.PROMPT_IDS])
    assert [e.logprob for e in plain.choices[0].logprobs.content] == s_plain.attributes[Attr.CHOICES][0]["logprobs"]


def test_completions_and_n(engine_gateway):
    server, engine = engine_gateway
    lease = server.lease()
    client = openai.OpenAI(base_url=server.base_url(lease), api_key="t", max_retries=0)
    completion = client.completions.create(model="tiny", prompt="Once upon a time", n=2, max_tokens=12, seed=7)
    [span] = server.spans(lease)
    recorded = span.attributes[Attr.CHOICES]
    assert [engine.decode(c["token_ids"]) for c in recorded] == [c.text for c in completion.choices]
    assert completion.usage.completion_tokens == sum(len(c["token_ids"]) for c in recorded)


def test_engine_refusal_is_a_bad_request(engine_gateway):
    server, _ = engine_gateway
    lease = server.lease()
    client = openai.OpenAI(base_url=server.base_url(lease), api_key="t", max_retries=0)
    with pytest.raises(openai.BadRequestError):  # far past the tiny model's context window
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=10_000_000)
    assert len(server.spans(lease)) == 1
