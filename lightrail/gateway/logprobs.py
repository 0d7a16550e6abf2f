"""OpenAI's ``logprobs`` objects for a choice's tokens (chat and legacy completions), whole or for a slice of the
tokens (a streamed delta). Shared by the JSON answers (`lightrail.gateway.openai_api`) and the event streams
(`lightrail.gateway.sse`). Tokens are labelled by id (``token_id:N``, vLLM's convention): the gateway has no
tokenizer."""

from __future__ import annotations

from lightrail.types import JSON, Choice

__all__ = ["chat_logprobs", "completion_logprobs", "token_label"]


def token_label(token_id: int) -> str:
    return f"token_id:{token_id}"


def _top(choice: Choice, lo: int, hi: int) -> list[list[tuple[int, float]]] | None:
    return choice.top_logprobs[lo:hi] if choice.top_logprobs is not None else None


def chat_logprobs(choice: Choice, lo: int = 0, hi: int | None = None) -> dict[str, JSON] | None:
    """OpenAI's ``choice.logprobs`` for chat, for tokens ``lo:hi`` of a choice: the sampled token's logprob and,
    when asked for, the most likely alternatives (``top_logprobs``)."""
    if choice.token_ids is None or choice.logprobs is None:
        return None
    hi = len(choice.token_ids) if hi is None else hi
    tops = _top(choice, lo, hi)
    content = [
        {
            "token": token_label(t),
            "logprob": lp,
            "bytes": None,
            "top_logprobs": [{"token": token_label(a), "logprob": alp, "bytes": None} for a, alp in tops[k]]
            if tops is not None
            else [],
        }
        for k, (t, lp) in enumerate(zip(choice.token_ids[lo:hi], choice.logprobs[lo:hi], strict=False))
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(choice: Choice, lo: int = 0, hi: int | None = None) -> dict[str, JSON] | None:
    """OpenAI's legacy ``choice.logprobs`` for tokens ``lo:hi``: sampled tokens and, when ``logprobs`` > 0 was
    asked, the most likely alternatives per token as ``{label: logprob}`` (no text offsets)."""
    if choice.token_ids is None or choice.logprobs is None:
        return None
    hi = len(choice.token_ids) if hi is None else hi
    tops = _top(choice, lo, hi)
    return {
        "tokens": [token_label(t) for t in choice.token_ids[lo:hi]],
        "token_logprobs": list(choice.logprobs[lo:hi]),
        "top_logprobs": [{token_label(a): alp for a, alp in top} for top in tops] if tops is not None else None,
        "text_offset": None,
    }
