"""The settings tree: every setting a config can write is declared once along its path (a section and the update
``config`` under it must not both hold a knob of the same name, as GRPO's ``max_staleness`` and
``grpo.config.max_staleness`` once did), and a removed setting names its replacement."""

from __future__ import annotations

import dataclasses
import typing

import msgspec
import pytest

from lightrail.algorithms.settings import RUN_FIELDS, APOSection, GRPOSection, SFTSection, update_config
from lightrail.model.update_config import UpdateConfig
from lightrail.trainer.config import ConfigError, TrainConfig, load_config
from lightrail.trainer.learn_config import LearnConfig

SAME_NAME_OTHER_SETTING = {
    ("seed", "config.seed"): "the run's seed (task order, sampling) vs the adapter's initialisation",
    ("temperature", "config.temperature"): "one setting, not two: the update divides logits by the calls' sampling "
    "temperature, so a config.temperature that differs is refused (tested below)",
}
"""Pairs of one name at two depths that are two settings, each with why (nothing else may repeat along a path)."""


def _names(schema: type, written: bool) -> set[str]:
    hints = typing.get_type_hints(schema)
    names = set(hints)
    if written and schema in (GRPOSection, SFTSection, APOSection):
        names -= set(RUN_FIELDS)  # a config gives these once, at its top level
    return names


def _paths() -> list[tuple[str, set[str], set[str]]]:
    """(section, names a config writes in it, names of its update ``config``) for every section with one."""
    update = set(typing.get_type_hints(UpdateConfig))
    return [
        ("grpo", _names(GRPOSection, written=True), update),
        ("sft", _names(SFTSection, written=True), update),
        ("learn", _names(LearnConfig, written=False), update),
    ]


@pytest.mark.parametrize(("section", "names", "update"), _paths(), ids=[p[0] for p in _paths()])
def test_no_setting_is_declared_both_in_a_section_and_in_its_update_config(section, names, update):
    top = set(typing.get_type_hints(TrainConfig)) if section != "learn" else set()
    twice = {name for name in (names | top) & update if (name, f"config.{name}") not in SAME_NAME_OTHER_SETTING}
    assert not twice, f"{section}: {sorted(twice)} declared in the section (or the top level) and in its config"


def test_the_top_level_and_the_sections_share_only_the_run_fields():
    top = set(typing.get_type_hints(TrainConfig))
    for section in (GRPOSection, SFTSection, APOSection):
        assert top & set(typing.get_type_hints(section)) <= set(RUN_FIELDS), section.__name__


def test_a_section_names_the_run_fields_at_the_top_level(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("agent: a:b\ndata: c:d\ngrpo: {seed: 3}\n")
    with pytest.raises(ConfigError, match=r"grpo.seed: a run's seed is the top-level 'seed'; set it there"):
        load_config(path)


def test_a_section_made_in_python_with_its_own_run_fields_is_refused_not_overridden(tmp_path):
    """``train(TrainConfig(grpo=GRPOSection(seed=7)))``: the run's seed is the config's; a section's other seed is
    refused in one line instead of being replaced without a word (the default, or the run's own value, passes)."""
    from lightrail.trainer.config import _grpo_kwargs

    config = TrainConfig(agent="a:b", data="c:d", seed=3, out_dir=str(tmp_path))
    assert _grpo_kwargs(config)["section"].seed == 3
    same = msgspec.structs.replace(config, grpo=GRPOSection(seed=3))
    assert _grpo_kwargs(same)["section"].out_dir == str(tmp_path)
    with pytest.raises(ConfigError, match=r"^grpo.seed: a run's seed is the config's top-level 'seed' \(3\), not 7"):
        _grpo_kwargs(msgspec.structs.replace(config, grpo=GRPOSection(seed=7)))
    with pytest.raises(ConfigError, match=r"^grpo.out_dir: a run's out_dir is the config's top-level 'out_dir'"):
        _grpo_kwargs(msgspec.structs.replace(config, grpo=GRPOSection(out_dir="elsewhere")))


@pytest.mark.parametrize(
    ("name", "read", "field"),
    [("async", "async_settings", "max_staleness"), ("filter_groups", "filtering", "max_rounds")],
)
def test_a_mode_is_true_false_null_or_its_fields(name, read, field):
    """A mode (``grpo.async``, ``grpo.filter_groups``) is a sub-section: off unless given, ``true`` for its defaults or
    a mapping of its fields, as a config file and as ``GRPO(...)``'s keyword arguments."""
    arg = "async_" if name == "async" else name
    assert getattr(GRPOSection(), read) is None and getattr(GRPOSection(**{arg: False}), read) is None
    assert getattr(GRPOSection(**{arg: True}), read) is not None
    assert getattr(getattr(GRPOSection(**{arg: {field: 2}}), read), field) == 2
    for bad in (1, "yes"):
        with pytest.raises(ValueError, match=rf"^grpo.{name}: expected true, false, null or a mapping of its fields"):
            GRPOSection(**{arg: bad})


def test_a_removed_setting_is_refused_naming_its_replacement(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("agent: a:b\ndata: c:d\ngrpo: {async: true, is_cap: 3.0}\n")
    with pytest.raises(
        ConfigError, match=r"grpo.is_cap: no longer a setting: the cap is the update's grpo.config.is_cap"
    ):
        load_config(path)
    with pytest.raises(ValueError, match=r"grpo.config.max_staleness: no longer an update setting"):
        update_config({"max_staleness": 2}, "grpo.config")


LEARN = "store: s.db\npolicies: p\nagent: a:b\ndata: d:e\n"


def test_learns_update_temperature_is_its_sampling_temperature(tmp_path):
    from lightrail.continuous.learn import load_learn_config

    path = tmp_path / "learn.yaml"
    path.write_text(LEARN + "temperature: 0.7\nconfig: {temperature: 0.5}\n")
    with pytest.raises(ConfigError, match=r"config.temperature: the update divides logits by the calls' sampling"):
        load_learn_config(str(path))
    path.write_text(LEARN + "temperature: 0.7\nconfig: {temperature: 0.7}\n")
    assert load_learn_config(str(path)).temperature == 0.7


def test_critic_settings_outside_a_gae_run_are_refused_not_unused(tmp_path):
    """``config.critic`` is read by PPO's critic only: ``lightrail learn``'s update has none, so it is refused."""
    from lightrail.continuous.learn import load_learn_config

    path = tmp_path / "learn.yaml"
    path.write_text(LEARN + "config: {critic: {gamma: 0.9}}\n")
    with pytest.raises(ConfigError, match=r"config.critic: PPO's critic settings \(grpo with advantage gae\)"):
        load_learn_config(str(path))


def test_every_update_setting_has_one_default():
    """`UpdateConfig`'s defaults are its own: a section's empty ``config`` is the dataclass's defaults, field by field."""
    assert dataclasses.asdict(update_config({}, "grpo.config")) == dataclasses.asdict(UpdateConfig())
    assert msgspec.structs.asdict(GRPOSection())["config"] == {}
