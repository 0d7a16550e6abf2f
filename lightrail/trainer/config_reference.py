"""The ``lightrail train`` config reference: every field with its type, default and meaning, generated from the
schema, and a config resolved with every default filled in.

Where each section's fields come from:

* structs and dataclasses (`TrainConfig`, `RunnerSettings`, `RaySettings`, `GatewaySettings`, `GRPOConfig`,
  `LoraSettings`, `ToolRewardRule`, `TraceFilter`, `LLM`): their fields, types and defaults, and the string literal
  under each field (its attribute docstring, read from the source);
* the ``grpo``, ``apo`` and ``sft`` sections, which are keyword arguments of `GRPO`, `APO` and `SFT`: the
  constructor's signature, with the config's own forms (``credit: per_turn`` for a `CreditAssignment`, ...)
  written in `_CONFIG_FORMS`.

A field without an attribute docstring takes its meaning from `_MEANINGS` (for classes this module does not own).
``tests/trainer/test_config_reference.py`` checks that every field has a meaning and that ``docs/config.md`` is what
`render_markdown` writes (regenerate it with ``lightrail train --config-reference > docs/config.md``).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["ConfigField", "Section", "render_markdown", "resolved_config", "sections"]


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

# Meanings of fields whose classes carry no docstring for them, keyed "Class.field".
_MEANINGS = {
    "GRPOConfig.lr": "Learning rate (AdamW).",
    "GRPOConfig.betas": "AdamW's beta1, beta2.",
    "GRPOConfig.max_grad_norm": "Clip the gradient's global norm to this (null: no clipping).",
    "GRPOConfig.clip_low": "PPO ratio clip below 1: the ratio is kept above ``1 - clip_low``.",
    "GRPOConfig.skip_zero_advantage_rows": "Leave rows whose advantages are all zero out of the update (they "
    "carry no gradient but the KL term).",
    "GRPOConfig.device": "Where the update runs: ``cpu``, ``cuda`` or ``auto`` (CUDA when available).",
    "LoraSettings.r": "Rank of the adapter matrices.",
    "LoraSettings.alpha": "Scale numerator: the update is ``(alpha / r) * B @ A``.",
    "LoraSettings.target_modules": "Names of the linear layers that get adapters (Llama's attention and MLP "
    "projections by default).",
    "ToolRewardRule.success": "Intermediate reward after a tool call that succeeded.",
    "ToolRewardRule.error": "Intermediate reward after a tool call whose result looks like an error.",
    "ToolRewardRule.unanswered": "Reward for a tool call no tool message answered (null: none, only counted).",
    "ToolRewardRule.from_messages": "Read tool outcomes from the tool messages of later requests.",
    "ToolRewardRule.from_spans": "Read tool outcomes from the framework's tool spans (needs ``otel``).",
    "TraceFilter.store": "Read the rollouts of another run's store (SQLite path, ``postgresql://`` or ``http://`` "
    "URL; token in $LIGHTRAIL_TOKEN); null: the trainer's own store.",
    "TraceFilter.since": "Only rollouts created at or after this Unix time.",
    "TraceFilter.until": "Only rollouts created before this Unix time.",
    "TraceFilter.task_metadata": "Only rollouts whose task metadata has these keys with these values.",
    "TraceFilter.modes": "Rollout modes taken (``train``, ``val``).",
    "LLM.endpoint": "Base URL of an OpenAI-compatible server (``http://host:8000/v1``).",
    "LLM.model": "The model name sent with each request.",
    "LLM.api_key": "Its API key (for ``sft.teacher`` prefer ``api_key_env``: keys stay out of config files).",
    # GRPO's keyword arguments
    "GRPO.config": "Optimizer, loss and LoRA settings (the ``grpo.config`` section).",
    "GRPO.steps": "Training steps (collect rollouts, update, serve the new weights).",
    "GRPO.epochs": "Count the run in passes over the training tasks instead of ``steps``: ``epochs`` times "
    "``len(train_tasks) // tasks_per_step`` steps (at least one), fixed when the run starts (verl's "
    "``total_epochs``); null: ``steps``.",
    "GRPO.tasks_per_step": "Training tasks sampled per step (a seeded shuffle, reshuffled each epoch).",
    "GRPO.n_samples": "Rollouts per task per step: one GRPO group.",
    "GRPO.sampling": "Sampling of training rollouts (OpenAI parameters handed to the agent through its `LLM` "
    "resource); null: ``{temperature: 1.0, max_tokens: 64}``, and given keys override those.",
    "GRPO.val_sampling": "Sampling of validation rollouts; null: greedy, ``{temperature: 0.0, max_tokens: 64}``.",
    "GRPO.val_every": "Validate every N steps (also before training, unless ``validate_before`` is false, and at the "
    "end); 0: only then.",
    "GRPO.validate_before": "Validate before training (the report's ``val_before``); false skips it (null then).",
    "GRPO.advantage": "Outcome-advantage estimator: ``grpo``, ``rloo``, ``dr_grpo``, ``reinforce_pp``, "
    "``reinforce_pp_baseline``; or ``gae``: PPO with a critic (a value head on the policy, GAE over each call's "
    "tokens, clipped value loss; settings ``config.gamma``, ``lam``, ``value_coef``, ``value_clip``).",
    "GRPO.loss_agg": "Loss aggregation: ``token_mean``, ``seq_mean_token_mean``, ``seq_mean_token_sum_norm`` (or "
    "a ``loss_norm`` name); null: the estimator's own (``seq_mean_token_sum_norm`` for ``dr_grpo``, else "
    "``token_mean``).",
    "GRPO.policies": "One trained policy per group of agents, ``{write: [write_query], rewrite: [rewrite_query]}``"
    " (instead of ``agents``): a model copy or LoRA adapter each, with its own optimizer; the gateway routes each "
    "call by the agent the runner names; other agents' calls are served by the start model. null: one shared "
    "policy.",
    "GRPO.merge_calls": "Merge an episode's calls into one row when each prompt extends the previous call's "
    "prompt and answer (fewer, longer rows).",
    "GRPO.filter_groups": "DAPO's dynamic sampling: leave groups whose transitions all have advantage 0 out of "
    "the update and sample more tasks until ``tasks_per_step`` groups carry a signal (more rollouts per step).",
    "GRPO.max_sample_rounds": "With ``filter_groups``: rounds of rollouts per step at most (the last round's "
    "informative groups are trained on even when fewer than ``tasks_per_step``).",
    "GRPO.success_threshold": "A rollout succeeds when its reward is at least this (success rates, validation).",
    "GRPO.out_dir": "Where metrics, TensorBoard events, checkpoints and the report go.",
    "GRPO.checkpoint_every": "Save a checkpoint every N steps (and at the end); 0: only at the end.",
    "GRPO.keep_checkpoints": "Keep only the newest N checkpoints (an older one is deleted once a newer one is "
    "complete); null keeps every one.",
    "GRPO.resume": "Continue from the newest checkpoint in ``out_dir``.",
    "GRPO.served_name": "The model name the gateway serves the policy as (what agents send as ``model``).",
    "GRPO.engine_options": "Keyword arguments of the embedded `Engine` (batch size, ...); `tool_format` (hermes, llama3_json, mistral, pythonic) and `reasoning` (think, think_open, none) name the model's formats when its chat template is not recognised (they also pick vLLM's parsers).",
    "GRPO.rollout_engine": "What samples rollouts: ``embedded`` (the engine in the trainer process) or ``vllm``.",
    "GRPO.vllm": "With ``rollout_engine: vllm``: ``python`` (start ``vllm serve`` with that interpreter) or "
    "``url`` (attach to a running server), and `VLLMRollouts` options.",
    "GRPO.mismatch_flag": "Train–inference mismatch: a row is flagged (``mismatch_rows_flagged``) when the mean k3 KL "
    "between the sampler's recorded logprobs and the trainer's own exceeds this (float32 on both sides: ~1e-13; "
    "raise it for a bfloat16 engine).",
    "GRPO.mismatch_stop": "Stop the run (`MismatchError`, one-line cause) when the rows of a policy version exceed "
    "this mean k3 KL: a weight sync that did not take shows as the size of the missed update; null: never stop on "
    "it (an engine that does not serve the synced version still stops the run).",
    "GRPO.mode": "``sync`` (collect, then update: on-policy) or ``async`` (rollouts of the next ``ahead`` steps keep "
    "sampling on the current weights while a step waits for its slowest rollouts and updates; stale tokens corrected "
    "by truncated importance sampling; see docs/algorithms.md).",
    "GRPO.max_staleness": "With ``mode: async``: calls answered by a policy more than this many versions older than "
    "the one being trained are dropped before the update (``dropped_stale``); null: 1.",
    "GRPO.ahead": "With ``mode: async``: steps of rollouts enqueued beyond the one being trained (each call's "
    "staleness is at most this); null: ``max_staleness`` (at least 1).",
    "GRPO.is_cap": "With ``mode: async``: the cap C of the truncated importance weight ``min(pi_trainer / "
    "pi_sampler, C)`` of each token; null: 2.0.",
    # APO's keyword arguments
    "APO.prompts": "Resource name -> initial template of each prompt to optimize (required).",
    "APO.llm": "A policy already served by a lightrail gateway (`LLM` fields) instead of the config's ``model``.",
    "APO.optimizer": "The model that writes critiques and edits: ``self`` (the policy), `LLM` fields (any "
    "OpenAI-compatible endpoint), or null (no textual gradients, demonstrations only).",
    "APO.rounds": "Search rounds.",
    "APO.beam_width": "Candidates kept after each round.",
    "APO.gradient_children": "Children per beam candidate from a critique-and-edit (textual gradient).",
    "APO.demo_children": "Children per beam candidate from a new choice of demonstrations.",
    "APO.batch_size": "Training tasks each candidate is scored on per round.",
    "APO.n_samples": "Rollouts per task and candidate.",
    "APO.max_rollouts": "Stop once this many rollouts ran (null: no budget).",
    "APO.max_optimizer_calls": "Stop proposing once the optimizer was called this often (null: no budget).",
    "APO.demonstrations": "Propose candidates with worked examples taken from successful rollouts.",
    "APO.demo_k": "Demonstrations per candidate.",
    "APO.demo_chars": "Characters kept of each demonstration.",
    "APO.demo_template": "Which prompt the demonstrations are appended to (default: the first).",
    "APO.demo_format": "``text`` (appended to the template) or ``messages`` (the template is a JSON list of messages).",
    "APO.bootstrap_rollouts": "Rollouts run before round 1 to find demonstrations.",
    "APO.bootstrap_sampling": "Sampling of the bootstrap rollouts (default ``{temperature: 1.0}``).",
    "APO.trace_examples": "Rollouts shown to the optimizer per critique.",
    "APO.trace_chars": "Characters kept of each rollout shown to the optimizer.",
    "APO.prompts_dir": "A folder of optimizer prompt templates replacing the built-in ones.",
    "APO.sampling": "Sampling of training rollouts; null: ``{temperature: 0.0, max_tokens: 128}``.",
    "APO.val_sampling": "Sampling of validation rollouts; null: ``{temperature: 0.0, max_tokens: 128}``.",
    "APO.optimizer_sampling": "Sampling of optimizer calls; null: ``{temperature: 0.7, max_tokens: 512}``.",
    "APO.success_threshold": "A rollout succeeds when its reward is at least this.",
    "APO.served_name": "The model name the gateway serves the policy as.",
    "APO.llm_name": "The resource name of the policy `LLM` (an agent's ``llm`` argument).",
    "APO.engine_options": "Keyword arguments of the embedded `Engine`.",
    # SFT's keyword arguments
    "SFT.n_samples": "With a teacher: rollouts per training task.",
    "SFT.sampling": (
        "With ``teacher: self``: how the student samples itself (OpenAI parameters; temperature 1.0 and 64 tokens "
        "unless set)."
    ),
    "SFT.tasks": (
        "With a teacher: how many training tasks are run (null: all), a random sample fixed by `seed`. A chained "
        "`grpo` stage still draws from all the training tasks, in an order independent of this sample."
    ),
    "SFT.min_reward": "Keep rollouts rewarded at least this (null: any).",
    "SFT.best_of": "Keep at most this many rollouts per task, best first (null: all).",
    "SFT.steps": "Optimizer steps.",
    "SFT.batch_size": "Rows per step, drawn without replacement (reshuffled each epoch).",
    "SFT.max_len": "Drop rows longer than this many tokens (null: keep all).",
    "SFT.merge_calls": "Merge an episode's calls into one row when each prompt extends the previous one.",
    "SFT.val_sampling": "Sampling of validation rollouts; null: greedy, ``{temperature: 0.0, max_tokens: 64}``.",
    "SFT.val_every": "Validate every N steps (and at the end); 0: only at the end.",
    "SFT.validate_before": "Also validate before training.",
    "SFT.success_threshold": "A rollout succeeds when its reward is at least this.",
    "SFT.checkpoint_every": "Save a checkpoint every N steps (and at the end).",
    "SFT.keep_checkpoints": "Keep only the newest N checkpoints (an older one is deleted once a newer one is "
    "complete); null keeps every one.",
    "SFT.resume": "Continue from the newest checkpoint in the output folder.",
    "SFT.served_name": "The model name the gateway serves the student as.",
    "SFT.backend": "Who runs the optimizer steps on the rows: ``lightrail`` (its own updater) or ``llamafactory`` "
    "(LLaMA-Factory's trainer in its own environment, full fine-tuning; the rows are also exported as a "
    "LLaMA-Factory dataset; see ``sft.llamafactory``).",
    "SFT.engine_options": "Keyword arguments of the embedded `Engine`; `tool_format` and `reasoning` name the model's formats (as in `grpo.engine_options`), which SFT targets are then written in.",
}

# How a config writes the keyword arguments that take objects in Python: (type, default, meaning).
_CONFIG_FORMS: dict[str, dict[str, tuple[str, str, str]]] = {
    "grpo": {
        "agents": ("list[str] | str", "null", "Train only the calls of these agents (by name); null with no "
                   "``agents_pattern``: every call."),
        "agents_pattern": ("str", "null", "Train only the calls of agents whose name fully matches this regex."),
        "credit": ("identical | per_turn | discounted", "per_turn", "How an episode's outcome is spread over its "
                   "calls."),
        "credit_args": ("mapping", "{}", "Options of the credit scheme, e.g. ``{gamma: 0.9}`` for ``discounted``."),
        "tool_rewards": ("bool | mapping", "null", "Intermediate rewards from tool outcomes: ``true`` for the "
                         "defaults, or the ``grpo.tool_rewards`` fields."),
        "config": ("mapping", "{}", "Optimizer, loss and LoRA settings (the ``grpo.config`` section)."),
        "seed": ("int", "the top-level seed", "Seeds the task order."),
        "out_dir": ("str", "the top-level out_dir", "Where metrics, TensorBoard events, checkpoints and the report "
                    "go."),
    },
    "apo": {
        "llm": ("mapping", "null", "A policy already served by a lightrail gateway (the `LLM` fields below) instead "
                "of the config's ``model``."),
        "optimizer": ("self | mapping", "null", "The model that writes critiques and edits: ``self`` (the policy), "
                      "`LLM` fields (any OpenAI-compatible endpoint), or null (demonstrations only)."),
        "seed": ("int", "the top-level seed", "Seeds task sampling and demonstration choice."),
        "demo_traces": ("mapping", "null", "Stored rollouts (the ``sft.traces`` fields) whose successes join the "
                        "demonstrations, e.g. a stronger model's or production's runs of the same agent."),
    },
    "sft": {
        "teacher": ("mapping | 'self'", "null", "Distillation: run the training tasks with this teacher (the "
                    "``sft.teacher`` fields: an endpoint, or ``{script: module:function}``, a program; or ``self``, "
                    "the student's own samples at ``sampling``) and train on its best rollouts."),
        "traces": ("mapping", "{} when no teacher", "Rejection sampling: train on the best stored rollouts that "
                   "pass this filter (the ``sft.traces`` fields)."),
        "agents": ("list[str] | str", "null", "Train only the calls of these agents (null: every call)."),
        "agents_pattern": ("str", "null", "Train only the calls of agents whose name fully matches this regex."),
        "config": ("mapping", "{}", "Optimizer and LoRA (the ``grpo.config`` fields; ``kl_coef`` must stay 0)."),
        "llamafactory": ("mapping", "null", "With ``backend: llamafactory``: its environment and arguments (the "
                         "``sft.llamafactory`` fields)."),
        "seed": ("int", "the top-level seed", "Seeds row sampling and the teacher's task sample (`tasks`)."),
    },
}  # fmt: skip


def _attribute_docs(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of ``cls`` (PEP 257 attribute docstrings), from its source."""
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


