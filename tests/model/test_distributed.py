"""`DistributedPolicyUpdater` with real processes and gloo: 2 ranks update the policy like 1 (full and LoRA, two
steps, optimizer state included), checkpoints, failing workers, no orphans, torchrun, and `GRPO` on 2 ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.engine.models import build_tiny_model
from lightrail.model.distributed import DistributedPolicyUpdater, RankFailedError, shard_by_tokens
from tests.algorithms.grpo_helpers import make_rows, tiny_grpo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ddp") / "model", size="tiny", seed=0)


def _rows():
    # 9 rows of uneven length, rollouts spanning rows (so spanning ranks), 2 with nothing to learn from.
    return make_rows(9, seed=1, zero_adv_rows=2)


def _state(upd: PolicyUpdater) -> dict[str, torch.Tensor]:
    """Trainable weights, their last gradients and AdamW's moments, by name."""
    out = {}
    for name, p in upd._trainable.items():
        out[name] = p.detach().clone()
        out[f"{name}.grad"] = p.grad.clone()
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{name}.{key}"] = upd.optimizer.state[p][key].clone()
    return out


def test_shard_by_tokens_balances_deterministically():
    lengths = [30, 5, 9, 3, 9, 1, 12]
    shards = shard_by_tokens(lengths, 2)
    assert sorted(i for s in shards for i in s) == list(range(7))
    loads = [sum(lengths[i] for i in s) for s in shards]
    assert shards == [[0, 1], [2, 3, 4, 5, 6]] and loads == [35, 34]
    assert shard_by_tokens(lengths, 2) == shards  # the same rows always land on the same ranks
    assert shard_by_tokens([4], 3) == [[0], [], []]  # fewer rows than ranks: empty shards


@pytest.mark.parametrize(
    "config",
    [
        UpdateConfig(lr=1e-3, micro_batch_tokens=40, loss_norm="rollout", kl_coef=0.05),
        UpdateConfig(lr=1e-3, micro_batch_tokens=40, loss_norm="token", lora=LoraSettings(r=4, alpha=8)),
    ],
    ids=["full", "lora"],
)
def test_two_ranks_update_the_policy_like_one(model_dir, config):
    rows = _rows()
    one = PolicyUpdater(str(model_dir), config)
    expected = [one.step(rows), one.step(rows)]
    with DistributedPolicyUpdater(str(model_dir), UpdateConfig(**{**vars(config), "ranks": 2})) as two:
        got = [two.step(rows), two.step(rows)]
        fingerprints = two.replica_fingerprints()
    for want, have in zip(expected, got, strict=True):
        for key in ("loss", "pg_loss", "kl_ref", "grad_norm", "entropy", "clip_frac", "ratio_max"):
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
        for key in ("tokens", "response_tokens", "micro_batches", "rows", "rows_zero_adv_skipped", "step"):
            assert have[key] == want[key], key
    a, b = _state(one), _state(two)
    assert a.keys() == b.keys()
    for key in a:  # weights, gradients and both Adam moments after two steps
        assert float((a[key] - b[key]).abs().max()) <= 1e-5, key
    # The worker's replica is rank 0's, bit for bit (a diverged rank would also have spoiled step 2 above).
    assert fingerprints[0] == fingerprints[1] and fingerprints[0][0] == 2.0


def test_checkpoint_save_and_load_with_ranks(model_dir, tmp_path):
    rows, later = _rows(), make_rows(7, seed=5)
    config = UpdateConfig(lr=1e-3, micro_batch_tokens=40, lora=LoraSettings(r=4, alpha=8), ranks=2)
    with DistributedPolicyUpdater(str(model_dir), config) as first:
        first.step(rows)
        first.save(tmp_path / "ckpt")
        uninterrupted = first.step(later)
        weights = {n: p.detach().clone() for n, p in first._trainable.items()}
    assert json.loads((tmp_path / "ckpt" / "updater.json").read_text())["steps"] == 1
    with DistributedPolicyUpdater(str(model_dir), config) as resumed:
        resumed.load(tmp_path / "ckpt")  # every rank loads, then the replicas are compared
        assert resumed.steps == 1
        again = resumed.step(later)
        fingerprints = resumed.replica_fingerprints()
        for name, p in resumed._trainable.items():
            torch.testing.assert_close(p.detach(), weights[name], atol=0, rtol=0, msg=name)
    assert again["loss"] == uninterrupted["loss"] and fingerprints[0] == fingerprints[1]


