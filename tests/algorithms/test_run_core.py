"""The run core every stage composes (`lightrail.algorithms.run`), tested once against real files and a real store:
resume (the loop state's round trip, RNG included), the set-aside of an earlier run to ``earlier/``, checkpoint
pruning, tracker mirroring, the step cadence, the served policy's token, and what counts as a success."""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import msgspec

from lightrail import MemoryStore
from lightrail.algorithms.protocol import TrainerContext
from lightrail.algorithms.run.folder import LOOP_STATE, RunFolder, latest_checkpoint
from lightrail.algorithms.run.loop import run_steps
from lightrail.algorithms.run.policy import ServedPolicy, succeeded, success_rate, validate
from lightrail.gateway.fake import ScriptedBackend
from lightrail.types import LLM, AttemptStatus, RetryPolicy, RolloutStatus, Task


class Tracker:
    """An experiment tracker that remembers what it was given."""

    def __init__(self) -> None:
        self.records: list[dict] = []

    def __call__(self, record: dict) -> None:
        self.records.append(record)


def lines(folder: RunFolder) -> list[dict]:
    return [json.loads(line) for line in (folder.path / "metrics.jsonl").read_text().splitlines()]


def save(path):
    """What an updater's save does: its files in the checkpoint folder."""
    path.mkdir(parents=True)
    (path / "weights.bin").write_bytes(b"w")


def test_a_resumed_folder_continues_where_its_checkpoint_left_off(tmp_path):
    tracker = Tracker()
    first = RunFolder(tmp_path, "GRPO", seed=3)
    assert first.start(resume=False, track=tracker) == (None, {})
    first.next_indices(3, 10)
    first.step = 1
    first.record({"kind": "train", "step": 1, "loss": 0.5})
    checkpoint = asyncio.run(first.checkpoint(save, policy_version=7))
    after = first.next_indices(4, 10), first.rng.random()
    first.step = 2
    first.record({"kind": "train", "step": 2, "loss": 0.4})  # a step the crash loses
    assert [m["step"] for m in lines(first)] == [1, 2] and tracker.records == first.history

    resumed = RunFolder(tmp_path, "GRPO", seed=99)  # another seed: the checkpoint's RNG wins
    assert resumed.start(resume=True, track=None) == (checkpoint, {"policy_version": 7})
    assert (resumed.step, resumed.history) == (1, [{"kind": "train", "step": 1, "loss": 0.5}])
    assert (resumed.next_indices(4, 10), resumed.rng.random()) == after
    assert lines(resumed) == resumed.history  # the lost step's line is gone: it is redone once
    assert (checkpoint / "weights.bin").exists() and checkpoint == tmp_path / "checkpoints" / "step-1"


def test_the_seeded_order_covers_every_index_once_per_epoch(tmp_path):
    folder = RunFolder(tmp_path, "SFT", seed=0)
    epoch = folder.next_indices(4, 6) + folder.next_indices(2, 6)
    assert sorted(epoch) == list(range(6)) and len(folder.next_indices(10, 6)) == 6
    order = list(range(6))
    random.Random(0).shuffle(order)
    assert epoch == order[::-1]  # popped from the end of a Random(seed) shuffle, as GRPO and SFT always drew


def test_a_fresh_run_sets_the_earlier_one_aside_and_an_empty_resume_keeps_the_pinned_traces(tmp_path):
    (tmp_path / "checkpoints" / "step-4").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-4" / LOOP_STATE).write_text("{}")
    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 4}\n')
    (tmp_path / "traces.json").write_text("{}")
    (tmp_path / "report.json").write_text("{}")
    folder = RunFolder(tmp_path, "SFT")
    assert folder.start(resume=False, track=None) == (None, {})
    (earlier,) = (tmp_path / "earlier").iterdir()
    assert sorted(p.name for p in earlier.iterdir()) == ["checkpoints", "metrics.jsonl", "traces.json"]
    assert latest_checkpoint(earlier).name == "step-4" and latest_checkpoint(tmp_path) is None  # moved, not deleted
    assert (tmp_path / "report.json").exists()  # (rewritten at the end of this run)

    (tmp_path / "traces.json").write_text("{}")
    folder.record({"kind": "data", "step": 0})
    assert RunFolder(tmp_path, "SFT").start(resume=True, track=None) == (None, {})
    assert (tmp_path / "metrics.jsonl").read_text() == "" and (tmp_path / "traces.json").exists()
    assert len(list((tmp_path / "earlier").iterdir())) == 1


