"""Engine fixtures: one tiny model built per session (seconds), the real thing everywhere (no mocks).

``tool_tuned_state`` is the tiny model fine-tuned for a few seconds to answer three prompts with fixed replies (a
well-formed tool call, a malformed one, and plain text ending in EOS), so tool parsing, EOS handling and weight
swaps can be checked end to end with a model that really generates those tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from engine_cases import TUNED_REPLIES
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightrail.engine import ChatFormat, Engine, build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", size="tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    """Shared, never modified: tests that swap weights load their own copy with `fresh_model`."""
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


@pytest.fixture
def fresh_model(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir).eval()


@pytest.fixture
async def engine(tiny_model, tiny_tokenizer):
    eng = Engine(tiny_model, tiny_tokenizer, name="tiny")
    yield eng
    await eng.close()


@pytest.fixture(scope="session")
def tool_tuned_state(tiny_model, tiny_tokenizer):
    """State dict of the tiny model after overfitting `TUNED_REPLIES` (a few seconds of AdamW)."""
    tok = tiny_tokenizer
    fmt = ChatFormat(tok)
    rows = []
    for messages, tools, reply in TUNED_REPLIES:
        prompt = tok(fmt.render(messages, tools), add_special_tokens=False)["input_ids"]
        target = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append((prompt, target))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, t) in enumerate(rows):
        seq = torch.tensor(p + t)
        ids[i, : len(seq)] = seq
        labels[i, len(p) : len(seq)] = torch.tensor(t)
        mask[i, : len(seq)] = 1
    model = copy.deepcopy(tiny_model).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(150):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture
async def tuned_engine(fresh_model, tiny_tokenizer, tool_tuned_state):
    fresh_model.load_state_dict(tool_tuned_state)
    eng = Engine(fresh_model, tiny_tokenizer, name="tiny-tuned")
    yield eng
    await eng.close()
