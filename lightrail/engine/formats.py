"""Model families' chat formats: how a family writes tool calls and reasoning. The one source of truth for them.

A model family answers with tool calls in its own markup, and reasoning models think inside ``<think>`` tags. Every
place that reads or writes model text asks this module, so they cannot disagree:

* the embedded engine renders prompts with the family's template and parses what the model wrote (`ChatFormat`);
* forced tool calls (``tool_choice``) follow the family's markup in the engine's grammar (`ToolFormat.calls_rule`);
* vLLM is launched with the matching ``--tool-call-parser`` and ``--reasoning-parser`` (`ModelFormat.vllm_args`);
* SFT targets are assistant turns written as the family writes them (`ModelFormat.assistant_text`);
* the dashboard names the format a run's model speaks.

Tool-call formats (`TOOL_FORMATS`), each named as vLLM names its parser:

==============  =================================================================  ===============================
name            what the model writes                                              families
==============  =================================================================  ===============================
``hermes``      ``<tool_call>\\n{"name": f, "arguments": {...}}\\n</tool_call>``   Qwen2.5, Qwen3, Hermes, SmolLM2,
                (one block per call, joined by a newline)                          lightrail's tiny models
``llama3_json`` ``{"name": f, "parameters": {...}}`` (calls joined by ``; ``),     Llama 3.1, 3.2, 3.3
                optionally after ``<|python_tag|>``
``mistral``     ``[TOOL_CALLS] [{"name": f, "arguments": {...}}, ...]``            Mistral 7B v0.3, Nemo, Small
``pythonic``    ``[f(a=1, b="x"), g()]``                                           Llama 3.2/4 pythonic, ToolACE
==============  =================================================================  ===============================

Reasoning (`REASONING_FORMATS`): ``think``, text between ``<think>`` and ``</think>`` before the answer (Qwen3,
DeepSeek-R1 and its distills; a template that opens ``<think>`` in its generation prompt makes the model write only
the closing tag). The reasoning stays in the recorded token ids (it is trained on) and comes back to the agent as
``reasoning_content`` (chat), a reasoning item (Responses) or a thinking block (Anthropic Messages).

`detect` picks the formats from a chat template's text; a template that renders tools in a markup this module does
not know is an error that names the formats, so a config can name one (``tool_format:``) instead of the model
silently getting text where it expected tool calls. Pure functions and frozen objects: no I/O, no locks.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightrail.types import ToolCall

__all__ = [
    "REASONING_FORMATS",
    "TOOL_FORMATS",
    "ModelFormat",
    "ParsedToolCalls",
    "ReasoningFormat",
    "ToolFormat",
    "UnknownFormatError",
    "detect",
    "formats_of",
    "model_format",
    "template_of",
]


SchemaRule = Callable[[Any, bool], str]
"""``(schema, strict) -> Lark expression`` of a JSON value valid against the schema (the engine's grammar builder)."""


class UnknownFormatError(ValueError):
    """A chat template renders tools in a markup no known format reads, or a format name is not known."""


@dataclass(frozen=True)
class ParsedToolCalls:
    """What a tool format's parser found: the content left outside the calls, the calls, and how many call blocks
    were malformed (bad JSON, no name, unclosed; those stay in ``content`` as plain text)."""

    content: str
    tool_calls: list[ToolCall]
    malformed: int


def _new_call(name: str, arguments: Any) -> ToolCall | None:
    """A `ToolCall` for ``name`` with ``arguments`` (an object, or JSON text of one); None when they are not."""
    if not isinstance(name, str) or not name:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _arguments(fn: dict[str, Any]) -> Any:
    """A call's arguments as an object when they parse (what templates and renderers want), else the text."""
    args = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(args) if args.strip() else {}
    return args


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class ToolFormat:
    """How one family writes tool calls. Subclasses fill in the markup; instances are stateless."""

    name: str
    vllm_parser: str
    tags: tuple[str, ...] = ()
    """Marker strings the format writes that a tokenizer may hold as single (often special) tokens."""
    prompt: str = ""
    """The instruction `tools_prompt` gives a model whose template cannot list tools."""

    def render(self, calls: list[dict[str, Any]]) -> str:
        """The text a model of this family writes for ``calls`` (OpenAI ``function`` objects: name, arguments)."""
        raise NotImplementedError

    def parse(self, text: str) -> ParsedToolCalls:
        """The calls in generated ``text`` (special marker tokens may have been dropped by decoding)."""
        raise NotImplementedError

    def calls_rule(
        self, tools: list[tuple[str, dict[str, Any]]], single: bool, tag: dict[str, str], schema_rule: SchemaRule
    ) -> list[str]:
        """Lark rules whose ``calls`` rule is one call (``single``) or several to ``tools`` (name, OpenAI
        ``function`` object), in this markup. ``tag`` maps each of `tags` to its Lark expression; ``schema_rule
        (schema, strict)`` is the Lark expression of a JSON value valid against a schema."""
        bodies = [(name, schema_rule(parameters_of(fn), bool(fn.get("strict")))) for name, fn in tools]
        return self._json_calls(bodies, single, tag)

    def _json_calls(self, bodies: list[tuple[str, str]], single: bool, tag: dict[str, str]) -> list[str]:
        """`calls_rule` for a markup whose arguments are one JSON object: ``bodies`` are (tool name, Lark
        expression of its arguments)."""
        raise NotImplementedError

    def tools_prompt(self, tools: list[dict[str, Any]]) -> str:
        """A system-prompt section listing ``tools`` and how to call them, for a template that cannot."""
        lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return f"# Tools\n\n{self.prompt}\n\n<tools>\n{lines}\n</tools>"

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` as this family's template expects them (after `normalize_messages`)."""
        return messages

    def __repr__(self) -> str:
        return f"<ToolFormat {self.name}>"


class _Hermes(ToolFormat):
    name = vllm_parser = "hermes"
    tags = ("<tool_call>", "</tool_call>")
    _block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def tools_prompt(self, tools: list[dict[str, Any]]) -> str:
        lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{lines}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n"
            '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def render(self, calls: list[dict[str, Any]]) -> str:
        return "\n".join(
            f'<tool_call>\n{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {_dumps(_arguments(fn))}}}\n</tool_call>'
            for fn in calls
        )

    def parse(self, text: str) -> ParsedToolCalls:
        calls: list[ToolCall] = []
        malformed = 0
        pieces: list[str] = []
        pos = 0
        for match in self._block.finditer(text):
            call = _json_call(match.group(1), ("arguments", "parameters"))
            if call is None:
                malformed += 1
                continue
            pieces.append(text[pos : match.start()])
            pos = match.end()
            calls.append(call)
        pieces.append(text[pos:])
        if "<tool_call>" in self._block.sub("", text):  # an opening tag never closed (e.g. cut by max_tokens)
            malformed += 1
        if not calls:
            return ParsedToolCalls(text, [], malformed)
        return ParsedToolCalls("".join(pieces).strip(), calls, malformed)

    def _json_calls(self, bodies: list[tuple[str, str]], single: bool, tag: dict[str, str]) -> list[str]:
        rules = _json_bodies(bodies, "arguments")
        rules.append(f'call: {tag["<tool_call>"]} "\\n" body "\\n" {tag["</tool_call>"]}')
        rules.append("calls: call" if single else 'calls: call ("\\n" call)*')
        return rules


class _Llama3Json(ToolFormat):
    name = vllm_parser = "llama3_json"
    tags = ("<|python_tag|>",)
    prompt = (
        "To call a function, respond with JSON for a function call. Respond in the format "
        '{"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.'
    )

    def render(self, calls: list[dict[str, Any]]) -> str:
        return "; ".join(
            f'{{"name": {json.dumps(fn.get("name", ""))}, "parameters": {_dumps(_arguments(fn))}}}' for fn in calls
        )

    def parse(self, text: str) -> ParsedToolCalls:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return ParsedToolCalls(text, [], 0)
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        pos = 0
        while True:
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except json.JSONDecodeError:
                return ParsedToolCalls(text, [], 1)
            call = _obj_call(obj, ("parameters", "arguments"))
            if call is None:  # JSON, but not a call: the model answered in JSON
                return ParsedToolCalls(text, [], 0)
            calls.append(call)
            rest = body[pos:].lstrip()
            if not rest:
                return ParsedToolCalls("", calls, 0)
            if not rest.startswith(";"):
                return ParsedToolCalls(text, [], 1)
            pos = len(body) - len(rest[1:].lstrip())

    def _json_calls(self, bodies: list[tuple[str, str]], single: bool, tag: dict[str, str]) -> list[str]:
        rules = _json_bodies(bodies, "parameters")
        rules.append("call: body")
        rules.append("calls: call" if single else 'calls: call ("; " call)*')
        return rules


class _Mistral(ToolFormat):
    name = vllm_parser = "mistral"
    tags = ("[TOOL_CALLS]",)
    prompt = (
        "To call functions, respond with [TOOL_CALLS] followed by a JSON list of calls: "
        '[TOOL_CALLS] [{"name": function name, "arguments": dictionary of argument name and its value}]'
    )

    def render(self, calls: list[dict[str, Any]]) -> str:
        items = ", ".join(
            f'{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {_dumps(_arguments(fn))}}}' for fn in calls
        )
        return f"[TOOL_CALLS] [{items}]"

    def parse(self, text: str) -> ParsedToolCalls:
        head, marker, tail = text.partition("[TOOL_CALLS]")
        body = tail if marker else text
        stripped = body.lstrip()
        if not stripped.startswith("[{"):  # [TOOL_CALLS] is a special token that decoding may have dropped
            return ParsedToolCalls(text, [], 1 if marker else 0)
        try:
            items, end = json.JSONDecoder().raw_decode(stripped)
        except json.JSONDecodeError:
            return ParsedToolCalls(text, [], 1)
        calls = [_obj_call(item, ("arguments", "parameters")) for item in items] if isinstance(items, list) else []
        if not calls or any(c is None for c in calls):
            return ParsedToolCalls(text, [], 1)
        content = (head + stripped[end:]).strip() if marker else stripped[end:].strip()
        return ParsedToolCalls(content, [c for c in calls if c is not None], 0)

    def _json_calls(self, bodies: list[tuple[str, str]], single: bool, tag: dict[str, str]) -> list[str]:
        rules = _json_bodies(bodies, "arguments")
        rules.append("call: body")
        items = "call" if single else 'call (", " call)*'
        rules.append(f'calls: {tag["[TOOL_CALLS]"]} " [" {items} "]"')
        return rules

    def prepare(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Mistral's template refuses call ids that are not 9 alphanumerics: map each id to one, consistently.
        def short(call_id: Any) -> str:
            text = str(call_id or "")
            if re.fullmatch(r"[A-Za-z0-9]{9}", text):
                return text
            return hashlib.sha1(text.encode()).hexdigest()[:9]

        out = []
        for m in messages:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": short(c.get("id"))} for c in m["tool_calls"]]
            if m.get("role") == "tool":
                m["tool_call_id"] = short(m.get("tool_call_id"))
            out.append(m)
        return out


_PY_LITERALS = {"boolean": '"True" | "False"', "null": '"None"'}


class _Pythonic(ToolFormat):
    name = vllm_parser = "pythonic"
    prompt = (
        "To call functions, respond with a python list of the calls. Respond in the format "
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]. "
        "Do not use variables."
    )
    _names = {"true": True, "false": False, "null": None}

    def render(self, calls: list[dict[str, Any]]) -> str:
        def call(fn: dict[str, Any]) -> str:
            args = _arguments(fn)
            kwargs = ", ".join(f"{k}={_py(v)}" for k, v in args.items()) if isinstance(args, dict) else ""
            return f"{fn.get('name', '')}({kwargs})"

        return "[" + ", ".join(call(fn) for fn in calls) + "]"

    def parse(self, text: str) -> ParsedToolCalls:
        body = text.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>").strip()
        if not (body.startswith("[") and body.endswith("]") and "(" in body):
            return ParsedToolCalls(text, [], 0)
        try:
            tree = ast.parse(body, mode="eval").body
        except SyntaxError:
            return ParsedToolCalls(text, [], 1)
        if not isinstance(tree, ast.List) or not tree.elts:
            return ParsedToolCalls(text, [], 0)
        calls: list[ToolCall] = []
        for node in tree.elts:
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
                return ParsedToolCalls(text, [], 1)
            try:
                args = {kw.arg: self._value(kw.value) for kw in node.keywords if kw.arg is not None}
            except ValueError:
                return ParsedToolCalls(text, [], 1)
            call = _new_call(node.func.id, args)
            if call is None:
                return ParsedToolCalls(text, [], 1)
            calls.append(call)
        return ParsedToolCalls("", calls, 0)

    def _value(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Name) and node.id in self._names:  # JSON's literals, as a grammar writes them
            return self._names[node.id]
        if isinstance(node, ast.List):
            return [self._value(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {
                self._value(k): self._value(v) for k, v in zip(node.keys, node.values, strict=True) if k is not None
            }
        return ast.literal_eval(node)

    def calls_rule(
        self, tools: list[tuple[str, dict[str, Any]]], single: bool, tag: dict[str, str], schema_rule: SchemaRule
    ) -> list[str]:
        """``name(k=v, ...)`` with only the declared keyword arguments, in their declared order, the required ones
        always present; booleans and null as Python writes them, other values as JSON (Python reads those too)."""
        rules: list[str] = []
        bodies = []
        for i, (name, fn) in enumerate(tools):
            params = parameters_of(fn)
            props = list((params.get("properties") or {}).items())
            required = set(params.get("required") or ())
            n = len(props)
            for j, (key, schema) in enumerate(props):
                v = _PY_LITERALS.get(str(schema.get("type"))) if isinstance(schema, dict) else None
                v = v or schema_rule(schema, False)  # strings and numbers: JSON's spelling is Python's
                rules.append(f"v_{i}_{j}: {v}")
                opt = key not in required
                rules.append(
                    f'start_{i}_{j}: "{key}=" v_{i}_{j} after_{i}_{j + 1}' + (f" | start_{i}_{j + 1}" if opt else "")
                )
                rules.append(
                    f'after_{i}_{j}: ", {key}=" v_{i}_{j} after_{i}_{j + 1}' + (f" | after_{i}_{j + 1}" if opt else "")
                )
            rules.append(f'start_{i}_{n}: ""')
            rules.append(f'after_{i}_{n}: ""')
            rules.append(f'body_{i}: {json.dumps(name + "(")} start_{i}_0 ")"')
            bodies.append(f"body_{i}")
        rules.append("call: " + " | ".join(bodies))
        rules.append('calls: "[" call "]"' if single else 'calls: "[" call (", " call)* "]"')
        return rules


def parameters_of(fn: dict[str, Any]) -> Any:
    """A tool's ``parameters`` schema (a tool without one takes no arguments)."""
    return fn.get("parameters", {"type": "object", "properties": {}})


def _py(value: Any) -> str:
    """A value as a Python literal the way a pythonic call writes it: strings and numbers as JSON writes them
    (double quotes: a valid Python literal too), ``True`` / ``False`` / ``None`` for JSON's literals."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if value is None or isinstance(value, bool):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


def _obj_call(obj: Any, keys: tuple[str, ...]) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    args: Any = next((obj[k] for k in keys if k in obj), {})
    name = obj.get("name")
    return _new_call(name, args) if isinstance(name, str) else None


def _json_call(body: str, keys: tuple[str, ...]) -> ToolCall | None:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    return _obj_call(obj, keys)


def _json_bodies(bodies: list[tuple[str, str]], key: str) -> list[str]:
    rules = []
    for i, (name, args) in enumerate(bodies):
        prefix = '{"name": ' + json.dumps(name) + f', "{key}": '
        rules.append(f'body_{i}: {json.dumps(prefix)} args_{i} "}}"')
        rules.append(f"args_{i}: {args}")
    rules.append("body: " + " | ".join(f"body_{i}" for i in range(len(bodies))))
    return rules


@dataclass(frozen=True)
class ReasoningFormat:
    """Reasoning between ``open`` and ``close`` tags before the answer. ``vllm_parser`` is vLLM's
    ``--reasoning-parser`` for it: ``deepseek_r1`` when the generation prompt already opens the tag (the model
    writes only the closing one), ``qwen3`` otherwise."""

    name: str = "think"
    open: str = "<think>"
    close: str = "</think>"
    vllm_parser: str = "qwen3"

    def split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, the rest) of generated ``text``. Without a closing tag, text that opened the tag is all
        reasoning (cut by max_tokens), and text that did not is all answer. Whitespace around each is stripped."""
        head, closed, tail = text.partition(self.close)
        if closed:
            return head.strip().removeprefix(self.open).strip(), tail.strip()
        stripped = text.lstrip()
        if stripped.startswith(self.open):
            return stripped.removeprefix(self.open).strip(), ""
        return None, text

    def render(self, reasoning: str) -> str:
        """The reasoning block a model of this format writes before its answer."""
        return f"{self.open}\n{reasoning.strip()}\n{self.close}\n\n"


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (_Hermes(), _Llama3Json(), _Mistral(), _Pythonic())}
"""The tool-call formats by name (the names of vLLM's ``--tool-call-parser`` for them)."""

REASONING_FORMATS: dict[str, ReasoningFormat] = {
    "think": ReasoningFormat(),
    "think_open": ReasoningFormat(name="think_open", vllm_parser="deepseek_r1"),
}
"""Reasoning formats by name: ``think`` (``<think>...</think>`` written by the model, vLLM's ``qwen3`` parser) and
``think_open`` (the generation prompt opens ``<think>``, the model writes the rest; vLLM's ``deepseek_r1``)."""


@dataclass(frozen=True)
class ModelFormat:
    """The formats one model speaks: how it calls tools, whether (and how) it reasons, and whether its chat
    template can list tools itself (``native_tools``; when it cannot, the tool format's `ToolFormat.tools_prompt`
    is added to the system message)."""

    tool: ToolFormat
    reasoning: ReasoningFormat | None = None

    def assistant_text(self, message: dict[str, Any]) -> str:
        """The text a model of this family generates for an assistant ``message``: its reasoning block (from
        ``reasoning_content``), its content, then its tool calls in the family's markup. SFT targets are built from
        it, so a model learns to write exactly what the parser reads back."""
        content = message.get("content") or ""
        if not isinstance(content, str):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        calls = [dict(c.get("function") or c) for c in message.get("tool_calls") or ()]
        text = "\n".join(([content] if content else []) + ([self.tool.render(calls)] if calls else []))
        reasoning = message.get("reasoning_content")
        if self.reasoning is not None and isinstance(reasoning, str) and reasoning.strip():
            text = self.reasoning.render(reasoning) + text
        return text

    def vllm_args(self) -> list[str]:
        """The vLLM server flags that make vLLM read this model's output as lightrail does."""
        args = ["--enable-auto-tool-choice", "--tool-call-parser", self.tool.vllm_parser]
        if self.reasoning is not None:
            args += ["--reasoning-parser", self.reasoning.vllm_parser]
        return args

    def describe(self) -> str:
        return self.tool.name + (f" + {self.reasoning.name}" if self.reasoning else "")


_LLAMA_HEADER = "<|start_header_id|>"


def detect(template: str | None) -> ModelFormat:
    """The formats a chat ``template`` (Jinja text) speaks, recognised by the markup it writes.

    A template that never mentions tools gets ``hermes``: lightrail then lists tools and renders calls itself, in the
    markup its own tiny models and most small instruct models (SmolLM2, Qwen) were trained on. A template that renders
    tools in a markup no format reads raises `UnknownFormatError` naming the formats (set one explicitly)."""
    text = template or ""
    reasoning = None
    if "<think>" in text or "</think>" in text:
        opens = (
            re.search(r"add_generation_prompt[\s\S]{0,200}?<think>", text) is not None and "enable_thinking" not in text
        )
        reasoning = REASONING_FORMATS["think_open" if opens else "think"]
    if "<tool_call>" in text:
        return ModelFormat(TOOL_FORMATS["hermes"], reasoning)
    if "[TOOL_CALLS]" in text:
        return ModelFormat(TOOL_FORMATS["mistral"], reasoning)
    if "python list" in text or "[func_name1(" in text:
        return ModelFormat(TOOL_FORMATS["pythonic"], reasoning)
    if _LLAMA_HEADER in text and '"parameters"' in text.replace("\\", ""):
        return ModelFormat(TOOL_FORMATS["llama3_json"], reasoning)
    if not re.search(r"\btools\b|tool_calls", text):
        return ModelFormat(TOOL_FORMATS["hermes"], reasoning)
    raise UnknownFormatError(
        "the model's chat template renders tools in a format lightrail does not recognise; name its tool-call format "
        f"(tool_format: one of {', '.join(TOOL_FORMATS)})"
    )


def model_format(template: str | None, tool_format: str | None = None, reasoning: str | None = None) -> ModelFormat:
    """The formats of a model: ``tool_format`` / ``reasoning`` when given (names in `TOOL_FORMATS` /
    `REASONING_FORMATS`, or ``"none"`` for no reasoning), else what `detect` reads from its ``template``."""
    detected = None
    if tool_format is None or reasoning is None:
        try:
            detected = detect(template)
        except UnknownFormatError:
            if tool_format is None:
                raise
    if tool_format is not None and tool_format not in TOOL_FORMATS:
        raise UnknownFormatError(f"unknown tool_format {tool_format!r}; known formats: {', '.join(TOOL_FORMATS)}")
    if reasoning is not None and reasoning != "none" and reasoning not in REASONING_FORMATS:
        known = ", ".join([*REASONING_FORMATS, "none"])
        raise UnknownFormatError(f"unknown reasoning format {reasoning!r}; known formats: {known}")
    tool = TOOL_FORMATS[tool_format] if tool_format is not None else detected.tool  # type: ignore[union-attr]
    if reasoning is None:
        chosen = detected.reasoning if detected is not None else None
    else:
        chosen = None if reasoning == "none" else REASONING_FORMATS[reasoning]
    return ModelFormat(tool, chosen)


def template_of(model_dir: str | Path) -> str | None:
    """The chat template saved with a model folder (``chat_template.jinja``, or ``tokenizer_config.json``'s
    ``chat_template``; of a list of named templates, ``tool_use`` when there is one, else ``default``), without
    loading the tokenizer; None when it has none."""
    folder = Path(model_dir)
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    return template if isinstance(template, str) else None


def formats_of(model_dir: str | Path, tool_format: str | None = None, reasoning: str | None = None) -> ModelFormat:
    """`model_format` of the model saved in ``model_dir`` (its `template_of`)."""
    return model_format(template_of(model_dir), tool_format, reasoning)
