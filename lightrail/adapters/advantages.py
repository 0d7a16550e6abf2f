"""Group advantages, carried to every trained LLM call through the credit assignment.

The scheme (one sentence): **turn each episode's outcome into an outcome advantage z_i with the chosen estimator,
then let the credit assignment distribute z_i plus the raw intermediate rewards over the calls**::

    z_i   = estimator(R, groups)[i]                      # GRPO by default: (R_i − mean_g R) / (std_g R + eps)
    A_i,t = credit(calls_i, z_i, intermediate_i)[t]      # advantage of call t of rollout i
    G_i,t = credit(calls_i, R_i, intermediate_i)[t]      # its raw return, kept in Transition.reward

where g is the rollout's group (the samples of one task, `Task.task_id`) and R_i its final reward.

Outcome estimators (``estimator=``, the registry `ADVANTAGE_ESTIMATORS`; n = size of i's group g, a group of one has
no baseline)::

    grpo                   z_i = (R_i − mean_g R) / (std_g R + eps)    std: sample std (n−1), as TRL and verl;
                           ``scale_by_std=False`` drops the division. n = 1 → 0.
                           (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300; verl compute_grpo_outcome_advantage)
    rloo                   z_i = R_i − mean_{j≠i} R_j = n/(n−1) · (R_i − mean_g R), no std. n = 1 → 0 (verl keeps
                           R_i there). (Ahmadian et al. 2024, arXiv:2402.14740; verl compute_rloo_outcome_advantage)
    dr_grpo                z_i = R_i − mean_g R, no std. n = 1 → 0. Its natural loss aggregation is the
                           constant-length token sum (``loss_agg="seq_mean_token_sum_norm"``, see
                           `lightrail.model._loss`). (Liu et al. 2025, "Understanding R1-Zero-Like Training:
                           A Critical Perspective", arXiv:2503.20783; verl ``norm_adv_by_std_in_grpo=False``)
    reinforce_pp           REINFORCE++ for outcome rewards: no group baseline, the outcomes are whitened over the
                           whole batch, token-weighted: z_i = (R_i − μ) / sqrt(σ² + 1e-8) with μ = Σ_i n_i R_i / N,
                           σ² = Σ_i n_i (R_i − μ)² / (N − 1), n_i the trained response tokens of rollout i and
                           N = Σ_i n_i. This is verl's compute_reinforce_plus_plus_outcome_advantage with γ = 1 and
                           the reward on the last token (its per-token return is then R_i on every response token,
                           and masked_whiten over the batch's response tokens gives exactly this); N ≤ 1 → 0.
                           (Hu 2025, "REINFORCE++", arXiv:2501.03262)
    reinforce_pp_baseline  REINFORCE++-baseline: R_i − mean_g R (n = 1 → 0; verl keeps R_i), then whitened over
                           the batch as above. verl compute_reinforce_plus_plus_baseline_outcome_advantage; the
                           paper's recommended variant when several samples per prompt are drawn.
    gae                    PPO with a critic (`lightrail.model.ppo`): the update replaces these advantages by GAE
                           over each call's tokens from a value head (``critic``); the outcomes here are grpo's,
                           kept only for the step's statistics. (Schulman et al. 2016, arXiv:1506.02438)

Adding one: a function ``(groups, options) -> advantages by group``, ``@register_advantage_estimator("name")``
with its verl name when verl has it, its formula above and its test.

The estimator replaces only the outcome term z_i; everything below (intermediate rewards, centring, credit) is
the same for all of them. verl whitens REINFORCE++ returns that include per-token rewards; here intermediate
rewards stay on their own scale for the reason given next.

Why per-episode outcomes and not "normalise per-call returns at the same turn position": samples of one task take
different numbers of turns, and turn 3 of one sample is not the same situation as turn 3 of another, so
position-wise groups compare unrelated calls and shrink to single samples at late turns (advantage 0). The group
mean of the outcome is a baseline that does not depend on any call's action, so subtracting it keeps the gradient
unbiased for every call; with `Identical` credit the formula is exactly GRPO's outcome advantage.

Intermediate rewards are not divided by any std (group or batch): they are already per-call deltas on the reward scale
the user chose (e.g. ±0.1 per tool call), and in a group where every sample has the same outcome (std 0)
dividing would turn ±0.1 into ±1e5 — there, GRPO's outcome advantage is 0 and the intermediate rewards are the
only signal left, at their own scale. They are **centred** in the advantage (``center_intermediate``, default
on): the group's mean intermediate return ``m = mean_g(Σ_t I_i,t)`` is removed, spread evenly over each episode's
own intermediate rewards (``I_i,t − m / k_i`` for its ``k_i`` rewards). Without it, a group where every sample
earned the same +0.1 would still push all their sampled tokens up, and an Adam step turns that uniform push into
a full-size update in a random direction (measured: the calculator demo collapsed from 47 % to 0 % in five
steps). Raw returns (``G``) keep the uncentred values.

Worked example (`PerTurn` credit, no std scaling, ``center_intermediate=False``): a group of two rollouts with
outcomes 1.0 and 0.0 (mean 0.5); rollout 1 has calls a, b with +0.1 linked to a: advantages 0.5 + 0.1 = 0.6 (a)
and 0.5 (b); rollout 2 has one call: −0.5. Centred, the group's mean intermediate return is 0.05, so a gets
0.5 + 0.1 − 0.05 = 0.55.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

from lightrail.adapters.credit import CreditAssignment, PerTurn, split_linked
from lightrail.adapters.records import Episode
from lightrail.adapters.selection import UNFINISHED_OUTCOMES
from lightrail.adapters.transitions import episode_transitions
from lightrail.types import Rollout, Transition

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "EstimatorOptions",
    "GroupReport",
    "check_estimator",
    "group_advantages",
    "leave_one_out",
    "normalize_group",
    "outcome_advantages",
    "register_advantage_estimator",
    "whiten",
]

WHITEN_EPS = 1e-8
"""verl's ``masked_whiten`` adds this to the variance (not the std)."""


