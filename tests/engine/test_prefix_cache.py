"""Prompt-prefix caching in the embedded engine, on a real (tiny) model: the same tokens and logprobs as without it,
fewer tokens prefilled, and never a prefix computed by weights the engine no longer serves."""

from __future__ import annotations

import asyncio

import pytest
from engine_cases import TUNED_REPLIES

from lightrail.engine import Engine
from lightrail.engine.prefix_cache import PrefixCache
from lightrail.types import ChatRequest, SamplingParams

PREAMBLE = "You answer questions about flights. " + " ".join(
    f"Table t{i} has columns a{i}, b{i} and c{i}." for i in range(12)
)


def ask(question: str, system: str = PREAMBLE, **sampling) -> ChatRequest:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return ChatRequest(model="tiny", messages=messages, sampling=SamplingParams(**sampling))


async def serve(engine: Engine, requests: list[ChatRequest]):
    try:
        return await asyncio.gather(*(engine.chat(r) for r in requests))
    finally:
        await engine.close()


async def test_prompts_sharing_a_preamble_prefill_it_once_and_generate_the_same(tiny_model, tiny_tokenizer):
    requests = [
        ask(f"How many flights left airport {i} in month {i % 12}?", temperature=0, max_tokens=10) for i in range(8)
    ]
    requests += [
        ask("What is the busiest route?", system="A short, different system prompt.", temperature=0, max_tokens=10)
    ]
    plain = Engine(tiny_model, tiny_tokenizer, prefix_cache=False, gather_window_s=0.02)
    expected = await serve(plain, requests)
    cached = Engine(tiny_model, tiny_tokenizer, gather_window_s=0.02)
    got = await serve(cached, requests)  # one prefill group: the first prompt alone, the 7 sharing its preamble
    again = Engine(tiny_model, tiny_tokenizer)
    one_by_one = [await again.chat(r) for r in requests]  # each one after the cache holds the preamble
    await again.close()

    for a, b, c in zip(got, one_by_one, expected, strict=True):
        assert a.prompt_ids == c.prompt_ids
        assert a.choices[0].token_ids == b.choices[0].token_ids == c.choices[0].token_ids
        assert a.choices[0].logprobs == pytest.approx(c.choices[0].logprobs, abs=1e-4)
        assert b.choices[0].logprobs == pytest.approx(c.choices[0].logprobs, abs=1e-4)
    shared = len(got[0].prompt_ids) - 30  # the preamble is most of each prompt
    assert cached.stats["cached_prompt_tokens"] >= 7 * shared
    assert cached.stats["prompt_tokens"] + cached.stats["cached_prompt_tokens"] == plain.stats["prompt_tokens"]
    assert cached.stats["prompt_tokens"] < plain.stats["prompt_tokens"] / 3


async def test_a_weight_update_forgets_the_prefixes_of_the_old_weights(
    fresh_model, tiny_model, tiny_tokenizer, tool_tuned_state
):
    messages, _, reply = TUNED_REPLIES[2]
    long_system = {"role": "system", "content": PREAMBLE}
    request = ChatRequest(
        model="t", messages=[long_system, *messages], sampling=SamplingParams(temperature=0, max_tokens=20)
    )
    engine = Engine(fresh_model, tiny_tokenizer)
    for _ in range(3):  # the second call makes the entry, the third uses it
        before = await engine.chat(request)
    assert engine.stats["cached_prompt_tokens"] > 0
    await engine.update_weights(tool_tuned_state)
    made = engine._prefixes.stats["entries_made"]
    after = await engine.chat(request)
    await engine.close()
    assert engine._prefixes.stats["entries_made"] == made + 1  # the preamble again, from the new weights

    tiny_model_copy = type(tiny_model).from_pretrained(tiny_model.config._name_or_path).eval()
    tiny_model_copy.load_state_dict(tool_tuned_state)
    fresh = Engine(tiny_model_copy, tiny_tokenizer, prefix_cache=False)
    expected = await fresh.chat(request)
    await fresh.close()
    assert after.choices[0].token_ids == expected.choices[0].token_ids != before.choices[0].token_ids
    assert after.choices[0].logprobs == pytest.approx(expected.choices[0].logprobs, abs=1e-4)


def test_the_cache_makes_an_entry_only_for_a_prefix_two_prompts_share_and_keeps_a_token_to_prefill():
    cache = PrefixCache(min_tokens=4, entries=2)
    assert cache.to_make([1, 2, 3, 4, 5, 6]) is None  # nothing seen yet
    assert cache.to_make([1, 2, 3, 9]) is None  # 3 tokens shared: under min_tokens
    assert cache.to_make([1, 2, 3, 4, 5, 6]) == (1, 2, 3, 4, 5)  # all but the last token
    from lightrail.engine.prefix_cache import PrefixEntry

    cache.add(PrefixEntry((1, 2, 3, 4, 5), []))
    assert cache.lookup([1, 2, 3, 4, 5]) is None  # a prompt equal to the prefix: no token left to prefill
    assert cache.lookup([1, 2, 3, 4, 5, 7]).ids == (1, 2, 3, 4, 5)
    cache.add(PrefixEntry((1, 2, 3, 4), []))
    assert cache.lookup([1, 2, 3, 4, 5, 7]).ids == (1, 2, 3, 4, 5)  # the longest one
    cache.add(PrefixEntry((8, 8, 8, 8), []))
    assert len(cache) == 2 and cache.lookup([1, 2, 3, 4, 9]) is None  # (1, 2, 3, 4) was least recently used
    cache.clear()
    assert len(cache) == 0
