"""Agent Lightning's resources (`LLM`, `ProxyLLM`, `PromptTemplate`, `NamedResources`) as the face hands them to
agents, and their conversion to and from lightrail's own `lightrail.types.LLM` / `lightrail.types.PromptTemplate`.

Agents of Agent Lightning read ``llm.endpoint``, ``llm.model``, ``llm.sampling_parameters`` and call
``llm.get_base_url(rollout_id, attempt_id)``; here the runner has already routed the endpoint to the attempt (the
gateway records every call made through it), so ``get_base_url`` returns that endpoint whatever ids it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from lightrail.types import LLM as _LLM
from lightrail.types import PromptTemplate as _PromptTemplate

__all__ = ["LLM", "NamedResources", "PromptTemplate", "ProxyLLM", "Resource", "from_lightrail", "to_lightrail"]


class Resource:
    """Base of Agent Lightning's resources; ``resource_type`` names the kind."""

    resource_type: str = "resource"

    def __init__(self, *, resource_type: str | None = None) -> None:
        if resource_type is not None:
            self.resource_type = resource_type


class LLM(Resource):
    """An OpenAI-compatible endpoint (Agent Lightning's ``LLM``): ``endpoint``, ``model``, ``api_key``,
    ``sampling_parameters`` (a dict: ``{"temperature": 0.7}``). Converted to `lightrail.types.LLM` (its
    ``sampling``) when published."""

    resource_type: str = "llm"

    def __init__(
        self,
        *,
        endpoint: str,
        model: str,
        api_key: str | None = None,
        sampling_parameters: Mapping[str, Any] | None = None,
        resource_type: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.api_key = api_key
        self.sampling_parameters: dict[str, Any] = dict(sampling_parameters or {})

    def get_base_url(self, *args: Any, **kwargs: Any) -> str:
        """The base URL to give an OpenAI client. Inside a rollout the endpoint is already the attempt's route
        through lightrail's gateway, so the rollout and attempt ids Agent Lightning's ``ProxyLLM`` takes are not
        needed (accepted and ignored)."""
        return self.endpoint

    def __repr__(self) -> str:
        return f"{type(self).__name__}(endpoint={self.endpoint!r}, model={self.model!r})"


class ProxyLLM(LLM):
    """Agent Lightning's LLM behind its LiteLLM proxy; here the same as `LLM` (lightrail's gateway routes every
    LLM resource to the attempt before the agent sees it)."""

    resource_type = "proxy_llm"

    def with_attempted_rollout(self, rollout: Any) -> LLM:
        """This LLM for one attempt: the endpoint is already routed, so an `LLM` with the same fields."""
        return LLM(endpoint=self.endpoint, model=self.model, api_key=self.api_key,
                   sampling_parameters=self.sampling_parameters)  # fmt: skip


Engine = Literal["f-string", "jinja", "poml"]


class PromptTemplate(Resource):
    """A prompt template (Agent Lightning's ``PromptTemplate``): ``engine="f-string"`` formats with `str.format`,
    ``engine="jinja"`` renders with Jinja2 (an undefined variable is an error, never an empty string); ``"poml"``
    is refused at construction (lightrail does not render POML)."""

    resource_type: str = "prompt_template"

    def __init__(self, *, template: str, engine: Engine = "f-string", resource_type: str | None = None) -> None:
        if engine not in ("f-string", "jinja"):
            raise ValueError(f"agl.PromptTemplate engine {engine!r}: lightrail formats 'f-string' and 'jinja' only")
        self.template = template
        self.engine: Engine = engine

    def format(self, **kwargs: Any) -> str:
        if self.engine == "jinja":
            import jinja2

            env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
            return env.from_string(self.template).render(**kwargs)
        return self.template.format(**kwargs)

    def __repr__(self) -> str:
        return f"PromptTemplate(template={self.template!r}, engine={self.engine!r})"


NamedResources = dict[str, Any]
"""Resources by name, as an agent's ``rollout`` receives them: `LLM`/`ProxyLLM` and `PromptTemplate` values."""


def to_lightrail(item: Any, *, routed: bool = True) -> _LLM | _PromptTemplate:
    """A face resource (or a lightrail one, returned as it is) as lightrail publishes it."""
    if isinstance(item, (_LLM, _PromptTemplate)):
        return item
    if isinstance(item, LLM):
        return _LLM(endpoint=item.endpoint, model=item.model, api_key=item.api_key,
                    sampling=dict(item.sampling_parameters), routed=routed)  # fmt: skip
    if isinstance(item, PromptTemplate):
        return _PromptTemplate(template=item.template)
    raise TypeError(f"resource of type {type(item).__name__}: lightrail publishes agl.LLM and agl.PromptTemplate")


def from_lightrail(items: Mapping[str, Any], engines: Mapping[str, Engine]) -> dict[str, Any]:
    """The resources an attempt got (LLM endpoints routed to it) as Agent Lightning's types; ``engines`` names the
    template engine of each `PromptTemplate` (lightrail stores the text only; default ``"f-string"``)."""
    out: dict[str, Any] = {}
    for name, item in items.items():
        if isinstance(item, _LLM):
            out[name] = ProxyLLM(endpoint=item.endpoint, model=item.model, api_key=item.api_key,
                                 sampling_parameters=item.sampling)  # fmt: skip
        elif isinstance(item, _PromptTemplate):
            out[name] = PromptTemplate(template=item.template, engine=engines.get(name, "f-string"))
        else:
            out[name] = item
    return out
