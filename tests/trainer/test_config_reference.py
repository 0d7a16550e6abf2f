"""The config reference (docs/config.md) is generated from the schema and never drifts from it, documents every
field, and ``lightrail train CONFIG --print-config`` prints a config that runs as given, every default filled in."""

from __future__ import annotations

import dataclasses
import inspect
import json
import textwrap
from pathlib import Path

import pytest
import yaml

from lightrail.algorithms.apo import APO
from lightrail.algorithms.grpo import GRPO
from lightrail.algorithms.settings import GRPOSection, SFTSection
from lightrail.algorithms.sft import SFT
from lightrail.cli import main
from lightrail.model.updater import UpdateConfig
from lightrail.trainer.config import ConfigError, TrainConfig, load_config, resolved_config
from lightrail.trainer.config_reference import render_markdown, sections

ROOT = Path(__file__).resolve().parents[2]

BASE = """
name: calc
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
data_args: {n_train: 8, n_val: 4, seed: 1}
trainer: {n_runners: 1, concurrency: 4}
"""


def test_committed_reference_is_what_the_generator_writes(capsys):
    assert (ROOT / "docs" / "config.md").read_text(encoding="utf-8") == render_markdown(), (
        "docs/config.md is stale: run `lightrail train --config-reference > docs/config.md`"
    )
    assert main(["train", "--config-reference"]) == 0
    assert capsys.readouterr().out == render_markdown()
    from lightrail.cli import build_parser

    train = build_parser()._subparsers._group_actions[0].choices["train"]
    assert "docs/config.md" in train.format_help()


def test_every_field_of_every_section_is_documented():
    by_path = {s.path: s for s in sections()}
    for section in by_path.values():
        missing = [f.name for f in section.fields if not f.meaning.strip()]
        assert not missing, f"{section.path or 'top level'}: no meaning for {missing}"
        assert all(f.type and f.default for f in section.fields)
    names = {path: {f.name for f in s.fields} for path, s in by_path.items()}
    assert names[""] == set(TrainConfig.__struct_fields__)
    assert names["grpo.config"] == {f.name for f in dataclasses.fields(UpdateConfig)}
    for path, cls, excluded in [("grpo", GRPO, {"model", "gateway"}), ("apo", APO, {"model", "gateway"}),
                                ("sft", SFT, {"model", "gateway", "out_dir"})]:  # fmt: skip
        assert set(inspect.signature(cls).parameters) - excluded - {"section", "settings"} <= names[path], path
    assert {"agents_pattern", "credit_args"} <= names["grpo"] and {"agents_pattern"} <= names["sft"]
    assert "api_key_env" in names["sft.teacher"]
    # types and defaults as a config writes them
    fields = {f.name: f for f in by_path["grpo.config"].fields}
    assert (fields["lr"].type, fields["lr"].default) == ("float", str(UpdateConfig.lr))
    assert fields["device"].type == "cpu | cuda | auto" and fields["lora"].type == "mapping | null"
    top = {f.name: f for f in by_path[""].fields}
    assert top["agent"].default == "required" and top["model"].default == "tiny"


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (GRPO, {"n_samples": 0}, "grpo.n_samples must be >= 1, got 0"),
        (GRPO, {"rollout_engine": "sglang"}, "grpo.rollout_engine: expected one of ['embedded', 'vllm'], got 'sglang'"),
        (
            GRPO,
            {"credit": "magic"},
            "grpo.credit: expected one of ['identical', 'per_turn', 'discounted'], got 'magic'",
        ),
        (SFT, {"batch_size": 0}, "sft.batch_size must be >= 1, got 0"),
        (SFT, {"backend": "axolotl"}, "sft.backend: expected one of ['lightrail', 'llamafactory'], got 'axolotl'"),
        (APO, {"prompts": {"p": "hi"}, "beam_width": 0}, "apo.beam_width must be >= 1, got 0"),
    ],
)
def test_a_bad_setting_is_the_same_one_line_error_from_yaml_and_from_python(tmp_path, cls, kwargs, message):
    """The section struct checks a setting once: a config (after the file's name) and `GRPO(...)`/`SFT(...)`/`APO(...)`
    say the same."""
    section = cls.__name__.lower()
    config = tmp_path / "config.yaml"
    algorithm = {"GRPO": "grpo", "SFT": "sft", "APO": "apo"}[cls.__name__]
    config.write_text(BASE + f"algorithm: {algorithm}\n{section}: {json.dumps(kwargs)}\n")
    with pytest.raises(ConfigError) as from_yaml:
        load_config(config)
    if cls is GRPO and "credit" in kwargs:  # GRPO(credit=) takes a CreditAssignment; the name is the section's
        with pytest.raises(ValueError) as from_python:
            GRPOSection(**kwargs)
    else:
        with pytest.raises(ValueError) as from_python:
            cls("m", **kwargs, **({} if cls is APO else {"out_dir": tmp_path / "run"}))
    assert str(from_yaml.value) == f"{config}: {message}" and str(from_python.value) == message


