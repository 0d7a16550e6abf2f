"""``lightrail train CONFIG.yaml``: train an agent with GRPO from a configuration file.

A config names the agent and its data by import reference, the model, how runners run, and the `GRPO` settings::

    name: sql_agent
    agent: examples.sql_agent.train:sql_agent      # a @rollout function or LitAgent
    data: examples.sql_agent.data:splits           # callable(**data_args) -> (train_tasks, val_tasks)
    data_args: {seed: 0}
    model: tiny                                    # tiny | small | smollm2 | a local model directory
    store: runs/sql/store.db                       # or postgresql://host/db, or http://store-host:4747
    trainer: {n_runners: 2, concurrency: 8, otel: true}   # n_runners: 0 = only runners started elsewhere
    # trainer: {loggers: [tensorboard, mlflow, wandb]}     # experiment tracking (default: tensorboard)
    # trainer: {runners: {ray: {address: auto, n: 8, k: 4}}}   # runners as Ray actors
    gateway: {host: 0.0.0.0, port: 8900, advertise_url: http://trainer-host:8900/v1}   # for remote runners
    grpo:                                          # keyword arguments of lightrail.algorithms.GRPO
      steps: 20
      agents: [write_query, rewrite_query]         # train only these agents' calls (agents_pattern: a regex)
      # policies: {write: [write_query], rewrite: [rewrite_query]}   # or one policy per group of agents
      credit: per_turn                             # identical | per_turn | discounted (credit_args: {gamma: 0.9})
      advantage: grpo                              # grpo | rloo | dr_grpo | reinforce_pp | reinforce_pp_baseline | gae
      # loss_agg: token_mean                       # | seq_mean_token_mean | seq_mean_token_sum_norm (dr_grpo's)
      tool_rewards: true                           # or ToolRewardRule fields: {success: 0.1, error: -0.1}
      config: {lr: 1.0e-4, kl_coef: 0.05, lora: {r: 8}}   # UpdateConfig fields
    # algorithm: verl                              # or a verl dict, as agent-lightning's agl.VERL(config) takes it:
    # verl: {data: {train_batch_size: 32}, actor_rollout_ref: {rollout: {n: 4}, model: {path: ...}}, ...}
    # algorithm: apo                               # prompt optimization instead: the apo: section, APO's arguments
    # apo: {prompts: {prompt_template: "Solve it."}, rounds: 3, optimizer: self}   # optimizer: self | LLM fields
    # algorithm: [sft, grpo]                       # SFT first, then GRPO from the SFT stage's weights
    # sft:                                         # keyword arguments of lightrail.algorithms.SFT
    #   teacher: {endpoint: http://teacher:8000/v1, model: big, api_key_env: TEACHER_KEY}   # distillation
    #   teacher: {script: examples.calc_agent.teacher:teacher}   # or a program: fn(train_tasks, seed=) -> Backend
    #   teacher: self                              # or the student's own samples (sampling: {temperature: 1.0})
    #   traces: {store: runs/old/store.db, since: 1.7e9, task_metadata: {level: easy}}    # or: rejection sampling
    #   min_reward: 1.0                            # keep rollouts rewarded at least this; best_of: 1 per task
    #   steps: 300
    #   batch_size: 32
    #   config: {lr: 1.0e-3, lora: {r: 8}}         # UpdateConfig fields (optimizer, LoRA)

Every field is checked before anything starts: a wrong type or an unknown key is reported with its path
(``grpo.config.lr: Expected `float`, got `str```). ``overrides`` (``--set grpo.steps=1``) change any field by its
dotted path, the value read as YAML. Import references resolve from the current directory (run from the
project root, as with ``python -m``). The tiny models' tokenizer is trained on the example's own text when the
data module defines ``tokenizer_corpus()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import msgspec

from lightrail.agent.cli import DEFAULT_CONCURRENCY
from lightrail.agent.ray import RaySettings
from lightrail.algorithms.settings import (
    RUN_FIELDS,
    APOSection,
    GRPOSection,
    SFTSection,
    convert,
    unknown_keys,
    update_config,
)
from lightrail.gateway.server import GatewaySettings
from lightrail.tracking import LoggerKind, LoggerSettings

if TYPE_CHECKING:
    from lightrail.algorithms.grpo import GRPO
    from lightrail.algorithms.protocol import Algorithm
    from lightrail.gateway.backends import Backend
    from lightrail.model.update_config import UpdateConfig
    from lightrail.types import LLM

log = logging.getLogger(__name__)

__all__ = [
    "VERL",
    "ConfigError",
    "RunnerSettings",
    "TrainConfig",
    "TrainResult",
    "load_config",
    "resolved_config",
    "train",
]


class ConfigError(ValueError):
    """A configuration that cannot run, with the offending field's path in the message."""


