"""The sampling options agents set, honoured by the embedded engine: presence/frequency penalties, logit_bias,
top_logprobs, seeds (alone and in mixed batches), n > 1 with options, and their validation.

The engine tests check reported logprobs against a reference computed here from the model's own logits (the model
run on prompt + generated prefix, the penalty applied by hand), so they fail if the engine samples from or reports
a different distribution. The pure tests pin `sampling.LogitProcessors` and `sampling.top_logprobs`.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest
import torch

from lightrail.engine import Engine
from lightrail.engine.sampling import LogitProcessors, sample, top_logprobs
from lightrail.types import BackendError, ChatRequest, SamplingParams


def chat(content: str, **sampling) -> ChatRequest:
    return ChatRequest(
        model="tiny", messages=[{"role": "user", "content": content}], sampling=SamplingParams(**sampling)
    )


def reference_logprobs(model, prompt_ids, token_ids, *, temperature, presence=0.0, frequency=0.0, bias=None):
    """Per generated token, ``log_softmax((logits - penalties + bias) / T)`` from the model run on the prefix, and
    the same without penalties/bias (to show the options changed something)."""
    processed, raw = [], []
    with torch.inference_mode():
        for t in range(len(token_ids)):
            logits = model(input_ids=torch.tensor([prompt_ids + token_ids[:t]])).logits[0, -1].float()
            counts = Counter(token_ids[:t])
            shaped = logits.clone()
            for token, c in counts.items():
                shaped[token] -= c * frequency + presence
            for token, v in (bias or {}).items():
                shaped[token] += v
            temp = temperature if temperature > 0 else 1.0
            processed.append(torch.log_softmax(shaped / temp, dim=-1))
            raw.append(torch.log_softmax(logits / temp, dim=-1))
    return processed, raw


def assert_matches_reference(model, gen, choice, **kw):
    processed, raw = reference_logprobs(model, gen.prompt_ids, choice.token_ids, **kw)
    got = torch.tensor(choice.logprobs)
    want = torch.stack([lp[tok] for lp, tok in zip(processed, choice.token_ids, strict=True)])
    unshaped = torch.stack([lp[tok] for lp, tok in zip(raw, choice.token_ids, strict=True)])
    assert torch.allclose(got, want, atol=1e-4), (got, want)
    assert (got - unshaped).abs().max() > 1e-3  # the options did change the distribution sampled from
    if kw.get("temperature", 1.0) <= 0:  # greedy under the processed logits
        assert choice.token_ids == [int(lp.argmax()) for lp in processed]
    return processed


# -- engine, real tiny model ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("temperature", "presence", "frequency"), [(0.0, 0.0, 1.5), (0.8, 1.2, 0.0), (1.0, 0.6, 0.9), (0.0, -1.0, 0.4)]
)
async def test_penalties_shape_the_distribution_exactly_as_the_formula_says(
    engine, tiny_model, temperature, presence, frequency
):
    req = chat(
        "Repeat after me: la la la la la",
        temperature=temperature,
        presence_penalty=presence,
        frequency_penalty=frequency,
        max_tokens=14,
        seed=3,
    )
    gen = await engine.chat(req)
    (choice,) = gen.choices
    assert_matches_reference(tiny_model, gen, choice, temperature=temperature, presence=presence, frequency=frequency)
    expected = [n for n, v in (("presence_penalty", presence), ("frequency_penalty", frequency)) if v]
    assert gen.logprobs_processed == expected


async def test_penalties_change_greedy_output(engine):
    plain = await engine.chat(chat("Repeat after me: la la la", temperature=0, max_tokens=16))
    penalized = await engine.chat(chat("Repeat after me: la la la", temperature=0, max_tokens=16, frequency_penalty=2))
    assert plain.logprobs_processed == []
    assert max(Counter(plain.choices[0].token_ids).values()) > 1  # the tiny model repeats itself ...
    assert penalized.choices[0].token_ids != plain.choices[0].token_ids  # ... and the penalty makes it stop


async def test_penalties_count_each_choices_own_tokens_in_a_changing_batch(engine, tiny_model):
    """Rows join (merge) and leave (row selection) around penalized rows; counts stay with their rows."""
    long = asyncio.ensure_future(engine.chat(chat("first", temperature=0, max_tokens=40)))
    while engine.stats["forward_passes"] < 3:
        await asyncio.sleep(0.001)
    opts = {"temperature": 0.9, "presence_penalty": 0.8, "frequency_penalty": 0.7, "seed": 11}
    short = asyncio.ensure_future(engine.chat(chat("a short one", max_tokens=3, logit_bias={5: 3.0}, **opts)))
    penalized = asyncio.ensure_future(engine.chat(chat("Count: one one one", max_tokens=12, n=3, **opts)))
    gens = await asyncio.gather(long, short, penalized)
    assert engine.stats["max_rows_in_batch"] == 5  # they really shared the batch
    gen = gens[2]
    assert len(gen.choices) == 3 and len({tuple(c.token_ids) for c in gen.choices}) > 1
    for choice in gen.choices:
        assert_matches_reference(tiny_model, gen, choice, temperature=0.9, presence=0.8, frequency=0.7)
    assert_matches_reference(
        tiny_model, gens[1], gens[1].choices[0], temperature=0.9, presence=0.8, frequency=0.7, bias={5: 3.0}
    )
    assert gens[1].logprobs_processed == ["presence_penalty", "frequency_penalty", "logit_bias"]
    # The unconstrained, option-free request in the same batch is untouched: greedy under raw logits.
    processed, _ = reference_logprobs(tiny_model, gens[0].prompt_ids, gens[0].choices[0].token_ids, temperature=0)
    assert gens[0].choices[0].token_ids == [int(lp.argmax()) for lp in processed]
    assert gens[0].logprobs_processed == []


async def test_logit_bias_plus_100_forces_a_token(engine, tiny_tokenizer):
    forced = tiny_tokenizer("hello", add_special_tokens=False)["input_ids"][0]
    for temperature in (0.0, 1.0):
        gen = await engine.chat(
            chat("anything", temperature=temperature, max_tokens=6, seed=1, logit_bias={forced: 100})
        )
        (choice,) = gen.choices
        assert choice.token_ids == [forced] * 6
        assert all(lp > -1e-3 for lp in choice.logprobs)  # the biased distribution: ~all mass on the forced token
        assert gen.logprobs_processed == ["logit_bias"]


async def test_logit_bias_minus_100_bans_tokens(engine, tiny_model):
    plain = await engine.chat(chat("Repeat after me: la la la", temperature=0, max_tokens=10))
    banned = sorted(set(plain.choices[0].token_ids))
    bias = {t: -100 for t in banned}
    gen = await engine.chat(chat("Repeat after me: la la la", temperature=0, max_tokens=10, logit_bias=bias))
    assert not set(gen.choices[0].token_ids) & set(banned)
    assert_matches_reference(tiny_model, gen, gen.choices[0], temperature=0, bias=bias)
    sampled = await engine.chat(chat("Repeat after me", temperature=1.5, max_tokens=30, n=4, seed=2, logit_bias=bias))
    assert not {t for c in sampled.choices for t in c.token_ids} & set(banned)


async def test_top_logprobs_greedy(engine, tiny_model):
    gen = await engine.chat(chat("Hello! How can I help you today?", temperature=0, max_tokens=8, top_logprobs=5))
    (choice,) = gen.choices
    assert choice.top_logprobs is not None and len(choice.top_logprobs) == len(choice.token_ids)
    processed, _ = reference_logprobs(tiny_model, gen.prompt_ids, choice.token_ids, temperature=0)
    for token, logprob, top, ref in zip(choice.token_ids, choice.logprobs, choice.top_logprobs, processed, strict=True):
        assert len(top) == 5
        values = [lp for _, lp in top]
        assert values == sorted(values, reverse=True)
        assert top[0][0] == token and top[0][1] == pytest.approx(logprob, abs=1e-6)
        ref_values, ref_ids = ref.topk(5)
        assert [t for t, _ in top] == ref_ids.tolist()
        assert values == pytest.approx(ref_values.tolist(), abs=1e-4)
    assert gen.logprobs_processed == []


async def test_top_logprobs_are_of_the_processed_tempered_distribution(tuned_engine):
    """On the tuned model (peaked distributions) sampled tokens are usually among the top 20: their entry there
    must equal their reported logprob."""
    model = tuned_engine.model
    opts = {"temperature": 1.3, "frequency_penalty": 0.5, "max_tokens": 12, "seed": 4, "top_logprobs": 20}
    gen = await tuned_engine.chat(chat("say hello", n=2, **opts))
    hits = 0
    for choice in gen.choices:
        processed = assert_matches_reference(model, gen, choice, temperature=1.3, frequency=0.5)
        for token, logprob, top, ref in zip(
            choice.token_ids, choice.logprobs, choice.top_logprobs, processed, strict=True
        ):
            assert len(top) == 20
            assert [t for t, _ in top] == ref.topk(20).indices.tolist()
            entry = dict(top).get(token)
            if entry is not None:
                hits += 1
                assert entry == pytest.approx(logprob, abs=1e-6)
    assert hits > len(gen.choices[0].token_ids)
    # Without asking: nothing reported (and nothing computed).
    plain = await tuned_engine.chat(chat("say hello", max_tokens=3))
    assert plain.choices[0].top_logprobs is None


async def test_top_logprobs_follow_a_stop_cut(engine):
    full = await engine.chat(chat("Tell me a story", temperature=0, max_tokens=12, top_logprobs=2))
    text = full.choices[0].text
    stop = text[len(text) // 2 :][:3]
    cut = await engine.chat(chat("Tell me a story", temperature=0, max_tokens=12, top_logprobs=2, stop=[stop]))
    (choice,) = cut.choices
    assert len(choice.top_logprobs) == len(choice.token_ids) < len(full.choices[0].token_ids)
    assert choice.top_logprobs == full.choices[0].top_logprobs[: len(choice.token_ids)]


async def test_seed_gives_the_same_tokens_alone_and_in_a_mixed_batch(tiny_model, tiny_tokenizer):
    seeded = [
        chat("Tell me a story", temperature=1.0, max_tokens=12, seed=7),
        chat("Tell me a story", temperature=0.9, top_p=0.9, max_tokens=12, n=3, seed=8, presence_penalty=0.5),
        chat("Write a poem", temperature=1.2, max_tokens=10, n=2, seed=9, frequency_penalty=1.0, top_logprobs=3),
        chat("Write a poem", temperature=1.0, max_tokens=10, seed=10, logit_bias={7: 5.0, 9: -5.0}),
    ]
    others = [
        chat("An unrelated, much longer prompt that pads the batch quite a bit more", temperature=1.0, max_tokens=20),
        chat("greedy", temperature=0, max_tokens=5, frequency_penalty=0.3),
        chat("short", temperature=1.0, max_tokens=2, n=2, top_logprobs=1),
    ]

    alone_engine = Engine(tiny_model, tiny_tokenizer)
    alone = [await alone_engine.chat(r) for r in seeded]
    await alone_engine.close()

    mixed_engine = Engine(tiny_model, tiny_tokenizer, gather_window_s=0.02)
    first = asyncio.gather(*(mixed_engine.chat(r) for r in others + seeded[:2]))
    while mixed_engine.stats["forward_passes"] < 2:
        await asyncio.sleep(0.001)
    late = asyncio.gather(*(mixed_engine.chat(r) for r in seeded[2:]))  # these join a running batch
    mixed = (await first)[len(others) :] + await late
    await mixed_engine.close()
    # the first gather holds 8 rows: more than 8 at once means late rows joined it (how many admissions that took
    # depends on timing under load, so the batch count is only a lower bound)
    assert mixed_engine.stats["batches"] >= 2 and mixed_engine.stats["max_rows_in_batch"] > 8

    for a, b in zip(alone, mixed, strict=True):
        assert [c.token_ids for c in a.choices] == [c.token_ids for c in b.choices]
        for ca, cb in zip(a.choices, b.choices, strict=True):
            assert ca.logprobs == pytest.approx(cb.logprobs, abs=1e-4)
    assert len({tuple(c.token_ids) for c in alone[1].choices}) > 1  # n rows of one seed still differ


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"logit_bias": {10**6: 1.0}}, "logit_bias"),
        ({"logit_bias": {613: 1.0}}, "logit_bias"),  # the tiny model's vocabulary is 0..612
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {5: float("nan")}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
    ],
)
async def test_bad_options_are_400s(engine, sampling, param):
    with pytest.raises(BackendError) as err:
        await engine.chat(chat("hi", max_tokens=2, **sampling))
    assert err.value.status == 400 and err.value.param == param
    assert (await engine.chat(chat("still serving", max_tokens=2))).choices  # the engine is fine afterwards


# -- sampling.py, pure ------------------------------------------------------------------------------------------


def test_no_options_no_processors():
    assert LogitProcessors.build([(0.0, 0.0, {}), (0, 0, {3: 0.0})], vocab=8) is None
    assert LogitProcessors.merge(None, 2, None, 3) is None


def test_penalties_and_bias_follow_the_formula():
    procs = LogitProcessors.build([(0.5, 0.25, {}), (0.0, 0.0, {1: 2.0, 3: -100.0}), (0.0, 1.0, {2: 1.0})], vocab=4)
    assert procs is not None
    for tokens in ([0, 1, 2], [0, 1, 2], [0, 3, 2]):
        procs.observe(torch.tensor(tokens))
    # counts: row 0 {0: 3}, row 1 {1: 2, 3: 1}, row 2 {2: 3}
    logits = torch.zeros(3, 4)
    procs.apply(logits)
    expected = torch.tensor(
        [
            [-(3 * 0.25 + 0.5), 0, 0, 0],
            [0, 2.0, 0, -100.0],  # row 1 has no penalty: only its bias
            [0, 0, -3.0 + 1.0, 0],
        ]
    )
    assert torch.allclose(logits, expected)


def reference_rows(options, history, vocab):
    """Apply each row's options alone (a batch of one), to compare against a batch that was reshaped."""
    out = []
    for opts, tokens in zip(options, history, strict=True):
        single = LogitProcessors.build([opts], vocab=vocab)
        logits = torch.zeros(1, vocab)
        if single is not None:
            for t in tokens:
                single.observe(torch.tensor([t]))
            single.apply(logits)
        out.append(logits[0])
    return torch.stack(out)