def _struct_fields(cls: type, owner: str | None = None, *, exclude: frozenset[str] = frozenset()) -> list[ConfigField]:
    docs = _attribute_docs(cls)
    owner = owner or cls.__name__
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
            out.append(ConfigField(f.name, type_name(f.type), default, _meaning(owner, f.name, docs)))
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
        out.append(ConfigField(field.name, type_name(hints[field.name]), default, _meaning(owner, field.name, docs)))
    return out


def _meaning(owner: str, name: str, docs: dict[str, str]) -> str:
    return docs.get(name) or _MEANINGS.get(f"{owner}.{name}", "")


def _signature_fields(section: str, cls: type, exclude: set[str]) -> list[ConfigField]:
    forms = _CONFIG_FORMS.get(section, {})
    out = []
    for name, parameter in inspect.signature(cls).parameters.items():
        if name in exclude or parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if name in forms:
            type_, default, meaning = forms[name]
            out.append(ConfigField(name, type_, default, meaning))
            continue
        annotation = re.sub(r"dict\[[^\]]*\]", "mapping", str(parameter.annotation))
        annotation = annotation.replace("None", "null").replace("str | Path", "str")
        default = _REQUIRED if parameter.default is inspect.Parameter.empty else yaml_value(parameter.default)
        out.append(ConfigField(name, annotation, default, _MEANINGS.get(f"{cls.__name__}.{name}", "")))
    for name, (type_, default, meaning) in forms.items():  # config-only keys (no parameter of that name)
        if name not in inspect.signature(cls).parameters:
            out.append(ConfigField(name, type_, default, meaning))
    return out


