"""Asynchronous GRPO (``GRPO(async_=...)``, a config's ``grpo.async``): the truncated importance-sampling loss on fixed tensors, the settings'
checks, and the pipeline through the real trainer, gateway, engine and runners on a tiny model: each call's staleness
across a weight sync in the middle of a rollout, the ``max_staleness`` bound, no rollout trained twice, and resume."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import UpdateConfig
from lightrail.algorithms.grpo import GRPO
from lightrail.algorithms.settings import AsyncSection, GRPOSection
from lightrail.engine.models import build_tiny_model
from lightrail.model._loss import policy_loss, tis_weights
from lightrail.types import Attr

AGENT = "loop_agents:two_call_agent"


# -- the correction's formula ---------------------------------------------------------------------------------------


def test_truncated_importance_weights_on_fixed_tensors():
    logp = torch.tensor([-1.0, -2.0, -0.5, -3.0], requires_grad=True)
    sampler = torch.tensor([-1.0, -1.0, -2.0, -3.5])  # the logprobs recorded when the tokens were sampled
    adv = torch.tensor([1.0, -1.0, 2.0, 0.5])
    w, capped = tis_weights(logp, sampler, cap=2.0)
    expected = [1.0, math.exp(-1.0), 2.0, math.exp(0.5)]  # min(exp(logp - sampler), 2): e^1.5 is capped
    assert w.tolist() == pytest.approx(expected) and capped.tolist() == [False, False, True, False]

    loss, stats = policy_loss(logp, sampler, adv, is_cap=2.0)
    # the ratio is against the trainer's own (detached) logprobs: 1 in value, so the loss is -mean(w * A) ...
    assert float(loss.detach()) == pytest.approx(-sum(wi * a for wi, a in zip(expected, adv.tolist(), strict=True)) / 4)
    loss.backward()
    # ... and its gradient TIS's policy gradient: -w_t * A_t / N per token
    assert logp.grad.tolist() == pytest.approx([-wi * a / 4 for wi, a in zip(expected, adv.tolist(), strict=True)])
    assert float(stats["is_weight_mean"]) == pytest.approx(sum(expected) / 4)
    assert float(stats["is_clipped_frac"]) == pytest.approx(0.25)
    assert float(stats["clip_frac"]) == 0.0

    # without the correction the ratio is against the sampler, and the clip zeroes the far tokens' gradient
    plain = logp.detach().clone().requires_grad_(True)
    loss, stats = policy_loss(plain, sampler, adv)
    loss.backward()
    assert plain.grad[2] == 0.0 and float(stats["is_weight_mean"]) == 0.0


def test_async_settings_are_checked_in_one_line():
    """`AsyncSection` fills its defaults and checks itself; the section refuses what async cannot run with."""
    assert GRPOSection(async_=True).async_settings == AsyncSection(max_staleness=1, ahead=None)
    assert AsyncSection(max_staleness=3).steps_ahead == 3 and AsyncSection(max_staleness=0).steps_ahead == 1
    assert GRPOSection().async_settings is None  # sync
    cases = [
        ({"async_": {"max_staleness": -1}}, "grpo.async.max_staleness must be >= 0"),
        ({"async_": {"ahead": 0}}, "grpo.async.ahead must be >= 1"),
        ({"async_": True, "filter_groups": True}, "grpo.async: not with filter_groups"),
        ({"async_": True, "advantage": "gae"}, "grpo.async: not with advantage gae"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message) as err:
            GRPOSection(**kwargs)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="grpo.config.mini_batches: async weighs stale tokens against the pre-update"):
        GRPOSection(async_=True).check_update(UpdateConfig(mini_batches=2))


# -- the pipeline through the real loop -----------------------------------------------------------------------------


class _ObservedGRPO(GRPO):
    """`GRPO` that lets the test line up a weight sync in the middle of step 2's rollouts: step 1's update starts
    only once every rollout of step 2 made its first call (on version 0), and each sync touches ``synced``, which
    the agent's second call waits for."""

    def __init__(self, *args, markers, expect_first_calls, **kwargs):
        super().__init__(*args, **kwargs)
        self.markers = markers
        self.expect_first_calls = expect_first_calls

    async def _update(self, slot, transitions):
        if self.step == 0:
            for _ in range(1200):
                if len(list(self.markers.glob("first-*"))) >= self.expect_first_calls:
                    break
                await asyncio.sleep(0.05)
        return await super()._update(slot, transitions)

    async def _sync(self, slot, version):
        await super()._sync(slot, version)
        (self.markers / "synced").touch()


def _settings(tmp_path, **kwargs):
    return dict(
        config=UpdateConfig(lr=1e-3),
        tasks_per_step=1,
        n_samples=2,
        sampling={"temperature": 1.0, "max_tokens": 6},
        val_sampling={"temperature": 0.0, "max_tokens": 6},
        validate_before=False,
        val_every=0,
        checkpoint_every=1,
        out_dir=tmp_path / "run",
        **{"async_": True, **kwargs},
    )


def _problems(n: int):
    from examples.calculator.data import make_splits

    return make_splits(n, 2, seed=1)


