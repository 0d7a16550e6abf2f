"""The ``lightrail train`` config reference: every field with its type, default and meaning, generated from the
schema (a config resolved with every default filled in is `lightrail.trainer.config.resolved_config`).

Every section is a msgspec struct or a dataclass: `TrainConfig` and the structs under it, the algorithms' sections
(`lightrail.algorithms.settings`: `GRPOSection`, `SFTSection`, `APOSection`), `UpdateConfig`, `LoraSettings`,
`ToolRewardRule`, `TraceFilter`, `LLM`. A field's type and default are its own; its meaning is the string literal
under it (its attribute docstring, read from the source).
``tests/trainer/test_config_reference.py`` checks that every field has a meaning and that ``docs/config.md`` is what
`render_markdown` writes (regenerate it with ``lightrail train --config-reference > docs/config.md``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

import msgspec

from lightrail.algorithms.settings import RUN_FIELDS

__all__ = ["ConfigField", "Section", "render_markdown", "sections"]


@dataclass(frozen=True)
class ConfigField:
    """One setting: its name, type and default as a config writes them, and what it does."""

    name: str
    type: str
    default: str
    """``required`` when the field has none."""
    meaning: str


@dataclass(frozen=True)
class Section:
    """The fields under one dotted path of a config (``""`` is the top level)."""

    path: str
    summary: str
    fields: list[ConfigField]


_REQUIRED = "required"


def _attribute_docs(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of ``cls`` or a base class (PEP 257 attribute docstrings), from
    their source; a subclass that only changes a field's default keeps its base's meaning."""
    docs = {}
    for base in reversed(cls.__mro__[1:-1]):
        docs.update(_own_attribute_docs(base))
    return {**docs, **_own_attribute_docs(cls)}


def _own_attribute_docs(cls: type) -> dict[str, str]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    if not tree.body or not isinstance(tree.body[0], ast.ClassDef):
        return {}
    body = tree.body[0].body
    docs = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = " ".join(inspect.cleandoc(after.value.value).split())
    return docs


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split()).replace(" (see the module docstring)", "")


def type_name(tp: Any) -> str:
    """A type as a config writer reads it: ``int | null``, ``auto | cpu``, ``mapping``, ``list[str]``."""
    if tp is type(None) or tp is None:
        return "null"
    if tp is Any:
        return "any"
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(v) for v in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(tp))
    if origin is dict:
        return "mapping"
    if origin in (list, tuple, frozenset, set):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = sorted({type_name(a) for a in args})
        return f"list[{' | '.join(inner)}]" if inner else "list"
    if isinstance(tp, type):
        if issubclass(tp, msgspec.Struct) or dataclasses.is_dataclass(tp):
            return "mapping"
        return {"str": "str", "int": "int", "float": "float", "bool": "bool", "dict": "mapping"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp)


def yaml_value(value: Any) -> str:
    """A default as YAML flow text (``null``, ``true``, ``[0.9, 0.999]``, ``{}``, ``tiny``)."""
    builtin = msgspec.to_builtins(value, enc_hook=str)
    if isinstance(builtin, str):
        return builtin if builtin else '""'
    return json.dumps(builtin)


