"""What the gateway does with every field it can be sent: one table per API, the source of the table in
``docs/gateway.md`` (`markdown_table`, checked equal under test) and of a generated test that sends every row to a
real gateway (``tests/gateway/test_fields.py``).

Each `FieldRule` is honoured, recorded or refused:

* ``honoured``: it reaches the model or the sampler, as ``meaning`` says;
* ``recorded``: accepted and kept on the call's span, changes nothing sampled (as at OpenAI or Anthropic, where
  it is not model input either: ``user``, ``metadata``, caching and tier hints);
* ``refused``: a 400 whose message names the field (``names``), because dropping it would record a call for
  training on a prompt or a distribution the agent did not ask for.

``send`` is what the generated test merges over the API's minimal request (`MINIMAL`) to exercise the row;
``"$previous"`` stands for the id of a response answered just before. The tests also check that every field of
each API's request struct has a row (a new field cannot be added without deciding what it means here).

With an upstream (``--upstream``) the upstream renders the chat template, so "honoured" means "passed on"; the
embedded engine refuses any message its template would drop (`lightrail.engine.chat.ChatFormat.dropped`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["FIELD_TABLES", "MINIMAL", "FieldRule", "markdown_table"]

Treatment = Literal["honoured", "recorded", "refused"]


@dataclass(frozen=True)
class FieldRule:
    """One field (or one value of it) of one API, and what the gateway does with it."""

    field: str
    """The field's path as the API documents it (``messages[].role: developer``)."""
    treatment: Treatment
    meaning: str
    """What honouring means, or why it is refused."""
    send: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Top-level keys merged over the API's minimal request to send this field."""
    names: str = ""
    """For ``refused``: the text the 400's message contains (the field path); defaults to `field`."""
    shows: str = ""
    """For ``honoured`` message content: text the rendered prompt (the recorded prompt ids) contains."""

    @property
    def named(self) -> str:
        return self.names or self.field


def _user(text: str = "hi") -> dict[str, Any]:
    return {"role": "user", "content": text}


_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}"}}

_R: Treatment = "recorded"
_H: Treatment = "honoured"
_X: Treatment = "refused"