def test_processors_follow_rows_through_select_and_merge():
    vocab = 6
    a_opts = [(0.3, 0.0, {}), (0.0, 0.0, {}), (0.0, 0.7, {4: 1.5})]
    b_opts = [(0.0, 0.0, {0: -2.0}), (0.0, 0.0, {})]
    a = LogitProcessors.build(a_opts, vocab=vocab)
    b = LogitProcessors.build(b_opts, vocab=vocab)
    a_hist = [[1, 1], [2, 3], [4, 4]]
    for step in range(2):
        a.observe(torch.tensor([h[step] for h in a_hist]))
    b.observe(torch.tensor([5, 5]))
    merged = LogitProcessors.merge(a, 3, b, 2)
    options, history = a_opts + b_opts, a_hist + [[5], [5]]
    logits = torch.zeros(5, vocab)
    merged.apply(logits)
    assert torch.allclose(logits, reference_rows(options, history, vocab))

    keep = [4, 2, 0]
    selected = merged.select(keep)
    logits = torch.zeros(3, vocab)
    selected.apply(logits)
    assert torch.allclose(logits, reference_rows([options[i] for i in keep], [history[i] for i in keep], vocab))

    # Rows without options left: the batch drops its processors (and their cost).
    assert merged.select([1, 4]) is None
    only_bias = merged.select([3])
    assert only_bias.penalties is None and only_bias.bias.rows.tolist() == [0]
    # A merge with a batch that has no processors pads it with neutral rows.
    padded = LogitProcessors.merge(None, 2, selected, 3)
    logits = torch.zeros(5, vocab)
    padded.apply(logits)
    assert torch.equal(logits[:2], torch.zeros(2, vocab))
    assert torch.allclose(logits[2:], reference_rows([options[i] for i in keep], [history[i] for i in keep], vocab))


