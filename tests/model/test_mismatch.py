"""Train–inference mismatch (`lightrail.model.mismatch`): measured per row in the update's forward pass, flagged,
and enforced by `GRPO`: a deliberately broken weight sync stops the run within one step with a one-line cause, and a
prompt re-rendered by a changed chat template is flagged. Real tiny models, real engine and gateway; the faults are
injected by skipping the engine's weight loading (or its whole sync)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import PolicyUpdater, UpdateConfig
from lightrail.engine import Engine, build_tiny_model
from lightrail.model._loss import mismatch_kl
from lightrail.model.mismatch import MismatchError, RowMismatch, stop_cause, summarize, unserved_cause
from lightrail.model.rollout_engines import EmbeddedRollouts
from lightrail.types import ChatRequest, SamplingParams, TrainingRow
from tests.algorithms.grpo_helpers import make_rows, tiny_grpo, tiny_llama


def _row(version: int | None, agent: str, rollout: str = "ro") -> TrainingRow:
    return TrainingRow(
        input_ids=[1, 2], loss_mask=[0, 1], old_logprobs=[0.0, -1.0], advantages=[0.0, 1.0],
        rollout_id=rollout, policy_version=version, metadata={"agent_name": agent},
    )  # fmt: skip


def test_mismatch_kl_is_k3_in_float64():
    logp = torch.tensor([-1.0, -2.0, -1.0 + 1e-7])
    kl = mismatch_kl(logp, torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64))
    assert kl.dtype == torch.float64 and kl[0] == 0.0
    assert kl[1].item() == pytest.approx(torch.e**-1 - 1 + 1)
    assert 0 < kl[2].item() < 1e-13  # float32 rounding noise, not (r - 1) - log r's cancellation


def test_rows_are_summarized_per_version_and_agent_and_flagged():
    measured = [
        RowMismatch(_row(3, "write", "ro-a"), kl=1e-9, kl_max=1e-8, tokens=10),
        RowMismatch(_row(3, "rewrite", "ro-b"), kl=0.2, kl_max=0.9, tokens=30),
        RowMismatch(_row(None, "write", "ro-c"), kl=0.01, kl_max=0.02, tokens=10),
    ]
    m = summarize(measured, flag=1e-3)
    assert m["mismatch_kl_mean"] == pytest.approx((1e-8 + 6 + 0.1) / 50)
    assert m["mismatch_kl_max"] == 0.2 and m["mismatch_rows"] == 3 and m["mismatch_rows_flagged"] == 2
    assert m["mismatch_flagged"] == ["ro-b", "ro-c"]  # worst first
    assert set(m["mismatch_by_version"]) == {"3", "-"} and m["mismatch_by_version"]["3"]["flagged"] == 1
    assert m["mismatch_by_agent"]["write"] == {"kl_mean": pytest.approx(0.005 + 5e-10), "kl_max": 0.01,
                                               "rows": 2, "flagged": 1}  # fmt: skip
    json.dumps(m)  # a metrics.jsonl line

    assert stop_cause(measured, None, synced=3) is None
    assert stop_cause(measured, 0.5, synced=3) is None
    cause = stop_cause(measured, 0.05, synced=3)
    assert "version 3, synced after the last update: the weight sync did not take" in cause and "\n" not in cause
    assert "before any update" in stop_cause(measured, 0.05, synced=None)
    assert unserved_cause(4, 4) is None
    assert unserved_cause(3, 4) == (
        "the rollout engine still serves policy version 3 after update 4: the weight sync did not take"
    )


def test_the_update_measures_the_mismatch_before_its_optimizer_step():
    updater = PolicyUpdater(tiny_llama(), UpdateConfig(lr=1e-2))
    rows = make_rows(6, seed=3)
    own = updater.token_logprobs(rows)
    for row, lps in zip(rows, own, strict=True):  # the sampler recorded exactly the trainer's logprobs
        it = iter(lps)
        row.old_logprobs = [next(it) if m else 0.0 for m in row.loss_mask]
    off = rows[2]
    off.old_logprobs = [lp - 0.5 if m else 0.0 for lp, m in zip(off.old_logprobs, off.loss_mask, strict=True)]
    metrics = updater.step(rows)
    assert metrics["step"] == 1
    by_row = {id(m.row): m for m in updater.last_mismatch}
    assert len(by_row) == 6
    assert by_row[id(off)].kl == pytest.approx(torch.e**0.5 - 1 - 0.5, rel=1e-5)  # r = e^0.5 on every token
    assert all(m.kl < 1e-12 for m in updater.last_mismatch if m.row is not off)
    assert summarize(updater.last_mismatch, flag=1e-3)["mismatch_flagged"] == [off.rollout_id]
    tokens = sum(m.tokens for m in updater.last_mismatch)
    assert metrics["mismatch_kl"] == pytest.approx(by_row[id(off)].kl * by_row[id(off)].tokens / tokens)


async def test_a_prompt_rendered_by_a_changed_chat_template_is_flagged(tmp_path):
    """The trainer never re-renders prompts (rows hold the token ids the engine saw), so a changed chat template can
    only reach it as rows whose context is not the sampler's: here the same sampled responses behind a prompt
    rendered with an extra system turn. Their logprobs no longer match; the engine's own prompts match to ~1e-13."""
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    engine = Engine.from_pretrained(str(model), name="tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    seen, rerendered = [], []
    try:
        for i in range(6):
            messages = [{"role": "user", "content": f"What is {i}+{3 * i}?"}]
            sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=i)
            gen = await engine.chat(ChatRequest(model="tiny", messages=messages, sampling=sampling))
            choice = gen.choices[0]
            changed = tokenizer.apply_chat_template(
                [{"role": "system", "content": "Be terse."}, *messages], tokenize=False, add_generation_prompt=True
            )
            for prompt, out in ((list(gen.prompt_ids), seen), (tokenizer.encode(changed, add_special_tokens=False), rerendered)):  # fmt: skip
                n, r = len(prompt), len(choice.token_ids)
                out.append(
                    TrainingRow(
                        input_ids=prompt + choice.token_ids, loss_mask=[0] * n + [1] * r,
                        old_logprobs=[0.0] * n + choice.logprobs, advantages=[0.0] * n + [1.0] * r,
                        rollout_id=f"ro-{i}", policy_version=gen.policy_version, metadata={"agent_name": "solver"},
                    )
                )  # fmt: skip
    finally:
        await engine.close()
    updater = PolicyUpdater(str(model), UpdateConfig(lr=1e-3))
    updater.step(seen)
    healthy = summarize(updater.last_mismatch, flag=1e-3)
    updater = PolicyUpdater(str(model), UpdateConfig(lr=1e-3))
    updater.step(rerendered)
    drifted = summarize(updater.last_mismatch, flag=1e-3)
    assert healthy["mismatch_kl_max"] < 1e-9 and healthy["mismatch_rows_flagged"] == 0
    assert drifted["mismatch_rows_flagged"] == 6 and drifted["mismatch_kl_mean"] > 1e-3
    assert "before any update" in stop_cause(updater.last_mismatch, 1e-3, synced=None)