CHAT: tuple[FieldRule, ...] = (
    FieldRule("model", _H, "any name; answered by the served model, both names recorded"),
    FieldRule("messages[].role: system", _H, "a system turn", {"messages": [{"role": "system", "content": "Be brief."}, _user()]}, shows="Be brief."),  # noqa: E501
    FieldRule("messages[].role: developer", _H, "a system turn (open-weight templates have no developer role)", {"messages": [{"role": "developer", "content": "Answer in French."}, _user()]}, shows="Answer in French."),  # noqa: E501
    FieldRule("messages[].role: user", _H, "a user turn", {"messages": [_user("What is 2+2?")]}, shows="What is 2+2?"),
    FieldRule("messages[].role: assistant", _H, "an assistant turn", {"messages": [_user(), {"role": "assistant", "content": "Hello there."}, _user()]}, shows="Hello there."),  # noqa: E501
    FieldRule("messages[].tool_calls", _H, "the family's tool-call markup in the assistant turn", {"messages": [_user(), {"role": "assistant", "content": None, "tool_calls": [_CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "42"}], "tools": [_TOOL]}),  # noqa: E501
    FieldRule("messages[].role: tool", _H, "a tool result in the family's markup", {"messages": [_user(), {"role": "assistant", "content": None, "tool_calls": [_CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "forty-two"}]}, shows="forty-two"),  # noqa: E501
    FieldRule("messages[].role: function", _X, "deprecated; send tool results as role tool", {"messages": [_user(), {"role": "function", "name": "add", "content": "42"}]}, names="messages[1].role"),  # noqa: E501
    FieldRule("messages[].refusal", _H, "an assistant's refusal text, as its content", {"messages": [_user(), {"role": "assistant", "content": None, "refusal": "I will not."}, _user()]}, shows="I will not."),  # noqa: E501
    FieldRule("messages[].reasoning_content", _H, "an assistant turn's reasoning, rendered as the family's template does (Qwen3: after the last user turn)", {"messages": [_user(), {"role": "assistant", "content": "ok", "reasoning_content": "hmm"}, _user()]}),  # noqa: E501
    FieldRule("messages[].reasoning", _H, "as reasoning_content (newer vLLM's name)", {"messages": [_user(), {"role": "assistant", "content": "ok", "reasoning": "hmm"}, _user()]}),  # noqa: E501
    FieldRule("messages[].annotations", _R, "citations of an earlier answer: output metadata, not model input", {"messages": [_user(), {"role": "assistant", "content": "ok", "annotations": [{"type": "url_citation"}]}, _user()]}),  # noqa: E501
    FieldRule("messages[].audio", _X, "no audio: send the transcript as content", {"messages": [_user(), {"role": "assistant", "content": "ok", "audio": {"id": "a"}}, _user()]}, names="messages[1].audio"),  # noqa: E501
    FieldRule("messages[].function_call", _X, "deprecated; use tool_calls", {"messages": [_user(), {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": "{}"}}, _user()]}, names="messages[1].function_call"),  # noqa: E501
    FieldRule("messages[].<other key>", _X, "a key a chat message does not have (null values are ignored: clients dump them back)", {"messages": [{"role": "user", "content": "hi", "frobnicate": 1}]}, names="messages[0].frobnicate"),  # noqa: E501
    FieldRule("messages[].name", _R, "recorded; no open-weight template renders speaker names", {"messages": [{"role": "user", "name": "alice", "content": "hi"}]}),  # noqa: E501
    FieldRule("messages[].content[]: text", _H, "the parts' text, joined", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Part one."}]}]}, shows="Part one."),  # noqa: E501
    FieldRule("messages[].content[]: refusal", _H, "an assistant's refusal text, as content", {"messages": [_user(), {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}, _user()]}, shows="I cannot."),  # noqa: E501
    FieldRule("messages[].content[]: image_url", _X, "the model is shown text only", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]}, names="messages[0].content[0].type"),  # noqa: E501
    FieldRule("messages[].content[]: input_audio", _X, "the model is shown text only", {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}, names="messages[0].content[0].type"),  # noqa: E501
    FieldRule("messages[].content[]: file", _X, "the model is shown text only", {"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]}, names="messages[0].content[0].type"),  # noqa: E501
    FieldRule("n", _H, "n choices, one row each", {"n": 2}),
    FieldRule("temperature", _H, "sampling temperature (logprobs are of the tempered distribution)", {"temperature": 0.5}),  # noqa: E501
    FieldRule("top_p", _H, "nucleus sampling", {"top_p": 0.9}),
    FieldRule("max_tokens", _H, "tokens per choice at most", {"max_tokens": 3}),
    FieldRule("max_completion_tokens", _H, "as max_tokens (wins over it)", {"max_completion_tokens": 3}),
    FieldRule("stop", _H, "stop strings, cut from text and ids", {"stop": ["\n\n"]}),
    FieldRule("seed", _H, "a private generator per row: the same tokens whatever shares the batch", {"seed": 7}),
    FieldRule("stream", _H, "the same answer as server-sent events", {"stream": True}),
    FieldRule("stream_options", _H, "include_usage: a usage chunk", {"stream": True, "stream_options": {"include_usage": True}}),  # noqa: E501
    FieldRule("presence_penalty", _H, "applied to the logits (recorded in logprobs_processed)", {"presence_penalty": 0.5}),  # noqa: E501
    FieldRule("frequency_penalty", _H, "applied to the logits (recorded in logprobs_processed)", {"frequency_penalty": 0.5}),  # noqa: E501
    FieldRule("logit_bias", _H, "added to the logits (recorded in logprobs_processed)", {"logit_bias": {"5": 1.0}}),
    FieldRule("logprobs", _H, "sampled tokens' logprobs in the answer", {"logprobs": True}),
    FieldRule("top_logprobs", _H, "the most likely alternatives per token", {"logprobs": True, "top_logprobs": 2}),
    FieldRule("response_format", _H, "json_object / json_schema enforced by a grammar while sampling", {"response_format": {"type": "json_object"}}),  # noqa: E501
    FieldRule("tools", _H, "offered in the family's markup", {"tools": [_TOOL]}),
    FieldRule("tool_choice", _H, "none / auto; required or a named function forced by a grammar", {"tools": [_TOOL], "tool_choice": "none"}),  # noqa: E501
    FieldRule("parallel_tool_calls", _H, "false keeps at most one call", {"tools": [_TOOL], "parallel_tool_calls": False}),  # noqa: E501
    FieldRule("return_token_ids", _H, "vLLM's extension: prompt_token_ids and token_ids in the answer", {"return_token_ids": True}),  # noqa: E501
    FieldRule("return_tokens_as_token_ids", _H, "vLLM's extension: tokens named token_id:<id> (always so here)", {"return_tokens_as_token_ids": True}),  # noqa: E501
    FieldRule("user", _R, "end-user id; also names a served session", {"user": "u1"}),
    FieldRule("metadata", _R, "recorded; names a served session", {"metadata": {"k": "v"}}),
    FieldRule("store", _R, "OpenAI-side storage; nothing to store here", {"store": True}),
    FieldRule("service_tier", _R, "a tier hint", {"service_tier": "auto"}),
    FieldRule("safety_identifier", _R, "an end-user id hint", {"safety_identifier": "s"}),
    FieldRule("prompt_cache_key", _R, "a cache hint (the engine caches shared prefixes itself)", {"prompt_cache_key": "k"}),  # noqa: E501
    FieldRule("modalities", _X, "text only (['text'] is accepted)", {"modalities": ["text", "audio"]}),
    FieldRule("audio", _X, "no audio output", {"audio": {"voice": "alloy", "format": "wav"}}),
    FieldRule("prediction", _X, "no predicted outputs", {"prediction": {"type": "content", "content": "x"}}),
    FieldRule("web_search_options", _X, "no hosted web search", {"web_search_options": {}}),
    FieldRule("reasoning_effort", _X, "no reasoning-effort control", {"reasoning_effort": "low"}),
    FieldRule("verbosity", _X, "no verbosity control", {"verbosity": "low"}),
    FieldRule("functions", _X, "deprecated; use tools", {"functions": [{"name": "add"}]}),
    FieldRule("function_call", _X, "deprecated; use tool_choice", {"function_call": "auto"}),
    FieldRule("any other field", _X, "as OpenAI: Unrecognized request argument", {"frobnicate": 1}, names="frobnicate"),  # noqa: E501
)  # fmt: skip

COMPLETIONS: tuple[FieldRule, ...] = (
    FieldRule("model", _H, "any name; answered by the served model"),
    FieldRule("prompt", _H, "the text continued (a string, or a list of one)", {"prompt": ["Once upon a time"]}, shows="Once upon a time"),  # noqa: E501
    FieldRule("n", _H, "n choices", {"n": 2}),
    FieldRule("temperature", _H, "sampling temperature", {"temperature": 0.5}),
    FieldRule("top_p", _H, "nucleus sampling", {"top_p": 0.9}),
    FieldRule("max_tokens", _H, "tokens per choice at most (default 16, as OpenAI)", {"max_tokens": 3}),
    FieldRule("stop", _H, "stop strings", {"stop": "\n\n"}),
    FieldRule("seed", _H, "reproducible rows", {"seed": 7}),
    FieldRule("stream", _H, "server-sent events", {"stream": True}),
    FieldRule("stream_options", _H, "include_usage", {"stream": True, "stream_options": {"include_usage": True}}),
    FieldRule("presence_penalty", _H, "applied to the logits", {"presence_penalty": 0.5}),
    FieldRule("frequency_penalty", _H, "applied to the logits", {"frequency_penalty": 0.5}),
    FieldRule("logit_bias", _H, "added to the logits", {"logit_bias": {"5": 1.0}}),
    FieldRule("logprobs", _H, "logprobs and that many alternatives per token", {"logprobs": 2}),
    FieldRule("return_token_ids", _H, "vLLM's extension", {"return_token_ids": True}),
    FieldRule("return_tokens_as_token_ids", _H, "vLLM's extension", {"return_tokens_as_token_ids": True}),
    FieldRule("user", _R, "end-user id", {"user": "u1"}),
    FieldRule("best_of", _R, "accepted when equal to n (nothing else to choose from)", {"best_of": 1}),
    FieldRule("best_of > n", _X, "no server-side best-of", {"best_of": 3}, names="best_of"),
    FieldRule("echo", _X, "the prompt is not echoed", {"echo": True}),
    FieldRule("suffix", _X, "no insertion", {"suffix": "end"}),
    FieldRule("any other field", _X, "as OpenAI: Unrecognized request argument", {"frobnicate": 1}, names="frobnicate"),  # noqa: E501
)  # fmt: skip

_FC = {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{}"}

RESPONSES: tuple[FieldRule, ...] = (
    FieldRule("model", _H, "any name; answered by the served model"),
    FieldRule("input (string)", _H, "one user turn", {"input": "What is 2+2?"}, shows="What is 2+2?"),
    FieldRule("input[].role: user", _H, "a user turn", {"input": [{"role": "user", "content": "Hello user."}]}, shows="Hello user."),  # noqa: E501
    FieldRule("input[].role: system", _H, "a system turn", {"input": [{"role": "system", "content": "Be brief."}, _user()]}, shows="Be brief."),  # noqa: E501
    FieldRule("input[].role: developer", _H, "a system turn (open-weight templates have no developer role)", {"input": [{"role": "developer", "content": "Answer in French."}, _user()]}, shows="Answer in French."),  # noqa: E501
    FieldRule("input[].role: assistant", _H, "an assistant turn", {"input": [_user(), {"role": "assistant", "content": "Hello there."}, _user()]}, shows="Hello there."),  # noqa: E501
    FieldRule("input[].content[]: input_text / output_text / text", _H, "the parts' text, joined", {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Part one."}]}]}, shows="Part one."),  # noqa: E501
    FieldRule("input[].content[]: refusal", _H, "the refusal text, as content", {"input": [_user(), {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot."}]}, _user()]}, shows="I cannot."),  # noqa: E501
    FieldRule("input[].content[]: input_image", _X, "the model is shown text only", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, names="input[0].content[0].type"),  # noqa: E501
    FieldRule("input[].content[]: input_file", _X, "the model is shown text only", {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, names="input[0].content[0].type"),  # noqa: E501
    FieldRule("input[]: function_call", _H, "an assistant turn's tool call", {"input": [_user(), _FC, {"type": "function_call_output", "call_id": "call_1", "output": "42"}]}),  # noqa: E501
    FieldRule("input[]: function_call_output", _H, "a tool result", {"input": [_user(), _FC, {"type": "function_call_output", "call_id": "call_1", "output": "forty-two"}]}, shows="forty-two"),  # noqa: E501
    FieldRule("input[]: reasoning", _H, "the next assistant turn's reasoning_content (the template decides whether it shows)", {"input": [_user(), {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]}, {"role": "assistant", "content": "ok"}, _user()]}),  # noqa: E501
    FieldRule("input[]: other item types", _X, "hosted-tool items and item_reference have no chat form", {"input": [{"type": "item_reference", "id": "x"}]}, names="input[0].type"),  # noqa: E501
    FieldRule("instructions", _H, "a leading system turn", {"instructions": "Be brief."}, shows="Be brief."),
    FieldRule("tools", _H, "function tools, offered in the family's markup", {"tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}]}),  # noqa: E501
    FieldRule("tools[]: hosted tools", _X, "function tools only", {"tools": [{"type": "web_search"}]}, names="tools[0].type"),  # noqa: E501
    FieldRule("tool_choice", _H, "as chat's", {"tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}], "tool_choice": "none"}),  # noqa: E501
    FieldRule("parallel_tool_calls", _H, "false keeps at most one call", {"tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}], "parallel_tool_calls": False}),  # noqa: E501
    FieldRule("max_output_tokens", _H, "tokens at most", {"max_output_tokens": 3}),
    FieldRule("temperature", _H, "sampling temperature", {"temperature": 0.5}),
    FieldRule("top_p", _H, "nucleus sampling", {"top_p": 0.9}),
    FieldRule("top_logprobs", _H, "alternatives per token", {"top_logprobs": 2}),
    FieldRule("text.format", _H, "json_object / json_schema enforced while sampling", {"text": {"format": {"type": "json_object"}}}),  # noqa: E501
    FieldRule("text.verbosity", _R, "a style hint", {"text": {"verbosity": "low"}}),
    FieldRule("previous_response_id", _H, "the remembered conversation continues", {"previous_response_id": "$previous"}),  # noqa: E501
    FieldRule("stream", _H, "the same response as events", {"stream": True}),
    FieldRule("stream_options", _R, "an event-stream hint", {"stream": True, "stream_options": {"include_obfuscation": False}}),  # noqa: E501
    FieldRule("store", _H, "false: the conversation is not remembered for previous_response_id", {"store": False}),
    FieldRule("include", _H, "message.output_text.logprobs adds logprobs to the output", {"include": ["message.output_text.logprobs"]}),  # noqa: E501
    FieldRule("metadata", _R, "recorded", {"metadata": {"k": "v"}}),
    FieldRule("user", _R, "end-user id", {"user": "u1"}),
    FieldRule("truncation", _R, "a context hint (an over-long prompt is a 400, never truncated)", {"truncation": "disabled"}),  # noqa: E501
    FieldRule("reasoning", _R, "a reasoning-effort hint for hosted models", {"reasoning": {"effort": "low"}}),
    FieldRule("service_tier", _R, "a tier hint", {"service_tier": "auto"}),
    FieldRule("prompt_cache_key", _R, "a cache hint", {"prompt_cache_key": "k"}),
    FieldRule("prompt_cache_retention", _R, "a cache hint", {"prompt_cache_retention": "24h"}),
    FieldRule("prompt_cache_options", _R, "a cache hint", {"prompt_cache_options": {}}),
    FieldRule("safety_identifier", _R, "an end-user id hint", {"safety_identifier": "s"}),
    FieldRule("max_tool_calls", _R, "a limit on hosted tool calls (one turn makes at most one round here)", {"max_tool_calls": 1}),  # noqa: E501
    FieldRule("image", _R, "an image-generation hint (no images are generated)", {"image": {}}),
    FieldRule("access_programs", _R, "an access hint", {"access_programs": {}}),
    FieldRule("background_options", _R, "options of background mode, itself refused", {"background_options": {}}),
    FieldRule("background", _X, "no background responses", {"background": True}),
    FieldRule("conversation", _X, "use previous_response_id", {"conversation": "conv_1"}),
    FieldRule("prompt", _X, "no stored prompt templates", {"prompt": {"id": "p"}}),
    FieldRule("context_management", _X, "no context management", {"context_management": [{"type": "compaction"}]}),
    FieldRule("moderation", _X, "no moderation", {"moderation": {}}),
    FieldRule("any other field", _X, "as OpenAI: Unknown parameter", {"frobnicate": 1}, names="frobnicate"),
)  # fmt: skip

_USE = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {}}

MESSAGES: tuple[FieldRule, ...] = (
    FieldRule("model", _H, "any name; answered by the served model"),
    FieldRule("max_tokens", _H, "tokens at most", {"max_tokens": 3}),
    FieldRule("messages[].role: user", _H, "a user turn", {"messages": [_user("What is 2+2?")]}, shows="What is 2+2?"),
    FieldRule("messages[].role: assistant", _H, "an assistant turn (not last: no prefill)", {"messages": [_user(), {"role": "assistant", "content": "Hello there."}, _user()]}, shows="Hello there."),  # noqa: E501
    FieldRule("messages[].role: developer / system", _X, "Anthropic has user and assistant turns; use system", {"messages": [{"role": "developer", "content": "x"}, _user()]}, names="messages[0].role"),  # noqa: E501
    FieldRule("messages[].content[]: text", _H, "the blocks' text", {"messages": [{"role": "user", "content": [{"type": "text", "text": "Part one."}]}]}, shows="Part one."),  # noqa: E501
    FieldRule("messages[].content[]: tool_use", _H, "an assistant turn's tool call", {"messages": [_user(), {"role": "assistant", "content": [_USE]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}]}]}),  # noqa: E501
    FieldRule("messages[].content[]: tool_result", _H, "a tool result (is_error: prefixed Error:)", {"messages": [_user(), {"role": "assistant", "content": [_USE]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "forty-two"}]}]}, shows="forty-two"),  # noqa: E501
    FieldRule("messages[].content[]: thinking", _H, "the assistant turn's reasoning_content", {"messages": [_user(), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""}, {"type": "text", "text": "ok"}]}, _user()]}),  # noqa: E501
    FieldRule("messages[].content[]: redacted_thinking", _R, "encrypted thinking of another model: nothing a template can show", {"messages": [_user(), {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "ok"}]}, _user()]}),  # noqa: E501
    FieldRule("messages[].content[]: image / document", _X, "the model is shown text only", {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}, names="messages[0].content[0].type"),  # noqa: E501
    FieldRule("system", _H, "a leading system turn (text blocks joined)", {"system": "Be brief."}, shows="Be brief."),
    FieldRule("tools", _H, "custom tools, offered in the family's markup", {"tools": [{"name": "add", "input_schema": {"type": "object"}}]}),  # noqa: E501
    FieldRule("tools[]: server tools", _X, "custom tools only", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, names="tools[0].type"),  # noqa: E501
    FieldRule("tool_choice", _H, "auto / any / tool / none; disable_parallel_tool_use", {"tools": [{"name": "add", "input_schema": {"type": "object"}}], "tool_choice": {"type": "none"}}),  # noqa: E501
    FieldRule("stop_sequences", _H, "stop strings", {"stop_sequences": ["\n\n"]}),
    FieldRule("temperature", _H, "sampling temperature (0..1)", {"temperature": 0.5}),
    FieldRule("top_p", _H, "nucleus sampling", {"top_p": 0.9}),
    FieldRule("top_k", _X, "no backend here samples with top-k", {"top_k": 5}),
    FieldRule("stream", _H, "the same message as events", {"stream": True}),
    FieldRule("metadata", _R, "user_id recorded as the chat user", {"metadata": {"user_id": "u1"}}),
    FieldRule("thinking", _X, "no extended thinking ({type: disabled} is accepted)", {"thinking": {"type": "enabled", "budget_tokens": 1024}}),  # noqa: E501
    FieldRule("service_tier", _R, "a tier hint", {"service_tier": "auto"}),
    FieldRule("output_config.effort", _R, "an effort hint", {"output_config": {"effort": "low"}}),
    FieldRule("output_config.format", _X, "no structured outputs on this route", {"output_config": {"format": {"type": "json_schema", "schema": {}}}}),  # noqa: E501
    FieldRule("container", _X, "no containers", {"container": "c"}),
    FieldRule("cache_control", _R, "a cache hint (the engine caches shared prefixes itself)", {"cache_control": {"type": "ephemeral"}}),  # noqa: E501
    FieldRule("inference_geo", _R, "a placement hint", {"inference_geo": "us"}),
    FieldRule("speed", _R, "a speed hint", {"speed": "fast"}),
    FieldRule("diagnostics", _R, "a diagnostics hint", {"diagnostics": {}}),
    FieldRule("user_profile_id", _R, "an end-user hint", {"user_profile_id": "u"}),
    FieldRule("workspace_id", _R, "a workspace hint", {"workspace_id": "w"}),
    FieldRule("any other field", _X, "as Anthropic: Extra inputs are not permitted", {"frobnicate": 1}, names="frobnicate"),  # noqa: E501
)  # fmt: skip

FIELD_TABLES: dict[str, tuple[FieldRule, ...]] = {
    "/chat/completions": CHAT,
    "/completions": COMPLETIONS,
    "/responses": RESPONSES,
    "/messages": MESSAGES,
}
"""Every API's rules, by its path under ``/v1``."""

MINIMAL: dict[str, dict[str, Any]] = {
    "/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/completions": {"model": "m", "prompt": "hi", "max_tokens": 2},
    "/responses": {"model": "m", "input": "hi", "max_output_tokens": 2},
    "/messages": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
"""The smallest valid request of each API, over which a rule's ``send`` is merged."""

_TITLES = {
    "/chat/completions": "OpenAI chat completions",
    "/completions": "OpenAI completions",
    "/responses": "OpenAI Responses",
    "/messages": "Anthropic Messages",
}


def markdown_table() -> str:
    """`FIELD_TABLES` as the Markdown section of ``docs/gateway.md`` (one table per API)."""
    out = []
    for path, rules in FIELD_TABLES.items():
        out += [f"**{_TITLES[path]}** (`/v1{path}`)", "", "| field | | what it does |", "|---|---|---|"]
        out += [f"| `{r.field}` | {r.treatment} | {r.meaning} |" for r in rules]
        out.append("")
    return "\n".join(out)
