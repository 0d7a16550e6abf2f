"""Credit assignment: how an episode's rewards become one return per LLM call.

A `CreditAssignment` is any callable ``(calls, final_reward, intermediate) -> returns`` with one return per
call, in turn order. It sees every call of the episode — also calls of agents that are not trained and calls
without token ids — so turn positions and discounting do not depend on what is trained.

Intermediate rewards reach a call only through its response id (`IntermediateReward.response_id`), because the
runner's reward spans and the gateway's call spans are not ordered against each other. An *unlinked*
intermediate reward (no id, or an id of no call) is ignored by default; ``unlinked="episode"`` instead adds it
to the final reward (it belongs to the episode, and adding it to every call needs no order).

Worked example — three calls with response ids a, b, c; final reward 1.0; intermediate rewards +0.1 → a,
−0.1 → c and 0.5 unlinked:

=====================================  ====================  ==============================================
scheme                                 returns (a, b, c)     why
=====================================  ====================  ==============================================
``Identical()``                        1.0, 1.0, 1.0         the final reward, intermediates ignored
``PerTurn()``                          1.1, 1.0, 0.9         final + the rewards linked to that call
``PerTurn(unlinked="episode")``        1.6, 1.5, 1.4         the unlinked 0.5 joins the final reward
``Discounted(gamma=0.5)``              0.325, 0.45, 0.9      G_t = r_t + γ·G_{t+1}, final added to r_{T-1}
=====================================  ====================  ==============================================

(Discounted: r = (0.1, 0, −0.1 + 1.0) → G_c = 0.9, G_b = 0 + 0.5·0.9 = 0.45, G_a = 0.1 + 0.5·0.45 = 0.325.)

Group advantages (`lightrail.adapters.advantages`) call the same function with the group-normalised outcome in
place of the final reward; the built-in schemes are additive in (final, intermediate), which is what makes that
equal to "normalised outcome credit + intermediate credit".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from lightrail.adapters.records import IntermediateReward, LLMCall

__all__ = [
    "CREDIT_ASSIGNMENTS",
    "CreditAssignment",
    "Discounted",
    "Identical",
    "PerTurn",
    "check_credit",
    "credit_by_name",
    "register_credit_assignment",
    "linked_rewards",
    "reward_links",
    "split_linked",
]

Unlinked = Literal["ignore", "episode"]

CREDIT_ASSIGNMENTS: dict[str, Callable[..., CreditAssignment]] = {}
"""Every named credit assignment (a class whose keyword arguments are its options), filled by
`register_credit_assignment`: the one list a config's ``credit`` is checked against."""

_Scheme = TypeVar("_Scheme", bound=type)


def register_credit_assignment(name: str) -> Callable[[_Scheme], _Scheme]:
    """Register a credit-assignment class as ``name`` (a config's ``credit: name``, its ``credit_args`` the class's
    keyword arguments); a name registered twice is an error."""

    def register(scheme: _Scheme) -> _Scheme:
        if name in CREDIT_ASSIGNMENTS:
            raise ValueError(f"credit assignment {name!r} is registered already")
        CREDIT_ASSIGNMENTS[name] = scheme
        return scheme

    return register


class CreditAssignment(Protocol):
    """Per-call returns of one episode. Must return ``len(calls)`` floats, in turn order, and be additive in
    ``(final_reward, intermediate)`` if it is to be used with group advantages."""

    def __call__(
        self, calls: Sequence[LLMCall], final_reward: float, intermediate: Sequence[IntermediateReward]
    ) -> list[float]: ...


def reward_links(calls: Sequence[LLMCall]) -> dict[str, int]:
    """Response id → turn of the call: the one rule by which an intermediate reward reaches a call."""
    return {c.response_id: i for i, c in enumerate(calls) if c.response_id is not None}