def test_checkpoints_are_pruned_to_keep_and_a_step_saved_twice_is_saved_once(tmp_path):
    folder = RunFolder(tmp_path, "GRPO", keep_checkpoints=2)
    folder.start(resume=False, track=None)
    saved = []
    for step in (1, 2, 3, 3, 4):  # step 3 twice: a periodic checkpoint, then the final one
        folder.step = step
        asyncio.run(folder.checkpoint(lambda path: (saved.append(path.name), save(path))))
    assert saved == ["step-1", "step-2", "step-3", "step-4"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-3", "step-4"]
    state = json.loads((tmp_path / "checkpoints" / "step-4" / LOOP_STATE).read_text())
    assert list(state) == ["step", "order", "history", "rng"] and state["step"] == 4


def test_records_are_mirrored_to_the_trackers_and_only_recorded_ones_are_checkpointed(tmp_path):
    tracker = Tracker()
    folder = RunFolder(tmp_path, "APO")
    folder.start(resume=False, track=tracker)
    folder.record({"kind": "val", "step": 0, "val_success": 0.25})
    folder.append({"key": "round:0", "kind": "round", "round": 0})  # APO's records: not loop state
    folder.record({"kind": "val", "step": 3, "val_success": 0.75})
    assert lines(folder) == tracker.records and len(tracker.records) == 3
    assert [m["step"] for m in folder.history] == [0, 3] and folder.first_val() == 0.25
    folder.write_report({"val_after": 0.75})
    assert json.loads((tmp_path / "report.json").read_text()) == {"val_after": 0.75}


def test_the_step_cadence_trains_validates_checkpoints_then_updates_the_bar(tmp_path):
    folder = RunFolder(tmp_path, "GRPO")
    folder.step = 1  # resumed after step 1
    events: list[str] = []

    async def train_step() -> str:
        folder.step += 1
        events.append(f"train {folder.step}")
        return "status"

    async def validate_() -> float:
        events.append(f"val {folder.step}")
        return 0.5

    async def checkpoint() -> None:
        events.append(f"checkpoint {folder.step}")

    asyncio.run(
        run_steps(folder, 6, train_step=train_step, validate=validate_, checkpoint=checkpoint, val_every=2,
                  checkpoint_every=3)
    )  # fmt: skip
    assert events == ["train 2", "val 2", "train 3", "checkpoint 3", "train 4", "val 4", "train 5", "train 6",
                      "checkpoint 6"]  # fmt: skip  # (no validation at the last step: the stage validates at its end)


def test_success_counts_policy_outcomes_only(tmp_path):
    """Success is the share of rollouts with a policy outcome (succeeded, failed, timed out) whose reward reaches
    the threshold; infrastructure errors and cancellations are left out of it and counted."""
    outcomes = [(AttemptStatus.SUCCEEDED, 1.0), (AttemptStatus.SUCCEEDED, 0.5), (AttemptStatus.FAILED, None),
                (AttemptStatus.TIMEOUT, None), (AttemptStatus.INFRA_ERROR, None), ("cancel", None)]  # fmt: skip
    store = MemoryStore()
    ctx = TrainerContext(store=store, train_tasks=[], retry=RetryPolicy(max_attempts=1))
    llm = LLM(endpoint="http://127.0.0.1:9/v1", model="policy", sampling={"temperature": 0.0})

    async def runner() -> None:  # ends each rollout with its task's scripted outcome
        for _ in outcomes:
            lease = await store.lease("runner", wait_s=5)
            assert lease is not None
            status, reward = outcomes[lease.rollout.task.input["i"]]
            if status == "cancel":
                await store.cancel([lease.rollout.rollout_id])
            else:
                await store.finish(lease.attempt.attempt_id, status, reward=reward)

    async def main():
        tasks = [Task(input={"i": i}) for i in range(len(outcomes))]
        val, _ = await asyncio.gather(validate(ctx, tasks, llm, 1.0, metadata={"step": 3}), runner())
        return val, (await store.get_resources(val.rollouts[0].resources_version)).items["llm"]

    val, published = asyncio.run(main())
    assert published == llm and all(r.metadata == {"step": 3} for r in val.rollouts)
    assert [r.status for r in val.rollouts][-2:] == [RolloutStatus.INFRA_ERROR, RolloutStatus.CANCELLED]
    assert val.success == 1 / 4 and success_rate(val.rollouts, 0.5) == 2 / 4 and success_rate([], 1.0) == 0.0
    assert [succeeded(r, 0.5) for r in val.rollouts] == [True, True, False, False, False, False]
    # one meaning for every algorithm (APO's too): a failed rollout that carries a reward is judged by its reward
    assert succeeded(msgspec.structs.replace(val.rollouts[2], reward=1.0), 1.0)
    assert not succeeded(msgspec.structs.replace(val.rollouts[4], reward=1.0), 1.0)  # infrastructure: never
    assert val.metrics(3, policy_version=2) == {
        "kind": "val", "step": 3, "policy_version": 2, "val_success": 0.25, "val_rollouts": 6, "val_infra_excluded": 2,
    }  # fmt: skip


def test_a_served_policy_is_reached_with_its_own_token():
    async def main():
        served = await ServedPolicy.start(ScriptedBackend(), MemoryStore(), name="policy")
        try:
            llm = served.llm({"temperature": 0.0})
            async with httpx.AsyncClient() as client:
                ok = await client.get(f"{llm.base_url()}/models", headers={"Authorization": f"Bearer {llm.api_key}"})
                refused = await client.get(f"{llm.base_url()}/models")
            return llm, served.gateway, ok.status_code, refused.status_code
        finally:
            await served.close()

    llm, gateway, ok, refused = asyncio.run(main())
    assert (llm.endpoint, llm.model, llm.api_key) == (gateway.url, "policy", gateway.token) and len(llm.api_key) >= 20
    assert (ok, refused) == (200, 401)
