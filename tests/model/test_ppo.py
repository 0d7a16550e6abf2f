"""PPO with a critic (`lightrail.model.ppo`, `GRPO(advantage="gae")`): GAE and the clipped value loss on fixed
tensors against hand-computed values, the value head trained by the real update on a tiny Llama (its loss falls),
its checkpoint round trip and resume, the served and exported weights without it, and a run through the loop."""

from __future__ import annotations

import json

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.algorithms.grpo import GRPO
from lightrail.engine.models import build_tiny_model
from lightrail.model._loss import gae, value_loss, whiten
from lightrail.model.export import export_checkpoint
from lightrail.model.ppo import PPOUpdater
from lightrail.model.update_config import CriticSettings
from tests.algorithms.grpo_helpers import VOCAB, make_rows, tiny_grpo, tiny_llama

AGENT = "tests.algorithms.loop_agents:parity_agent"  # reward: parity of the sampled reply's length (0 or 1)


# -- the formulas ----------------------------------------------------------------------------------------------------


def test_gae_matches_the_hand_computed_recursion():
    rewards = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    values = torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64)
    adv, ret = gae(rewards, values, gamma=0.9, lam=0.8)
    # delta = [0 + .9*.2 - .5, 0 + .9*.8 - .2, 1 - .8] = [-.32, .52, .2]; A_t = delta_t + .72 * A_{t+1}
    assert adv.tolist() == pytest.approx([-0.32 + 0.72 * (0.52 + 0.72 * 0.2), 0.52 + 0.72 * 0.2, 0.2], abs=1e-12)
    assert ret.tolist() == pytest.approx([0.15808 + 0.5, 0.664 + 0.2, 1.0], abs=1e-12)
    # gamma = lam = 1: every token's advantage is the return minus its own value
    adv, ret = gae(rewards, values, gamma=1.0, lam=1.0)
    assert adv.tolist() == pytest.approx([0.5, 0.8, 0.2], abs=1e-12) and ret.tolist() == pytest.approx([1.0] * 3)
    # lam = 0: one-step TD errors
    adv, _ = gae(rewards, values, gamma=1.0, lam=0.0)
    assert adv.tolist() == pytest.approx([0.2 - 0.5, 0.8 - 0.2, 0.2], abs=1e-12)
    with pytest.raises(ValueError, match="1-D of one length"):
        gae(rewards, values[:2], gamma=1.0, lam=1.0)


def test_clipped_value_loss_matches_hand_values_and_clipped_tokens_get_no_gradient():
    values = torch.tensor([1.0, 0.0, 2.0], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([0.5, 0.5, 2.0], dtype=torch.float64)
    returns = torch.tensor([2.0, 0.0, 1.0], dtype=torch.float64)
    loss, stats = value_loss(values, old, returns, clip=0.2)
    # token 0: max((1-2)^2, (0.7-2)^2) = 1.69; token 1: max(0, (0.3-0)^2) = 0.09; token 2: max(1, 1) = 1
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.09 + 1.0) / 3, abs=1e-12)
    assert float(stats["value_loss"]) == pytest.approx(0.5 * 2.78 / 3, abs=1e-12)
    assert float(stats["value_clip_frac"]) == pytest.approx(2 / 3) and float(stats["value_mean"]) == pytest.approx(1.0)
    loss.backward()
    assert values.grad is not None
    assert values.grad[:2].tolist() == [0.0, 0.0]  # the clipped branch won: the value left the trust region
    unclipped, _ = value_loss(values.detach(), old, returns, clip=None, weights=torch.tensor([1.0, 0.0, 1.0]))
    assert float(unclipped) == pytest.approx(0.5 * (1.0 + 1.0))


def test_whiten_centres_and_scales():
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    w = whiten(x)
    assert float(w.mean()) == pytest.approx(0.0, abs=1e-12) and float(w.std()) == pytest.approx(1.0, abs=1e-6)
    assert whiten(torch.tensor([5.0])).tolist() == [0.0]


# -- the updater -----------------------------------------------------------------------------------------------------


