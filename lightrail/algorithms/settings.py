"""The ``grpo:``, ``sft:`` and ``apo:`` sections of a ``lightrail train`` config as typed structs (each key with the
type a config writes, its default and, under it, its meaning), and `convert`, the one check every config section goes
through: a wrong type names the field's path (``grpo.steps: Expected `int`, got `str```), an unknown key the closest
valid one (``grpo: unknown setting(s) ['epoch']; did you mean 'epochs'?``), a name outside a ``Literal`` the allowed
ones (``grpo.rollout_engine: expected one of ['embedded', 'vllm'], got 'sglang'``).

The structs are the one place the algorithms' defaults and value checks live: a section checks itself when it is
made (``__post_init__``), from YAML or from `GRPO(...)`'s keyword arguments alike, and `GRPO`, `SFT` and `APO` are
built from their section. `lightrail.trainer.config_reference` renders ``docs/config.md`` and ``--print-config`` from
these structs. No torch here: a config is checked before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

import msgspec

from lightrail.types import SAMPLING_PARAMETERS

if TYPE_CHECKING:
    from lightrail.adapters import AgentFilter, CreditAssignment, ToolRewardRule
    from lightrail.model.update_config import LossNorm, UpdateConfig

__all__ = [
    "APOSection",
    "AsyncSection",
    "DEFAULT_GRPO_STEPS",
    "DEFAULT_IS_CAP",
    "GRPOSection",
    "GuardSection",
    "RUN_FIELDS",
    "SFTSection",
    "ToolRewards",
    "agents_argument",
    "check_update_temperature",
    "convert",
    "credit_argument",
    "resolve_loss_agg",
    "tool_rewards_argument",
    "unknown_keys",
    "update_config",
]

T = TypeVar("T")


def unknown_keys(where: str, given: Iterable[str], valid: Iterable[str]) -> str | None:
    """The one-line error for keys of ``given`` that are not in ``valid``, naming the closest valid key (None when
    every key is known)."""
    valid = sorted(valid)
    unknown = sorted(set(given) - set(valid))
    if not unknown:
        return None
    close = [match for key in unknown for match in difflib.get_close_matches(key, valid, n=1)]
    hint = f"did you mean {' or '.join(map(repr, close))}?" if close else f"accepted: {valid}"
    return f"{where + ': ' if where else ''}unknown setting(s) {unknown}; {hint}"


def _fields(tp: Any) -> dict[str, Any] | None:
    """The fields of a struct or dataclass with their types, by the name a config writes (None for any other
    type)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return {field.encode_name: field.type for field in msgspec.structs.fields(tp)}
    if dataclasses.is_dataclass(tp):
        return typing.get_type_hints(tp)
    return None


def _at(tp: Any, path: list[str]) -> list[Any]:
    """The struct and dataclass types a value at ``path`` (field names, ``[n]`` for items) may have."""
    origin, args = typing.get_origin(tp), [a for a in typing.get_args(tp) if a is not Ellipsis]
    if origin in (typing.Union, types.UnionType):
        return [t for arg in args for t in _at(arg, path)]
    if not path:
        return [tp] if _fields(tp) is not None else []
    if path[0].startswith("["):
        return [t for arg in args[-1:] if origin in (list, tuple, dict) for t in _at(arg, path[1:])]
    field = (_fields(tp) or {}).get(path[0])
    return [] if field is None else _at(field, path[1:])


def _readable(exc: msgspec.ValidationError, schema: Any, where: str) -> str:
    """msgspec says ``... - at `$.grpo.steps```; users wrote ``grpo.steps`` (under ``where``), and for an unknown
    field they get the closest valid one."""
    head, sep, at = str(exc).rpartition(" - at `$")
    head = head if sep else str(exc)
    names = [name or index for name, index in re.findall(r"\.(\w+)|(\[\d+\])", at.rstrip("`") if sep else "")]
    dotted = ".".join(filter(None, [where, *names])).replace(".[", "[")
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", head)
    types_there = _at(schema, names) if unknown else []
    valid = {name for tp in types_there for name in _fields(tp) or ()}
    if unknown and (why := removed_setting(types_there, unknown.group(1))):
        return f"{dotted}.{unknown.group(1)}: no longer a setting: {why}"
    if unknown and valid:
        return unknown_keys(dotted, [unknown.group(1)], valid) or dotted
    if (enum := re.fullmatch(r"Invalid enum value (.+)", head)) and names:
        for tp in _at(schema, names[:-1]):
            if choices := _choices((_fields(tp) or {}).get(names[-1])):
                return f"{dotted}: expected one of {list(choices)}, got {enum.group(1)}"
    if head.startswith(f"{dotted}.") or head.startswith(f"{dotted}:"):
        return head  # a section's own check names the field already
    return f"{dotted}: {head}" if dotted else head


def removed_setting(schemas: Iterable[Any], name: str) -> str | None:
    """What replaced the setting ``name`` that one of ``schemas`` (section structs) no longer has (its ``_removed``),
    or None."""
    return next((why for tp in schemas if (why := getattr(tp, "_removed", {}).get(name))), None)