def _struct_fields(cls: type, *, exclude: frozenset[str] = frozenset()) -> list[ConfigField]:
    docs = _attribute_docs(cls)
    out = []
    if issubclass(cls, msgspec.Struct):
        for f in msgspec.structs.fields(cls):
            if f.name in exclude:
                continue
            if f.default is not msgspec.NODEFAULT:
                default = yaml_value(f.default)
            elif f.default_factory is not msgspec.NODEFAULT:
                made = f.default_factory()
                default = "see below" if isinstance(made, msgspec.Struct) else yaml_value(made)
            else:
                default = _REQUIRED
            out.append(ConfigField(f.encode_name, type_name(f.type), default, docs.get(f.name, "")))
        return out
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is neither a msgspec struct nor a dataclass")
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in exclude:
            continue
        if field.default is not dataclasses.MISSING:
            default = "null" if field.default is None else yaml_value(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = yaml_value(field.default_factory())
        else:
            default = _REQUIRED
        out.append(ConfigField(field.name, type_name(hints[field.name]), default, docs.get(field.name, "")))
    return out


def _section_fields(cls: type) -> list[ConfigField]:
    """An algorithm's section (`lightrail.algorithms.settings`) as a config writes it: without `RUN_FIELDS`."""
    return _struct_fields(cls, exclude=frozenset(RUN_FIELDS))


def sections() -> list[Section]:
    """Every section of a ``lightrail train`` config, in the order a config is usually written."""
    from lightrail.adapters import ToolRewardRule
    from lightrail.agent.ray import RaySettings
    from lightrail.algorithms.rejection import TraceFilter
    from lightrail.algorithms.settings import (
        APOSection,
        AsyncSection,
        FilterGroupsSection,
        GRPOSection,
        GuardSection,
        SFTSection,
    )
    from lightrail.gateway.server import GatewaySettings
    from lightrail.model.llamafactory import LlamaFactorySettings
    from lightrail.model.update_config import CriticSettings, LoraSettings, UpdateConfig
    from lightrail.tracking import LoggerSettings
    from lightrail.trainer.config import RunnerKinds, RunnerSettings, TrainConfig
    from lightrail.types import LLM

    teacher = _struct_fields(LLM, exclude=frozenset({"routed", "agent"}))
    teacher.append(
        ConfigField("api_key_env", "str", "null", "Name of the environment variable holding the key (``sft.teacher``).")
    )
    teacher.append(
        ConfigField(
            "script",
            "str",
            "null",
            "Instead of an endpoint, a teacher program: ``module:function``, called as ``function(train_tasks, "
            "seed=...)``, returns a gateway backend (e.g. a ``ScriptedBackend``) that plays the agent's model; no "
            "other field then (``examples/calc_agent/teacher.py``). It runs in the trainer's process (also with "
            "``trainer.runner_python``, where only the agent is imported by the runners' interpreter), and SFT "
            "closes the backend (its ``aclose``/``close``) when the run ends.",
        )  # fmt: skip
    )
    return [
        Section("", _summary(TrainConfig), _struct_fields(TrainConfig)),
        Section("trainer", _summary(RunnerSettings), _struct_fields(RunnerSettings)),
        Section("trainer.runners", _summary(RunnerKinds), _struct_fields(RunnerKinds)),
        Section("trainer.runners.ray", _summary(RaySettings), _struct_fields(RaySettings)),
        Section(
            "trainer.loggers[]",
            _summary(LoggerSettings) + " An item of ``trainer.loggers`` as a mapping (a bare name takes the defaults).",
            _struct_fields(LoggerSettings),
        ),
        Section("gateway", _summary(GatewaySettings), _struct_fields(GatewaySettings)),
        Section("grpo", _summary(GRPOSection), _section_fields(GRPOSection)),
        Section("grpo.config", _summary(UpdateConfig) + " Also ``sft.config``.", _struct_fields(UpdateConfig)),
        Section(
            "grpo.config.lora",
            _summary(LoraSettings) + " ``lora: true`` takes the defaults.",
            _struct_fields(LoraSettings),
        ),  # fmt: skip
        Section("grpo.config.critic", _summary(CriticSettings), _struct_fields(CriticSettings)),
        Section(
            "grpo.tool_rewards",
            _summary(ToolRewardRule),
            _struct_fields(ToolRewardRule, exclude=frozenset({"is_error"})),
        ),
        Section(
            "grpo.async", _summary(AsyncSection) + " ``async: true`` takes the defaults.", _struct_fields(AsyncSection)
        ),
        Section(
            "grpo.filter_groups",
            _summary(FilterGroupsSection) + " ``filter_groups: true`` takes the defaults.",
            _struct_fields(FilterGroupsSection),
        ),
        Section(
            "grpo.guard",
            _summary(GuardSection) + " Also ``sft.guard`` and ``apo.guard``.",
            _struct_fields(GuardSection),
        ),  # fmt: skip
        Section("apo", _summary(APOSection), _section_fields(APOSection)),
        Section("sft", _summary(SFTSection), _section_fields(SFTSection)),
        Section(
            "sft.teacher",
            "An OpenAI-compatible endpoint (`LLM` fields; also the form of ``apo.llm`` and ``apo.optimizer``), or a "
            "teacher program (``script``).",
            teacher,
        ),
        Section("sft.traces", _summary(TraceFilter), _struct_fields(TraceFilter)),
        Section("sft.llamafactory", _summary(LlamaFactorySettings), _struct_fields(LlamaFactorySettings)),
    ]


def learn_sections() -> list[Section]:
    """Every section of a ``lightrail learn`` config."""
    from lightrail.trainer.learn_config import GateSettings, LearnConfig

    return [
        Section("", _summary(LearnConfig), _struct_fields(LearnConfig)),
        Section("gate", _summary(GateSettings), _struct_fields(GateSettings)),
    ]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    """The reference as Markdown (``docs/config.md``)."""
    lines = [
        "# `lightrail train` configuration reference",
        "",
        "<!-- Generated by `lightrail train --config-reference` from lightrail/trainer/config_reference.py; do not "
        "edit by hand. -->",
        "",
        "Every field of a `lightrail train CONFIG.yaml` file: its type, its default and what it does. Any field can "
        "be overridden on the command line by its dotted path (`--set grpo.config.lr=1e-4`), and "
        "`lightrail train CONFIG.yaml --print-config` prints the config with every default filled in. "
        "`examples/*/config.yaml` are complete examples.",
        "",
    ]
    lines += _render_sections(sections(), "")
    lines += [
        "# `lightrail learn` configuration reference",
        "",
        "Every field of a `lightrail learn CONFIG.yaml` file (continuous learning from served sessions); "
        "`lightrail learn --help` shows an example, and `--set gate.tolerance=0.05` overrides a field.",
        "",
    ]
    lines += _render_sections(learn_sections(), "learn: ")
    return "\n".join(lines)


def _render_sections(chosen: list[Section], prefix: str) -> list[str]:
    lines: list[str] = []
    for section in chosen:
        title = f"{prefix}`{section.path}`" if section.path else (f"{prefix}top level" if prefix else "Top level")
        lines += [f"## {title}", "", section.summary, ""]
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for f in section.fields:
            default = "*required*" if f.default == _REQUIRED else f"`{_cell(f.default)}`"
            if f.default.startswith("the top-level ") or f.default == "see below":
                default = _cell(f.default)
            lines.append(f"| `{f.name}` | {_cell(f.type)} | {default} | {_cell(f.meaning)} |")
        lines.append("")
    return lines
