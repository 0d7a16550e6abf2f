"""The embedded engine on a real (tiny) model: ids, logprobs, batching, sampling, stops, tools, errors, swaps."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from engine_cases import ADD_TOOL, TUNED_REPLIES

from lightrail.engine import ChatFormat, Engine
from lightrail.types import BackendError, ChatRequest, CompletionRequest, SamplingParams


def chat(content: str, **sampling) -> ChatRequest:
    return ChatRequest(
        model="tiny", messages=[{"role": "user", "content": content}], sampling=SamplingParams(**sampling)
    )


def assert_choice_invariants(engine: Engine, choice) -> None:
    assert choice.token_ids is not None and choice.logprobs is not None
    assert engine.decode(choice.token_ids) == choice.text or choice.tool_calls
    assert len(choice.logprobs) == len(choice.token_ids)
    assert all(lp <= 0.0 for lp in choice.logprobs)


async def test_chat_returns_prompt_ids_response_ids_and_logprobs(engine, tiny_tokenizer):
    gen = await engine.chat(chat("What is 2+3?", temperature=1.0, max_tokens=16, seed=1))
    expected_prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    assert gen.prompt_ids == tiny_tokenizer(expected_prompt, add_special_tokens=False)["input_ids"]
    assert gen.policy_version == 0 and gen.model == "tiny"
    (choice,) = gen.choices
    assert_choice_invariants(engine, choice)
    assert choice.text == tiny_tokenizer.decode(choice.token_ids, skip_special_tokens=True)


async def test_greedy_is_deterministic_and_equals_manual_argmax(engine, tiny_model):
    req = chat("Hello! How can I help you today?", temperature=0, max_tokens=6)
    first = await engine.chat(req)
    second = await engine.chat(req)
    assert first.choices[0].token_ids == second.choices[0].token_ids
    ids = list(first.prompt_ids)
    with torch.inference_mode():
        for _ in range(6):
            logits = tiny_model(input_ids=torch.tensor([ids])).logits[0, -1]
            ids.append(int(logits.argmax()))
    manual = ids[len(first.prompt_ids) :]
    assert first.choices[0].token_ids == manual
    assert first.choices[0].finish_reason == "length"


async def test_logprobs_are_of_the_temperature_scaled_distribution(engine, tiny_model):
    req = chat("Tom has 3 apples.", temperature=0.7, top_p=0.9, max_tokens=1, seed=5)
    gen = await engine.chat(req)
    (token,), (logprob,) = gen.choices[0].token_ids, gen.choices[0].logprobs
    with torch.inference_mode():
        logits = tiny_model(input_ids=torch.tensor([gen.prompt_ids])).logits[0, -1].float()
    expected = torch.log_softmax(logits / 0.7, dim=-1)[token].item()
    assert logprob == pytest.approx(expected, abs=1e-4)


async def test_concurrent_requests_are_batched_and_match_one_by_one(tiny_model, tiny_tokenizer):
    prompts = [f"What is {i}+{i * 7}? Let me think step by step." for i in range(8)]
    reqs = [chat(p, temperature=0, max_tokens=12) for p in prompts]
    reqs += [chat(p, temperature=1.0, max_tokens=12, seed=i) for i, p in enumerate(prompts)]

    sequential = Engine(tiny_model, tiny_tokenizer)
    one_by_one = [await sequential.chat(r) for r in reqs]
    await sequential.close()

    batched = Engine(tiny_model, tiny_tokenizer, gather_window_s=0.02)
    together = await asyncio.gather(*(batched.chat(r) for r in reqs))
    await batched.close()

    assert [g.choices[0].token_ids for g in together] == [g.choices[0].token_ids for g in one_by_one]
    for a, b in zip(together, one_by_one, strict=True):
        assert a.choices[0].logprobs == pytest.approx(b.choices[0].logprobs, abs=1e-4)
        assert a.prompt_ids == b.prompt_ids
    assert batched.stats["forward_passes"] < sequential.stats["forward_passes"] / 4
    assert batched.stats["max_rows_in_batch"] == len(reqs)


async def test_requests_arriving_mid_generation_join_the_running_batch(engine):
    long = asyncio.ensure_future(engine.chat(chat("first", temperature=0, max_tokens=40)))
    while engine.stats["forward_passes"] < 3:
        await asyncio.sleep(0.001)
    late = await engine.chat(chat("second", temperature=0, max_tokens=5))
    assert not long.done()  # the late one finished while the long one was still decoding
    first = await long
    alone = await engine.chat(chat("second", temperature=0, max_tokens=5))
    assert late.choices[0].token_ids == alone.choices[0].token_ids
    assert len(first.choices[0].token_ids) == 40
    assert engine.stats["batches"] == 3


async def test_n_expands_into_rows_and_seeds_are_reproducible(engine):
    a = await engine.chat(chat("Tell me a story", temperature=1.0, max_tokens=10, n=3, seed=42))
    b = await engine.chat(chat("Tell me a story", temperature=1.0, max_tokens=10, n=3, seed=42))
    assert len(a.choices) == 3
    assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
    assert len({tuple(c.token_ids) for c in a.choices}) > 1  # the n rows sample independently
    for choice in a.choices:
        assert_choice_invariants(engine, choice)


async def test_tiny_top_p_keeps_only_the_most_likely_token(engine):
    greedy = await engine.chat(chat("Oslo is nice.", temperature=0, max_tokens=8))
    nucleus = await engine.chat(chat("Oslo is nice.", temperature=1.0, top_p=1e-6, max_tokens=8, seed=3))
    assert nucleus.choices[0].token_ids == greedy.choices[0].token_ids


async def test_stop_string_is_excluded_and_ids_still_decode_to_text(engine):
    sampling = {"temperature": 1.0, "max_tokens": 30, "seed": 7}
    full = (await engine.chat(chat("Li says 5 * 6 = 30.", **sampling))).choices[0]
    text = full.text
    assert len(text) > 12
    stop = text[8:11]
    cut = (await engine.chat(chat("Li says 5 * 6 = 30.", stop=[stop, "never-matches"], **sampling))).choices[0]
    before = text[: text.find(stop)]
    assert cut.finish_reason == "stop"
    assert stop not in cut.text
    assert before.startswith(cut.text)
    assert engine.decode(cut.token_ids) == cut.text
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.token_ids)])


async def test_stop_cut_drops_a_token_that_straddles_the_stop_string(engine, tiny_tokenizer):
    # Force the rule's edge case: a stop string that starts inside a multi-character token.
    full = (await engine.chat(chat("Tell me", temperature=1.0, max_tokens=30, seed=11))).choices[0]
    pieces = [engine.decode([t]) for t in full.token_ids]
    k = next(i for i, p in enumerate(pieces) if len(p) >= 2 and i > 0)
    stop = pieces[k][1:] + "".join(pieces[k + 1 :])[:2]
    cut = (await engine.chat(chat("Tell me", temperature=1.0, max_tokens=30, seed=11, stop=[stop]))).choices[0]
    assert cut.finish_reason == "stop"
    assert engine.decode(cut.token_ids) == cut.text
    full_text = "".join(pieces)
    assert full_text[: full_text.find(stop)].startswith(cut.text)
    assert stop not in cut.text


async def test_max_tokens_gives_finish_reason_length(engine):
    gen = await engine.chat(chat("count", temperature=1.0, max_tokens=5, seed=0))
    assert gen.choices[0].finish_reason == "length"
    assert len(gen.choices[0].token_ids) == 5


async def test_text_completion(engine, tiny_tokenizer):
    gen = await engine.complete(
        CompletionRequest(model="tiny", prompt="Tom has 12", sampling=SamplingParams(max_tokens=4))
    )
    assert gen.prompt_ids == tiny_tokenizer("Tom has 12")["input_ids"]
    assert_choice_invariants(engine, gen.choices[0])


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [""]}, "stop"),
        ({"max_tokens": 10_000}, "max_tokens"),
    ],
)
async def test_bad_parameters_are_400s(engine, sampling, param):
    with pytest.raises(BackendError) as err:
        await engine.chat(chat("hi", **sampling))
    assert err.value.status == 400 and err.value.param == param


async def test_context_overflow_is_a_400_not_a_crash(engine):
    with pytest.raises(BackendError) as err:
        await engine.chat(chat("Tom has 3 apples. " * 200, max_tokens=4))
    assert err.value.status == 400 and err.value.code == "context_length_exceeded"
    gen = await engine.chat(chat("still serving", max_tokens=3))  # the engine is fine afterwards
    assert len(gen.choices[0].token_ids) == 3


async def test_tool_calls_are_parsed_out_of_generations(tuned_engine):
    messages, tools, reply = TUNED_REPLIES[0]
    req = ChatRequest(model="t", messages=messages, tools=tools, sampling=SamplingParams(temperature=0, max_tokens=60))
    gen = await tuned_engine.chat(req)
    (choice,) = gen.choices
    assert choice.finish_reason == "tool_calls"
    assert [(c.name, c.arguments) for c in choice.tool_calls] == [("add", '{"a": 1, "b": 2}')]
    assert choice.tool_calls[0].id.startswith("call_")
    assert choice.text == ""
    # The ids hold the raw markup plus the EOS token the model stopped on.
    assert tuned_engine.decode(choice.token_ids) == reply
    assert choice.token_ids[-1] == tuned_engine.tokenizer.eos_token_id
    assert tuned_engine.stats["malformed_tool_calls"] == 0


async def test_malformed_tool_call_stays_text_and_is_counted(tuned_engine):
    messages, tools, reply = TUNED_REPLIES[1]
    req = ChatRequest(model="t", messages=messages, tools=tools, sampling=SamplingParams(temperature=0, max_tokens=60))
    (choice,) = (await tuned_engine.chat(req)).choices
    assert choice.tool_calls == []
    assert choice.text == reply and choice.finish_reason == "stop"
    assert tuned_engine.stats["malformed_tool_calls"] == 1


async def test_without_tools_markup_is_not_parsed(tuned_engine):
    messages, _, reply = TUNED_REPLIES[0]
    # Same conversation rendered with tools, then served as a completion: no tools offered, nothing parsed.
    prompt = ChatFormat(tuned_engine.tokenizer).render(messages, [ADD_TOOL])
    gen = await tuned_engine.complete(
        CompletionRequest(model="t", prompt=prompt, sampling=SamplingParams(temperature=0, max_tokens=60))
    )
    assert gen.choices[0].text == reply and gen.choices[0].tool_calls == []


async def test_eos_ends_a_reply_and_is_kept_in_the_ids(tuned_engine):
    messages, _, reply = TUNED_REPLIES[2]
    req = ChatRequest(model="t", messages=messages, sampling=SamplingParams(temperature=0, max_tokens=60))
    (choice,) = (await tuned_engine.chat(req)).choices
    assert choice.text == reply and choice.finish_reason == "stop"
    assert choice.token_ids[-1] == tuned_engine.tokenizer.eos_token_id
    assert len(choice.logprobs) == len(choice.token_ids)


async def test_weight_swap_waits_for_in_flight_requests(fresh_model, tiny_tokenizer, tool_tuned_state):
    engine = Engine(fresh_model, tiny_tokenizer, name="tiny")
    messages, _, reply = TUNED_REPLIES[2]
    req = ChatRequest(model="t", messages=messages, sampling=SamplingParams(temperature=0, max_tokens=30))
    before = await engine.chat(req)

    start = engine.stats["forward_passes"]
    in_flight = [asyncio.ensure_future(engine.chat(req)) for _ in range(3)]
    while engine.stats["forward_passes"] < start + 5:
        await asyncio.sleep(0.001)
    swap = asyncio.ensure_future(engine.update_weights(tool_tuned_state))
    await asyncio.sleep(0)
    later = asyncio.ensure_future(engine.chat(req))  # arrives while the swap is pending
    assert await swap == 1
    old = await asyncio.gather(*in_flight)
    new = await later

    for gen in old:
        assert gen.policy_version == 0
        assert gen.choices[0].token_ids == before.choices[0].token_ids
    assert new.policy_version == 1 and engine.policy_version == 1
    assert new.choices[0].text == reply
    assert new.choices[0].token_ids != before.choices[0].token_ids
    assert engine.stats["weight_updates"] == 1
    await engine.close()


async def test_weight_update_accepts_a_module_and_explicit_version(engine, fresh_model, tiny_tokenizer):
    served = Engine(fresh_model, tiny_tokenizer)
    assert await served.update_weights(fresh_model, version=7) == 7
    with pytest.raises(ValueError, match="version must increase"):
        await served.update_weights(fresh_model, version=7)
    bad = {k: v for k, v in fresh_model.state_dict().items() if "layers.0" not in k}
    with pytest.raises(ValueError, match="missing"):
        await served.update_weights(bad)
    assert served.policy_version == 7
    gen = await served.chat(chat("still serving", max_tokens=2))
    assert gen.policy_version == 7
    await served.close()


async def test_cancelled_request_does_not_disturb_others(engine):
    doomed = asyncio.ensure_future(engine.chat(chat("a", temperature=0, max_tokens=200)))
    other = asyncio.ensure_future(engine.chat(chat("b", temperature=0, max_tokens=20)))
    while engine.stats["forward_passes"] < 3:
        await asyncio.sleep(0.001)
    doomed.cancel()
    gen = await other
    assert len(gen.choices[0].token_ids) == 20
    assert engine.stats["generated_tokens"] < 150  # the cancelled row stopped decoding


async def test_close_fails_requests_mid_generation(tiny_model, tiny_tokenizer):
    engine = Engine(tiny_model, tiny_tokenizer)
    endless = chat("x", max_tokens=400, logit_bias={5: 100})  # token 5 forced: no EOS ends it before 400 tokens
    pending = asyncio.ensure_future(engine.chat(endless))
    while engine.stats["generated_tokens"] == 0 and not pending.done():
        await asyncio.sleep(0.005)
    await engine.close()
    with pytest.raises(BackendError) as err:
        await pending
    assert err.value.status == 503
    with pytest.raises(BackendError):
        await engine.chat(chat("x"))


async def test_close_fails_requests_whose_first_step_has_not_run(tiny_model, tiny_tokenizer):
    """Requests the batcher took for a step still waiting for the model's thread (in no batch yet), and queued ones,
    fail at once; a weight update waiting for them to drain fails too; close then waits for the thread off the loop."""
    engine = Engine(tiny_model, tiny_tokenizer)
    busy = threading.Event()
    engine._worker.submit(busy.wait, 60)  # the model's thread is taken: no step of these requests can start
    try:
        pending = [asyncio.ensure_future(engine.chat(chat(f"x{i}", max_tokens=4))) for i in range(3)]
        for _ in range(1000):  # until the batcher has taken the first of them for its (blocked) step
            if engine._admitted:
                break
            await asyncio.sleep(0.01)
        assert engine._admitted
        update = asyncio.ensure_future(engine.update_weights(engine.model.state_dict()))
        await asyncio.sleep(0.01)
        closing = asyncio.ensure_future(engine.close())
        for request in [*pending, update]:
            with pytest.raises(BackendError) as err:
                await asyncio.wait_for(request, timeout=30)
            assert err.value.status == 503
    finally:
        busy.set()
    await closing


async def test_event_loop_stays_responsive_while_generating(engine):
    job = asyncio.ensure_future(engine.chat(chat("go", temperature=0, max_tokens=150)))
    gaps = []
    loop = asyncio.get_running_loop()
    while not job.done():
        t = loop.time()
        await asyncio.sleep(0.001)
        gaps.append(loop.time() - t)
    await job
    assert len(gaps) >= 20  # the loop kept running other work all through the 150 tokens, not once per generation


async def test_calls_from_another_threads_loop_are_forwarded(engine):
    req = chat("from elsewhere", temperature=0, max_tokens=6)
    here = asyncio.ensure_future(engine.chat(req))
    there = await asyncio.to_thread(asyncio.run, engine.chat(req))  # a second event loop in another thread
    assert there.choices[0].token_ids == (await here).choices[0].token_ids
    version = await asyncio.to_thread(asyncio.run, engine.update_weights(engine.model.state_dict()))
    assert version == 1 and engine.policy_version == 1


def test_engine_rebinds_when_its_loop_is_gone(tiny_model, tiny_tokenizer):
    engine = Engine(tiny_model, tiny_tokenizer)
    req = chat("sync user", temperature=0, max_tokens=4)
    first = asyncio.run(engine.chat(req))
    second = asyncio.run(engine.chat(req))  # the first loop is closed by now
    assert first.choices[0].token_ids == second.choices[0].token_ids
    asyncio.run(engine.close())


@pytest.mark.parametrize(
    "messages", [[], [{"content": "no role"}], [{"role": "user", "content": "x"}, "not a message"]]
)
async def test_bad_messages_are_400s(engine, messages):
    with pytest.raises(BackendError) as err:
        await engine.chat(ChatRequest(model="tiny", messages=messages))
    assert err.value.status == 400 and err.value.param == "messages"


async def test_empty_completion_prompt_is_a_400(engine):
    with pytest.raises(BackendError) as err:
        await engine.complete(CompletionRequest(model="tiny", prompt=""))
    assert err.value.status == 400