def _rows(n=8, seed=0):
    """`make_rows` with one response per row (the return on its last response token, as `returns_as_rows` gives)."""
    rows = make_rows(n, seed)
    out = []
    for r in rows:
        first = r.loss_mask.index(1)
        end = first
        while end < len(r.loss_mask) and r.loss_mask[end]:
            end += 1
        mask = [1 if first <= t < end else 0 for t in range(end)]
        ret = 1.0 if r.advantages[first] > 0 else 0.0
        out.append(
            type(r)(
                input_ids=r.input_ids[:end],
                loss_mask=mask,
                old_logprobs=r.old_logprobs[:end],
                advantages=[ret if m else 0.0 for m in mask],
                rollout_id=r.rollout_id,
                group_id=r.group_id,
            )  # fmt: skip
        )
    return out


def test_first_gae_advantages_are_the_returns_with_a_fresh_value_head():
    upd = PPOUpdater(tiny_llama(), UpdateConfig(critic=CriticSettings(whiten_advantages=False, gamma=1.0, lam=1.0)))
    rows = _rows()
    for row, out in zip(rows, upd.gae_rows(rows), strict=True):
        n = sum(row.loss_mask)
        assert out.metadata["values"] == [0.0] * n  # zero-initialised head
        assert out.metadata["returns"] == [row.advantages[row.loss_mask.index(1)]] * n
        assert out.advantages == row.advantages
    whitened = PPOUpdater(tiny_llama(), UpdateConfig()).gae_rows(rows)
    flat = torch.tensor([a for r in whitened for a, m in zip(r.advantages, r.loss_mask, strict=True) if m])
    assert float(flat.mean()) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8)], ids=["full", "lora"])
def test_the_value_loss_falls_as_the_head_learns_the_returns(lora):
    upd = PPOUpdater(tiny_llama(), UpdateConfig(lr=1e-2, lora=lora, critic=CriticSettings(value_coef=1.0)))
    rows = _rows()
    metrics = [upd.step(rows) for _ in range(12)]
    first, last = metrics[0], metrics[-1]
    assert first["value_mean"] == 0.0 and first["return_mean"] > 0.0
    assert last["value_loss"] < 0.5 * first["value_loss"], [m["value_loss"] for m in metrics]
    assert upd.value_head.weight.abs().sum() > 0
    served = upd.state_dict_for_serving()
    assert not any("value_head" in k for k in served)  # the engine serves the policy only