class EstimatorOptions(NamedTuple):
    """What an estimator may read besides the outcomes."""

    scale_by_std: bool = True
    """GRPO's division by the group's std (off: Dr. GRPO's plain centring)."""
    eps: float = 1e-6
    """GRPO's epsilon next to the std."""
    tokens: Sequence[Sequence[float]] | None = None
    """The trained response tokens of each rollout, by group (the REINFORCE++ batch whitening's weights; None: 1)."""


OutcomeEstimator = Callable[[Sequence[Sequence[float]], EstimatorOptions], list[list[float]]]
"""``estimator(outcomes by group, options) -> outcome advantages by group`` (the same shape)."""


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered advantage estimator."""

    name: str
    fn: OutcomeEstimator
    verl_name: str | None = None
    """verl's ``algorithm.adv_estimator`` name for it (None: verl has none)."""
    tokens: bool = False
    """Whether it weighs rollouts by their trained tokens (`EstimatorOptions.tokens`)."""
    critic: bool = False
    """Whether the update replaces its advantages by a critic's (GAE from a value head, `lightrail.model.ppo`)."""


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""Every advantage estimator by name, filled by `register_advantage_estimator`; the one list settings checks, verl's
mapping and the docs read."""


def register_advantage_estimator(
    name: str, *, verl: str | None = None, tokens: bool = False, critic: bool = False
) -> Callable[[OutcomeEstimator], OutcomeEstimator]:
    """Register an outcome estimator as ``name`` (``verl``: verl's name for it); a name registered twice is an
    error."""

    def register(fn: OutcomeEstimator) -> OutcomeEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is registered already")
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(name, fn, verl, tokens, critic)
        return fn

    return register


def check_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as ``name``, else ValueError naming the registered ones."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except (KeyError, TypeError):
        raise ValueError(f"advantage: expected one of {list(ADVANTAGE_ESTIMATORS)}, got {name!r}") from None


def normalize_group(rewards: Sequence[float], *, scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """``(r − mean)`` and, with ``scale_by_std``, ``/ (std + eps)`` using the sample std (n−1).

    A group of one has no baseline: its advantage is 0.

    >>> normalize_group([1.0, 0.0, 0.0, 1.0], eps=0.0)
    [0.8660254037844387, -0.8660254037844387, -0.8660254037844387, 0.8660254037844387]
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = math.fsum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]