def _choices(tp: Any) -> tuple[Any, ...]:
    """The values of a ``Literal`` type (also inside ``X | None``); empty for any other type."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(value for arg in typing.get_args(tp) for value in _choices(arg))
    return ()


def convert(data: Any, schema: type[T], where: str = "", *, strict: bool = True) -> T:
    """``data`` (plain YAML data) as ``schema``; a `ValueError` whose one line names the field's path under ``where``
    (unknown keys with the closest valid one). Dataclasses get the unknown-key check msgspec only gives structs."""
    if dataclasses.is_dataclass(schema):
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {data!r}")
        if error := unknown_keys(where, data, _fields(schema) or ()):
            raise ValueError(error)
    try:
        return msgspec.convert(data, schema, strict=strict)
    except msgspec.ValidationError as exc:
        raise ValueError(_readable(exc, schema, where)) from None


def update_config(data: dict[str, Any], where: str) -> UpdateConfig:
    """An `UpdateConfig` from a config's ``config`` section (``lora: true`` or a mapping of `LoraSettings`; ``critic``
    a mapping of `CriticSettings`); errors name ``where`` (``grpo.config.lr: ...``)."""
    from lightrail.model.update_config import REMOVED_FIELDS, CriticSettings, LoraSettings, UpdateConfig

    if removed := sorted(set(data) & set(REMOVED_FIELDS)):
        raise ValueError(f"{where}.{removed[0]}: no longer an update setting: {REMOVED_FIELDS[removed[0]]}")
    data = dict(data)
    lora, critic = data.pop("lora", None), data.pop("critic", None)
    settings = convert(data, UpdateConfig, where)
    if lora:
        lora = LoraSettings() if lora is True else convert(lora, LoraSettings, f"{where}.lora")
        settings = dataclasses.replace(settings, lora=lora)
    if critic is not None:  # (its fields checked as lora's are: a misspelt one is refused, not dropped)
        settings = dataclasses.replace(settings, critic=convert(critic, CriticSettings, f"{where}.critic"))
    return settings


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class GuardSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``<algorithm>.guard``: the run guard's rules (`lightrail.algorithms.run.guard`), in one place. Every step's
    health record (rollouts failed and why, calls, token ids, calls selected, reward spread, transitions trained, a
    finite update) is printed and logged whatever these say; they decide what a step trains on and when a run that
    learns nothing stops."""

    failure_reward: float | None = None
    """The reward a rollout whose agent raised or timed out is trained with; null: such rollouts are not trained on
    at all (counted as ``excluded_failed`` / ``excluded_timeout``), since 0 would be a reward nobody gave."""
    max_empty_steps: int = 3
    """Stop the run (exit code 3, a one-line cause) after this many steps in a row that trained nothing: every
    rollout failed, no call was recorded, selected or had token ids, every group scored the same, or the update was
    not finite. Each such step prints its cause at once; 0: never stop on it."""

    def __post_init__(self) -> None:
        if self.max_empty_steps < 0:
            raise ValueError(f"guard.max_empty_steps must be >= 0, got {self.max_empty_steps}")
        if self.failure_reward is not None and not math.isfinite(self.failure_reward):
            raise ValueError(f"guard.failure_reward must be a finite number, got {self.failure_reward}")


class _Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What every algorithm's section has, and the checks every section makes when it is built: each ``Literal``
    field holds one of its names, each field of ``_at_least`` is at least that (None passes)."""

    _key: ClassVar[str] = ""
    """The section's key in a config, which errors start with (``grpo.n_samples must be >= 1, got 0``)."""
    _removed: ClassVar[dict[str, str]] = {}
    """Settings the section no longer has, each with what replaced it: refused naming the replacement."""
    _at_least: ClassVar[dict[str, float]] = {}

    val_sampling: dict[str, Any] | None = None
    """Sampling of validation rollouts; null: greedy, ``{temperature: 0.0, max_tokens: 64}`` (``apo``: 128 tokens)."""
    success_threshold: float = 1.0
    """A rollout succeeds when its reward is at least this (success rates, validation)."""
    served_name: str = "policy"
    """The model name the gateway serves the policy as (what agents send as ``model``)."""
    seed: int = 0
    """Seeds the task order and every other sampling of the run (``sft``: row sampling and the teacher's task
    sample; ``apo``: task sampling and demonstration choice)."""
    engine_options: dict[str, Any] | None = None
    """Keyword arguments of the embedded `Engine` (batch size, ...); `tool_format` (hermes, llama3_json, mistral,
    pythonic) and `reasoning` (think, think_open, none) name the model's formats when its chat template is not
    recognised (they also pick vLLM's parsers, and the formats SFT targets are written in). `dtype` is the precision
    the engine samples in (float32 on a CPU by default; bfloat16 decodes faster, and GRPO then weighs each token by
    truncated IS against the trainer's float32 logprobs)."""
    guard: GuardSection = msgspec.field(default_factory=GuardSection)
    """The run guard: what a failed rollout is worth, and when a run that trains nothing stops."""

    def __post_init__(self) -> None:
        if isinstance(self.guard, dict):  # keyword arguments (``GRPO(guard={...})``) as a config file gives them
            self.guard = convert(self.guard, GuardSection, f"{self._key}.guard")
        for name, tp in _hints(type(self)).items():
            value = getattr(self, name, None)
            if value is not None and (choices := _choices(tp)) and value not in choices:
                raise ValueError(f"{self._key}.{name}: expected one of {list(choices)}, got {value!r}")
            # agents pass sampling to their client as keyword arguments: a typo there fails every rollout
            sampling = value if name.endswith("sampling") and isinstance(value, dict) else {}
            if error := unknown_keys(f"{self._key}.{name}", sampling, SAMPLING_PARAMETERS):
                raise ValueError(f"{error} (OpenAI's sampling parameters)")
        for name, low in self._at_least.items():
            value = getattr(self, name)
            if value is not None and value < low:
                raise ValueError(f"{self._key}.{name} must be >= {low}, got {value}")


