"""The policy the continuous-learning tests serve and learn from."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gate_agents import QUESTIONS


@pytest.fixture(scope="session")
def yes_model(tmp_path_factory) -> Path:
    """The tiny Llama after a short supervised pass on 70% "yes" / 30% "no" answers."""
    from transformers import AutoTokenizer

    from lightrail.algorithms import PolicyUpdater, UpdateConfig
    from lightrail.algorithms.sft import conversation_rows
    from lightrail.engine.models import build_tiny_model

    root = tmp_path_factory.mktemp("yes")
    base = build_tiny_model(root / "base", size="tiny", seed=0)
    tokenizer = AutoTokenizer.from_pretrained(base)
    rng = random.Random(0)
    conversations = [
        [{"role": "user", "content": q}, {"role": "assistant", "content": "yes" if rng.random() < 0.7 else "no"}]
        for q in QUESTIONS * 8
    ]
    rows = conversation_rows(tokenizer, conversations)
    updater = PolicyUpdater(str(base), UpdateConfig(lr=3e-3, seed=0))
    for _ in range(40):
        updater.step(rng.sample(rows, 16), objective="sft")
    updater.model.save_pretrained(root / "warm")
    tokenizer.save_pretrained(root / "warm")
    updater.close()
    return root / "warm"
