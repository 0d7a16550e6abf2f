"""KL estimators of the penalty to the reference policy, by name: the one registry (`KL_ESTIMATORS`) every name list
is read from (`UpdateConfig.kl_estimator`'s check, verl's ``actor.kl_loss_type`` in `lightrail.trainer.verl_compat`).

Per response token, with ``d = logp - ref_logp`` (``logp = log pi_theta(a|s)``, carrying the gradient;
``ref_logp = log pi_ref(a|s)``, the frozen reference), each estimator is a function of the two [N] tensors that
returns the per-token [N] penalty. The formulas are J. Schulman's ("Approximating KL divergence", 2020,
joschu.net/blog/kl-approx.html), with verl's clamps (``verl.trainer.ppo.core_algos.kl_penalty_forward``, verl 0.9.1),
so that a name means here what it means in verl (proven against verl's own function in tests/trainer/
test_verl_parity.py).

``<name>+`` is verl's straight-through variant: the value of ``<name>``, the gradient of k2
(``0.5 * d**2``, gradient ``d``), whose expected gradient is the gradient of the KL (k1's and k3's are not).

No torch import: the functions only call tensor methods, so reading the names (config checks, the verl table)
keeps ``import lightrail`` light.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["KL_ESTIMATORS", "KLEstimator", "kl_estimator", "register_kl_estimator"]

KLEstimator = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""``estimator(logp, ref_logp) -> per-token penalty``, all three the same shape."""

KL_ESTIMATORS: dict[str, KLEstimator] = {}
"""Every KL estimator by name (aliases included), filled by `register_kl_estimator`."""


def register_kl_estimator(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    """Register a KL estimator under ``names`` (its name and aliases); a name registered twice is an error."""

    def register(fn: KLEstimator) -> KLEstimator:
        for name in names:
            if name in KL_ESTIMATORS:
                raise ValueError(f"KL estimator {name!r} is registered already")
            KL_ESTIMATORS[name] = fn
        return fn

    return register


def kl_estimator(name: str) -> KLEstimator:
    """The estimator registered as ``name``; ValueError naming the registered ones otherwise."""
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown KL estimator {name!r}; choose from {list(KL_ESTIMATORS)}") from None


@register_kl_estimator("kl", "k1")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = ``logp - ref_logp``: unbiased for KL(pi_theta || pi_ref), high variance, negative for some tokens
    (Schulman 2020; verl ``kl``/``k1``)."""
    return logp - ref_logp


@register_kl_estimator("abs")
def absolute(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """``|logp - ref_logp|`` (verl ``abs``; not an estimator of the KL, a distance)."""
    return (logp - ref_logp).abs()


@register_kl_estimator("mse", "k2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = ``0.5 * (logp - ref_logp)**2``: biased, low variance; its gradient ``d`` is the KL's in expectation
    (Schulman 2020; verl ``mse``/``k2``)."""
    return 0.5 * (logp - ref_logp).square()


@register_kl_estimator("low_var_kl", "k3")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = ``exp(x) - x - 1`` with ``x = ref_logp - logp`` clamped to [-20, 20], the result clamped to [-10, 10]:
    unbiased for KL(pi_theta || pi_ref), never negative, low variance (Schulman 2020; verl ``low_var_kl``/``k3``,
    whose clamps these are: at ``x = 3`` the value is 10, not 16.09, and the gradient 0)."""
    x = (ref_logp - logp).clamp(min=-20.0, max=20.0)
    return (x.exp() - x - 1.0).clamp(min=-10.0, max=10.0)


def _straight_through(forward: KLEstimator) -> KLEstimator:
    def estimator(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        backward = k2(logp, ref_logp)
        return backward - backward.detach() + forward(logp, ref_logp).detach()

    estimator.__doc__ = (
        f"Straight-through ``{forward.__name__}+``: the value of {forward.__name__}, the gradient of k2 "
        "(``logp - ref_logp``), as verl's ``kl_penalty`` for a name ending in ``+``."
    )
    return estimator


for _base in ("kl", "k1", "abs", "low_var_kl", "k3"):
    register_kl_estimator(f"{_base}+")(_straight_through(KL_ESTIMATORS[_base]))
register_kl_estimator("mse+", "k2+")(k2)  # k2's own gradient is the straight-through one (verl returns k2 as is)
del _base
