"""Agent Lightning's ``Trainer`` (and its algorithms ``VERL``, ``APO``, ``Baseline``) on lightrail's `Trainer`:
one store, one set of runner processes, one gateway, lightrail's own. What the arguments become:

* ``n_runners`` (or the deprecated ``n_workers``): runner processes. ``initial_resources``: published before the
  rollouts; in `Trainer.dev` an `LLM` with an endpoint is served through a lightrail gateway forwarding to it
  (`lightrail.gateway.backends.OpenAIUpstream`), so its calls are recorded like training's.
* ``adapter={"agent_match": REGEX}`` (or ``TracerTraceToTriplet(agent_match=...)``, or the agent's deprecated
  ``trained_agents``): train the calls of the agents whose name the regex *searches* (Agent Lightning's meaning;
  lightrail's own ``agents_pattern`` is a full match, so the regex is wrapped).
* ``algorithm=VERL(config)``: lightrail's `GRPO` from the verl dict, with Agent Lightning's credit ``identical``
  (every call of a rollout gets its final reward) unless said otherwise.
* ``tracer``: Agent Lightning's tracers are accepted and not used (lightrail records calls at its gateway and
  spans through its runner); ``hooks``: called around each rollout; ``store``/``strategy``/``port``/``runner``:
  the harmless defaults accepted, anything else refused in one line.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from lightrail.agl._accepted import FastAlgorithm
from lightrail.agl._agent import FunctionalLitAgent, LitAgent
from lightrail.agl._resources import LLM, PromptTemplate, to_lightrail

__all__ = ["APO", "VERL", "Baseline", "Trainer", "TracerTraceToTriplet", "search_pattern"]

log = logging.getLogger("lightrail.agl")


def search_pattern(regex: str) -> re.Pattern[str]:
    """Agent Lightning's ``agent_match`` (``re.search`` on the agent name) as a pattern lightrail's `AgentFilter`
    matches in full: ``write|rewrite`` matches ``write_query`` and ``rewrite_query``, as in Agent Lightning."""
    re.compile(regex)  # a bad regex is an error here, naming it
    return re.compile(f"(?s:.*?(?:{regex}).*)")


class TracerTraceToTriplet:
    """Agent Lightning's default adapter; only ``agent_match`` has a meaning here (which agents' calls train)."""

    def __init__(self, *, agent_match: str | None = None, **options: Any) -> None:
        self.agent_match = agent_match
        if options:
            log.info("agl adapter options %s: lightrail builds training rows from the gateway's records",
                     sorted(options))  # fmt: skip


def VERL(config: Mapping[str, Any], **grpo_options: Any) -> Any:  # noqa: N802 - Agent Lightning's name
    """`lightrail.VERL` with Agent Lightning's default credit assignment, ``identical``: every LLM call of a rollout
    is credited with the rollout's final reward (lightrail's own default is ``per_turn``). ``credit=`` overrides."""
    from lightrail.adapters.credit import credit_by_name
    from lightrail.trainer.config import VERL as _VERL

    grpo_options.setdefault("credit", credit_by_name("identical"))
    return _VERL(config, **grpo_options)


class APO:
    """Agent Lightning's ``APO(async_openai_client, ...)``: lightrail's `lightrail.algorithms.apo.APO`, built at
    `Trainer.fit` once the prompts (``initial_resources``' `PromptTemplate` values) are known. The client is the
    optimizer model's OpenAI-compatible endpoint (``gradient_model`` is asked; lightrail uses one optimizer model,
    so ``apply_edit_model`` is that one too). The agent's own LLM: ``initial_resources``' `LLM`, or ``model=`` (a
    local model folder lightrail serves, a lightrail extension)."""

    def __init__(
        self,
        async_openai_client: Any = None,
        *,
        seed: int | None = None,
        gradient_model: str = "gpt-5-mini",
        apply_edit_model: str = "gpt-4.1-mini",
        diversity_temperature: float = 1.0,
        gradient_batch_size: int = 4,
        val_batch_size: int = 16,
        beam_width: int = 4,
        branch_factor: int = 4,
        beam_rounds: int = 3,
        rollout_batch_timeout: float = 3600.0,
        run_initial_validation: bool = True,
        model: str | None = None,
        **lightrail_options: Any,
    ) -> None:
        self.client = async_openai_client
        self.seed = seed
        self.gradient_model = gradient_model
        self.apply_edit_model = apply_edit_model
        self.diversity_temperature = diversity_temperature
        self.gradient_batch_size = gradient_batch_size
        self.val_batch_size = val_batch_size
        self.beam_width = beam_width
        self.branch_factor = branch_factor
        self.beam_rounds = beam_rounds
        self.rollout_batch_timeout = rollout_batch_timeout
        self.run_initial_validation = run_initial_validation
        self.model = model
        self.lightrail_options = lightrail_options

    def build(self, resources: Mapping[str, Any]) -> Any:
        """The lightrail `APO` for these initial resources (prompts and the agent's LLM)."""
        from lightrail.algorithms.apo import APO as _APO
        from lightrail.types import LLM as _LLM

        prompts = {n: r.template for n, r in resources.items() if isinstance(r, PromptTemplate)}
        if not prompts:
            raise ValueError("agl.APO optimizes a PromptTemplate: give one in Trainer(initial_resources=...)")
        llms = [(n, r) for n, r in resources.items() if isinstance(r, (LLM, _LLM))]
        optimizer = None
        if self.client is not None:
            optimizer = _LLM(endpoint=str(self.client.base_url), model=self.gradient_model,
                             api_key=getattr(self.client, "api_key", None), routed=False)  # fmt: skip
        options: dict[str, Any] = {
            "prompts": prompts, "beam_width": self.beam_width, "gradient_children": self.branch_factor,
            "rounds": self.beam_rounds, "batch_size": self.gradient_batch_size,
            "optimizer_sampling": {"temperature": self.diversity_temperature},
        }  # fmt: skip
        options.update(self.lightrail_options)
        if self.model is not None:
            if llms:
                options["llm_name"] = llms[0][0]
            return _APO(self.model, optimizer=optimizer, **options)
        if not llms:
            raise ValueError("agl.APO needs the agent's LLM: an agl.LLM in initial_resources, or APO(model=FOLDER)")
        name, llm = llms[0]
        options["llm_name"] = name
        policy = to_lightrail(llm)
        assert isinstance(policy, _LLM)
        return _APO(llm=policy, optimizer=optimizer, **options)


class Baseline(FastAlgorithm):
    """Agent Lightning's ``Baseline`` (what ``Trainer.dev`` runs): each task once; here `Trainer.dev` itself."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def run(self, train_dataset: Any = None, val_dataset: Any = None) -> None:
        raise TypeError("agl.Baseline runs under Trainer.dev, which runs each task once (lightrail.Trainer.dev)")


_HARMLESS_STORES = ("InMemoryLightningStore",)


class Trainer:
    """Agent Lightning's ``Trainer`` on lightrail's `lightrail.trainer.Trainer` (module docstring: what each
    argument becomes). ``fit`` and ``dev`` take Agent Lightning's datasets (any sequence of task inputs)."""

    def __init__(
        self,
        *,
        dev: bool = False,
        n_runners: int | None = None,
        max_rollouts: int | None = None,
        initial_resources: Mapping[str, Any] | None = None,
        tracer: Any = None,
        adapter: Any = None,
        store: Any = None,
        runner: Any = None,
        strategy: Any = None,
        port: int | None = None,
        algorithm: Any = None,
        llm_proxy: Any = None,
        hooks: Any = None,
        n_workers: int | None = None,
        max_tasks: int | None = None,
        daemon: bool = True,
        triplet_exporter: Any = None,
        **lightrail_options: Any,
    ) -> None:
        if llm_proxy is not None:
            raise ValueError("agl.Trainer(llm_proxy=...): lightrail's gateway serves and records the model; GRPO "
                             "starts it, and Trainer.dev serves an initial_resources LLM through one")  # fmt: skip
        if runner is not None:
            raise ValueError("agl.Trainer(runner=...): lightrail's runner processes run the agent; give n_runners")
        if store is not None and type(store).__name__ not in _HARMLESS_STORES:
            raise ValueError("agl.Trainer(store=...): lightrail keeps every run in its own durable store; pass "
                             "lightrail's Trainer(store=PATH_OR_URL) instead")  # fmt: skip
        if strategy is not None and strategy not in ("cs", "shm") and not _named(strategy, "ExecutionStrategy"):
            raise ValueError(f"agl.Trainer(strategy={strategy!r}): lightrail runs runner processes over its store")
        if triplet_exporter is not None:
            raise ValueError("agl.Trainer(triplet_exporter=...): lightrail builds training rows from the gateway's "
                             "records (GRPO)")  # fmt: skip
        if tracer is not None and not _named(tracer, "Tracer"):
            raise ValueError(f"agl.Trainer(tracer={type(tracer).__name__}): give an Agent Lightning tracer or none")
        self.dev_mode = dev
        """Agent Lightning's ``Trainer(dev=True)``: ``fit`` is a `dev` run (each task once, no training)."""
        self.n_runners = n_workers if n_runners is None and n_workers is not None else n_runners
        self.max_rollouts = max_rollouts if max_rollouts is not None else max_tasks
        self.initial_resources = dict(initial_resources or {})
        self.agent_match = _agent_match(adapter)
        self.algorithm = algorithm
        self.hooks = list(hooks) if isinstance(hooks, (list, tuple)) else [hooks] if hooks is not None else []
        self.port = port
        self.lightrail_options = lightrail_options

    def _lightrail(self, algorithm: Any = None) -> Any:
        from lightrail.trainer import Trainer as _Trainer

        options = dict(self.lightrail_options)
        if self.port is not None:
            options.setdefault("store_port", self.port)
        return _Trainer(n_runners=self.n_runners if self.n_runners is not None else 1, algorithm=algorithm,
                        **options)  # fmt: skip

    def _prepare(self, agent: Any) -> LitAgent[Any]:
        if not isinstance(agent, LitAgent):
            if callable(agent) and not isinstance(agent, type):
                agent = FunctionalLitAgent(agent)
            else:
                raise TypeError(f"agl.Trainer runs an agl.LitAgent or an @agl.rollout function, not {agent!r}")
        agent.resource_engines = {
            n: r.engine for n, r in self.initial_resources.items() if isinstance(r, PromptTemplate)
        }
        agent.hooks = self.hooks
        return agent

    def fit(self, agent: Any, train_dataset: Iterable[Any] | None = None, *, val_dataset: Iterable[Any] | None = None,
            ) -> Any:  # fmt: skip
        """Train ``agent`` on ``train_dataset`` with the trainer's algorithm (validating on ``val_dataset``)."""
        if isinstance(train_dataset, str):
            raise ValueError("agl.Trainer.fit with a server URL is Agent Lightning's v0 mode; lightrail runs its "
                             "own runners: pass the dataset")  # fmt: skip
        if self.dev_mode:
            return self.dev(agent, train_dataset, val_dataset=val_dataset)
        if self.algorithm is None:
            raise ValueError("agl.Trainer.fit needs an algorithm (agl.VERL(config), agl.APO(client)); "
                             "to run the agent without training use Trainer.dev")  # fmt: skip
        agent = self._prepare(agent)
        algorithm = self.algorithm
        if isinstance(algorithm, APO):
            algorithm = algorithm.build(self.initial_resources)
        match = self.agent_match if self.agent_match is not None else agent.trained_agents
        if match is not None:
            from lightrail.adapters.selection import AgentFilter

            if getattr(algorithm, "policies", None) is not None:
                raise ValueError("agent_match and GRPO policies both select agents: give one")
            if not hasattr(algorithm, "agents"):
                raise ValueError(f"agent_match: {type(algorithm).__name__} trains no LLM calls")
            algorithm.agents = AgentFilter((), search_pattern(match))
        if type(algorithm).__name__ == "GRPO":  # Agent Lightning's VERL publishes the policy as ``main_llm``
            llm_names = [n for n, r in self.initial_resources.items() if isinstance(r, LLM)]
            agent.resource_aliases = dict.fromkeys(["main_llm", *llm_names], "llm")
            agent.fixed_resources = {n: r for n, r in self.initial_resources.items() if isinstance(r, PromptTemplate)}
        trainer = self._lightrail(algorithm)
        trainer.fit(agent, list(train_dataset or ()), list(val_dataset or ()))
        return algorithm

    def dev(
        self,
        agent: Any,
        train_dataset: Iterable[Any] | None = None,
        *,
        val_dataset: Iterable[Any] | None = None,
        dev_dataset: Iterable[Any] | None = None,
    ) -> Any:
        """Run ``agent`` once on each task: ``train_dataset`` (or ``dev_dataset``) in mode ``train``, then
        ``val_dataset`` in mode ``val``; returns the last `DevReport`. An `LLM` of ``initial_resources`` is served
        through a lightrail gateway that forwards to its endpoint, so its calls are recorded (the first such LLM;
        any other is handed to the agent unrecorded)."""
        if train_dataset is not None and dev_dataset is not None:
            raise ValueError("agl.Trainer.dev: give train_dataset or dev_dataset, not both")
        agent = self._prepare(agent)
        report = None
        for tasks, mode in ((train_dataset if dev_dataset is None else dev_dataset, "train"), (val_dataset, "val")):
            if tasks is not None:
                report = self._dev_once(agent, list(tasks), mode)
        if report is None:
            raise ValueError("agl.Trainer.dev needs a dataset: dev(agent, train_dataset) or dev_dataset=...")
        return report

    def _dev_once(self, agent: LitAgent[Any], tasks: list[Any], mode: str) -> Any:
        resources = {n: r for n, r in self.initial_resources.items()}
        llms = [n for n, r in resources.items() if isinstance(r, LLM)]
        kwargs: dict[str, Any] = {}
        if llms:
            from lightrail.gateway.backends import OpenAIUpstream

            name = llms[0]
            llm = resources.pop(name)
            local = (urlsplit(llm.endpoint).hostname or "") in ("127.0.0.1", "localhost", "::1")
            # hosted APIs (OpenAI's own) refuse vLLM's token-id field: ask only local servers for ids
            kwargs = {"llm": OpenAIUpstream(llm.endpoint, api_key=llm.api_key, model=llm.model,
                                            request_token_ids=local),
                      "sampling": llm.sampling_parameters, "llm_name": name}  # fmt: skip
            for other in llms[1:]:
                log.warning("agl dev: LLM %r goes to the agent unrecorded (one LLM is served through the gateway)",
                            other)  # fmt: skip
        published = {n: to_lightrail(r, routed=False) for n, r in resources.items()}
        return self._lightrail().dev(agent, tasks, published or None, mode=mode, **kwargs)


def _named(obj: Any, suffix: str) -> bool:
    return any(cls.__name__.endswith(suffix) for cls in type(obj).__mro__)


def _agent_match(adapter: Any) -> str | None:
    if adapter is None:
        return None
    if isinstance(adapter, Mapping):
        unknown = sorted(set(adapter) - {"agent_match", "type"})
        if unknown:
            raise ValueError(f"agl adapter key {unknown[0]!r}: lightrail's adapter takes agent_match only")
        return adapter.get("agent_match")
    if isinstance(adapter, TracerTraceToTriplet):
        return adapter.agent_match
    raise ValueError(f"agl adapter {type(adapter).__name__}: lightrail builds rows itself; give {{'agent_match': ...}}")