def leave_one_out(rewards: Sequence[float]) -> list[float]:
    """RLOO: ``r_i − mean_{j≠i} r_j``, which is ``n / (n − 1) · (r_i − mean)``; a group of one gets 0.

    >>> leave_one_out([1.0, 0.0, 0.0])
    [1.0, -0.5, -0.5]
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def whiten(values: Sequence[float], weights: Sequence[float] | None = None) -> list[float]:
    """``(v_i − μ) / sqrt(σ² + 1e-8)`` over the whole batch, each value counted ``weights[i]`` times (its tokens).

    μ and the Bessel-corrected σ² are taken over the N = Σ weights tokens, as verl's ``masked_whiten`` does over a
    batch's response tokens; N ≤ 1 leaves nothing to compare with: all 0. Without weights every value counts once.

    >>> [round(z, 6) for z in whiten([1.0, 0.0], [3, 1])]    # μ = 0.75, σ² = (3·0.0625 + 0.5625) / 3 = 0.25
    [0.5, -1.5]
    """
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    if len(w) != len(values):
        raise ValueError(f"need one weight per value: {len(values)} values, {len(w)} weights")
    n = math.fsum(w)
    if n <= 1:
        return [0.0] * len(values)
    mean = math.fsum(wi * v for wi, v in zip(w, values, strict=True)) / n
    var = math.fsum(wi * (v - mean) ** 2 for wi, v in zip(w, values, strict=True)) / (n - 1)
    scale = 1.0 / math.sqrt(var + WHITEN_EPS)
    return [(v - mean) * scale for v in values]


def outcome_advantages(
    groups: Sequence[Sequence[float]],
    estimator: str = "grpo",
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    tokens: Sequence[Sequence[float]] | None = None,
) -> list[list[float]]:
    """The outcome advantages z of every rollout, by group (same shape as ``groups``), for ``estimator``.

    ``scale_by_std`` and ``eps`` are GRPO's (std division on or off, and its epsilon); ``tokens`` (same shape)
    are the trained response tokens of each rollout, the weights of the REINFORCE++ batch whitening (default 1
    each: every rollout counts once). See the module docstring for the formulas.

    >>> outcome_advantages([[1.0, 0.0], [2.0]], "dr_grpo")
    [[0.5, -0.5], [0.0]]
    """
    options = EstimatorOptions(scale_by_std=scale_by_std, eps=eps, tokens=tokens)
    return check_estimator(estimator).fn(groups, options)


@register_advantage_estimator("grpo", verl="grpo")
def grpo(groups: Sequence[Sequence[float]], options: EstimatorOptions) -> list[list[float]]:
    """GRPO: each group centred on its mean and divided by its sample std (module docstring)."""
    return [normalize_group(g, scale_by_std=options.scale_by_std, eps=options.eps) for g in groups]


@register_advantage_estimator("rloo", verl="rloo")
def rloo(groups: Sequence[Sequence[float]], options: EstimatorOptions) -> list[list[float]]:
    """RLOO: each rollout against the mean of the others in its group (module docstring)."""
    return [leave_one_out(g) for g in groups]


@register_advantage_estimator("dr_grpo")
def dr_grpo(groups: Sequence[Sequence[float]], options: EstimatorOptions) -> list[list[float]]:
    """Dr. GRPO: each group centred on its mean, no std (module docstring; verl: grpo with
    ``norm_adv_by_std_in_grpo=False``)."""
    return [normalize_group(g, scale_by_std=False) for g in groups]


def _batch_whitened(centred: list[list[float]], options: EstimatorOptions) -> list[list[float]]:
    flat = [v for g in centred for v in g]
    weights = None if options.tokens is None else [w for ts in options.tokens for w in ts]
    white = whiten(flat, weights)
    out, k = [], 0
    for g in centred:
        out.append(white[k : k + len(g)])
        k += len(g)
    return out


@register_advantage_estimator("reinforce_pp", verl="reinforce_plus_plus", tokens=True)
def reinforce_pp(groups: Sequence[Sequence[float]], options: EstimatorOptions) -> list[list[float]]:
    """REINFORCE++: the outcomes whitened over the batch, token-weighted (module docstring)."""
    return _batch_whitened([list(g) for g in groups], options)


@register_advantage_estimator("reinforce_pp_baseline", verl="reinforce_plus_plus_baseline", tokens=True)
def reinforce_pp_baseline(groups: Sequence[Sequence[float]], options: EstimatorOptions) -> list[list[float]]:
    """REINFORCE++-baseline: each group centred on its mean, then whitened over the batch (module docstring)."""
    return _batch_whitened([normalize_group(g, scale_by_std=False) for g in groups], options)


register_advantage_estimator("gae", verl="gae", critic=True)(grpo)  # the critic's advantages replace these


class GroupReport(msgspec.Struct, kw_only=True):
    """Group statistics of one batch: how many groups had no learning signal from the outcome."""

    groups: int = 0
    rollouts: int = 0
    singleton_groups: int = 0
    """Groups with one rollout (the others were excluded or n=1): outcome advantage 0."""
    zero_std_groups: int = 0
    """Groups of ≥ 2 rollouts whose outcomes are all equal (outcome advantage 0)."""
    defaulted_rewards: int = 0
    """Rollouts with no final reward in spans nor on the rollout, scored ``missing_reward``."""


def group_advantages(
    items: Iterable[tuple[Rollout, Episode]],
    credit: CreditAssignment = PerTurn(),  # noqa: B008 - frozen, stateless
    *,
    agents: Callable[[str | None], bool] | None = None,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    missing_reward: float = 0.0,
    failure_reward: float | None = None,
    center_intermediate: bool = True,
    estimator: str = "grpo",
) -> tuple[list[Transition], GroupReport]:
    """Transitions of trainable ``(rollout, episode)`` pairs with group advantages (see the module docstring).

    Pass only trainable rollouts (`select_trainable`): whatever is passed is trained. A rollout's outcome is
    its episode's final reward, else `Rollout.reward`, else ``missing_reward`` (counted) — a policy failure that
    reported nothing; a rollout whose agent raised or timed out scores ``failure_reward`` when one is given (what
    `select_trainable` keeps them for). ``estimator`` (`ADVANTAGE_ESTIMATORS`) turns the outcomes into outcome advantages; ``scale_by_std``
    and ``eps`` apply to ``grpo``. Transitions come out grouped by task, in input order within a group; each
    carries its task id as ``metadata["group_id"]`` (it becomes `TrainingRow.group_id`).
    """
    weighted = check_estimator(estimator).tokens
    groups: dict[str, list[tuple[Rollout, Episode, float]]] = {}
    report = GroupReport()
    for rollout, episode in items:
        outcome = episode.final_reward if episode.final_reward is not None else rollout.reward
        if failure_reward is not None and rollout.status in UNFINISHED_OUTCOMES:
            outcome = failure_reward
        if outcome is None:
            outcome = missing_reward
            report.defaulted_rewards += 1
        groups.setdefault(rollout.task.task_id, []).append((rollout, episode, outcome))
        report.rollouts += 1
    outcomes = [[m[2] for m in members] for members in groups.values()]
    tokens = None
    if weighted:  # batch whitening weighs each rollout by its trained tokens
        tokens = [[_trained_tokens(m[1], agents) for m in members] for members in groups.values()]
    normalised_groups = outcome_advantages(outcomes, estimator, scale_by_std=scale_by_std, eps=eps, tokens=tokens)
    out: list[Transition] = []
    for (group_id, members), group_outcomes, normalised in zip(
        groups.items(), outcomes, normalised_groups, strict=True
    ):
        report.groups += 1
        if len(members) == 1:
            report.singleton_groups += 1
        elif max(group_outcomes) == min(group_outcomes):
            report.zero_std_groups += 1
        linked = [split_linked(m[1].calls, m[1].intermediate)[0] for m in members]
        mean_inter = math.fsum(math.fsum(r.value for r in rs) for rs in linked) / len(members)
        for (_, episode, outcome), z, rs in zip(members, normalised, linked, strict=True):
            calls, inter = episode.calls, episode.intermediate
            returns = credit(calls, outcome, inter)
            if center_intermediate and len(members) > 1 and rs and mean_inter:
                shift = mean_inter / len(rs)
                centred = {id(r) for r in rs}
                inter = [msgspec.structs.replace(r, value=r.value - shift) if id(r) in centred else r for r in inter]
            advantages = credit(calls, z, inter)
            out.extend(episode_transitions(episode, returns, advantages, agents=agents, group_id=group_id))
    return out, report


def _trained_tokens(episode: Episode, agents: Callable[[str | None], bool] | None) -> int:
    """Response tokens of ``episode`` that become training tokens (the calls `episode_transitions` keeps)."""
    n = 0
    for call in episode.calls:
        if call.prompt_ids is None or (agents is not None and not agents(call.agent_name)):
            continue
        for choice in call.choices:
            ids = choice.get("token_ids")
            n += len(ids) if ids is not None else 0
    return n