def test_a_section_keeps_its_own_default_where_grpo_and_sft_differ(tmp_path):
    grpo, sft = GRPOSection(), SFTSection()
    assert (grpo.steps, grpo.checkpoint_every, grpo.val_every, grpo.merge_calls) == (None, 10, 10, False)
    assert GRPO("m", out_dir=tmp_path / "g").steps == 50  # null: 50, unless epochs count the steps
    assert (sft.steps, sft.checkpoint_every, sft.val_every, sft.merge_calls) == (100, 50, 0, True)
    assert GRPO("m", out_dir=tmp_path / "g").settings.checkpoint_every == 10
    assert SFT("m", out_dir=tmp_path / "s").settings.checkpoint_every == 50


def test_every_field_of_the_learn_config_is_documented():
    from lightrail.continuous.learn import GateSettings, LearnConfig
    from lightrail.trainer.config_reference import learn_sections

    by_path = {s.path: s for s in learn_sections()}
    assert {f.name for f in by_path[""].fields} == set(LearnConfig.__struct_fields__)
    assert {f.name for f in by_path["gate"].fields} == set(GateSettings.__struct_fields__)
    for section in by_path.values():
        missing = [f.name for f in section.fields if not f.meaning.strip()]
        assert not missing, f"learn {section.path or 'top level'}: no meaning for {missing}"
    assert "# `lightrail learn` configuration reference" in render_markdown()


def _print_config(tmp_path, capsys, text: str, *overrides: str) -> dict:
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(text))
    argv = ["train", str(path), "--print-config"]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_print_config_fills_every_default_and_runs_as_printed(tmp_path, capsys):
    printed = _print_config(
        tmp_path, capsys,
        BASE + "grpo: {steps: 1, credit: discounted, credit_args: {gamma: 0.5}, tool_rewards: true, "
        "config: {lr: 1.0e-3, lora: {r: 8}}}\n",
        "grpo.n_samples=2", f"out_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert printed["out_dir"] == str(tmp_path / "run") and printed["store"] == str(tmp_path / "run" / "store.db")
    assert printed["trainer"]["store_host"] == "127.0.0.1" and printed["gateway"]["port"] == 0
    grpo = printed["grpo"]
    assert (grpo["steps"], grpo["n_samples"], grpo["tasks_per_step"], grpo["val_every"]) == (1, 2, 8, 10)
    assert grpo["credit"] == "discounted" and grpo["credit_args"] == {"gamma": 0.5}
    assert grpo["tool_rewards"]["success"] == 0.1 and "seed" not in grpo and printed["seed"] == 0  # the run's
    assert grpo["config"]["lr"] == 1e-3 and grpo["config"]["clip_high"] == UpdateConfig.clip_high
    assert grpo["config"]["lora"]["r"] == 8 and grpo["config"]["lora"]["alpha"] == 32
    assert "apo" not in printed and "sft" not in printed
    # the printed config is a config: it loads, and prints the same again
    again = tmp_path / "printed.yaml"
    again.write_text(yaml.safe_dump(printed))
    assert resolved_config(load_config(again)) == printed


def test_print_config_of_apo_and_the_sft_grpo_chain(tmp_path, capsys):
    apo = _print_config(tmp_path, capsys, BASE + "algorithm: apo\napo: {prompts: {prompt_template: Solve it.}}\n")
    assert apo["apo"]["prompts"] == {"prompt_template": "Solve it."} and apo["apo"]["rounds"] == 3
    assert apo["apo"]["optimizer"] is None and "grpo" not in apo
    chain = _print_config(tmp_path, capsys, BASE + "algorithm: [sft, grpo]\nsft: {steps: 5, config: {lr: 1.0e-3}}\n")
    assert chain["sft"]["steps"] == 5 and chain["sft"]["config"]["kl_coef"] == 0.0 and chain["sft"]["best_of"] is None
    assert chain["grpo"]["steps"] == 50
    for printed in (apo, chain):
        path = tmp_path / "printed.yaml"
        path.write_text(yaml.safe_dump(printed))
        assert resolved_config(load_config(path)) == printed


def test_print_config_reports_a_bad_config_like_train(tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(BASE + "grpo: {config: {kl_coeff: 0.1}}\n"))
    assert main(["train", str(path), "--print-config"]) == 2
    assert "grpo.config: unknown setting(s) ['kl_coeff']" in capsys.readouterr().err
    assert main(["train"]) == 2 and "give CONFIG.yaml" in capsys.readouterr().err