def split_linked(
    calls: Sequence[LLMCall], intermediate: Sequence[IntermediateReward]
) -> tuple[list[IntermediateReward], list[IntermediateReward]]:
    """The intermediate rewards that reach a call of ``calls``, and the rest (no id, or an id of no call)."""
    links = reward_links(calls)
    linked: list[IntermediateReward] = []
    unlinked: list[IntermediateReward] = []
    for r in intermediate:
        (linked if r.response_id in links else unlinked).append(r)
    return linked, unlinked


def linked_rewards(calls: Sequence[LLMCall], intermediate: Sequence[IntermediateReward]) -> tuple[list[float], float]:
    """Sum the intermediate rewards per call (by response id); also return the sum of the unlinked ones."""
    per_call = [0.0] * len(calls)
    if not intermediate:
        return per_call, 0.0
    links = reward_links(calls)
    unlinked = 0.0
    for r in intermediate:
        i = links.get(r.response_id) if r.response_id is not None else None
        if i is None:
            unlinked += r.value
        else:
            per_call[i] += r.value
    return per_call, unlinked


@register_credit_assignment("identical")
@dataclass(frozen=True, slots=True)
class Identical:
    """Every call gets the final reward; intermediate rewards are ignored (outcome-only GRPO)."""

    def __call__(
        self, calls: Sequence[LLMCall], final_reward: float, intermediate: Sequence[IntermediateReward]
    ) -> list[float]:
        return [final_reward] * len(calls)


@register_credit_assignment("per_turn")
@dataclass(frozen=True, slots=True)
class PerTurn:
    """Call t gets the final reward plus the intermediate rewards linked to call t (its own turn's reward,
    not those of later turns: use `Discounted` with ``gamma=1`` for reward-to-go)."""

    unlinked: Unlinked = "ignore"

    def __call__(
        self, calls: Sequence[LLMCall], final_reward: float, intermediate: Sequence[IntermediateReward]
    ) -> list[float]:
        if not intermediate:
            return [final_reward] * len(calls)
        per_call, unlinked = linked_rewards(calls, intermediate)
        base = final_reward + unlinked if self.unlinked == "episode" else final_reward
        return [base + r for r in per_call]


@register_credit_assignment("discounted")
@dataclass(frozen=True, slots=True)
class Discounted:
    """The discounted return from call t on: ``G_t = Σ_{k≥t} γ^(k−t)·r_k``, where r_k is the sum of the
    intermediate rewards linked to call k and the final reward is added to the last call's r. Without
    intermediate rewards, call t gets ``γ^(T−1−t) × final``."""

    gamma: float = 0.9
    unlinked: Unlinked = "ignore"

    def __post_init__(self) -> None:
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError("gamma must be in [0, 1]")

    def __call__(
        self, calls: Sequence[LLMCall], final_reward: float, intermediate: Sequence[IntermediateReward]
    ) -> list[float]:
        if not calls:
            return []
        r, unlinked = linked_rewards(calls, intermediate)
        r[-1] += final_reward + unlinked if self.unlinked == "episode" else final_reward
        g = 0.0
        for t in range(len(r) - 1, -1, -1):
            g = r[t] + self.gamma * g
            r[t] = g
        return r


def check_credit(name: str) -> Callable[..., CreditAssignment]:
    """The scheme registered as ``name``, else ValueError naming the registered ones (a config's ``credit``)."""
    try:
        return CREDIT_ASSIGNMENTS[name]
    except (KeyError, TypeError):
        raise ValueError(f"credit: expected one of {list(CREDIT_ASSIGNMENTS)}, got {name!r}") from None


def credit_by_name(name: str, **options: object) -> CreditAssignment:
    """A registered scheme from configuration: ``credit_by_name("discounted", gamma=0.95)``; ValueError naming the
    registered ones for an unknown name."""
    try:
        scheme = CREDIT_ASSIGNMENTS[name]
    except KeyError:
        raise ValueError(f"unknown credit assignment {name!r}; choose from {sorted(CREDIT_ASSIGNMENTS)}") from None
    return scheme(**options)