class RunnerKinds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Runners beyond the trainer's own processes."""

    ray: RaySettings | None = None
    """Runners as actors on a Ray cluster (needs ``lightrail[ray]``)."""


class RunnerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How rollouts run: runner processes, rollouts per runner, OpenTelemetry, the runners' interpreter, Ray
    actors, and where the trainer's store server listens for runners on other machines."""

    n_runners: int | None = None
    """Runner processes on this machine (default 2, or 0 when Ray runners are configured). 0 without Ray: only
    runners started elsewhere (``lightrail runner --store URL --agent REF``) serve the run."""
    concurrency: int = DEFAULT_CONCURRENCY
    """Rollouts each runner process runs at once."""
    otel: bool = False
    """Export the agent framework's OpenTelemetry spans (agent names, tools) with each rollout."""
    runner_python: str | None = None
    """Run the runners under another Python (an environment where the agent's framework is installed)."""
    runners: RunnerKinds = msgspec.field(default_factory=RunnerKinds)
    """Runners beyond the trainer's own processes (Ray actors)."""
    store_host: str = "127.0.0.1"
    """Where the trainer's own store server binds (``0.0.0.0`` to let other machines in; needs $LIGHTRAIL_TOKEN)."""
    store_port: int = 0
    """Its port (0: any free one)."""
    loggers: list[LoggerKind | LoggerSettings] = msgspec.field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers that mirror ``metrics.jsonl``, the config and the report: ``tensorboard`` (in
    ``<run dir>/tb``), ``mlflow`` (``sqlite:///<run dir>/mlflow.db``; needs ``lightrail[mlflow]``), ``wandb``
    (offline, ``<run dir>/wandb``; needs ``lightrail[wandb]``), or `LoggerSettings` mappings
    (``{kind: mlflow, tracking_uri: http://mlflow:5000}``); ``[]`` for none."""


class TrainConfig(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A training run, as ``lightrail train`` reads it from YAML."""

    agent: str
    """The agent, as an import reference ``module:object`` (a ``@rollout`` function or a `LitAgent`)."""
    data: str
    """``module:function``: called with ``data_args``, returns ``(train_tasks, val_tasks)``."""
    name: str = "run"
    """The run's name; the output folder defaults to ``runs/<name>``."""
    data_args: dict[str, Any] = msgspec.field(default_factory=dict)
    """Keyword arguments of the ``data`` function."""
    model: str = "tiny"
    """``tiny`` or ``small`` (built on the spot, tokenizer trained on the data module's ``tokenizer_corpus()`` if it
    has one), ``smollm2``, or a local Hugging Face model directory."""
    out_dir: str | None = None
    """Where checkpoints, metrics, plots and the store go (default ``runs/<name>``)."""
    store: str | None = None
    """Where the run's rollouts and spans live: a SQLite file (default ``<out_dir>/store.db``), a PostgreSQL URL
    (``postgresql://user@host/db``; the trainer serves it), or a running store server (``http://host:4747``, its
    token in $LIGHTRAIL_TOKEN)."""
    seed: int = 0
    """Seeds model building and the algorithm (its task order, sampling of candidates)."""
    trainer: RunnerSettings = msgspec.field(default_factory=RunnerSettings)
    """How rollouts run: runner processes, Ray actors, the trainer's store server (the ``trainer`` section below)."""
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)
    """Where the training gateway listens and the URL runners are given (set both for runners on other hosts)."""
    grpo: GRPOSection = msgspec.field(default_factory=GRPOSection)
    """Keyword arguments of `GRPO` (the ``grpo`` section below); its ``seed`` and ``out_dir`` are the run's."""
    algorithm: str | list[str] = "grpo"
    """``grpo`` (the ``grpo:`` section), ``verl`` (the ``verl:`` section, a verl config dict, trained by `GRPO`), ``apo``
    (prompt optimization: the ``apo:`` section, `APO`'s arguments),
    ``sft`` (the ``sft:`` section, `SFT`'s arguments), or the chain ``[sft, grpo]`` (GRPO starts from SFT's weights;
    their outputs go to ``<out_dir>/sft`` and ``<out_dir>/grpo``)."""
    apo: APOSection | None = None
    """Keyword arguments of `APO` when ``algorithm: apo`` (the ``apo`` section below)."""
    sft: SFTSection = msgspec.field(default_factory=SFTSection)
    """Keyword arguments of `SFT` when ``algorithm`` is ``sft`` or ``[sft, grpo]`` (the ``sft`` section below)."""
    verl: dict[str, Any] = msgspec.field(default_factory=dict)
    """With ``algorithm: verl``: a verl config dict, as agent-lightning's ``agl.VERL(config)`` takes it, run as `GRPO`
    (``docs/algorithms.md``, "Migrating from verl / agent-lightning", has the mapping); the ``grpo`` section may add
    settings verl has no key for."""

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir or Path("runs") / self.name)

    @property
    def store_location(self) -> str:
        """The store as the trainer opens it: the configured URL or path, else the run's SQLite file."""
        return self.store or str(self.run_dir / "store.db")


@dataclass(frozen=True)
class TrainResult:
    """What a run produced: the `GRPO` report (``val_before``, ``val_after``, ``checkpoint``, ``reward_curve``...),
    the run directory, and the store holding every rollout and span (a SQLite path or a URL)."""

    report: dict[str, Any]
    out_dir: Path
    store: str


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for key in parents:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {key!r} is not a mapping")
        node = child
    node[leaf] = value


T = TypeVar("T")


def read_yaml_data(path: str | os.PathLike[str], overrides: Sequence[str]) -> dict[str, Any]:
    """A YAML file's top-level mapping, ``--set dotted.path=value`` overrides applied; every problem is a one-line
    `ConfigError` naming the file (and the line and column of a YAML error)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}{_yaml_where(exc)}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected dotted.path=value")
        _set_path(data, key.strip(), yaml.safe_load(raw))
    return data


def read_yaml_config(path: str | os.PathLike[str], overrides: Sequence[str], schema: type[T]) -> T:
    """A YAML file as ``schema`` (a msgspec struct), ``--set dotted.path=value`` overrides applied first; every
    problem is a one-line `ConfigError` naming the file and the field."""
    return _checked(read_yaml_data(path, overrides), schema, str(path), strict=True)


def _checked(data: Any, schema: type[T], where: str, *, strict: bool = False) -> T:
    """``data`` as ``schema``; its one-line error as a `ConfigError` starting with ``where`` (the file). Not
    ``strict`` (a train config's sections always were not): YAML reads ``1e-4`` as a string, which is a number here."""
    try:
        return convert(data, schema, strict=strict)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def check_store_field(path: str | os.PathLike[str], store: str | None) -> None:
    """A config's ``store`` names a store lightrail opens (`lightrail.store.store_kind`), else a `ConfigError`."""
    from lightrail.store import store_kind

    if store is not None:
        try:
            store_kind(store)
        except ValueError as exc:
            raise ConfigError(f"{path}: store: {exc}") from None


def load_config(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read and check a YAML config; ``overrides`` are ``dotted.path=value`` strings applied first."""
    data = read_yaml_data(path, overrides)
    for name in ("grpo", "sft", "apo"):  # the sections run with the run's seed and folder: given once, at the top
        if isinstance(section := data.get(name), dict) and (taken := sorted(set(RUN_FIELDS) & set(section))):
            raise ConfigError(
                f"{path}: {name}.{taken[0]}: a run's {taken[0]} is the top-level {taken[0]!r}; set it there"
            )
    if data.get("algorithm") == "verl":
        data = _from_verl(data)
    elif data.get("verl"):
        raise ConfigError(f"verl: a verl dict runs with algorithm: verl, not {data.get('algorithm', 'grpo')!r}")
    config = _checked(data, TrainConfig, str(path))
    check_store_field(path, config.store)
    # a bare word is a model's name: one that is neither a name nor a folder here is a typo (`tiny2`), said now; a
    # path may name a folder of another machine (the GPU configs), checked when the run starts (`train`)
    if "/" not in config.model and os.sep not in config.model:
        from lightrail.engine.models import check_model_name

        try:
            check_model_name(config.model)
        except FileNotFoundError as exc:
            raise ConfigError(f"{path}: model: {exc}") from None
    recipe(config).arguments(config, None)  # every section it reads checked now, not after the model is built
    return config


def _from_verl(data: dict[str, Any]) -> dict[str, Any]:
    """``algorithm: verl``: a config's ``verl`` dict as its ``grpo`` section, ``model``, ``name`` and
    ``trainer.loggers`` (`lightrail.trainer.verl_compat`), the config then checked and run as ``algorithm: grpo``. A
    setting given both in the verl dict and by its lightrail name is an error, not a silent choice. ``data``: the
    config as plain data (as written: a key present is a key given)."""
    from lightrail.trainer.verl_compat import verl_settings

    for key in ("verl", "grpo", "trainer"):  # what is merged here must be a mapping to merge
        if not isinstance(data.get(key) or {}, dict):
            raise ConfigError(f"{key}: expected a mapping, got {data[key]!r}")
    try:
        settings = verl_settings(data.get("verl") or {})
    except ValueError as exc:
        raise ConfigError(f"verl: {exc}") from None
    written = dict(data.get("grpo") or {})
    twice = sorted(set(settings.grpo) & set(written))
    if twice == ["config"]:  # verl sets grpo.config keys (always clip_ratio_c): the section may add the others
        twice = [f"config.{k}" for k in sorted(set(settings.grpo["config"]) & set(written["config"] or {}))]
    if twice:
        raise ConfigError(f"grpo: {', '.join(twice)} set by the verl section already; give each setting once")
    grpo = {**written, **settings.grpo}
    if "config" in settings.grpo and written.get("config"):
        grpo["config"] = {**written["config"], **settings.grpo["config"]}
    out = {**data, "algorithm": "grpo", "grpo": grpo}
    for name, value, verl_key in (
        ("model", settings.model, "actor_rollout_ref.model.path"),
        ("name", settings.name, "trainer.experiment_name"),
    ):
        if value is None:
            continue
        if data.get(name, value) != value:
            raise ConfigError(f"{name}: set by verl {verl_key} already ({value!r}); give it once")
        out[name] = value
    if settings.loggers is not None:
        trainer = dict(data.get("trainer") or {})
        if "loggers" in trainer:
            raise ConfigError("trainer.loggers: set by verl trainer.logger already; give them once")
        out["trainer"] = {**trainer, "loggers": settings.loggers}
    return out


def _yaml_where(exc: Exception) -> str:
    """``:LINE:COLUMN`` of a YAML error (1-based), or nothing when PyYAML does not know."""
    mark = getattr(exc, "problem_mark", None)
    return "" if mark is None else f":{mark.line + 1}:{mark.column + 1}"


def _yaml_problem(exc: Exception) -> str:
    """What PyYAML says went wrong, without its multi-line excerpt of the file."""
    problem = getattr(exc, "problem", None)
    return str(problem) if problem else str(exc).splitlines()[0]


def resolve_reference(reference: str, what: str) -> Any:  # an imported object: its type is the reference's
    """The object ``module:name`` (or ``path/file.py:name``) names, imported from the working folder; a `ConfigError`
    naming ``what`` (the config field) when it cannot be imported."""
    from lightrail._imports import import_object

    try:
        return import_object(reference)  # the working folder imports, like `python -m` (runners inherit it)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from None


def checked_update_config(update: dict[str, Any], where: str) -> UpdateConfig:
    """An `UpdateConfig` from a ``config`` section (``grpo.config``, ``sft.config``, ``lightrail learn``'s ``config``;
    `lightrail.algorithms.settings.update_config`), its errors as `ConfigError`."""
    try:
        return update_config(update, where)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


S = TypeVar("S", GRPOSection, SFTSection, APOSection)


def _with_run_fields(section: S, name: str, seed: int, out_dir: str | None) -> S:
    """``section`` with the run's seed and output folder (`RUN_FIELDS`: a config gives them once, at its top level).
    A section made in Python that sets one to something else is a `ConfigError` naming it, not a value replaced."""
    run = {key: value for key, value in (("seed", seed), ("out_dir", out_dir)) if value is not None}
    for field in msgspec.structs.fields(section):
        if field.name not in run:
            continue
        value = getattr(section, field.name)
        if value not in (field.default, run[field.name]):
            raise ConfigError(
                f"{name}.{field.name}: a run's {field.name} is the config's top-level {field.name!r} "
                f"({run[field.name]!r}), not {value!r}; set it there"
            )
    return msgspec.structs.replace(section, **{key: run[key] for key in run if key in section.__struct_fields__})


def _grpo_kwargs(
    config: TrainConfig, train_tasks: list[dict] | None = None, *, out_dir: Path | None = None
) -> dict[str, Any]:
    """The config's ``grpo`` section as `GRPO` arguments: the section with the run's seed and folder (``out_dir``, by
    default the run's), its ``config`` as an `UpdateConfig` checked against it (`GRPOSection.check_update`), and the
    gateway. ``train_tasks`` are not read (GRPO gets them from the trainer)."""
    section = _with_run_fields(config.grpo, "grpo", config.seed, str(out_dir or config.run_dir))
    update = checked_update_config(section.config, "grpo.config") if section.config else None
    try:
        section.check_update(update)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return {"section": section, "config": update, "gateway": config.gateway}


def _section(data: Any, schema: type[T], where: str) -> T:
    try:
        return convert(data, schema, where, strict=False)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _apo_kwargs(config: TrainConfig, train_tasks: list[dict] | None = None) -> dict[str, Any]:
    """The config's ``apo`` section as `APO` keyword arguments (checked by `lightrail.algorithms.apo`), with the run's
    seed and folder."""
    from lightrail.algorithms.apo import section_objects

    if config.apo is None:
        raise ConfigError("apo: algorithm apo needs an apo section (at least apo.prompts: the prompts to optimize)")
    section = _with_run_fields(config.apo, "apo", config.seed, str(config.run_dir))
    try:
        return {**section_objects(section), "gateway": config.gateway}
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _sft_kwargs(config: TrainConfig, train_tasks: list[dict] | None = None) -> dict[str, Any]:
    """The config's ``sft`` section as `SFT` arguments: the checked `SFTSection` (the top-level ``seed`` its
    default), and as objects ``teacher`` as `_sft_teacher` builds it (a script's backend once ``train_tasks`` are
    given), ``traces``, ``config`` and ``llamafactory``."""
    from lightrail.algorithms.rejection import TraceFilter

    settings = _with_run_fields(config.sft, "sft", config.seed, None)
    out_dir = config.run_dir / "sft" if isinstance(config.algorithm, list) else config.run_dir  # a chain's stage
    kwargs: dict[str, Any] = {"section": settings, "out_dir": out_dir, "gateway": config.gateway}
    if settings.teacher is not None:
        kwargs["teacher"] = _sft_teacher(settings.teacher, config.seed, train_tasks)
    if settings.traces is not None:
        kwargs["traces"] = _section(settings.traces, TraceFilter, "sft.traces")
    kwargs["config"] = checked_update_config(settings.config, "sft.config") if settings.config else None
    if settings.llamafactory is not None or settings.backend == "llamafactory":
        from lightrail.model.llamafactory import LlamaFactorySettings

        factory = _section(settings.llamafactory or {}, LlamaFactorySettings, "sft.llamafactory")
        kwargs["llamafactory"] = factory
        if settings.backend == "llamafactory":
            try:
                factory.interpreter()
            except FileNotFoundError as exc:
                raise ConfigError(str(exc)) from None
    return kwargs


def _sft_teacher(section: Any, seed: int, train_tasks: list[dict] | None) -> str | LLM | Backend | None:
    """``sft.teacher`` as `SFT`'s teacher: ``self`` (the student's own samples at ``sft.sampling``), an `LLM` from its
    fields, or the backend its ``script`` program returns (None until ``train_tasks`` are given: the reference is
    only checked)."""
    from lightrail.algorithms.sft import SELF
    from lightrail.types import LLM

    if section == SELF:
        return SELF
    if not isinstance(section, dict):
        raise ConfigError(
            f"sft.teacher: expected {SELF!r} (the student's own samples) or a mapping of LLM fields, got {section!r}"
        )
    teacher = dict(section)
    if "script" in teacher:
        if set(teacher) != {"script"}:
            raise ConfigError(f"sft.teacher: a script teacher takes no other setting, got {sorted(teacher)}")
        if not isinstance(teacher["script"], str):
            raise ConfigError(f"sft.teacher.script: expected 'module:function', got {teacher['script']!r}")
        make = resolve_reference(teacher["script"], "sft.teacher.script")
        return None if train_tasks is None else _teacher_program(make, teacher["script"], train_tasks, seed)
    key_env = teacher.pop("api_key_env", None)
    fields = set(LLM.__struct_fields__) - {"routed", "agent"}  # a teacher is no gateway: no route, no agent
    if error := unknown_keys("sft.teacher", teacher, fields | {"api_key_env"}):
        raise ConfigError(error)
    if key_env is not None:
        if not isinstance(key_env, str) or key_env not in os.environ:
            raise ConfigError(f"sft.teacher.api_key_env: ${key_env} is not set")
        teacher["api_key"] = os.environ[key_env]
    return _section({**teacher, "routed": False}, LLM, "sft.teacher")


def _teacher_program(make: Any, reference: str, train_tasks: list[dict], seed: int) -> Backend:
    """``make(train_tasks, seed=seed)``, checked to be a gateway backend (errors raised inside the program are its
    own and propagate as they are)."""
    from lightrail.gateway.backends import Backend

    try:
        inspect.signature(make).bind(train_tasks, seed=seed)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"sft.teacher.script: {reference} cannot be called as (train_tasks, seed=...): {exc}"
        ) from None
    backend = make(train_tasks, seed=seed)
    if not isinstance(backend, Backend):
        raise ConfigError(
            f"sft.teacher.script: {reference} returned a {type(backend).__name__}, not a gateway backend "
            "(chat, complete and model_names, e.g. lightrail.gateway.fake.ScriptedBackend)"
        )
    if not backend.model_names():
        raise ConfigError(
            f"sft.teacher.script: {reference} returned a {type(backend).__name__} that lists no model names "
            "(model_names() is empty): the agent needs one to call"
        )
    return backend


class Recipe(NamedTuple):
    """What one value of a config's ``algorithm`` means: the one dispatch `load_config` checks a config through and
    `train` builds the run's algorithm with (`recipe`)."""

    arguments: Callable[[TrainConfig, list[dict] | None], dict[str, Any]]
    """The algorithm's checked arguments from the sections it reads (a `ConfigError` naming the field); the training
    tasks are None when the config is only being checked (a teacher program then is not run)."""
    make: Callable[[Path, dict[str, Any]], Algorithm]
    """The algorithm, from the model's folder and those arguments."""


def _grpo(model: Path, kwargs: dict[str, Any]) -> Algorithm:
    from lightrail.algorithms.grpo import GRPO

    return GRPO(model, **kwargs)


def _sft(model: Path, kwargs: dict[str, Any]) -> Algorithm:
    from lightrail.algorithms.sft import SFT

    return SFT(model, **kwargs)


def _apo(model: Path, kwargs: dict[str, Any]) -> Algorithm:
    from lightrail.algorithms.apo import APO

    return APO(model if "llm" not in kwargs else None, **kwargs)  # an `llm` section serves the policy instead


def _chain_arguments(config: TrainConfig, train_tasks: list[dict] | None) -> dict[str, Any]:
    return {"sft": _sft_kwargs(config, train_tasks), "grpo": _grpo_kwargs(config, out_dir=config.run_dir / "grpo")}


def _chain(model: Path, kwargs: dict[str, Any]) -> Algorithm:
    from lightrail.algorithms.chain import Chain
    from lightrail.algorithms.sft import SFT

    sft = SFT(model, **kwargs["sft"])
    return Chain([sft, _grpo(sft.output_model, kwargs["grpo"])])  # GRPO starts from the SFT stage's weights


ALGORITHMS: dict[str | tuple[str, ...], Recipe] = {
    "grpo": Recipe(_grpo_kwargs, _grpo),
    "sft": Recipe(_sft_kwargs, _sft),
    "apo": Recipe(_apo_kwargs, _apo),
    ("sft", "grpo"): Recipe(_chain_arguments, _chain),
}
"""A config's ``algorithm`` (a name, or the chain ``[sft, grpo]`` as a tuple) -> its `Recipe`. ``verl`` is not here:
its section becomes the ``grpo`` one when the config is loaded (`_from_verl`)."""


def recipe(config: TrainConfig) -> Recipe:
    """The `Recipe` of ``config.algorithm``; a `ConfigError` naming the accepted values otherwise."""
    key = tuple(config.algorithm) if isinstance(config.algorithm, list) else config.algorithm
    if key in ALGORITHMS:
        return ALGORITHMS[key]
    chains = " or ".join(str(list(chain)) for chain in ALGORITHMS if isinstance(chain, tuple))
    if isinstance(key, tuple):  # a list names a chain (one name is written as it is: `grpo`, not `[grpo]`)
        raise ConfigError(f"algorithm: the one chain is {chains} (GRPO from SFT's weights), got {config.algorithm}")
    names = [name for name in ALGORITHMS if isinstance(name, str)] + ["verl"]
    close = difflib.get_close_matches(key, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"algorithm: expected one of {names} or the chain {chains}, got {key!r}{hint}")


def _build_model(config: TrainConfig, data_module: str) -> Path:
    from lightrail.engine.models import check_model_dir, resolve_model

    if config.model not in ("tiny", "small"):
        return check_model_dir(resolve_model(config.model))  # the config's model exists before the run starts
    corpus_fn = getattr(importlib.import_module(data_module), "tokenizer_corpus", None)
    corpus = list(corpus_fn()) if callable(corpus_fn) else None
    return resolve_model(config.model, out=config.run_dir / "base", seed=config.seed, extra_corpus=corpus)


def _check_formats(model: Path, config: TrainConfig) -> None:
    """Read the model's tool-call and reasoning formats now (`lightrail.engine.formats`): a chat template whose tool
    markup is not recognised, or a format name that does not exist, is a one-line error before anything starts."""
    from lightrail.engine.formats import UnknownFormatError, formats_of

    for name, section in (("grpo", config.grpo), ("sft", config.sft)):
        options = section.engine_options or {}
        try:
            formats_of(model, options.get("tool_format"), options.get("reasoning"))
        except UnknownFormatError as exc:
            raise ConfigError(f"model {config.model}: {exc} in {name}.engine_options") from None


def verl_as_grpo(config: TrainConfig) -> TrainConfig:
    """A config made in Python with ``algorithm: verl`` as `load_config` makes a file's (`_from_verl`): its verl dict
    as the ``grpo`` section, ``model``, ``name`` and ``trainer.loggers``; a field set beside the dict is kept (one
    differing from its default counts as set), one the dict sets too is refused. The other fields stay as they are."""
    defaults = TrainConfig(agent=config.agent, data=config.data)
    written: dict[str, Any] = {"verl": config.verl, "grpo": _written(config.grpo, defaults.grpo)}
    written.update(
        {name: getattr(config, name) for name in ("model", "name") if getattr(config, name) != getattr(defaults, name)}
    )
    if trainer := _written(config.trainer, defaults.trainer):
        written["trainer"] = trainer
    merged = _from_verl(written)
    return msgspec.structs.replace(
        config,
        algorithm="grpo",
        grpo=_section(merged["grpo"], GRPOSection, "grpo"),
        trainer=_section(merged["trainer"], RunnerSettings, "trainer") if "trainer" in merged else config.trainer,
        **{name: merged[name] for name in ("model", "name") if name in merged},
    )


def _written(section: msgspec.Struct, default: msgspec.Struct) -> dict[str, Any]:
    """A section of a config made in Python as a file would hold it: the fields that differ from ``default``'s, as
    plain data."""
    given, defaults = msgspec.to_builtins(section), msgspec.to_builtins(default)
    return {key: value for key, value in given.items() if value != defaults.get(key)}


def resolved_config(config: TrainConfig) -> dict[str, Any]:
    """``config`` (a checked `TrainConfig`) as plain data with every default filled in: the output folder and store
    resolved, and the sections of the algorithms it runs with the run's seed and folder and their ``config`` as the
    `UpdateConfig` it becomes (sections it does not run are left out)."""
    from lightrail.algorithms.settings import ToolRewards

    data = msgspec.to_builtins(config, enc_hook=str)
    data["out_dir"] = str(config.run_dir)
    data["store"] = config.store_location
    algorithms = config.algorithm if isinstance(config.algorithm, list) else [config.algorithm]
    for name in ("grpo", "apo", "sft"):
        if name not in algorithms:
            del data[name]
            continue
        filled = data[name]
        for key in RUN_FIELDS:  # the run's, at the top level
            filled.pop(key, None)
        if name == "grpo":
            filled["steps"] = config.grpo.step_count
        if name in ("grpo", "sft"):
            filled["config"] = dataclasses.asdict(update_config(filled["config"], f"{name}.config"))
        if name == "grpo" and filled["tool_rewards"] is True:
            filled["tool_rewards"] = msgspec.to_builtins(ToolRewards())
    return msgspec.json.decode(msgspec.json.encode(data, enc_hook=str))  # plain YAML-able data: tuples as lists


def train(config: TrainConfig) -> TrainResult:
    """Build or prepare the model, generate the data, and run `GRPO` through `Trainer.fit`."""
    from lightrail.engine.models import check_model_name
    from lightrail.trainer.trainer import Trainer

    if config.algorithm == "verl":  # a config made in Python, not loaded (`load_config` turns it into grpo's)
        config = verl_as_grpo(config)
    try:
        check_model_name(config.model)  # before anything is made or imported
    except FileNotFoundError as exc:
        raise ConfigError(f"model: {exc}") from None
    splits = resolve_reference(config.data, "data")
    if not config.trainer.runner_python:  # under another interpreter the agent may not import here
        resolve_reference(config.agent, "agent")  # fail here, not in every runner
    try:
        train_tasks, val_tasks = splits(**config.data_args)
    except TypeError as exc:
        raise ConfigError(f"data_args: {config.data}(**{config.data_args}) failed: {exc}") from None
    except (ValueError, OSError) as exc:  # data that cannot be used (a file or field missing): one line naming it
        raise ConfigError(f"data {config.data}: {exc}") from None
    config.run_dir.mkdir(parents=True, exist_ok=True)
    # the sections are settled before the model is built: a teacher program that fails, fails first
    how = recipe(config)
    arguments = how.arguments(config, train_tasks)
    model = _build_model(config, config.data.partition(":")[0])
    if config.algorithm != "apo":
        _check_formats(model, config)
    algorithm = how.make(model, arguments)
    runners = config.trainer
    runner_options: dict[str, Any] = {}
    if runners.otel:
        runner_options["otel"] = True
    if runners.runner_python:
        runner_options["runner_python"] = runners.runner_python
    trainer = Trainer(
        n_runners=runners.n_runners,
        concurrency=runners.concurrency,
        store=config.store_location,
        algorithm=algorithm,
        ray=runners.runners.ray,
        store_host=runners.store_host,
        store_port=runners.store_port,
        loggers=runners.loggers,
        experiment=config.name,
        run_config=resolved_config(config),  # what the run trains with, every default filled in
        **runner_options,
    )
    trainer.token_source = "$LIGHTRAIL_TOKEN"  # a config holds no token: the environment gives it
    fitted = trainer.fit(config.agent, train_tasks, val_tasks)  # by reference: spawned runners import it themselves
    return TrainResult(report=fitted.report, out_dir=config.run_dir, store=config.store_location)


def VERL(config: Mapping[str, Any], **grpo_options: Any) -> GRPO:  # noqa: N802 - named as agent-lightning's
    """The `GRPO` a verl config dict describes (``agl.VERL(config)``'s counterpart; the mapping is `VERL_KEYS`).

    ``grpo_options`` are further `GRPO` keyword arguments the dict cannot say (``out_dir``, ``credit``, ``vllm``...);
    one the dict sets already is an error. ``actor_rollout_ref.model.path`` must name a local model directory.
    ``trainer.logger``/``project_name``/``experiment_name`` are `Trainer` settings: a config file
    (``algorithm: verl``) applies them; here they are logged as the ``Trainer(loggers=..., experiment=...)`` to pass.

        >>> grpo = lightrail.VERL(config)                                                 # doctest: +SKIP
        >>> lightrail.Trainer(n_runners=2, algorithm=grpo).fit(agent, train, val)          # doctest: +SKIP
    """
    from lightrail.algorithms.grpo import GRPO
    from lightrail.trainer.verl_compat import verl_settings

    settings = verl_settings(config)
    if settings.model is None:
        raise ValueError("verl key actor_rollout_ref.model.path is required: the model to train")
    twice = sorted(set(grpo_options) & set(settings.grpo))
    if twice:
        raise ValueError(f"{', '.join(twice)}: set by the verl config already; give each setting once")
    section = convert(settings.grpo, GRPOSection, "verl", strict=False)
    kwargs: dict[str, Any] = {"section": section}
    grpo_options.setdefault("config", section.update_config())
    if settings.name is not None:
        grpo_options.setdefault("out_dir", f"runs/{settings.name}")
    if settings.loggers is not None or settings.name is not None:
        from lightrail.tracking import LoggerSettings

        loggers = [LoggerSettings(**entry) for entry in settings.loggers or ()]
        log.warning(
            "verl trainer.logger/experiment_name are Trainer settings: pass Trainer(loggers=%r, experiment=%r)",
            loggers, settings.name,
        )  # fmt: skip
    return GRPO(settings.model, **kwargs, **grpo_options)
