"""``grpo.advantage`` and ``grpo.loss_agg`` in a config reach `GRPO`; a misspelt value is an error naming the field
when the config is read (before a model is built)."""

from __future__ import annotations

import re
import textwrap

import pytest

from lightrail.trainer.config import ConfigError, _grpo_kwargs, load_config

CONFIG = """
name: calc
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
model: tiny
grpo:
  steps: 1
  advantage: rloo
"""


def _load(tmp_path, overrides=()):
    path = tmp_path / "config.yaml"
    path.write_text(textwrap.dedent(CONFIG))
    return load_config(path, list(overrides))


def test_advantage_and_loss_agg_reach_grpo(tmp_path):
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO

    kwargs = _grpo_kwargs(_load(tmp_path))
    assert kwargs["section"].advantage == "rloo" and kwargs["section"].loss_agg is None
    grpo = GRPO(tmp_path / "model", **kwargs)
    assert (grpo.settings.advantage, grpo.settings.loss_agg) == ("rloo", None)

    kwargs = _grpo_kwargs(_load(tmp_path, ["grpo.advantage=dr_grpo", "grpo.loss_agg=seq_mean_token_mean"]))
    grpo = GRPO(tmp_path / "model", **kwargs)
    assert (grpo.settings.advantage, grpo.settings.loss_agg) == ("dr_grpo", "seq_mean_token_mean")
    assert grpo._loss_config(kwargs["config"] or UpdateConfig()).loss_norm == "sequence"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.advantage=rlooo", "grpo.advantage: expected one of ['grpo', 'rloo'"),
        ("grpo.advantage=7", "grpo.advantage: Expected `str`"),
        ("grpo.loss_agg=token-mean", "grpo.loss_agg: expected one of ['token_mean'"),
        ("grpo.config.loss_norm=tokens", "grpo.config"),
        ("grpo.config.loss_norm_tokens=0", "loss_norm_tokens must be >= 1"),
    ],
)
def test_a_bad_value_names_the_field(tmp_path, override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _load(tmp_path, [override])


def test_loss_agg_contradicting_the_update_config_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=re.escape("grpo.loss_agg: 'token_mean' contradicts config.loss_norm")):
        _load(tmp_path, ["grpo.loss_agg=token_mean", "grpo.config={loss_norm: rollout}"])