class _PolicySection(_Section, kw_only=True, forbid_unknown_fields=True):
    """The run of an algorithm that trains the policy's weights (``grpo`` and ``sft``): steps, what is trained,
    validation and checkpoints. Where the two differ in a default, each keeps its own (named in the field's meaning)."""

    config: dict[str, Any] = {}
    """Optimizer, loss and LoRA settings (the ``grpo.config`` fields; in ``sft``, ``kl_coef`` must stay 0)."""
    agents: list[str] | str | None = None
    """Train only the calls of these agents (by name); null with no ``agents_pattern``: every call."""
    agents_pattern: str | None = None
    """Train only the calls of agents whose name fully matches this regex."""
    merge_calls: bool = False
    """Merge an episode's calls into one row when each prompt extends the previous call's prompt and answer (fewer,
    longer rows); default false in ``grpo``, true in ``sft``."""
    val_every: int = 10
    """Validate every N steps (and at the end; 0: only then); default 10 in ``grpo``, 0 in ``sft``."""
    validate_before: bool = True
    """Validate before training (the report's ``val_before``; null when skipped); default true in ``grpo``, false
    in ``sft``."""
    checkpoint_every: int = 10
    """Save a checkpoint every N steps (and at the end; 0: only at the end); default 10 in ``grpo``, 50 in
    ``sft``."""
    keep_checkpoints: int | None = None
    """Keep only the newest N checkpoints (an older one is deleted once a newer one is complete); null keeps every
    one."""
    resume: bool = False
    """Continue from the newest checkpoint in the output folder."""
    llm_name: str = "llm"
    """A resource name the policy `LLM` is published under for the agent (``resources[...]``), besides ``llm`` and
    ``main_llm`` (Agent Lightning's name), which it always has."""

    def agent_filter(self) -> AgentFilter | None:
        """``agents`` and ``agents_pattern`` as an `AgentFilter` (None when neither is given)."""
        from lightrail.adapters import AgentFilter

        if self.agents is None and self.agents_pattern is None:
            return None
        return AgentFilter([self.agents] if isinstance(self.agents, str) else self.agents or (), self.agents_pattern)

    def update_config(self) -> UpdateConfig | None:
        """``config`` as an `UpdateConfig` (None when the section gives none)."""
        return update_config(self.config, f"{self._key}.config") if self.config else None