def sections() -> list[Section]:
    """Every section of a ``lightrail train`` config, in the order a config is usually written."""
    from lightrail.adapters import ToolRewardRule
    from lightrail.agent.ray import RaySettings
    from lightrail.algorithms.apo import APO
    from lightrail.algorithms.grpo import GRPO
    from lightrail.algorithms.llamafactory import LlamaFactorySettings
    from lightrail.algorithms.rejection import TraceFilter
    from lightrail.algorithms.sft import SFT
    from lightrail.algorithms.updater import GRPOConfig, LoraSettings
    from lightrail.gateway.server import GatewaySettings
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
        Section(
            "grpo",
            "Keyword arguments of `lightrail.algorithms.GRPO` (reinforcement learning), used when ``algorithm`` is "
            "``grpo`` or ``[sft, grpo]``.",
            _signature_fields("grpo", GRPO, {"model", "gateway"}),
        ),
        Section("grpo.config", _summary(GRPOConfig) + " Also ``sft.config``.", _struct_fields(GRPOConfig)),
        Section(
            "grpo.config.lora",
            _summary(LoraSettings) + " ``lora: true`` takes the defaults.",
            _struct_fields(LoraSettings),
        ),  # fmt: skip
        Section(
            "grpo.tool_rewards",
            _summary(ToolRewardRule),
            _struct_fields(ToolRewardRule, exclude=frozenset({"is_error"})),
        ),
        Section(
            "apo",
            "Keyword arguments of `lightrail.algorithms.APO` (prompt optimization), used when ``algorithm: apo``.",
            _signature_fields("apo", APO, {"model", "gateway", "out_dir"}),
        ),
        Section(
            "sft",
            "Keyword arguments of `lightrail.algorithms.SFT` (supervised fine-tuning on the best traces), used when "
            "``algorithm`` is ``sft`` or ``[sft, grpo]``.",
            _signature_fields("sft", SFT, {"model", "gateway", "out_dir"}),
        ),
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