def _skip_weight_loading(monkeypatch):
    """The fault: the engine bumps its version but keeps its weights (a sync that did not take)."""
    monkeypatch.setattr(Engine, "_load_state", lambda self, state: None)


def _skip_sync(monkeypatch):
    """The fault: the sync returns without reaching the engine (its version does not advance)."""

    async def sync(self, updater, version):
        return None

    monkeypatch.setattr(EmbeddedRollouts, "sync", sync)


@pytest.mark.parametrize(
    ("fault", "stopped_at", "cause"),
    [
        (None, None, None),
        (_skip_weight_loading, 2, "version 1, synced after the last update: the weight sync did not take"),
        (
            _skip_sync,
            1,
            "the rollout engine still serves policy version 0 after update 1: the weight sync did not take",
        ),
    ],
    ids=["healthy", "weights-not-loaded", "version-not-served"],
)
def test_a_broken_sync_stops_the_run_within_one_step(tmp_path, monkeypatch, fault, stopped_at, cause):
    from examples.calculator.data import make_splits

    if fault is not None:
        fault(monkeypatch)
    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    train, val = make_splits(8, 2, seed=1)
    grpo = tiny_grpo(model, tmp_path / "run", config=UpdateConfig(lr=1e-2), steps=3, mismatch_stop=0.02)
    trainer = Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo)
    lines = tmp_path / "run" / "metrics.jsonl"
    if fault is None:
        trainer.fit("tests.algorithms.loop_agents:parity_agent", train, val)
        records = [json.loads(line) for line in lines.read_text().splitlines()]
        steps = [m for m in records if m["kind"] == "train"]
        assert len(steps) == 3 and not [m for m in records if m["kind"] == "stop"]
        assert all(m["mismatch_kl_mean"] < 1e-6 and m["mismatch_rows_flagged"] == 0 for m in steps), steps
        assert all(m["mismatch_by_agent"] and m["mismatch_by_version"] for m in steps if m["mismatch_rows"])
        return
    with pytest.raises(MismatchError) as stopped:
        trainer.fit("tests.algorithms.loop_agents:parity_agent", train, val)
    assert cause in str(stopped.value) and "\n" not in str(stopped.value)
    records = [json.loads(line) for line in lines.read_text().splitlines()]
    steps = [m for m in records if m["kind"] == "train"]
    # a step whose groups all tie is skipped and syncs nothing: the fault shows from the first step that synced (the
    # engine not advancing), or the first step after it that measured rows of the synced version (weights not loaded)
    synced = next(m["step"] for m in steps if not m["skipped"])
    expected = (
        synced if stopped_at == 1 else next(m["step"] for m in steps if m["step"] > synced and m["mismatch_rows"])
    )
    assert steps[-1]["step"] == expected and expected <= stopped_at + 1, steps
    (stop,) = [m for m in records if m["kind"] == "stop"]
    assert stop["step"] == expected and stop["cause"] == str(stopped.value)