def _rule_default(name: str) -> Any:
    from lightrail.adapters import ToolRewardRule

    return {field.name: field.default for field in dataclasses.fields(ToolRewardRule)}[name]


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def credit_argument(value: Any, options: dict[str, Any] | None = None) -> CreditAssignment:
    """A constructor's ``credit``: a `CreditAssignment` (any callable) as it is, or a built-in scheme's name
    (``"identical"``, ``"per_turn"``, ``"discounted"``) made with ``options`` (the section's ``credit_args``).
    Anything else is a one-line TypeError naming what was given, raised at construction, before any rollout."""
    from lightrail.adapters.credit import credit_by_name

    if isinstance(value, str):
        try:
            return credit_by_name(value, **(options or {}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"credit: {exc}") from None
    if callable(value):
        return value
    raise TypeError(f"credit: expected a scheme's name ('identical', ...) or a CreditAssignment callable, got "
                    f"{_kind(value)}")  # fmt: skip


def agents_argument(value: Any) -> Callable[[str | None], bool]:
    """A constructor's ``agents``: an `AgentFilter` (or any callable ``agent_name -> bool``) as it is, an agent's
    name or a list of names as the `AgentFilter` of those names. Anything else is a one-line TypeError at
    construction."""
    from lightrail.adapters import AgentFilter

    if isinstance(value, str):
        return AgentFilter([value])
    if isinstance(value, list | tuple | set | frozenset):
        if not all(isinstance(name, str) for name in value):
            raise TypeError(f"agents: expected agent names (strings), got {_kind(value)}")
        return AgentFilter(value)
    if callable(value):
        return value
    raise TypeError(f"agents: expected an AgentFilter, an agent's name or a list of names, got {_kind(value)}")


def tool_rewards_argument(value: Any) -> ToolRewardRule | None:
    """A constructor's ``tool_rewards``: a `ToolRewardRule` as it is, ``True`` for the default rule, ``False`` for
    none, or a mapping of ``grpo.tool_rewards`` fields. Anything else is a one-line error at construction."""
    from lightrail.adapters import ToolRewardRule

    if isinstance(value, ToolRewardRule) or value is None:
        return value
    if isinstance(value, bool):
        return ToolRewards().rule() if value else None
    if isinstance(value, dict):
        return convert(value, ToolRewards, "tool_rewards").rule()
    raise TypeError(f"tool_rewards: expected a ToolRewardRule, true/false or a mapping of its fields, got "
                    f"{_kind(value)}")  # fmt: skip


class ToolRewards(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``grpo.tool_rewards`` as a mapping: the `ToolRewardRule` fields a config can set (its defaults, its meanings
    in ``docs/config.md``); ``true`` takes them all."""

    success: float = _rule_default("success")
    error: float = _rule_default("error")
    unanswered: float | None = _rule_default("unanswered")
    from_messages: bool = _rule_default("from_messages")
    from_spans: bool = _rule_default("from_spans")

    def rule(self) -> ToolRewardRule:
        from lightrail.adapters import ToolRewardRule

        return ToolRewardRule(**msgspec.structs.asdict(self))


RUN_FIELDS = ("seed", "out_dir")
"""Fields of an algorithm's section that a ``lightrail train`` config gives once, at its top level, for the whole run
(`GRPO(...)` and the other constructors take them as arguments; a config's section that names one is refused)."""

DEFAULT_IS_CAP = 2.0
"""The cap C of truncated importance sampling (verl's TIS default) when ``config.is_cap`` is unset and GRPO needs one:
with ``grpo.async``, and for an engine sampling below float32."""

DEFAULT_GRPO_STEPS = 50
"""GRPO's step count when a section gives neither ``steps`` nor ``epochs``."""

LossAgg = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "token", "sequence", "rollout", "sequence_sum_norm"
]


class AsyncSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``grpo.async``: asynchronous GRPO's pipeline (`lightrail.algorithms.grpo`, docs/algorithms.md)."""

    max_staleness: int = 1
    """Calls answered by a policy more than this many versions older than the one being trained are dropped before
    the update (``dropped_stale``); 0 is strictly on-policy."""
    ahead: int | None = None
    """Steps of rollouts enqueued beyond the one being trained (each call's staleness is at most this); null:
    ``max_staleness`` (at least 1)."""

    def __post_init__(self) -> None:
        if self.max_staleness < 0:
            raise ValueError(f"grpo.async.max_staleness must be >= 0, got {self.max_staleness}")
        if self.ahead is not None and self.ahead < 1:
            raise ValueError(f"grpo.async.ahead must be >= 1 (steps of rollouts sampling while a step trains), "
                             f"got {self.ahead}")  # fmt: skip

    @property
    def steps_ahead(self) -> int:
        """``ahead``, or ``max_staleness`` (at least 1) when unset."""
        return max(self.max_staleness, 1) if self.ahead is None else self.ahead


class FilterGroupsSection(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``grpo.filter_groups``: DAPO's dynamic sampling (`lightrail.algorithms.grpo`; verl's ``algorithm.filter_groups``):
    groups whose transitions all have advantage 0 are left out of the update, and more tasks are sampled on the same
    weights until ``tasks_per_step`` groups carry a signal."""

    max_rounds: int = 3
    """Rounds of rollouts per step at most (verl's ``max_num_gen_batches``); the last round's informative groups are
    trained on even when fewer than ``tasks_per_step``."""

    def __post_init__(self) -> None:
        if self.max_rounds < 1:
            raise ValueError(f"grpo.filter_groups.max_rounds must be >= 1, got {self.max_rounds}")


_Mode = TypeVar("_Mode", bound=msgspec.Struct)


def _mode(value: _Mode | bool | dict[str, Any] | None, section: type[_Mode], path: str) -> _Mode | None:
    """A mode's sub-section as given: ``true`` (its defaults), ``false`` or null (off: None), a mapping of its fields
    (keyword arguments in Python, as a config file gives them) or the struct itself."""
    if isinstance(value, dict):
        value = convert(value, section, path)
    if value is True:
        return section()
    if value is False or value is None:
        return None
    if not isinstance(value, section):
        raise ValueError(f"{path}: expected true, false, null or a mapping of its fields, got {value!r}")
    return value


class GRPOSection(_PolicySection, kw_only=True, forbid_unknown_fields=True):
    """Keyword arguments of `lightrail.algorithms.GRPO` (reinforcement learning), used when ``algorithm`` is ``grpo``
    or ``[sft, grpo]``."""

    _key = "grpo"
    _removed = {
        "is_cap": "the cap is the update's grpo.config.is_cap (UpdateConfig.is_cap; with grpo.async 2.0 unless set)",
        "mode": "asynchronous GRPO is the grpo.async section (async: true, or its max_staleness and ahead); sync is "
        "its absence",
        "max_staleness": "it is grpo.async.max_staleness",
        "ahead": "it is grpo.async.ahead",
        "max_sample_rounds": "it is grpo.filter_groups.max_rounds (filter_groups: {max_rounds: N})",
    }
    _at_least = {"steps": 0, "epochs": 1, "tasks_per_step": 1, "n_samples": 1, "mismatch_flag": 0,
                 "mismatch_stop": 0}  # fmt: skip

    steps: int | None = None
    """Training steps (collect rollouts, update, serve the new weights); null: 50 (`DEFAULT_GRPO_STEPS`), or
    counted from ``epochs``."""
    epochs: int | None = None
    """Count the run in passes over the training tasks instead of ``steps``: ``epochs`` times ``len(train_tasks) //
    tasks_per_step`` steps (at least one), fixed when the run starts (verl's ``total_epochs``); null: ``steps``."""
    tasks_per_step: int = 8
    """Training tasks sampled per step (a seeded shuffle, reshuffled each epoch)."""
    n_samples: int = 8
    """Rollouts per task per step: one GRPO group."""
    sampling: dict[str, Any] | None = None
    """Sampling of training rollouts (OpenAI parameters handed to the agent through its `LLM` resource); null:
    ``{temperature: 1.0, max_tokens: 64}``, and given keys override those."""
    advantage: str = "grpo"
    """Advantage estimator, a name of `lightrail.adapters.advantages.ADVANTAGE_ESTIMATORS` (formulas there): ``grpo``,
    ``rloo``, ``dr_grpo``, ``reinforce_pp``, ``reinforce_pp_baseline``; ``gae``: PPO with a critic (a value head on
    the policy, GAE over each call's tokens, clipped value loss; its settings ``config.critic``)."""
    loss_agg: LossAgg | None = None
    """Loss aggregation (verl's names, or a ``config.loss_norm`` name); null: the estimator's own
    (``seq_mean_token_sum_norm`` for ``dr_grpo``, else ``token_mean``)."""
    credit: str = "per_turn"
    """How an episode's outcome is spread over its calls, a name of `lightrail.adapters.credit.CREDIT_ASSIGNMENTS`:
    ``identical``, ``per_turn`` or ``discounted``."""
    credit_args: dict[str, Any] = {}
    """Options of the credit scheme, e.g. ``{gamma: 0.9}`` for ``discounted``."""
    tool_rewards: bool | ToolRewards | None = None
    """Intermediate rewards from tool outcomes: ``true`` for the defaults, or the ``grpo.tool_rewards`` fields."""
    policies: dict[str, list[str]] | None = None
    """One trained policy per group of agents, ``{write: [write_query], rewrite: [rewrite_query]}`` (instead of
    ``agents``): a model copy or LoRA adapter each, with its own optimizer; the gateway routes each call by the agent
    the runner names; other agents' calls are served by the start model. With ``rollout_engine: vllm``: LoRA only
    (one adapter per policy on one server). null: one shared policy."""
    filter_groups: FilterGroupsSection | bool | None = None
    """DAPO's dynamic sampling (``filter_groups: true``, or the ``grpo.filter_groups`` fields): leave groups whose
    transitions all have advantage 0 out of the update and sample more tasks until ``tasks_per_step`` groups carry a
    signal (more rollouts per step). null: every group is trained on."""
    out_dir: str = "runs/grpo"
    """Where metrics, TensorBoard events, checkpoints and the report go."""
    rollout_engine: Literal["embedded", "vllm"] = "embedded"
    """What samples rollouts: the engine in the trainer process, or a ``vllm serve`` process."""
    vllm: dict[str, Any] | None = None
    """With ``rollout_engine: vllm``: ``python`` (start ``vllm serve`` with that interpreter) or ``url`` (attach to a
    running server), and `VLLMRollouts` options."""
    mismatch_flag: float = 1e-3
    """Train–inference mismatch: a row is flagged (``mismatch_rows_flagged``) when the mean k3 KL between the
    sampler's recorded logprobs and the trainer's own exceeds this (float32 on both sides: ~1e-13; raise it for a
    bfloat16 engine)."""
    mismatch_stop: float | None = 0.02
    """Stop the run (`MismatchError`, one-line cause) when the rows of a policy version exceed this mean k3 KL: a
    weight sync that did not take shows as the size of the missed update; null: never stop on it (an engine that does
    not serve the synced version still stops the run)."""
    async_: AsyncSection | bool | None = msgspec.field(default=None, name="async")
    """Asynchronous GRPO (``async: true``, or the ``grpo.async`` fields): rollouts of the next ``ahead`` steps keep
    sampling on the current weights while a step waits for its slowest rollouts and updates; stale tokens are
    weighted by truncated importance sampling (cap ``config.is_cap``, 2.0 unless set; docs/algorithms.md). null:
    sync, collect then update (on-policy)."""

    @property
    def critic(self) -> bool:
        """Whether ``advantage`` is a critic's (GAE from a value head): PPO rather than a group estimator."""
        from lightrail.adapters.advantages import check_estimator

        return check_estimator(self.advantage).critic

    def __post_init__(self) -> None:
        from lightrail.adapters.advantages import check_estimator
        from lightrail.adapters.credit import check_credit, credit_by_name
        from lightrail.algorithms.policies import PolicyMap
        from lightrail.model.rollout_engines import check_vllm_options

        super().__post_init__()
        key = self._key
        self.async_ = _mode(self.async_, AsyncSection, f"{key}.async")  # first: the checks below read them
        self.filter_groups = _mode(self.filter_groups, FilterGroupsSection, f"{key}.filter_groups")
        for name, check in (("advantage", lambda: check_estimator(self.advantage)),
                            ("credit", lambda: check_credit(self.credit)),
                            ("credit_args", lambda: credit_by_name(self.credit, **self.credit_args)),
                            ("vllm", lambda: check_vllm_options(self.vllm)),
                            ("policies", lambda: self.policies is None or PolicyMap(self.policies))):  # fmt: skip
            try:
                check()
            except (TypeError, ValueError) as exc:  # PolicyMap's errors start with "policies"
                raise ValueError(
                    f"{key}.{exc}" if name in ("policies", "advantage", "credit") else f"{key}.{name}: {exc}"
                ) from None
        if self.policies is not None and (self.agents is not None or self.agents_pattern is not None):
            raise ValueError(f"{key}: give agents or policies, not both (the policies name the agents they train)")
        if self.policies is not None and self.config:  # its own config (one given beside it: `check_update`)
            from lightrail.algorithms.policies import check_policies_engine

            check_policies_engine(self.rollout_engine, lora=bool(self.config.get("lora")))
        if self.critic:
            for name, why in (("merge_calls", "needs one call per row (its return on the row's last token)"),
                              ("filter_groups", "has no group advantages to filter on"),
                              ("policies", "trains one policy with its value head")):  # fmt: skip
                if getattr(self, name):
                    raise ValueError(f"{key}.{name}: advantage {self.advantage!r} {why}")
        if self.steps is not None and self.epochs is not None:
            raise ValueError(f"{key}: give steps or epochs, not both (epochs sets the step count)")
        if self.async_ is not None:
            for given, what, why in ((self.filter_groups, "filter_groups", "it samples more rounds within a step"),
                                     (self.policies, "policies", "async trains one shared policy"),
                                     (self.critic, f"advantage {self.advantage}", "its critic trains on on-policy "
                                      "rows only")):  # fmt: skip
                if given:
                    raise ValueError(f"{key}.async: not with {what} ({why})")

    @property
    def step_count(self) -> int | None:
        """``steps``, or `DEFAULT_GRPO_STEPS` when neither it nor ``epochs`` is given; None with ``epochs`` (counted
        from the training tasks when the run starts)."""
        if self.epochs is not None:
            return None
        return DEFAULT_GRPO_STEPS if self.steps is None else self.steps

    @property
    def async_settings(self) -> AsyncSection | None:
        """The async settings (``async``) as a struct, None in sync mode."""
        return self.async_ if isinstance(self.async_, AsyncSection) else None

    @property
    def filtering(self) -> FilterGroupsSection | None:
        """The dynamic sampling settings (``filter_groups``) as a struct, None when every group is trained on."""
        return self.filter_groups if isinstance(self.filter_groups, FilterGroupsSection) else None

    def check_update(self, config: UpdateConfig | None) -> None:
        """Every check between this section and the update settings it trains with (the section's ``config``, or the
        `UpdateConfig` given to `GRPO` beside it): the loss aggregation, the policies' engine and processes, the
        async options, the update temperature, the critic's processes. A `ValueError` whose one line starts with
        ``grpo`` and names the setting."""
        key = self._key
        try:
            resolve_loss_agg(self.advantage, self.loss_agg, config)
        except ValueError as exc:  # "loss_agg: ..."
            raise ValueError(f"{key}.{exc}") from None
        if self.policies is not None:
            from lightrail.algorithms.policies import check_policies_engine

            check_policies_engine(self.rollout_engine, lora=config is not None and config.lora is not None)
            if config is not None and config.ranks > 1:
                raise ValueError(f"{key}.config.ranks: policies train in this process: ranks must be 1")
        if config is None:
            return
        if config.critic is not None and not self.critic:
            raise ValueError(f"{key}.config.critic: PPO's critic settings, for advantage gae only (this run's "
                             f"estimator, {self.advantage}, has no critic)")  # fmt: skip
        if self.critic and config.sharding != "replicate":
            raise ValueError(f"{key}.config.sharding: advantage {self.advantage!r} does not run with sharding "
                             f"{config.sharding!r} yet (untested)")  # fmt: skip
        if self.critic and config.ranks > 1:
            raise ValueError(f"{key}.config.ranks: advantage {self.advantage!r} trains its value head in one process, "
                             f"not {config.ranks}")  # fmt: skip
        if self.async_settings is not None and config.mini_batches != 1:
            raise ValueError(
                f"{key}.config.mini_batches: async weighs stale tokens against the pre-update weights: needs 1, "
                f"not {config.mini_batches}"
            )
        try:
            check_update_temperature(config, self.training_sampling())
        except ValueError as exc:  # "config.temperature: ..."
            raise ValueError(f"{key}.{exc}") from None

    def training_sampling(self) -> dict[str, Any]:
        """The sampling of training rollouts: ``sampling`` over the defaults (temperature 1.0, 64 tokens)."""
        return {"temperature": 1.0, "max_tokens": 64, **(self.sampling or {})}

    def validation_sampling(self) -> dict[str, Any]:
        """The sampling of validation rollouts: ``val_sampling`` over the defaults (greedy, 64 tokens)."""
        return {"temperature": 0.0, "max_tokens": 64, **(self.val_sampling or {})}

    def credit_scheme(self) -> CreditAssignment:
        """``credit`` and ``credit_args`` as a `CreditAssignment`."""
        from lightrail.adapters.credit import credit_by_name

        return credit_by_name(self.credit, **self.credit_args)

    def tool_rule(self) -> ToolRewardRule | None:
        """``tool_rewards`` as a `ToolRewardRule` (None when off)."""
        if isinstance(self.tool_rewards, ToolRewards):
            return self.tool_rewards.rule()
        return ToolRewards().rule() if self.tool_rewards else None


class SFTSection(_PolicySection, kw_only=True, forbid_unknown_fields=True):
    """Keyword arguments of `lightrail.algorithms.SFT` (supervised fine-tuning on the best traces), used when
    ``algorithm`` is ``sft`` or ``[sft, grpo]``."""

    _key = "sft"
    _at_least = {"steps": 0, "batch_size": 1, "n_samples": 1, "tasks": 1, "best_of": 1}

    steps: int = 100
    """Optimizer steps."""
    merge_calls: bool = True
    val_every: int = 0
    validate_before: bool = False
    checkpoint_every: int = 50

    teacher: str | dict[str, Any] | None = None
    """Distillation: run the training tasks with this teacher (the ``sft.teacher`` fields: an endpoint, or ``{script:
    module:function}``, a program; or ``self``, the student's own samples at ``sampling``) and train on its best
    rollouts."""
    traces: dict[str, Any] | None = None
    """Rejection sampling: train on the best stored rollouts that pass this filter (the ``sft.traces`` fields); null
    with no teacher: ``{}``, every rollout of the trainer's own store."""
    n_samples: int = 1
    """With a teacher: rollouts per training task."""
    sampling: dict[str, Any] | None = None
    """With ``teacher: self``: how the student samples itself (OpenAI parameters; temperature 1.0 and 64 tokens
    unless set)."""
    tasks: int | None = None
    """With a teacher: how many training tasks are run (null: all), a random sample fixed by `seed`. A chained
    `grpo` stage still draws from all the training tasks, in an order independent of this sample."""
    min_reward: float | None = 1.0
    """Keep rollouts rewarded at least this (null: any)."""
    best_of: int | None = None
    """Keep at most this many rollouts per task, best first (null: all)."""
    batch_size: int = 32
    """Rows per step, drawn without replacement (reshuffled each epoch)."""
    max_len: int | None = None
    """Drop rows longer than this many tokens (null: keep all)."""
    backend: Literal["lightrail", "llamafactory"] = "lightrail"
    """Who runs the optimizer steps on the rows: lightrail's own updater, or LLaMA-Factory's trainer in its own
    environment (full fine-tuning; the rows are also exported as a LLaMA-Factory dataset; see
    ``sft.llamafactory``)."""
    llamafactory: dict[str, Any] | None = None
    """With ``backend: llamafactory``: its environment and arguments (the ``sft.llamafactory`` fields)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.teacher is not None and self.traces is not None:
            raise ValueError("sft: give teacher (distillation) or traces (rejection sampling), not both")
        if self.config.get("kl_coef"):
            raise ValueError("sft.config.kl_coef: SFT has no KL term (leave it at 0)")
        if self.config.get("critic") is not None:
            raise ValueError("sft.config.critic: PPO's critic settings (grpo with advantage gae): SFT has no critic")


class APOSection(_Section, kw_only=True, forbid_unknown_fields=True):
    """Keyword arguments of `lightrail.algorithms.APO` (prompt optimization), used when ``algorithm: apo``."""

    _key = "apo"
    _at_least = {"rounds": 0, "beam_width": 1, "batch_size": 1, "n_samples": 1, "gradient_children": 0,
                 "demo_children": 0, "demo_k": 1}  # fmt: skip

    prompts: dict[str, str]
    """Resource name -> initial template of each prompt to optimize."""
    llm: dict[str, Any] | None = None
    """A policy already served by a lightrail gateway (the `LLM` fields below) instead of the config's ``model``."""
    optimizer: str | dict[str, Any] | None = None
    """The model that writes critiques and edits: ``self`` (the policy), `LLM` fields (any OpenAI-compatible
    endpoint), or null (no textual gradients, demonstrations only)."""
    rounds: int = 3
    """Search rounds."""
    beam_width: int = 2
    """Candidates kept after each round."""
    gradient_children: int = 1
    """Children per beam candidate from a critique-and-edit (textual gradient)."""
    demo_children: int = 1
    """Children per beam candidate from a new choice of demonstrations."""
    batch_size: int = 8
    """Training tasks each candidate is scored on per round."""
    n_samples: int = 1
    """Rollouts per task and candidate."""
    max_rollouts: int | None = None
    """Stop once this many rollouts ran (null: no budget)."""
    max_optimizer_calls: int | None = None
    """Stop proposing once the optimizer was called this often (null: no budget)."""
    demonstrations: bool = True
    """Propose candidates with worked examples taken from successful rollouts."""
    demo_k: int = 2
    """Demonstrations per candidate."""
    demo_chars: int = 1500
    """Characters kept of each demonstration."""
    demo_template: str | None = None
    """Which prompt the demonstrations are appended to (default: the first)."""
    demo_format: Literal["text", "messages"] = "text"
    """Appended to the template as text, or as messages (the template is then a JSON list of messages)."""
    bootstrap_rollouts: int = 0
    """Rollouts run before round 1 to find demonstrations."""
    bootstrap_sampling: dict[str, Any] | None = None
    """Sampling of the bootstrap rollouts (default ``{temperature: 1.0}``)."""
    demo_traces: dict[str, Any] | None = None
    """Stored rollouts (the ``sft.traces`` fields) whose successes join the demonstrations, e.g. a stronger model's
    or production's runs of the same agent."""
    trace_examples: int = 4
    """Rollouts shown to the optimizer per critique."""
    trace_chars: int = 1500
    """Characters kept of each rollout shown to the optimizer."""
    prompts_dir: str | None = None
    """A folder of optimizer prompt templates replacing the built-in ones."""
    sampling: dict[str, Any] | None = None
    """Sampling of training rollouts; null: ``{temperature: 0.0, max_tokens: 128}``."""
    optimizer_sampling: dict[str, Any] | None = None
    """Sampling of optimizer calls; null: ``{temperature: 0.7, max_tokens: 512}``."""
    out_dir: str = "runs/apo"
    """Where the report, metrics and the best prompts go."""
    llm_name: str = "llm"
    """The resource name of the policy `LLM` (an agent's ``llm`` argument)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.prompts:
            raise ValueError("apo.prompts: name at least one PromptTemplate resource to optimize")
        if taken := sorted({self.llm_name, "llm", "main_llm"} & set(self.prompts)):
            raise ValueError(f"apo.prompts: {taken[0]!r} is a resource name of the policy LLM")
        if self.demo_template is not None and self.demo_template not in self.prompts:
            raise ValueError(
                f"apo.demo_template: {self.demo_template!r} is not one of the prompts {sorted(self.prompts)}"
            )


def check_update_temperature(config: UpdateConfig | None, sampling: Mapping[str, Any]) -> None:
    """GRPO sets ``config.temperature`` from the sampling temperature (the engine reports logprobs of the
    temperature-scaled distribution, and the update's must be the same): another value given there is a ValueError
    naming it, not a setting silently replaced."""
    temperature = sampling.get("temperature")
    if config is not None and config.temperature != 1.0 and temperature and config.temperature != temperature:
        raise ValueError(
            f"config.temperature: the update divides logits by the sampling temperature (sampling.temperature, "
            f"here {temperature}), not by {config.temperature}; set sampling.temperature instead"
        )


def resolve_loss_agg(advantage: str, loss_agg: str | None, config: UpdateConfig | None = None) -> LossNorm:
    """The `LossNorm` a run uses: ``loss_agg`` if given, else a non-default ``config.loss_norm``, else the
    estimator's natural one (``sequence_sum_norm`` for ``dr_grpo``, ``token`` otherwise)."""
    from lightrail.model.update_config import resolve_loss_norm

    configured = config.loss_norm if config is not None else "token"
    if loss_agg is not None:
        norm = resolve_loss_norm(loss_agg)
        if configured != "token" and configured != norm:
            raise ValueError(
                f"loss_agg: {loss_agg!r} contradicts config.loss_norm={configured!r}; set only one of them"
            )
        return norm
    if configured != "token":
        return configured
    return NATURAL_LOSS_NORM.get(advantage, "token")


NATURAL_LOSS_NORM: dict[str, LossNorm] = {"dr_grpo": "sequence_sum_norm"}
"""Estimators whose paper defines its own loss aggregation; the others keep token-mean (verl's default)."""
