"""Constructors check what they are given when they are called: a name where a name is documented (``credit=
"identical"``, ``agents=[...]``) becomes the object it names, and an object of the wrong kind is one line naming the
argument, before any rollout runs (it used to be ``'list' object is not callable`` after the first step's rollouts)."""

from __future__ import annotations

import pytest

import lightrail
from lightrail.adapters import AgentFilter, ToolRewardRule
from lightrail.adapters.credit import Discounted, Identical
from lightrail.algorithms import APO, GRPO, SFT
from lightrail.types import LLM

VERL_DICT = {"actor_rollout_ref": {"model": {"path": "smollm2"}}}


def test_grpo_and_verl_take_a_credit_schemes_name_and_a_list_of_agent_names(tmp_path):
    for grpo in (
        GRPO("m", credit="identical", agents=["write_query"], out_dir=str(tmp_path)),
        lightrail.VERL(VERL_DICT, credit="identical", agents=["write_query"], out_dir=str(tmp_path)),
    ):
        assert isinstance(grpo.credit, Identical)
        assert grpo.credit([object(), object()], 1.0, []) == [1.0, 1.0]  # type: ignore[list-item]
        assert isinstance(grpo.agents, AgentFilter)
        assert grpo.agents("write_query") and not grpo.agents("rewrite_query")
    grpo = GRPO("m", credit="discounted", credit_args={"gamma": 0.5}, agents="write_query", tool_rewards=True)
    assert isinstance(grpo.credit, Discounted) and grpo.credit.gamma == 0.5
    assert grpo.agents is not None and grpo.agents("write_query")
    assert grpo.tool_rewards == ToolRewardRule()
    assert GRPO("m", tool_rewards={"error": -0.5}).tool_rewards == ToolRewardRule(error=-0.5)
    mine = AgentFilter(pattern="write.*")
    assert GRPO("m", agents=mine).agents is mine  # an object is kept as it is


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"credit": 3}, TypeError, "credit: expected a scheme's name ('identical', ...) or a CreditAssignment callable, "
         "got int 3"),
        ({"credit": "identicle"}, ValueError, "grpo.credit: expected one of ['identical', 'per_turn', 'discounted'], "
         "got 'identicle'"),
        ({"agents": 5}, TypeError, "agents: expected an AgentFilter, an agent's name or a list of names, got int 5"),
        ({"agents": ["a", 1]}, TypeError, "agents: expected agent names (strings), got list ['a', 1]"),
        ({"tool_rewards": "yes"}, TypeError, "tool_rewards: expected a ToolRewardRule, true/false or a mapping"),
        ({"tool_rewards": {"eror": 1.0}}, ValueError, "tool_rewards: unknown setting(s) ['eror']; did you mean"),
    ],
)  # fmt: skip
def test_grpo_and_verl_refuse_the_wrong_kind_in_one_line(tmp_path, kwargs, error, message):
    for build in (lambda: GRPO("m", out_dir=str(tmp_path), **kwargs),
                  lambda: lightrail.VERL(VERL_DICT, out_dir=str(tmp_path), **kwargs)):  # fmt: skip
        with pytest.raises(error) as caught:
            build()
        text = str(caught.value)
        assert text.startswith(message) and "\n" not in text


def test_an_update_setting_grpo_sets_from_another_is_refused_not_overwritten(tmp_path):
    """``config.temperature`` is the sampling temperature's (the update divides logits by it): a different one given
    in ``config`` used to be replaced without a word."""
    from lightrail.model import UpdateConfig

    with pytest.raises(ValueError) as caught:
        GRPO("m", out_dir=str(tmp_path), sampling={"temperature": 0.7}, config=UpdateConfig(temperature=0.5))
    assert str(caught.value).startswith(
        "grpo.config.temperature: the update divides logits by the sampling temperature"
    )
    same = GRPO("m", out_dir=str(tmp_path), sampling={"temperature": 0.7}, config=UpdateConfig(temperature=0.7))
    assert same.sampling["temperature"] == 0.7


def test_critic_settings_given_in_python_to_an_algorithm_without_a_critic_are_refused(tmp_path):
    """``UpdateConfig(critic=...)`` is read by PPO's critic only: GRPO with a group estimator and SFT refuse it rather
    than train without it."""
    from lightrail.model.update_config import CriticSettings, UpdateConfig

    config = UpdateConfig(critic=CriticSettings(gamma=0.9))
    with pytest.raises(ValueError, match=r"^grpo.config.critic: PPO's critic settings, for advantage gae only"):
        GRPO("m", out_dir=str(tmp_path), config=config)
    with pytest.raises(ValueError, match=r"^SFT has no critic: config.critic is PPO's"):
        SFT("m", out_dir=tmp_path, config=config)
    assert GRPO("m", out_dir=str(tmp_path), advantage="gae", config=config).config is config


def test_sft_takes_agent_names_and_refuses_the_wrong_kind(tmp_path):
    sft = SFT("m", agents=["write_query"], out_dir=tmp_path)
    assert sft.agents is not None and sft.agents("write_query") and not sft.agents("other")
    for kwargs, message in (
        ({"agents": 5}, "agents: expected an AgentFilter"),
        ({"traces": {"store": "x.db"}}, "traces: expected a TraceFilter, got dict"),
        ({"teacher": 5}, "teacher: expected an LLM, a gateway Backend or 'self', got int"),
    ):
        with pytest.raises(TypeError, match=f"^{message}"):
            SFT("m", out_dir=tmp_path, **kwargs)


def test_apo_and_trainer_refuse_the_wrong_kind_in_one_line(tmp_path):
    for kwargs, message in (
        ({"llm": "http://localhost:8000/v1"}, "llm: expected an LLM, got str"),
        ({"model": "m", "demo_traces": "runs/x"}, "demo_traces: expected a TraceFilter, got str"),
        ({"model": "m", "optimizer": {"model": "gpt"}}, "optimizer: expected an LLM or 'self', got dict"),
    ):
        with pytest.raises(TypeError, match=f"^{message}$"):
            APO(prompts={"system": "x"}, **kwargs)
    assert APO(llm=LLM(endpoint="http://127.0.0.1:1/v1", model="m"), prompts={"system": "x"}).llm is not None
    with pytest.raises(TypeError, match=r"^algorithm: expected an Algorithm \(GRPO\(...\), SFT\(...\), APO\(...\)\), "
                       r"got 'grpo'$"):  # fmt: skip
        lightrail.Trainer(n_runners=1, store=str(tmp_path / "s.db"), algorithm="grpo")  # type: ignore[arg-type]


def test_a_removed_grpo_setting_names_its_replacement(tmp_path):
    """One knob per setting: the async cap of the truncated importance weights is the update's ``config.is_cap``;
    GRPO's own ``is_cap`` is gone, and giving it says where the setting went instead of failing on an unknown name."""
    from lightrail.model import UpdateConfig

    with pytest.raises(
        TypeError, match=r"^is_cap: no longer a GRPO setting: the cap is the update's grpo.config.is_cap"
    ):
        GRPO("m", out_dir=str(tmp_path), async_=True, is_cap=3.0)
    with pytest.raises(
        TypeError, match=r"^mode: no longer a GRPO setting: asynchronous GRPO is the grpo.async section"
    ):
        GRPO("m", out_dir=str(tmp_path), mode="async")
    capped = GRPO("m", out_dir=str(tmp_path), async_={"max_staleness": 2}, config=UpdateConfig(is_cap=3.0))
    assert capped.asynchronous is not None and capped.asynchronous.steps_ahead == 2
    assert capped.config is not None and capped.config.is_cap == 3.0