def _sample(upd, prompt, n, length, gen):
    """``n`` on-policy rows: responses of ``length`` tokens sampled from the updater's current policy, their return
    (the share of tokens in the lower half of the vocabulary) on the last token, old logprobs the policy's own."""
    from lightrail.types import TrainingRow

    ids = torch.tensor([prompt] * n)
    with torch.no_grad():
        for _ in range(length):
            logits = upd.model(input_ids=ids).logits[:, -1, :].float()
            ids = torch.cat([ids, torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)], dim=1)
    rows = []
    for seq in ids.tolist():
        response = seq[len(prompt) :]
        ret = sum(t < VOCAB // 2 for t in response) / length
        mask = [0] * len(prompt) + [1] * length
        rows.append(TrainingRow(input_ids=seq, loss_mask=mask, old_logprobs=[0.0] * len(seq),
                                advantages=[ret if m else 0.0 for m in mask]))  # fmt: skip
    on_policy = []
    for row, logp in zip(rows, upd.token_logprobs(rows), strict=True):
        it = iter(logp)
        old = [next(it) if m else 0.0 for m in row.loss_mask]
        on_policy.append(msgspec.structs.replace(row, old_logprobs=old))
    return on_policy


def test_a_short_ppo_run_raises_the_reward_of_its_own_samples():
    """Sample from the policy, reward, PPO step, repeat: the mean return of fresh samples rises well above the
    start's ~0.5 (a wrong GAE sign, a critic that swamps the policy loss or a dead gradient keeps it near 0.5)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    upd = PPOUpdater(tiny_llama(seed=3, hidden=64), UpdateConfig(lr=3e-3, kl_coef=0.0))
    prompt = [5, 17, 3, 42, 8]
    mean = lambda rows: sum(r.advantages[-1] for r in rows) / len(rows)  # noqa: E731
    start = mean(_sample(upd, prompt, 64, 6, gen))
    for _ in range(12):
        metrics = upd.step(_sample(upd, prompt, 16, 6, gen))
    end = mean(_sample(upd, prompt, 64, 6, gen))
    assert 0.3 < start < 0.7 and end > start + 0.25, (start, end)
    assert metrics["value_mean"] != 0.0  # the critic trained alongside


def test_checkpoint_round_trip_and_resume_are_exact(tmp_path):
    cfg = UpdateConfig(lr=1e-2, mini_batches=2)
    rows = _rows()
    for i, r in enumerate(rows):
        r.group_id = f"g-{i % 4}"
    a = PPOUpdater(tiny_llama(), cfg)
    a.step(rows)
    a.save(tmp_path / "ckpt")
    saved = load_file(tmp_path / "ckpt" / "trainable.safetensors")
    assert torch.equal(saved["value_head.weight"], a.value_head.weight.detach())
    expected = a.step(rows)

    b = PPOUpdater(tiny_llama(seed=1), cfg)  # other start weights: everything must come from the checkpoint
    b.load(tmp_path / "ckpt")
    got = b.step(rows)
    assert got["loss"] == expected["loss"] and got["value_loss"] == expected["value_loss"]
    assert torch.equal(a.value_head.weight, b.value_head.weight) and torch.equal(a.value_head.bias, b.value_head.bias)
    for name, p in a._trainable.items():
        assert torch.equal(p, b._trainable[name]), name

    grpo = PolicyUpdater(tiny_llama(), cfg)  # a checkpoint without a value head is not silently loaded
    with pytest.raises(ValueError, match="value_head"):
        PPOUpdater(tiny_llama(), cfg).load(grpo.save(tmp_path / "grpo"))


def test_export_drops_the_value_head(tmp_path):
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    upd = PPOUpdater(str(model), UpdateConfig(lr=1e-2))
    upd.step(_rows())
    out = export_checkpoint(upd.save(tmp_path / "ckpt"), tmp_path / "export")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(out)
    served = upd.state_dict_for_serving()
    for name, value in exported.state_dict().items():
        assert torch.equal(value, served[name]), name


# -- settings and the loop ------------------------------------------------------------------------------------------


def test_settings_are_checked_with_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=r"^grpo.advantage: expected one of \[.*'gae'\], got 'ppo'"):
        GRPO("m", advantage="ppo", out_dir=tmp_path)
    with pytest.raises(ValueError, match="gamma and lam must be in"):
        CriticSettings(lam=1.5)
    with pytest.raises(ValueError, match="value_clip > 0"):
        CriticSettings(value_clip=0.0)
    with pytest.raises(ValueError, match="^grpo.merge_calls: advantage 'gae'"):
        GRPO("m", advantage="gae", merge_calls=True, out_dir=tmp_path)
    with pytest.raises(ValueError, match="^grpo.config.ranks: advantage 'gae'"):
        GRPO("m", advantage="gae", config=UpdateConfig(ranks=2), out_dir=tmp_path)
    with pytest.raises(ValueError, match="^grpo.config.sharding: advantage 'gae' does not run with sharding 'fsdp'"):
        GRPO("m", advantage="gae", config=UpdateConfig(ranks=2, sharding="fsdp"), out_dir=tmp_path)


def test_gae_runs_through_the_loop_checkpoints_and_resumes(tmp_path):
    from examples.calculator.data import make_splits

    train, val = make_splits(8, 2, seed=1)
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    grpo = tiny_grpo(model, tmp_path / "run", advantage="gae", steps=2, checkpoint_every=1)
    Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo).fit(AGENT, train, val)
    assert grpo.report["advantage"] == "gae" and grpo.report["steps"] == 2
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["kind"] == "train"]
    assert len(steps) == 2 and all("value_loss" in m and "return_mean" in m for m in steps)
    assert steps[0]["value_mean"] == 0.0  # the head starts at 0
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    assert "value_head.weight" in load_file(ckpt / "trainable.safetensors")

    resumed = tiny_grpo(model, tmp_path / "run", advantage="gae", steps=3, checkpoint_every=1, resume=True)
    Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=resumed).fit(AGENT, train, val)
    assert resumed.report["steps"] == 3
    assert resumed._updater.steps == 3 and resumed._updater.value_head.weight.abs().sum() > 0