async def test_a_bfloat16_engine_is_measured_and_corrected_in_sync_mode(tmp_path):
    """An embedded engine sampling in bfloat16 (``engine_options: {dtype: bfloat16}``): a sync run's update weighs
    its tokens by truncated IS (`sampler_correction`), the mismatch is measured far above float32's ~1e-13 and below
    the default stop, and each token's weight is near 1; a float32 engine's run keeps the plain ratio."""
    from lightrail.algorithms.grpo import sampler_correction
    from lightrail.algorithms.settings import DEFAULT_IS_CAP

    model = build_tiny_model(tmp_path / "model", size="tiny", seed=0)
    rollouts = {dtype: EmbeddedRollouts(str(model), dtype=dtype, name="tiny") for dtype in ("bfloat16", "float32")}
    rows = []
    try:
        for r in rollouts.values():
            await r.start()
        dtypes = {name: r.sampling_dtype for name, r in rollouts.items()}
        for i in range(6):
            messages = [{"role": "user", "content": f"What is {i}+{3 * i}?"}]
            sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=i)
            gen = await rollouts["bfloat16"].engine.chat(
                ChatRequest(model="tiny", messages=messages, sampling=sampling)
            )
            prompt, (choice,) = list(gen.prompt_ids), gen.choices
            n, k = len(prompt), len(choice.token_ids)
            rows.append(
                TrainingRow(
                    input_ids=prompt + choice.token_ids, loss_mask=[0] * n + [1] * k,
                    old_logprobs=[0.0] * n + choice.logprobs, advantages=[0.0] * n + [1.0 - (i % 2) * 2.0] * k,
                    rollout_id=f"ro-{i}", policy_version=gen.policy_version, metadata={"agent_name": "solver"},
                )
            )  # fmt: skip
    finally:
        for r in rollouts.values():
            await r.close()
    assert dtypes == {"bfloat16": "bfloat16", "float32": "float32"}
    plain = UpdateConfig(lr=1e-3)
    assert sampler_correction(plain, False, dtypes["float32"]).is_cap is None
    assert sampler_correction(plain, False, None).is_cap is None  # an engine whose dtype is unknown (vLLM)
    assert sampler_correction(plain, True, "bfloat16") is plain
    assert sampler_correction(UpdateConfig(lr=1e-3, mini_batches=2), False, "bfloat16").is_cap is None
    config = sampler_correction(plain, False, dtypes["bfloat16"])
    assert config.is_cap == DEFAULT_IS_CAP
    metrics = PolicyUpdater(str(model), config).step(rows)
    assert 1e-7 < metrics["mismatch_kl"] < 0.02
    assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=0.05)
    assert PolicyUpdater(str(model), plain).step(rows)["is_weight_mean"] == 0.0  # uncorrected: the plain ratio
