"""verl's side of `bench/verl_parity.py`, run by verl's own interpreter (scripts/_env_verl.sh): reads the cases as
JSON on stdin, computes each one's actor loss with verl's functions, writes the results as JSON on stdout.

The loss is what verl's actor computes (``verl.workers.utils.losses.ppo_loss``, verl 0.9.1), on one rank with
no entropy term: the registered policy loss the case's ``policy_loss.loss_mode`` names (``get_policy_loss_fn``;
``vanilla`` when absent) with an `ActorConfig` built from
the case's ``actor`` keys, plus, with ``use_kl_loss``, ``kl_loss_coef * agg_loss(kl_penalty(...))``. Imports
nothing of lightrail (this interpreter has none); float64 throughout.
"""

from __future__ import annotations

import json
import sys

import torch
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.workers.config import ActorConfig


def _actor(keys: dict) -> ActorConfig:
    config = ActorConfig(strategy="fsdp", ppo_mini_batch_size=1, ppo_micro_batch_size_per_gpu=1, rollout_n=1, **keys)
    # as ppo_loss sets it on one data-parallel rank (batch sizes then counted from the mask)
    config.global_batch_info.update(dp_size=1, loss_scale_factor=config.loss_scale_factor)
    return config


def _case(case: dict) -> dict:
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in case["tensors"].items()}
    keys = dict(case["actor"])
    mode = keys.pop("policy_loss", {}).get("loss_mode", "vanilla")  # (ppo_loss reads config.policy_loss.loss_mode)
    config = _actor(keys)
    log_prob = t["log_prob"].clone().requires_grad_(True)
    mask = t["response_mask"]
    loss, _ = get_policy_loss_fn(mode)(
        old_log_prob=t["old_log_prob"], log_prob=log_prob, advantages=t["advantages"], response_mask=mask,
        loss_agg_mode=config.loss_agg_mode, config=config,
    )  # fmt: skip
    kl = None
    if config.use_kl_loss:
        kl = kl_penalty(logprob=log_prob, ref_logprob=t["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(loss_mat=kl, loss_mask=mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info)
        loss = loss + kl_loss * config.kl_loss_coef
    (grad,) = torch.autograd.grad(loss, log_prob, retain_graph=kl is not None)
    out = {"loss": float(loss), "grad": grad.tolist()}
    if kl is not None:
        (kl_grad,) = torch.autograd.grad((kl * mask).sum(), log_prob)
        out |= {"kl": (kl.detach() * mask).tolist(), "kl_grad": kl_grad.tolist()}
    return out


def main() -> None:
    torch.set_default_dtype(torch.float64)
    cases = json.load(sys.stdin)
    json.dump({case["name"]: _case(case) for case in cases}, sys.stdout)


if __name__ == "__main__":
    main()
