"""The engine's decode path (issue 56: slot KV cache, packed weights, the lean Llama-family step) against the
transformers reference forward pass on the same float32 model: the same greedy tokens, logprobs within 1e-4, through
rows joining and leaving the batch, slot reuse and weight swaps."""

from __future__ import annotations

import asyncio

import pytest
import torch

from lightrail.engine import Engine
from lightrail.types import ChatRequest, SamplingParams

PROMPTS = [
    "Hi",
    "What is 2+3? Let me think step by step about it.",
    "Tom has 3 apples and gives one to Ann. How many are left?",
    "Oslo is nice in the summer.",
]


def chat(content: str, **sampling) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": content}], sampling=SamplingParams(**sampling))


def reference(model, prompt_ids: list[int], tokens: list[int], temperature: float = 0.0) -> tuple[list[int], list]:
    """Greedy continuation of ``prompt_ids`` by the transformers forward pass over the whole sequence (no cache),
    and the logprobs of ``tokens`` (the engine's) under it: ``log_softmax(logits / T)`` (T = 1 for greedy)."""
    ids, greedy, logprobs = list(prompt_ids), [], []
    with torch.inference_mode():
        for token in tokens:
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            greedy.append(int(logits.argmax()))
            logprobs.append(float(torch.log_softmax(logits / (temperature or 1.0), dim=-1)[token]))
            ids.append(token)
    return greedy, logprobs


FAST = {"kv_cache": "slots", "packed_weights": True, "fused_decode": True}
"""The opt-in decode path (the default stays ``concat`` until it is measured on a quiet machine)."""


def test_the_engine_decodes_with_the_slot_cache_and_the_lean_step_when_asked(tiny_model, tiny_tokenizer):
    engine = Engine(tiny_model, tiny_tokenizer, **FAST)
    assert engine.kv_cache == "slots" and engine._fused is not None and engine._packed is not None
    plain = Engine(tiny_model, tiny_tokenizer)
    assert plain.kv_cache == "concat" and plain._fused is None and plain._packed is None
    with pytest.raises(ValueError, match="kv_cache must be one of"):
        Engine(tiny_model, tiny_tokenizer, kv_cache="paged")


@pytest.mark.parametrize(
    "options",
    [FAST, {**FAST, "packed_weights": False}, {**FAST, "fused_decode": False}, {}],
    ids=["fast", "unpacked", "forward", "concat"],
)
async def test_batched_rows_equal_the_transformers_forward(tiny_model, tiny_tokenizer, options):
    """Rows of different prompt lengths decoding together, one joining mid-decode and rows leaving at different
    lengths: every row's greedy tokens are the reference forward's argmax, its logprobs within 1e-4, and sampled
    rows' logprobs are the reference's tempered ones."""
    engine = Engine(tiny_model, tiny_tokenizer, gather_window_s=0.02, **options)
    try:
        first = [chat(p, temperature=0, max_tokens=6 + 3 * i) for i, p in enumerate(PROMPTS)]
        first.append(chat(PROMPTS[1], temperature=0.8, max_tokens=9, seed=3))
        running = [asyncio.ensure_future(engine.chat(r)) for r in first]
        while engine.stats["decode_steps"] < 2:
            await asyncio.sleep(0.001)
        late = await engine.chat(chat("A late question joins the batch.", temperature=0, max_tokens=5))
        gens = [*await asyncio.gather(*running), late]
    finally:
        await engine.close()
    assert engine.stats["max_rows_in_batch"] == len(first) + 1 and engine.stats["batches"] >= 2
    for gen, request in zip(gens, [*first, None], strict=True):
        temperature = request.sampling.temperature if request is not None else 0.0
        (choice,) = gen.choices
        greedy, logprobs = reference(tiny_model, gen.prompt_ids, choice.token_ids, temperature)
        if temperature == 0:
            assert choice.token_ids == greedy
        assert choice.logprobs == pytest.approx(logprobs, abs=1e-4)


async def test_slots_are_reused_by_later_batches_and_follow_weight_swaps(
    fresh_model, tiny_model, tiny_tokenizer, tool_tuned_state
):
    """A second wave of requests reuses the first wave's slots (no new allocation); after a weight update the
    packed and stacked copies of the weights are the new ones: generations equal the reference forward of the new
    weights."""
    engine = Engine(fresh_model, tiny_tokenizer, gather_window_s=0.02, **FAST)
    requests = [chat(p, temperature=0, max_tokens=12) for p in PROMPTS]
    try:
        before = await asyncio.gather(*(engine.chat(r) for r in requests))
        capacity = engine._slots.capacity
        again = await asyncio.gather(*(engine.chat(r) for r in requests))
        assert engine._slots.capacity == capacity
        assert [g.choices[0].token_ids for g in again] == [g.choices[0].token_ids for g in before]
        await engine.update_weights(tool_tuned_state)
        after = await asyncio.gather(*(engine.chat(r) for r in requests))
    finally:
        await engine.close()
    new_model = type(tiny_model).from_pretrained(tiny_model.config._name_or_path).eval()
    new_model.load_state_dict(tool_tuned_state)
    assert [g.choices[0].token_ids for g in after] != [g.choices[0].token_ids for g in before]
    for gen in after:
        greedy, logprobs = reference(new_model, gen.prompt_ids, gen.choices[0].token_ids)
        assert gen.choices[0].token_ids == greedy
        assert gen.choices[0].logprobs == pytest.approx(logprobs, abs=1e-4)


async def test_bfloat16_sampling_runs_the_same_paths_and_stays_close_to_float32(tiny_dir, tiny_model, tiny_tokenizer):
    """A bfloat16 engine (the setting ``dtype``) decodes through the slot cache and packed weights; its logprobs of
    its own tokens are within bfloat16's reach of the float32 model's (the gap GRPO corrects by truncated IS)."""
    engine = Engine.from_pretrained(tiny_dir, dtype="bfloat16", **FAST)
    assert engine.model.dtype == torch.bfloat16 and engine.kv_cache == "slots"
    try:
        gens = await asyncio.gather(*(engine.chat(chat(p, temperature=1.0, max_tokens=10, seed=i))
                                      for i, p in enumerate(PROMPTS)))  # fmt: skip
    finally:
        await engine.close()
    gaps = []
    for gen in gens:
        _, logprobs = reference(tiny_model, gen.prompt_ids, gen.choices[0].token_ids, temperature=1.0)
        gaps += [abs(a - b) for a, b in zip(gen.choices[0].logprobs, logprobs, strict=True)]
    assert max(gaps) < 0.1 and sum(gaps) / len(gaps) < 0.02