def _fit(grpo: GRPO, train, val, store: MemoryStore) -> None:
    Trainer(n_runners=1, concurrency=4, store=store, algorithm=grpo).fit(AGENT, train, val)


def _train_steps(out_dir):
    lines = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {m["step"]: m for m in lines if m["kind"] == "train"}


async def _trained(store: MemoryStore):
    """{rollout id: (its training steps, the policy versions of its LLM calls in order, its trained calls)}."""
    out = {}
    for r in await store.query_rollouts():
        if r.mode != "train":
            continue
        spans = sorted(await store.query_spans(r.rollout_id), key=lambda s: s.seq)
        versions = [s.attributes.get(Attr.POLICY_VERSION) for s in spans if s.name == Attr.SPAN_LLM_CALL]
        training = [s.attributes for s in spans if s.name == Attr.SPAN_TRAINING]
        steps = [a[Attr.TRAINING_STEP] for a in training]
        calls = [c for a in training for c in a[Attr.TRAINING_CALLS]]
        out[r.rollout_id] = (r, steps, versions, calls)
    return out


@pytest.mark.parametrize("max_staleness", [1, 0])
def test_staleness_is_per_call_across_a_sync_in_the_middle_of_a_rollout(tmp_path, monkeypatch, max_staleness):
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("LIGHTRAIL_TEST_MARKERS", str(markers))
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = _problems(4)
    store = MemoryStore()
    grpo = _ObservedGRPO(
        model,
        steps=2,
        markers=markers,
        expect_first_calls=2,
        **_settings(tmp_path, async_={"max_staleness": max_staleness, "ahead": 1}),
    )
    _fit(grpo, train, val, store)
    steps = _train_steps(tmp_path / "run")
    assert sorted(steps) == [1, 2]
    assert steps[1]["staleness_max"] == 0 and steps[1]["dropped_stale"] == 0 and not steps[1]["skipped"]
    # step 1 is on-policy: the truncated importance weights are 1 up to float32 numerics
    assert steps[1]["is_weight_mean"] == pytest.approx(1.0, abs=1e-4) and steps[1]["is_clipped_frac"] == 0.0

    trained = asyncio.run(_trained(store))
    by_step = {}
    for rollout, train_steps, versions, calls in trained.values():
        assert len(train_steps) <= 1, f"rollout {rollout.rollout_id} trained at steps {train_steps}"  # never twice
        if train_steps:  # admission is in enqueue order: a rollout is trained at the step it was enqueued for
            assert train_steps[0] == rollout.metadata["step"]
            by_step.setdefault(train_steps[0], []).append((versions, calls))
    assert [len(by_step[s]) for s in (1, 2)] == [2, 2]
    assert all(versions == [0, 0] and len(calls) == 2 for versions, calls in by_step[1])
    # step 2's rollouts made their first call on version 0 and their second after the sync to version 1; the
    # trainer was at version 1 for step 2, so their calls are 1 and 0 versions old
    assert all(versions == [0, 1] for versions, _ in by_step[2])
    if max_staleness == 1:
        assert steps[2]["staleness_max"] == 1 and steps[2]["staleness_mean"] == pytest.approx(0.5)
        assert steps[2]["dropped_stale"] == 0
        assert all(len(calls) == 2 for _, calls in by_step[2])
    else:  # the bound: each rollout's stale first call is dropped, its fresh second call trained
        assert steps[2]["staleness_max"] == 0 and steps[2]["dropped_stale"] == 2
        assert all([c["turn"] for c in calls] == [1] for _, calls in by_step[2])


def test_a_resumed_async_run_samples_the_batches_it_had_in_flight(tmp_path):
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = _problems(8)
    first_store, resumed_store = MemoryStore(), MemoryStore()
    _fit(GRPO(model, steps=3, **_settings(tmp_path)), train, val, first_store)
    step1 = json.loads((tmp_path / "run" / "checkpoints" / "step-1" / "loop_state.json").read_text())
    assert len(step1["pending"]) == 1  # step 2's batch was sampling when step 1's checkpoint was written
    # interrupted after step 1: only its checkpoint is left
    for name in ("step-2", "step-3"):
        import shutil

        shutil.rmtree(tmp_path / "run" / "checkpoints" / name)
    resumed = GRPO(model, steps=3, resume=True, **_settings(tmp_path))
    _fit(resumed, train, val, resumed_store)
    assert resumed.report["steps"] == 3

    def tasks_by_step(store):
        out = {}
        for rollout, steps, _, _ in asyncio.run(_trained(store)).values():
            assert len(steps) <= 1
            for step in steps:
                out.setdefault(step, []).append(json.dumps(rollout.task.input, sort_keys=True))
        return {step: sorted(tasks) for step, tasks in out.items()}

    first, again = tasks_by_step(first_store), tasks_by_step(resumed_store)
    assert sorted(first) == [1, 2, 3] and sorted(again) == [2, 3]
    # the resumed run trained the tasks the interrupted one had in flight, then continued its order
    assert again[2] == first[2] and again[3] == first[3]
    state = json.loads((tmp_path / "run" / "checkpoints" / "step-3" / "loop_state.json").read_text())
    assert [m["step"] for m in state["history"] if m["kind"] == "train"] == [1, 2, 3] and state["pending"] == []
