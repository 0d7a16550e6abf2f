"""`VERL(config)` trains verl's loss: lightrail's `policy_loss`, set up by `verl_settings` from a verl actor config,
against verl's own functions on the same fixed tensors (values and gradients), with padding.

Each case is a verl ``actor_rollout_ref.actor`` dict and [B, T] tensors (``response_mask`` zeros mark padding; the
padded entries hold values that would change the result if they were read). verl's side (`bench/_verl_core_algos.py`)
runs in verl's own interpreter (``scripts/_env_verl.sh``; ``$LIGHTRAIL_VERL_PYTHON``); lightrail's side maps the
dict with `lightrail.trainer.verl_compat.verl_settings` into an `UpdateConfig` and a `LossNorm`, then calls
`lightrail.model._loss.policy_loss` with `loss_weights` as the updater does. Everything in float64.

Prints one JSON line: ``verl_parity_max_abs_diff`` (over every case: the loss, its gradient, and with a KL term the
per-token penalty and its gradient; target <= 1e-6), ``cases``, and the same-run baseline
``lightrail_defaults_max_abs_diff``: the same cases under lightrail's own ``grpo:`` defaults (no dual-clip), which
is what `VERL(config)` trained before it applied verl's defaults (``lightrail_defaults_issue_case_diff``: on the
issue's example alone, ratio 4 with a negative advantage: loss 4 against 3, gradient 4 against 0).

verl's ``seq-mean-token-mean`` divides each row's sum by its token count plus 1e-8 (``agg_loss``): a relative
difference of about 1e-8 / n from the exact mean lightrail takes, the largest part of the figure.

    python bench/verl_parity.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LN4 = math.log(4.0)


def verl_python() -> str:
    """verl's interpreter: ``$LIGHTRAIL_VERL_PYTHON`` when it names a file, else the venv ``scripts/_env_verl.sh``
    builds (or finds already built); a build that fails raises `subprocess.CalledProcessError`."""
    python = os.environ.get("LIGHTRAIL_VERL_PYTHON")
    if python and Path(python).is_file():
        return python
    built = subprocess.run(["bash", str(REPO / "scripts" / "_env_verl.sh")], check=True, capture_output=True, text=True)
    return built.stdout.strip().splitlines()[-1]


def _random(shape: tuple[int, int], seed: int, low: float, high: float) -> list[list[float]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return (low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)).tolist()


# Padding: masked entries hold values that would change any result that read them.
_PAD = 7.5


def cases() -> list[dict[str, Any]]:
    """The fixed cases, each ``{"name", "actor": verl actor keys, "tensors": {name: [B][T] floats}}``."""
    out: list[dict[str, Any]] = []
    mask = [[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0, 0.0]]
    old = _random((3, 5), 1, -3.0, -0.1)
    logp = [[o + d for o, d in zip(row, deltas, strict=True)]
            for row, deltas in zip(old, _random((3, 5), 2, -1.5, 1.5), strict=True)]  # fmt: skip
    adv = _random((3, 5), 3, -2.0, 2.0)
    ref = [[x + d for x, d in zip(row, deltas, strict=True)]
           for row, deltas in zip(logp, _random((3, 5), 4, -4.0, 4.0), strict=True)]  # fmt: skip
    for i, row in enumerate(mask):  # garbage where padded
        for j, m in enumerate(row):
            if not m:
                old[i][j], logp[i][j], adv[i][j], ref[i][j] = -_PAD, _PAD, -_PAD, _PAD
    tensors = {"old_log_prob": old, "log_prob": logp, "advantages": adv, "ref_log_prob": ref, "response_mask": mask}

    # the issue's example: a negative advantage, ratio 4; verl's default c = 3 -> loss 3.0, gradient 0
    out.append({"name": "dual_clip_ratio_4", "actor": {},
                "tensors": {"old_log_prob": [[-1.0, -_PAD]], "log_prob": [[-1.0 + LN4, _PAD]],
                            "advantages": [[-1.0, -_PAD]], "ref_log_prob": [[-1.0, _PAD]],
                            "response_mask": [[1.0, 0.0]]}})  # fmt: skip
    out.append({"name": "dual_clip_c_2", "actor": {"clip_ratio_c": 2.0}, "tensors": tensors})
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        out.append({"name": f"clip_higher_{mode}", "actor": {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28,
                    "loss_agg_mode": mode}, "tensors": tensors})  # fmt: skip
    out.append({"name": "sum_norm_scale_factor", "actor": {"loss_agg_mode": "seq-mean-token-sum-norm",
                "loss_scale_factor": 16}, "tensors": tensors})  # fmt: skip
    # verl clamps the log-ratio to [-20, 20] before exp: at -30 with a large positive advantage the loss is
    # -A * e^-20 and the gradient 0 (unclamped: -A * e^-30, gradient -A * e^-30)
    out.append({"name": "log_ratio_clamp", "actor": {},
                "tensors": {"old_log_prob": [[-1.0, -1.0, -_PAD]], "log_prob": [[-31.0, 24.0, _PAD]],
                            "advantages": [[1e8, -1.0, -_PAD]], "ref_log_prob": [[-1.0, -1.0, _PAD]],
                            "response_mask": [[1.0, 1.0, 0.0]]}})  # fmt: skip
    # the other registered policy losses: GSPO's ratio is per sequence (its clip ranges are the paper's 3e-4 / 4e-4,
    # and PPO's 0.2 / 0.28 that clip fewer sequences), CISPO's weight clipped with its gradient stopped
    for mode, low, high, agg in (("gspo", 3e-4, 4e-4, "seq-mean-token-mean"), ("gspo", 0.2, 0.28, "token-mean"),
                                 ("cispo", 0.2, 0.28, "token-mean"), ("cispo", 0.1, 0.1, "seq-mean-token-mean")):  # fmt: skip
        out.append({"name": f"{mode}_{low:g}_{high:g}_{agg}", "actor": {"policy_loss": {"loss_mode": mode},
                    "clip_ratio_low": low, "clip_ratio_high": high, "loss_agg_mode": agg}, "tensors": tensors})  # fmt: skip
    out.append({"name": "gspo_kl", "actor": {"policy_loss": {"loss_mode": "gspo"}, "use_kl_loss": True,
                "kl_loss_coef": 0.1, "loss_agg_mode": "seq-mean-token-mean"}, "tensors": tensors})  # fmt: skip
    from lightrail.model.kl import KL_ESTIMATORS

    for name in KL_ESTIMATORS:
        out.append({"name": f"kl_{name}", "actor": {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": name,
                    "loss_agg_mode": "seq-mean-token-mean"}, "tensors": tensors})  # fmt: skip
    # low_var_kl's clamp: ref - logp = 3 gives 10.0 (not e^3 - 4 = 16.09) and gradient 0
    for name in ("low_var_kl", "k3+"):
        out.append({"name": f"kl_clamp_{name}", "actor": {"use_kl_loss": True, "kl_loss_coef": 1.0,
                    "kl_loss_type": name},
                    "tensors": {"old_log_prob": [[-4.0, -1.0, -_PAD]], "log_prob": [[-4.0, -1.0, _PAD]],
                                "advantages": [[0.0, 0.0, -_PAD]], "ref_log_prob": [[-1.0, -0.5, _PAD]],
                                "response_mask": [[1.0, 1.0, 0.0]]}})  # fmt: skip
    return out


def lightrail_side(case: dict[str, Any], *, verl_defaults: bool = True) -> dict[str, Any]:
    """The case through `verl_settings` and `policy_loss`: ``{"loss", "grad"[, "kl", "kl_grad"]}`` as verl's side.
    ``verl_defaults=False`` drops the settings verl's defaults added (lightrail's own ``grpo:`` defaults)."""
    import torch

    from lightrail.algorithms.settings import resolve_loss_agg, update_config
    from lightrail.model._loss import loss_weights, policy_loss
    from lightrail.model.kl import kl_estimator
    from lightrail.trainer.verl_compat import verl_settings

    grpo = verl_settings({"actor_rollout_ref": {"actor": case["actor"]}}).grpo
    section = dict(grpo.get("config", {}))
    if not verl_defaults:
        section.pop("clip_ratio_c", None)
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in case["tensors"].items()}
    mask = t["response_mask"].bool()
    config = update_config(section, "verl")
    norm = resolve_loss_agg("grpo", grpo.get("loss_agg"), config)
    rows = torch.arange(mask.shape[0]).unsqueeze(1).expand_as(mask)[mask]
    if norm == "token":
        weights = loss_weights(None, int(mask.sum()))
    else:  # verl pads responses to one length: its L is that length unless loss_scale_factor
        sum_norm = (config.loss_norm_tokens or mask.shape[1]) if norm == "sequence_sum_norm" else None
        weights = loss_weights(rows, sum_norm=sum_norm)
    logp = t["log_prob"].clone().requires_grad_(True)
    loss, _ = policy_loss(
        logp, t["old_log_prob"], t["advantages"], mask=mask, weights=weights, clip_low=config.clip_low,
        clip_high=config.clip_high, ref_logp=t["ref_log_prob"], kl_coef=config.kl_coef,
        clip_ratio_c=config.clip_ratio_c, kl_estimator=config.kl_estimator, loss=config.policy_loss,
        segment_ids=torch.arange(mask.shape[0]).unsqueeze(1).expand_as(mask),
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss, logp, retain_graph=True)
    out: dict[str, Any] = {"loss": float(loss.detach()), "grad": grad.tolist()}
    if config.kl_coef:
        kl = kl_estimator(config.kl_estimator)(logp, t["ref_log_prob"]) * t["response_mask"]
        (kl_grad,) = torch.autograd.grad(kl.sum(), logp)
        out |= {"kl": kl.detach().tolist(), "kl_grad": kl_grad.tolist()}
    return out


def verl_side(python: str, all_cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """verl's results for ``all_cases``, computed by ``python`` (verl's interpreter) running `_verl_core_algos`."""
    done = subprocess.run(
        [python, str(REPO / "bench" / "_verl_core_algos.py")], input=json.dumps(all_cases), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"verl's side failed: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return result


def _flat(value: Any) -> list[float]:
    return [x for item in value for x in _flat(item)] if isinstance(value, list) else [float(value)]


def max_abs_diff(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    """The largest difference between two results over every key both must have (``loss``, ``grad``, ``kl``...)."""
    if set(ours) != set(theirs):
        return math.inf
    worst = 0.0
    for key in ours:
        a, b = _flat(ours[key]), _flat(theirs[key])
        if len(a) != len(b):
            return math.inf
        worst = max([worst, *(abs(x - y) for x, y in zip(a, b, strict=True))])
    return worst


KEYS = ("verl_parity_max_abs_diff", "cases", "worst_case", "lightrail_defaults_max_abs_diff", "seconds")
NEEDS = {"verl": ("verl_parity_max_abs_diff", "cases", "worst_case", "lightrail_defaults_max_abs_diff", "seconds")}
"""Every key needs verl's venv (``scripts/_env_verl.sh``); ``--smoke`` runs the same cases (they take seconds)."""


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the same cases (the whole bench is seconds of compute)")
    parser.parse_args()
    start = time.perf_counter()
    all_cases = cases()
    theirs = verl_side(verl_python(), all_cases)
    diffs = {c["name"]: max_abs_diff(lightrail_side(c), theirs[c["name"]]) for c in all_cases}
    before = {c["name"]: max_abs_diff(lightrail_side(c, verl_defaults=False), theirs[c["name"]]) for c in all_cases}
    print(json.dumps({
        "verl_parity_max_abs_diff": max(diffs.values()),
        "cases": len(diffs),
        "worst_case": max(diffs, key=lambda k: diffs[k]),
        "lightrail_defaults_max_abs_diff": max(before.values()),
        "lightrail_defaults_issue_case_diff": before["dual_clip_ratio_4"],
        "seconds": round(time.perf_counter() - start, 1),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
