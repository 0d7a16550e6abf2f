"""Supervised rows from chat conversations: the data side of SFT (warm starts, fine-tuning on the best traces).

A conversation (OpenAI messages, optionally with tools) becomes one `TrainingRow` per assistant turn: the prompt is
what the engine would condition on at that point (the same `ChatFormat` rendering and tokenization the engine
uses), the target is what the model should generate (`ChatFormat.assistant_text`) followed by EOS. Training on them
is `PolicyUpdater.step(rows, objective="sft")`. Pure functions of a tokenizer; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lightrail.engine.chat import ChatFormat
from lightrail.types import TrainingRow

__all__ = ["conversation_rows"]


def conversation_rows(
    tokenizer: Any,
    conversations: Iterable[Sequence[dict[str, Any]]],
    *,
    tools: list[dict[str, Any]] | None = None,
    max_len: int | None = None,
) -> list[TrainingRow]:
    """One row per assistant turn of every conversation: prompt tokens masked out, the turn's tokens and EOS
    trained. Rows longer than ``max_len`` tokens are dropped (a model cannot attend past its positions)."""
    chat = ChatFormat(tokenizer)
    eos = tokenizer.eos_token_id
    rows: list[TrainingRow] = []
    for c, conversation in enumerate(conversations):
        for i, message in enumerate(conversation):
            if message.get("role") != "assistant":
                continue
            prompt = tokenizer(chat.render(list(conversation[:i]), tools), add_special_tokens=False).input_ids
            target = tokenizer(chat.assistant_text(message), add_special_tokens=False).input_ids + [eos]
            ids = prompt + target
            if max_len is not None and len(ids) > max_len:
                continue
            mask = [0] * len(prompt) + [1] * len(target)
            rows.append(
                TrainingRow(
                    input_ids=ids,
                    loss_mask=mask,
                    old_logprobs=[0.0] * len(ids),
                    advantages=[float(m) for m in mask],
                    rollout_id=f"sft-{c}",
                    group_id=f"sft-{c}",
                )
            )
    return rows
