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
    merge: bool = True,
) -> list[TrainingRow]:
    """Rows that teach every assistant turn of every conversation: prompt and environment tokens masked out, the
    turn's tokens and EOS trained.

    With ``merge`` (default) the turns of a conversation share one row whenever the next turn's prompt tokens start
    with the row so far (the tool result and the next turn opener are appended as masked context), which is how
    the model sees a multi-turn run and costs each prompt token once; otherwise a new row starts. Rows longer than
    ``max_len`` tokens are dropped (a model cannot attend past its positions).
    """
    chat = ChatFormat(tokenizer)
    eos = tokenizer.eos_token_id
    rows: list[TrainingRow] = []
    for c, conversation in enumerate(conversations):
        ids: list[int] = []
        mask: list[int] = []
        for i, message in enumerate(conversation):
            if message.get("role") != "assistant":
                continue
            prompt = tokenizer(chat.render(list(conversation[:i]), tools), add_special_tokens=False).input_ids
            target = tokenizer(chat.assistant_text(message), add_special_tokens=False).input_ids + [eos]
            if merge and ids and prompt[: len(ids)] == ids:
                context = prompt[len(ids) :]
            else:
                _append_row(rows, ids, mask, c, max_len)
                ids, mask, context = [], [], prompt
            ids += context + target
            mask += [0] * len(context) + [1] * len(target)
        _append_row(rows, ids, mask, c, max_len)
    return rows


def _append_row(
    rows: list[TrainingRow], ids: list[int], mask: list[int], conversation: int, max_len: int | None
) -> None:
    if not ids or (max_len is not None and len(ids) > max_len):
        return
    rows.append(
        TrainingRow(
            input_ids=ids,
            loss_mask=mask,
            old_logprobs=[0.0] * len(ids),
            advantages=[float(m) for m in mask],
            rollout_id=f"sft-{conversation}",
            group_id=f"sft-{conversation}",
        )
    )
