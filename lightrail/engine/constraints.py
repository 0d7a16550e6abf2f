"""Structured outputs for the embedded engine: a grammar per request, enforced by masking logits while decoding.

What is constrained (`build_grammar` reads a `ChatRequest`):

* ``response_format={"type": "json_object"}``: any JSON object;
* ``response_format={"type": "json_schema", "json_schema": {"schema": ..., "strict": ...}}``: JSON valid against
  the schema (unknown keywords are a 400 when ``strict`` is true, ignored otherwise);
* ``tool_choice="required"`` / ``{"type": "function", "function": {"name": ...}}`` with ``tools``: the output is
  tool calls in the model family's markup (`lightrail.engine.formats`: Hermes ``<tool_call>`` blocks, Llama 3
  JSON, Mistral ``[TOOL_CALLS]``, pythonic), the arguments valid against that tool's ``function.parameters``.
  ``required`` allows one or more calls, exactly one when ``parallel_tool_calls`` is False; a named tool choice is
  exactly one call. With ``tool_choice`` "auto"/unset and a ``response_format``, the output is either the JSON or
  tool calls.

Schemas are closed by default, as vLLM's default structured-output backend (xgrammar, strict mode) closes them: an
object admits only the properties it declares and an array with ``prefixItems`` only those items, unless the schema
itself says otherwise (``additionalProperties: true`` or a schema, ``items``). So a one-argument tool's call has that
one argument, and a tool without parameters gets ``{}``. ``{"type": "json_object"}`` stays any object.

JSON is written the way ``json.dumps`` and the chat templates' ``tojson`` write it (``", "`` and ``": "``, no other
whitespace): the layout the model saw in its prompts, and no room for runaway whitespace.

`Grammars` compiles grammars for one tokenizer (cached per grammar text, LRU) and hands out one `RowMatcher`
per sampled row. The engine masks each constrained row's logits before sampling (so the recorded logprobs are
those of the masked distribution), feeds the sampled token back, and once the grammar is complete only EOS is
allowed, so a constrained row ends with a parseable result or with ``finish_reason="length"``.

Why llguidance (``llguidance==1.9.1``), measured by ``bench/_grammar_libs.py`` (8 rows in lockstep through a
95-token nested pydantic schema on SmolLM2-135M's 49152-token vocabulary; 1 torch thread, 2-core box):

==============================  ===========  ============  ==============
                                xgrammar     llguidance    outlines-core
                                0.2.8        1.9.1         0.2.14
==============================  ===========  ============  ==============
install (package + deps)        1061 MB      7.9 MB        5.4 MB
                                (triton is a hard dep on Linux x86-64)
compile, strict nested schema   324 ms       2 ms          1440 ms
compile, enum schema            318 ms       1 ms          719 ms
mask fill, 8 rows, mean / p99   68 / 1072us  328 / 4258us  183 / 1043us
mask apply [8, 49152]           253 us       276 us        227 us  (same plain-torch kernel for all)
matcher advance, 8 rows         26 us        33 us         3 us
schemas (of 11 valid)           11 enforce   11 enforce    10 (min/max not enforced)
==============================  ===========  ============  ==============

All three compile every valid schema (nested $defs/$ref, arrays of objects, enums, anyOf-null, strict
additionalProperties false, date-time/email/uuid formats, min/max, recursive $ref, discriminated unions, dict
schemas) and refuse the malformed one; outlines-core accepts ``minimum``/``maximum`` violations. The per-token
differences (well under 1 ms per step for 8 rows) are small next to a SmolLM2 decode step (tens of ms on CPU);
what separates them is compile latency, paid on every new schema or tool set, which agent traffic is full of
(xgrammar 0.3 s, outlines-core up to 1.4 s, on the event loop's critical path; llguidance 1-3 ms because it
builds masks lazily), and xgrammar's gigabyte of triton. llguidance also takes Lark grammars with embedded JSON
schemas (``%json {...}``), which expresses the Hermes tool-call wrapper directly, and can address
tokenizer-added tokens such as ``<tool_call>`` by id. Its own ``llguidance.torch`` helpers are not used: they
``torch.compile`` at import (1.3 s, and a C compiler at first call); `apply_bitmask` is plain torch.

Threads: `Grammars.compile` may run in any thread (llguidance releases the GIL while compiling); the cache is
guarded by a lock. A `RowMatcher` is used by one thread at a time (the engine's worker).
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lightrail.engine.formats import TOOL_FORMATS, ToolFormat
from lightrail.types import BackendError, ChatRequest

__all__ = ["Constraint", "Grammar", "Grammars", "RowMatcher", "apply_bitmask", "build_grammar", "grammars_for"]

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
_CACHE_SIZE = 256


@dataclass(frozen=True)
class Grammar:
    """A request's constraint: its kind (reported in `Generation.logprobs_processed`), the Lark grammar text, and
    the request field a compile error is blamed on."""

    kind: str  # "json_object" | "json_schema" | "tool_choice"
    lark: str
    param: str


_COMBINATORS = ("anyOf", "oneOf")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_VALUES = ("items", "additionalItems", "not", "if", "then", "else", "contains", "additionalProperties")


def closed_schema(schema: Any) -> Any:
    """``schema`` with every object that does not say otherwise closed (``additionalProperties: false``) and every
    ``prefixItems`` array without ``items`` limited to those items. Branches of an ``allOf`` are left open (closing
    each would reject the properties the others declare)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_schema(v) for k, v in out[key].items()}
    for key in _SCHEMA_VALUES:
        if key in out:
            out[key] = closed_schema(out[key])
    for key in (*_COMBINATORS, "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [closed_schema(v) for v in out[key]]
    is_object = out.get("type") == "object" or (isinstance(out.get("type"), list) and "object" in out["type"])
    open_keys = ("additionalProperties", "unevaluatedProperties", "patternProperties", "allOf", "$ref")
    if (is_object or "properties" in out) and not any(k in out for k in open_keys):
        out["additionalProperties"] = False
    if "prefixItems" in out and "items" not in out and "unevaluatedItems" not in out:
        out["items"] = False
    return out


def _schema_rule(schema: Any, strict: bool, param: str, closed: bool = True) -> str:
    """A Lark rule body constraining a JSON value to ``schema`` (llguidance's ``%json`` with our layout).

    ``strict``: unknown keywords are an error (else ignored); ``closed``: objects admit only the properties they
    declare unless the schema says otherwise (`closed_schema`)."""
    if schema is True:
        schema = {}
    if not isinstance(schema, dict):
        raise BackendError(f"the JSON schema must be an object, got {type(schema).__name__}", param=param)
    if closed:
        schema = closed_schema(schema)
    options = dict(JSON_OPTIONS, lenient=not strict)
    try:
        text = json.dumps({**schema, "x-guidance": options}, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"the JSON schema is not serialisable JSON: {exc}", param=param) from exc
    return "%json " + text


def _response_rule(fmt: Any) -> tuple[str, str] | None:
    """(kind, rule body) for an OpenAI ``response_format``; None for free text."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise BackendError("response_format must be an object with a 'type'", param="response_format")
    kind = fmt["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return kind, _schema_rule({"type": "object"}, False, "response_format", closed=False)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise BackendError("response_format.json_schema must be an object with a 'schema'", param="response_format")
        return kind, _schema_rule(spec["schema"], bool(spec.get("strict")), "response_format")
    raise BackendError(
        f"response_format type must be 'text', 'json_object' or 'json_schema', got {kind!r}", param="response_format"
    )


def _tool_functions(tools: Any) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BackendError("every tool must be {'type': 'function', 'function': {'name': ...}}", param="tools")
        if not _TOOL_NAME.match(fn["name"]):
            raise BackendError(f"invalid tool name {fn['name']!r}", param="tools")
        out[fn["name"]] = fn
    return out


def build_grammar(
    request: ChatRequest,
    tool_format: ToolFormat | None = None,
    tags: Callable[[ToolFormat], dict[str, str]] | None = None,
) -> Grammar | None:
    """The grammar ``request`` must follow, or None when its output is free. Raises `BackendError` (a 400 naming
    the field) for a malformed ``response_format``, ``tools`` or ``tool_choice``.

    Tool calls are written in ``tool_format``'s markup (default Hermes); ``tags`` gives the Lark expression of each
    of its marker strings (`Grammars.tags` also accepts a tokenizer's own token for a marker).
    """
    fmt = tool_format or TOOL_FORMATS["hermes"]
    response = _response_rule(request.response_format)
    choice = request.tool_choice
    tools = _tool_functions(request.tools) if request.tools else {}
    forced: list[str] | None = None  # names the output must call
    single = request.parallel_tool_calls is False
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise BackendError(
                "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        if name not in tools:
            raise BackendError(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        forced, single = [name], True
    elif choice == "required":
        if not tools:
            raise BackendError("tool_choice 'required' needs tools", param="tool_choice")
        forced = list(tools)
    elif choice not in (None, "auto", "none"):
        raise BackendError(f"unknown tool_choice {choice!r}", param="tool_choice")
    if forced is None and response is None:
        return None
    # With tools on offer ("auto"), a response_format output may still be tool calls.
    callable_ = forced if forced is not None else (list(tools) if choice != "none" else [])
    lines: list[str] = []
    if callable_:
        tag = tags(fmt) if tags is not None else {t: json.dumps(t) for t in fmt.tags}
        lines += fmt.calls_rule(
            [(name, tools[name]) for name in callable_],
            single,
            tag,
            lambda schema, strict: _schema_rule(schema, strict, "tools"),
        )
        calls = "calls"
    if forced is not None:
        kind, start = "tool_choice", calls
    else:
        assert response is not None
        kind, start = response[0], "response" + (f" | {calls}" if callable_ else "")
        lines.append(f"response: {response[1]}")
    lark = "\n".join([f"start: {start}", *lines]) + "\n"
    return Grammar(kind, lark, "response_format" if kind != "tool_choice" else "tools")


class RowMatcher:
    """One row's position in its grammar: write the allowed-token mask, advance with the sampled token."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: Any):
        self.matcher = matcher

    def advance(self, token: int) -> bool:
        """Consume the sampled token; False when the grammar rejects it (the row is then only allowed EOS)."""
        return self.matcher.consume_token(token)


@dataclass(frozen=True)
class Constraint:
    """A request's compiled grammar, ready to hand a fresh `RowMatcher` to each of its rows."""

    kind: str
    grammars: Grammars
    compiled: Any

    def new_row(self) -> RowMatcher:
        return RowMatcher(self.compiled.deep_copy())


class Grammars:
    """Compiles grammars for one tokenizer (LRU-cached by grammar text) and fills token bitmasks in batches."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_ids: list[int]):
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=self.eos_ids)
        self._executor = llguidance.LLExecutor(num_threads=2)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.compiled = 0
        """Grammars compiled (cache misses)."""
        self._added = {
            added.content: token_id for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items()
        }

    def tags(self, tool_format: ToolFormat) -> dict[str, str]:
        """The Lark expression of each of ``tool_format``'s marker strings: the text, or the tokenizer's own token
        for it when it has one (llguidance treats every added token as special, matched only by id; the model was
        trained to write the token, so the grammar must allow it)."""
        out = {}
        for tag in tool_format.tags:
            token_id = self._added.get(tag)
            out[tag] = f"(<[{token_id}]> | {json.dumps(tag)})" if token_id is not None else json.dumps(tag)
        return out

    def cached(self, grammar: Grammar) -> Any | None:
        """The compiled grammar for ``grammar`` if it is in the cache, else None."""
        with self._lock:
            hit = self._cache.get(grammar.lark)
            if hit is not None:
                self._cache.move_to_end(grammar.lark)
            return hit

    def compile(self, grammar: Grammar) -> Any:
        """The compiled grammar for ``grammar`` (a matcher in its start state, copied for each row); cached.
        Raises `BackendError` (param: the field the grammar came from) when the grammar does not compile."""
        hit = self.cached(grammar)
        if hit is not None:
            return hit
        llg = self._llg
        matcher = llg.LLMatcher(self.tokenizer, llg.LLMatcher.grammar_from_lark(grammar.lark), log_level=0)
        if matcher.is_error():
            raise BackendError(
                f"unsupported or malformed schema: {_first_line(matcher.get_error())}", param=grammar.param
            )
        with self._lock:
            self.compiled += 1
            self._cache[grammar.lark] = matcher
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def fill(self, rows: list[tuple[int, RowMatcher]], bitmask: Any) -> None:
        """Write the allowed-token bitmask of each (bitmask row, matcher) pair, all in one parallel call.

        ``bitmask`` is a contiguous int32 CPU tensor of shape [rows, ceil(vocab / 32)]. A matcher in an error
        state (it consumed a token its grammar forbids) gets EOS only, so its row ends instead of failing."""
        self._executor.unsafe_compute_mask_ptr(
            [(m.matcher, i) for i, m in rows], bitmask.data_ptr(), bitmask.shape[1] * 4, bitmask.shape[0]
        )
        for i, m in rows:
            if m.matcher.is_error():
                bitmask[i].zero_()
                for eos in self.eos_ids:
                    bitmask[i, eos // 32] |= _bit(eos % 32)


def _bit(j: int) -> int:
    return (1 << j) - (1 << 32) if j == 31 else 1 << j  # an int32 with bit j set


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["unknown error"])[0][:300]


_BYTE_BITS: Any = None


def apply_bitmask(logits: Any, bitmask: Any) -> None:
    """Add -inf to the logits of tokens the bitmask forbids (bit j of int32 word i allows token 32*i + j), in place.

    One embedding lookup of each mask byte in a [256, 8] table of 0 / -inf: several times faster on CPU than
    unpacking the bits with shifts and ``masked_fill``."""
    import torch

    global _BYTE_BITS
    if _BYTE_BITS is None or _BYTE_BITS.device != logits.device:
        table = [[0.0 if (b >> j) & 1 else float("-inf") for j in range(8)] for b in range(256)]
        _BYTE_BITS = torch.tensor(table, dtype=torch.float32, device=logits.device)
    rows = bitmask.shape[0]
    bias = torch.nn.functional.embedding(bitmask.view(torch.uint8).long(), _BYTE_BITS).view(rows, -1)
    logits.add_(bias[:, : logits.shape[1]].to(logits.dtype))


_BY_TOKENIZER: weakref.WeakKeyDictionary[Any, Grammars] = weakref.WeakKeyDictionary()
_BY_TOKENIZER_LOCK = threading.Lock()


def grammars_for(tokenizer: Any, vocab_size: int, eos_ids: set[int] | list[int]) -> Grammars:
    """The `Grammars` of ``tokenizer`` (built once per tokenizer and vocabulary size: ~0.5 s for 49 k tokens)."""
    with _BY_TOKENIZER_LOCK:
        g = _BY_TOKENIZER.get(tokenizer)
        if g is None or g.vocab_size != vocab_size or g.eos_ids != sorted(eos_ids):
            g = Grammars(tokenizer, vocab_size, list(eos_ids))
            _BY_TOKENIZER[tokenizer] = g
        return g
