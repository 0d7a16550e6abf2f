"""`Chain`'s own duties, apart from running its stages (`test_sft_traces.py` runs a whole SFT-then-GRPO config):
a fresh chained run sets every stage's earlier run aside before the first stage starts, and stages never share a
folder."""

from __future__ import annotations

import asyncio
import json

import pytest

from lightrail.algorithms import GRPO, SFT
from lightrail.algorithms.chain import Chain
from lightrail.algorithms.run.folder import LOOP_STATE, latest_checkpoint


def earlier_run(out_dir, step):
    """What a finished run leaves in a stage's folder: its metrics and a complete checkpoint."""
    (out_dir / "checkpoints" / f"step-{step}").mkdir(parents=True)
    (out_dir / "checkpoints" / f"step-{step}" / LOOP_STATE).write_text("{}")
    (out_dir / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": step}) + "\n")


def test_a_fresh_chain_sets_aside_every_stages_earlier_run_before_the_first_stage_starts(tmp_path):
    # the crash this prevents: a fresh run dies during SFT, then `--resume` (every stage resuming) would have GRPO
    # continue the earlier run's step-40 once SFT is done, and report that run's result as this one's
    earlier_run(tmp_path / "sft", 600)
    earlier_run(tmp_path / "grpo", 40)
    sft = SFT("base", out_dir=tmp_path / "sft")
    chain = Chain([sft, GRPO(sft.output_model, out_dir=tmp_path / "grpo")])
    asyncio.run(chain.setup(None))  # type: ignore[arg-type]  # (the context is not used before the stages run)
    for stage, step in (("sft", 600), ("grpo", 40)):
        assert latest_checkpoint(tmp_path / stage) is None and not (tmp_path / stage / "metrics.jsonl").exists()
        (earlier,) = (tmp_path / stage / "earlier").iterdir()
        assert latest_checkpoint(earlier).name == f"step-{step}"  # moved, not deleted

    # resuming stages keep their checkpoints
    earlier_run(tmp_path / "grpo", 20)
    sft = SFT("base", out_dir=tmp_path / "sft", resume=True)
    asyncio.run(Chain([sft, GRPO(sft.output_model, out_dir=tmp_path / "grpo", resume=True)]).setup(None))  # type: ignore[arg-type]
    assert latest_checkpoint(tmp_path / "grpo").name == "step-20"


def test_stages_in_one_folder_are_refused(tmp_path):
    sft = SFT("base", out_dir=tmp_path / "run")
    with pytest.raises(ValueError, match="each stage needs its own out_dir"):
        Chain([sft, GRPO(sft.output_model, out_dir=tmp_path / "run" / ".." / "run")])


def test_a_stage_hands_its_closing_validation_to_the_next_through_the_written_protocols(tmp_path):
    """What `Chain` reads of a stage is its protocols' (`WeightsProducer`, `ValidationTaker`): the validation is
    handed over only when it measured the weights the next stage starts from, the same way; a stage of one's own
    that has none of the attributes is run and reported as empty."""
    from types import SimpleNamespace

    from lightrail.algorithms.chain import ValidationTaker, WeightsProducer, _hand_over_validation

    weights = tmp_path / "sft" / "model"
    settings = {"val_sampling": {"temperature": 0.0}, "success_threshold": 1.0, "engine_options": {}}
    sft = SimpleNamespace(output_model=weights, report={"val_after": 0.4}, **settings)
    grpo = SimpleNamespace(model=weights, val_before=None, rollout_engine="embedded", **settings)
    assert isinstance(sft, WeightsProducer) and isinstance(grpo, ValidationTaker)
    _hand_over_validation(sft, grpo)
    assert grpo.val_before == 0.4
    for change in ({"val_sampling": {"temperature": 1.0}}, {"rollout_engine": "vllm"}, {"model": tmp_path / "other"}):
        other = SimpleNamespace(**{**vars(grpo), "val_before": None, **change})
        _hand_over_validation(sft, other)
        assert other.val_before is None, change
    # the real stages satisfy them (an attribute renamed would otherwise end the hand-over without a word)
    from lightrail.algorithms.chain import Reporting, Resumable

    real_sft = SFT("base", out_dir=tmp_path / "real" / "sft")
    real_grpo = GRPO(real_sft.output_model, out_dir=tmp_path / "real" / "grpo")
    assert all(isinstance(s, Reporting) and isinstance(s, Resumable) for s in (real_sft, real_grpo))
    assert isinstance(real_sft, WeightsProducer) and isinstance(real_grpo, ValidationTaker)
    plain = SimpleNamespace()  # a stage of one's own: none of the protocols
    assert not isinstance(plain, WeightsProducer | ValidationTaker)
    _hand_over_validation(plain, grpo)
    _hand_over_validation(sft, plain)