def test_a_worker_that_dies_fails_the_step_with_its_rank(model_dir):
    upd = DistributedPolicyUpdater(str(model_dir), UpdateConfig(ranks=2), timeout_s=60)
    try:
        (pid,) = upd.worker_pids
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(RankFailedError, match=rf"rank 1 \(pid {pid}\) killed by SIGKILL"):
            upd.step(_rows())
        assert time.monotonic() - t0 < upd.timeout_s  # reported when it died, not when the step timed out
        with pytest.raises(RankFailedError, match="close"):  # no half-updated replicas are used again
            upd.step(_rows())
    finally:
        upd.close()


def test_a_hung_worker_times_out_instead_of_hanging(model_dir):
    upd = DistributedPolicyUpdater(str(model_dir), UpdateConfig(ranks=2), timeout_s=5)
    try:
        (pid,) = upd.worker_pids
        os.kill(pid, signal.SIGSTOP)
        with pytest.raises(RankFailedError, match=rf"step failed on rank 0 .*rank 1 \(pid {pid}\) still running"):
            upd.step(_rows())
    finally:
        upd.close()  # kills the stopped worker
    assert upd._workers[0].process.exitcode == -signal.SIGKILL


_TRAINER = """
import sys, time
from lightrail.model import UpdateConfig
from lightrail.model.distributed import DistributedPolicyUpdater
if __name__ == "__main__":
    upd = DistributedPolicyUpdater(sys.argv[1], UpdateConfig(ranks=2))
    print(upd.worker_pids[0], flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"  # an unreaped zombie has exited


def test_workers_die_with_a_killed_trainer(model_dir, tmp_path):
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    trainer = subprocess.Popen([sys.executable, str(script), str(model_dir)], stdout=subprocess.PIPE, env=env)
    try:
        worker = int(trainer.stdout.readline())
        assert _alive(worker)
    finally:
        trainer.kill()  # kill -9: no chance to close() anything
        trainer.wait()
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


_TORCHRUN = """
import sys
from tests.algorithms.grpo_helpers import make_rows
from lightrail.model import UpdateConfig
from lightrail.model.distributed import DistributedPolicyUpdater
from safetensors.torch import save_file

upd = DistributedPolicyUpdater(sys.argv[1], UpdateConfig(lr=1e-3, micro_batch_tokens=40))
if upd.rank == 0:
    upd.step(make_rows(9, seed=1, zero_adv_rows=2))
    save_file({k: v.clone() for k, v in upd.state_dict_for_serving().items()}, sys.argv[2])  # tied: copies
    upd.close()
else:
    upd.serve()
"""


def test_torchrun_ranks_update_like_one(model_dir, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_TORCHRUN)
    out = tmp_path / "served.safetensors"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", str(script), str(model_dir), str(out)]
    subprocess.run(cmd, env=env, check=True, timeout=300, capture_output=True)
    from safetensors.torch import load_file

    one = PolicyUpdater(str(model_dir), UpdateConfig(lr=1e-3, micro_batch_tokens=40))
    one.step(_rows())
    served = load_file(out)
    for name, value in one.state_dict_for_serving().items():
        assert float((served[name] - value).abs().max()) <= 1e-5, name


@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_grpo_trains_on_two_ranks(model_dir, tmp_path, sharding):
    from examples.calculator.data import make_splits
    from lightrail import MemoryStore, Trainer

    train, val = make_splits(4, 2, seed=1)
    # Four groups of 4 (not tiny_grpo's two): a step is skipped when every group's rewards are equal (the parity of
    # a sampled length: at least 1 in 8 per group), which two groups did at least 1 run in 64, four 1 in 4,096.
    config = UpdateConfig(lr=1e-3, ranks=2, sharding=sharding)
    grpo = tiny_grpo(model_dir, tmp_path / "run", tasks_per_step=4, config=config)
    Trainer(n_runners=1, concurrency=4, store=MemoryStore(), algorithm=grpo).fit(
        "tests.algorithms.loop_agents:parity_agent", train, val
    )
    updater = grpo._updater
    assert isinstance(updater, DistributedPolicyUpdater) and updater.world_size == 2
    assert [w.process.exitcode for w in updater._workers] == [0]  # closed cleanly with the run
    (step,) = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"train"' in line
    ]
    assert step["rollouts"] == 16 and not step["skipped"] and step["policy_version"] == 1
    saved = json.loads((Path(grpo.report["checkpoint"]) / "updater.json").read_text())["config"]
    assert saved["ranks"] == 2 and saved["sharding"] == sharding