# `apo.kwargs_from_config` cannot check a ``str | Path`` value (msgspec refuses that union), so a printed config
# must not name ``prompts_dir`` unless the user did.
_PRINTED_ONLY_WHEN_GIVEN = {"apo": ("prompts_dir",)}


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
            if f.default.startswith("the top-level ") or f.default in ("see below", "{} when no teacher"):
                default = _cell(f.default)
            lines.append(f"| `{f.name}` | {_cell(f.type)} | {default} | {_cell(f.meaning)} |")
        lines.append("")
    return lines


def resolved_config(config: Any) -> dict[str, Any]:
    """``config`` (a checked `TrainConfig`) as plain data with every default filled in: the output folder and store
    resolved, and the sections of the algorithms it runs completed from their signatures (sections it does not
    run are left out)."""
    from lightrail.adapters import ToolRewardRule
    from lightrail.algorithms.updater import GRPOConfig, LoraSettings

    data = msgspec.to_builtins(config, enc_hook=str)
    data["out_dir"] = str(config.run_dir)
    data["store"] = config.store_location
    by_path = {s.path: s for s in sections()}
    algorithms = config.algorithm if isinstance(config.algorithm, list) else [config.algorithm]
    for name in ("grpo", "apo", "sft"):
        if name not in algorithms:
            if not data[name]:
                del data[name]
            continue
        given = dict(data[name])
        filled: dict[str, Any] = {}
        for f in by_path[name].fields:
            if f.name in given:
                filled[f.name] = given.pop(f.name)
            elif f.name in _PRINTED_ONLY_WHEN_GIVEN.get(name, ()):
                continue
            elif f.default == "the top-level seed":
                filled[f.name] = config.seed
            elif f.default == "the top-level out_dir":
                filled[f.name] = str(config.run_dir)
            elif f.default != _REQUIRED:
                filled[f.name] = _parse_default(f.default)
        filled.update(given)
        if name in ("grpo", "sft") and isinstance(filled.get("config"), dict):
            update = dict(filled["config"])
            lora = update.pop("lora", None)
            settings = msgspec.to_builtins(dataclasses.asdict(msgspec.convert(update, GRPOConfig)), enc_hook=str)
            if lora:
                base = dataclasses.asdict(LoraSettings())
                settings["lora"] = msgspec.to_builtins({**base, **(lora if isinstance(lora, dict) else {})})
            filled["config"] = settings
        if name == "grpo" and filled.get("tool_rewards"):
            rule = filled["tool_rewards"]
            base = {
                f.name: getattr(ToolRewardRule(), f.name)
                for f in _struct_fields(ToolRewardRule, exclude=frozenset({"is_error"}))
            }
            filled["tool_rewards"] = {**base, **(rule if isinstance(rule, dict) else {})}
        data[name] = filled
    return msgspec.json.decode(msgspec.json.encode(data, enc_hook=str))  # plain YAML-able data: tuples as lists


def _parse_default(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None if text.endswith("when no teacher") else text