def test_top_logprobs_per_row_k():
    logp = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 1.0, 0.5], [0.0, 0.5, 0.25, 9.0]]), -1)
    top = top_logprobs(logp, [2, 0, 4])
    assert [[t for t, _ in row] for row in top] == [[1, 3], [], [3, 1, 2, 0]]
    assert top[0][0][1] == pytest.approx(float(logp[0, 1]))
    assert all(row[i][1] >= row[i + 1][1] for row in top for i in range(len(row) - 1))
    assert top_logprobs(logp, [0, 0, 0]) == [[], [], []]


def test_sample_reports_the_processed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    procs = LogitProcessors.build([(0.0, 0.0, {2: 100.0})], vocab=3)
    procs.apply(logits)
    tokens, logprobs = sample(logits, torch.tensor([1.0]), torch.tensor([1.0]), [torch.Generator().manual_seed(0)])
    assert int(tokens[0]) == 2 and float(logprobs[0]) == pytest.approx(0.0, abs=1e-6)


async def test_options_compose_with_structured_outputs(engine, tiny_tokenizer):
    """Masks come after the bias: a +100 bias cannot force a token the grammar forbids; all shaping is reported."""
    forced = tiny_tokenizer("hello", add_special_tokens=False)["input_ids"][0]
    req = ChatRequest(
        model="tiny",
        messages=[{"role": "user", "content": "json please"}],
        response_format={"type": "json_object"},
        sampling=SamplingParams(max_tokens=8, seed=1, frequency_penalty=0.5, logit_bias={forced: 100}, top_logprobs=3),
    )
    gen = await engine.chat(req)
    (choice,) = gen.choices
    assert choice.text.startswith("{") and choice.token_ids[0] != forced
    assert gen.logprobs_processed == ["json_object", "frequency_penalty", "logit_bias"]
    assert all(math.isfinite(lp) for lp in choice.logprobs)
    # The forced token is masked out at the first step, whatever its bias: never a finite top entry there.
    assert all(token != forced or not math.isfinite(lp) for token, lp in choice.top_logprobs[0])
