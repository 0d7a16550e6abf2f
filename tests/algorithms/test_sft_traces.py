"""`SFT` from traces: rejection sampling picks exactly the rows it should from a hand-built store (multi-agent
episodes, known rewards), distillation from the scripted teacher trains a tiny student end to end through the
gateway and runners, and ``algorithm: [sft, grpo]`` runs from one config."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from lightrail import MemoryStore, Trainer
from lightrail.adapters import AgentFilter
from lightrail.algorithms import SFT, TraceFilter, UpdateConfig
from lightrail.algorithms.protocol import TrainerContext
from lightrail.algorithms.sft import call_rows, conversation_rows
from lightrail.engine.chat import ChatFormat, parse_tool_calls
from lightrail.store.sqlite import SQLiteStore
from lightrail.types import AttemptStatus, Attr, RetryPolicy, RolloutSpec, Span, Task

AGENT = "examples.calculator.train:calculator_agent"
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from rich.console import Console

    from examples.calculator.data import make_splits
    from examples.calculator.demo import DemoSettings, build_model

    train, _ = make_splits(60, 0, seed=3)
    settings = DemoSettings(model="tiny", out=tmp_path_factory.mktemp("model"))
    return build_model(settings, train, Console(quiet=True))  # its tokenizer knows the task's words


# -- a hand-built store: two agents per episode, known rewards ------------------------------------------------------


def _call(rid: str, aid: str, seq: int, agent: str, messages: list[dict], answer: dict) -> Span:
    response = {"id": f"resp-{rid}-{seq}", "choices": [{"index": 0, "message": answer, "finish_reason": "stop"}]}
    return Span(
        rollout_id=rid,
        attempt_id=aid,
        seq=seq,
        name=Attr.SPAN_LLM_CALL,
        attributes={
            Attr.REQUEST: {"model": "m", "messages": messages, "tools": TOOLS},
            Attr.RESPONSE: response,
            Attr.ENDPOINT: "chat.completions",
            Attr.RESPONSE_ID: response["id"],
            Attr.TOKEN_IDS_AVAILABLE: False,  # a teacher's calls: the messages are the data
            Attr.AGENT_NAME: agent,
        },
    )


def conversation(rid: str) -> tuple[list[dict], list[dict]]:
    """The planner's one call and the solver's two (tool call, then answer), as full conversations."""
    question = {"role": "user", "content": f"question of {rid}"}
    plan = [{"role": "system", "content": "Plan."}, question, {"role": "assistant", "content": f"plan for {rid}"}]
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "1+2"}'}}
    solve = [
        {"role": "system", "content": "Solve."},
        question,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "assistant", "content": f"Answer: {rid}"},
    ]
    return plan, solve


async def _add_rollout(store, task: Task, reward: float | None, *, mode="train", infra=False) -> str:
    (rollout,) = await store.enqueue([RolloutSpec(task=task, mode=mode, policy=RetryPolicy(max_attempts=1))])
    lease = await store.lease("w")
    rid, aid = rollout.rollout_id, lease.attempt.attempt_id
    assert lease.rollout.rollout_id == rid
    plan, solve = conversation(rid)
    await store.add_spans(
        [
            _call(rid, aid, 1, "planner", plan[:2], plan[2]),
            _call(rid, aid, 2, "solver", solve[:2], solve[2]),
            _call(rid, aid, 3, "solver", solve[:4], solve[4]),
        ]
    )
    status = AttemptStatus.INFRA_ERROR if infra else AttemptStatus.SUCCEEDED
    await store.finish(aid, status, reward=None if infra else reward)
    return rid


async def _hand_built_store(path) -> tuple[SQLiteStore, dict[str, list[str]]]:
    store = SQLiteStore(str(path))
    tasks = {
        "a": Task(input="a", task_id="a", metadata={"level": "easy"}),
        "b": Task(input="b", task_id="b", metadata={"level": "easy"}),
        "c": Task(input="c", task_id="c", metadata={"level": "hard"}),
    }
    ids: dict[str, list[str]] = {}
    for name, rewards in (("a", [1.0, 0.5, 1.0]), ("b", [0.0, 0.7, 0.2]), ("c", [1.0, 1.0, 0.9])):
        ids[name] = [await _add_rollout(store, tasks[name], r) for r in rewards]
    ids["infra"] = [await _add_rollout(store, tasks["a"], None, infra=True)]
    ids["val"] = [await _add_rollout(store, tasks["a"], 1.0, mode="val")]
    return store, ids


def _select(tiny_model, tmp_path, store, **options) -> SFT:
    """Run `SFT` with no training steps: it selects, builds its rows and writes traces.json and metrics.jsonl."""
    sft = SFT(tiny_model, steps=0, out_dir=tmp_path / "sft", checkpoint_every=0, **options)

    async def go():
        ctx = TrainerContext(store=store, train_tasks=[])
        await sft.setup(ctx)
        try:
            await sft.run(ctx)
        finally:
            await sft.close()

    asyncio.run(go())
    return sft


def test_rejection_sampling_keeps_best_of_n_per_task_and_only_the_trained_agents_calls(tiny_model, tmp_path):
    store, ids = asyncio.run(_hand_built_store(tmp_path / "store.db"))
    sft = _select(
        tiny_model, tmp_path, store,
        traces=TraceFilter(task_metadata={"level": "easy"}), min_reward=None, best_of=1,
        agents=AgentFilter(["solver"]),
    )  # fmt: skip
    # best of each easy task: a's first 1.0 (the tie goes to the earlier rollout), b's 0.7; c is "hard"
    kept = [ids["a"][0], ids["b"][1]]
    traces = json.loads((tmp_path / "sft" / "traces.json").read_text())
    assert traces["rollout_ids"] == kept
    assert traces["dropped"] == {"infra_error": 1, "not_best_of_n": 4, "task_metadata": 3, "validation": 1}
    # one row per kept rollout: the solver's two turns merged, the planner's call nowhere
    tokenizer = sft._tokenizer
    expected = conversation_rows(tokenizer, [conversation(rid)[1] for rid in kept], tools=TOOLS)
    assert [(r.input_ids, r.loss_mask) for r in sft._rows] == [(r.input_ids, r.loss_mask) for r in expected]
    assert [r.rollout_id for r in sft._rows] == kept
    trained = [tokenizer.decode([t for t, m in zip(r.input_ids, r.loss_mask, strict=True) if m]) for r in sft._rows]
    assert all("plan for" not in text and "Plan." not in text for text in trained)
    assert all(f"Answer: {rid}" in text for rid, text in zip(kept, trained, strict=True))
    # the tool call is trained as the text the engine parses back into the same call
    calls = parse_tool_calls(trained[0].split("Answer:")[0]).tool_calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("calculator", {"expression": "1+2"})]
    data = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()][0]
    assert data["kind"] == "data" and data["kept_rollouts"] == 2 and data["rows"] == 2
    assert (data["calls"], data["calls_trained"], data["calls_other_agents"]) == (6, 4, 2)
    assert data["dropped_not_best_of_n"] == 4


def test_rejection_sampling_threshold_window_and_every_agent(tiny_model, tmp_path):
    store, ids = asyncio.run(_hand_built_store(tmp_path / "store.db"))
    c_first = asyncio.run(store.get_rollout(ids["c"][0])).created_at
    sft = _select(tiny_model, tmp_path, store, traces=TraceFilter(until=c_first), min_reward=0.5, merge_calls=False)
    assert json.loads((tmp_path / "sft" / "traces.json").read_text())["rollout_ids"] == [*ids["a"], ids["b"][1]]
    # every agent's calls, one row per call without merging: planner, solver, solver per rollout
    tokenizer = sft._tokenizer
    chat = ChatFormat(tokenizer)
    assert len(sft._rows) == 4 * 3
    first = sft._rows[0]
    answer = [t for t, m in zip(first.input_ids, first.loss_mask, strict=True) if m]
    plan = conversation(ids["a"][0])[0]
    assert answer == tokenizer(chat.assistant_text(plan[2]), add_special_tokens=False).input_ids + [
        tokenizer.eos_token_id
    ]
    dropped = json.loads((tmp_path / "sft" / "traces.json").read_text())["dropped"]
    assert dropped == {"below_threshold": 2, "infra_error": 1, "outside_window": 3, "validation": 1}


def test_call_rows_drop_too_long_rows_and_say_so(tiny_model):
    from transformers import AutoTokenizer

    from lightrail.adapters import ChatSample, Exclusions

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    _, solve = conversation("r1")
    sample = ChatSample(rollout_id="r1", attempt_id="a", turn=0, choice=0, messages=solve, tools=TOOLS)
    dropped = Exclusions()
    assert call_rows(tokenizer, [sample], max_len=5, dropped=dropped) == []
    assert dropped.counts == {"too_long": 1} and dropped.rollout_ids == {"too_long": ["r1"]}


# -- distillation, end to end ---------------------------------------------------------------------------------------


def _problems():
    from examples.calculator.data import make_splits

    return make_splits(6, 3, seed=3)


def test_distillation_trains_the_student_to_reproduce_the_teacher(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.calculator.teacher_server import TeacherServer

    train, val = _problems()
    train = train[:3]  # few enough to memorise in a few dozen steps
    with TeacherServer(train + val) as teacher:
        # The rate falls to 0 at step 80: at a constant 5e-3, 6 rows memorised by step ~60 spike again (loss 0.02 ->
        # 0.2), and whether step 80 lands on a spike depends on the CPU's float rounding.
        settings = dict(
            teacher=teacher.llm(), n_samples=3, steps=4, batch_size=8, config=UpdateConfig(lr=5e-3, decay_steps=80),
            val_sampling={"max_tokens": 48}, out_dir=tmp_path / "sft", checkpoint_every=2,
        )  # fmt: skip
        store = MemoryStore()
        first = SFT(tiny_model, **settings)
        Trainer(n_runners=1, concurrency=8, store=store, algorithm=first).fit(AGENT, train, val)
        asked = len(teacher.backend.requests)
        assert asked >= 2 * len(train)  # every training problem went to the teacher (through SFT's gateway)
        # resumed from the step-4 checkpoint: same traces (the teacher is not asked again), steps 5..80
        sft = SFT(tiny_model, **{**settings, "steps": 80, "resume": True})
        Trainer(n_runners=1, concurrency=8, store=store, algorithm=sft).fit(AGENT, train, val)
        assert len(teacher.backend.requests) == asked  # validation runs the student, never the teacher
    lines = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in lines if m["kind"] == "train"]
    assert steps == list(range(1, 81))
    data = next(m for m in lines if m["kind"] == "data")
    assert data["kept_rollouts"] > 0 and data["dropped"] == data.get("dropped_below_threshold", 0)
    report = sft.report
    assert report["loss_last"] < 0.5 * report["loss_first"], report
    # the student answers a training problem's first turn exactly as the teacher's kept traces do
    traces = json.loads((tmp_path / "sft" / "traces.json").read_text())
    spans = asyncio.run(store.query_spans(traces["rollout_ids"][0]))
    from lightrail.adapters import episode_messages
    from lightrail.adapters.episode import build_episode

    first_call = episode_messages(build_episode(spans))[0]
    tokenizer = AutoTokenizer.from_pretrained(report["model"])
    chat = ChatFormat(tokenizer)
    prompt = tokenizer(chat.render(first_call.messages[:-1], first_call.tools), return_tensors="pt").input_ids
    model = AutoModelForCausalLM.from_pretrained(report["model"])
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=48, do_sample=False)
    target = tokenizer(chat.assistant_text(first_call.messages[-1]), add_special_tokens=False).input_ids
    generated = out[0, prompt.shape[1] :].tolist()
    assert generated[: len(target) + 1] == [*target, tokenizer.eos_token_id], tokenizer.decode(generated)


def test_the_students_own_samples_are_the_teachers_with_teacher_self(tiny_model, tmp_path):
    """``teacher="self"``: every training task is run ``n_samples`` times by the student itself (served by the
    embedded engine at ``sampling``, recorded under this run), and the kept rows are those tries."""
    train, val = _problems()
    store = MemoryStore()
    sampling = {"temperature": 0.9, "max_tokens": 24}
    sft = SFT(
        tiny_model, teacher="self", sampling=sampling, n_samples=2, min_reward=None, steps=2, batch_size=4,
        val_sampling={"max_tokens": 24}, out_dir=tmp_path / "sft", checkpoint_every=0,
    )  # fmt: skip
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=sft).fit(AGENT, train, val)
    tries = [r for r in asyncio.run(store.query_rollouts()) if r.mode == "train"]
    assert sorted(json.dumps(r.task.input) for r in tries) == sorted(json.dumps(t) for t in train for _ in range(2))
    traces = json.loads((tmp_path / "sft" / "traces.json").read_text())
    assert traces["source"] == "self" and set(traces["rollout_ids"]) <= {r.rollout_id for r in tries}
    assert traces["rollout_ids"] and sft.report["rows"] > 0 and sft.report["steps"] == 2
    spans = asyncio.run(store.query_spans(traces["rollout_ids"][0]))
    requests = [s.attributes[Attr.REQUEST] for s in spans if s.name == Attr.SPAN_LLM_CALL]
    assert requests and all(r["temperature"] == 0.9 and r["max_tokens"] == 24 for r in requests), requests
    assert all(r["model"] == "policy" for r in requests)  # the student, as served for validation


def test_teacher_self_is_the_only_teacher_sampling_applies_to(tmp_path):
    from lightrail.trainer.config import _sft_kwargs, load_config
    from lightrail.types import LLM

    with pytest.raises(ValueError, match="sampling sets how the student samples itself"):
        SFT(tmp_path, teacher=LLM(endpoint="http://127.0.0.1:9/v1", model="m"), sampling={"temperature": 0.5})
    with pytest.raises(ValueError, match="'self' \\(the student's own samples\\), not 'me'"):
        SFT(tmp_path, teacher="me")
    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\nsft: {teacher: self, sampling: {temperature: 0.5}}\n")
    kwargs = _sft_kwargs(load_config(path))
    assert kwargs["teacher"] == "self" and kwargs["section"].sampling == {"temperature": 0.5}


def test_sft_closes_the_teacher_backend_and_a_resumed_run_does_not_ask_it_again(tiny_model, tmp_path):
    """A teacher backend (a program's) belongs to the run: closed when it ends; a resumed run reloads its pinned
    traces without calling it or serving it."""
    from examples.calculator.teacher_server import teacher_backend

    class Closable:  # the scripted teacher, counting its closes
        def __init__(self, problems):
            self.inner, self.closed = teacher_backend(problems), 0

        async def chat(self, request):
            return await self.inner.chat(request)

        async def complete(self, request):
            return await self.inner.complete(request)

        def model_names(self):
            return self.inner.model_names()

        async def aclose(self):
            self.closed += 1

    train, val = _problems()
    store, settings = MemoryStore(), dict(steps=2, batch_size=4, val_sampling={"max_tokens": 16}, out_dir=tmp_path)
    teacher = Closable(train + val)
    sft = SFT(tiny_model, teacher=teacher, tasks=3, min_reward=None, checkpoint_every=1, **settings)
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=sft).fit(AGENT, train, val)
    asked = len(teacher.inner.requests)
    assert asked >= 3 and teacher.closed == 1 and sft.report["kept_rollouts"] > 0
    again = SFT(tiny_model, teacher=teacher, tasks=3, min_reward=None, resume=True, **{**settings, "steps": 3})
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=again).fit(AGENT, train, val)
    assert len(teacher.inner.requests) == asked and teacher.closed == 2 and again.report["steps"] == 3

    def metrics():
        return [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    # killed before its first checkpoint (the showcases' SFT checkpoints only at the end): a resume still reloads the
    # pinned traces without asking the teacher, and the metrics start over with the data line they had
    (data,) = [m for m in metrics() if m["kind"] == "data"]
    shutil.rmtree(tmp_path / "checkpoints")
    again = SFT(tiny_model, teacher=teacher, tasks=3, min_reward=None, resume=True, **settings)
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=again).fit(AGENT, train, val)
    assert len(teacher.inner.requests) == asked and again.report["kept_rollouts"] == sft.report["kept_rollouts"]
    assert [m for m in metrics() if m["kind"] == "data"] == [data]
    assert [m["step"] for m in metrics() if m["kind"] == "train"] == [1, 2]
    # run again without resume: the teacher is asked again, and the earlier run's traces, metrics and checkpoints
    # are set aside, not deleted
    fresh = SFT(tiny_model, teacher=teacher, tasks=3, min_reward=None, **settings)
    Trainer(n_runners=1, concurrency=8, store=store, algorithm=fresh).fit(AGENT, train, val)
    assert len(teacher.inner.requests) > asked
    (earlier,) = (tmp_path / "earlier").iterdir()
    assert sorted(p.name for p in earlier.iterdir()) == ["checkpoints", "metrics.jsonl", "traces.json"]
    assert json.loads((earlier / "traces.json").read_text())["record"] == data

    class Nameless(Closable):
        def model_names(self):
            return []

    with pytest.raises(ValueError, match=r"teacher backend \(Nameless\) lists no model names"):
        Trainer(n_runners=1, store=store, algorithm=SFT(tiny_model, teacher=Nameless([]), **settings)).fit(
            AGENT, train, val
        )


# -- sft then grpo from one config ----------------------------------------------------------------------------------

CHAIN = """
name: chain
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
data_args: {n_train: 6, n_val: 2, seed: 3}
trainer: {n_runners: 1, concurrency: 8}
algorithm: [sft, grpo]
sft:
  teacher: {endpoint: TEACHER_URL, model: teacher, api_key_env: TEACHER_KEY, sampling: {max_tokens: 200}}
  n_samples: 2
  steps: 3
  batch_size: 8
  val_sampling: {max_tokens: 32}
  config: {lr: 1.0e-3}
grpo:
  steps: 1
  tasks_per_step: 2
  n_samples: 2
  val_every: 0
  sampling: {temperature: 1.0, max_tokens: 32}
  val_sampling: {temperature: 0.0, max_tokens: 32}
"""


def test_config_chains_sft_then_grpo_from_the_sft_weights(tiny_model, tmp_path, monkeypatch):
    from examples.calculator.teacher_server import TeacherServer
    from lightrail.trainer.config import load_config, train

    train_tasks, val_tasks = _problems()
    with TeacherServer(train_tasks + val_tasks) as teacher:
        monkeypatch.setenv("TEACHER_KEY", teacher.token)
        path = tmp_path / "chain.yaml"
        path.write_text(textwrap.dedent(CHAIN).replace("TEACHER_URL", teacher.url))
        config = load_config(path, [f"out_dir={tmp_path / 'run'}", f"model={tiny_model}"])
        result = train(config)
    report = result.report
    assert set(report["stages"]) == {"sft", "grpo"} and report["steps"] == 1
    from lightrail.trainer.result import summary  # what `lightrail train` prints: both stages' minutes and outputs

    printed = summary(report, "store.db")
    minutes = report["stages"]["sft"]["minutes"] + report["stages"]["grpo"]["train_minutes"]
    assert f" in {minutes:.1f} min" in printed.splitlines()[0]
    outputs = dict(re.fullmatch(r"(.+?): +(\S.*)", line).groups() for line in printed.splitlines()[1:])
    assert outputs["sft model"] == str(tmp_path / "run" / "sft" / "model") and "grpo checkpoint" in outputs
    assert "grpo reward curve" in outputs and "store" in outputs
    assert len({re.match(r".+?: +", line).end() for line in printed.splitlines()[1:]}) == 1  # values in one column
    assert report["stages"]["sft"]["steps"] == 3 and report["stages"]["sft"]["val_after"] is not None
    sft_model = tmp_path / "run" / "sft" / "model"
    assert report["stages"]["sft"]["model"] == str(sft_model)
    updater = json.loads((tmp_path / "run" / "grpo" / "checkpoints" / "step-1" / "updater.json").read_text())
    assert updater["base_model"]["path"] == str(sft_model.resolve())  # GRPO started from the SFT stage's weights
    # the SFT's last validation measured GRPO's starting weights the same way: GRPO does not run it again
    grpo_vals = [json.loads(line) for line in (tmp_path / "run" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    grpo_vals = [m for m in grpo_vals if m["kind"] == "val"]
    assert grpo_vals[0]["reused"] is True and grpo_vals[0]["val_success"] == report["stages"]["sft"]["val_after"]
    assert report["val_before"] == report["stages"]["sft"]["val_after"] and "reused" not in grpo_vals[-1]
    assert (tmp_path / "run" / "sft" / "metrics.jsonl").exists() and (
        tmp_path / "run" / "grpo" / "metrics.jsonl"
    ).exists()
    # one TensorBoard log for the chained run, in its folder, each stage's records under the stage's name
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"sft/train/loss", "grpo/train/reward_mean", "grpo/val/val_success"} <= tags, sorted(tags)


def test_a_teacher_sample_of_the_tasks_leaves_a_chained_grpo_the_others(tiny_model, tmp_path):
    """A teacher sample from ``sft.tasks`` is fixed by the seed, and a chained GRPO's first tasks (same seed) mix
    taught and untaught ones: not the taught ones in SFT's order, which Random(seed).sample and Random(seed).shuffle
    would give (they make the same draws)."""
    from examples.calculator.teacher_server import teacher_backend
    from lightrail.algorithms import GRPO

    tasks = [Task(input={"i": i}) for i in range(100)]
    taught = [t.input["i"] for t in SFT(tiny_model, teacher=teacher_backend([]), tasks=60)._teacher_tasks(tasks)]
    again = [t.input["i"] for t in SFT(tiny_model, teacher=teacher_backend([]), tasks=60)._teacher_tasks(tasks)]
    assert len(set(taught)) == 60 and again == taught
    first_step = [t.input["i"] for t in GRPO(tiny_model, out_dir=tmp_path)._next_tasks(tasks, 40)]
    assert first_step != taught[:40]
    untaught = [i for i in first_step if i not in set(taught)]
    assert 6 <= len(untaught) <= 30, untaught  # 16 expected of 40 (40 % of the tasks are untaught)
    assert len(SFT(tiny_model, teacher=teacher_backend([]), tasks=200)._teacher_tasks(tasks)) == 100


def test_a_chain_hands_over_a_validation_only_when_it_measured_the_next_stages_start():
    from types import SimpleNamespace

    from lightrail.algorithms.chain import _hand_over_validation

    def pair(**next_stage):
        sft = SimpleNamespace(
            report={"val_after": 0.5}, output_model=Path("run/sft/model"), val_sampling={"temperature": 0.0},
            success_threshold=1.0, engine_options={},
        )  # fmt: skip
        grpo = SimpleNamespace(
            val_before=None, model=Path("run/sft/model"), val_sampling={"temperature": 0.0}, success_threshold=1.0,
            rollout_engine="embedded", engine_options={},
        )  # fmt: skip
        for key, value in next_stage.items():
            setattr(grpo, key, value)
        _hand_over_validation(sft, grpo)
        return grpo.val_before

    assert pair() == 0.5
    assert pair(model=Path("elsewhere")) is None  # other weights
    assert pair(val_sampling={"temperature": 0.0, "max_tokens": 8}) is None  # measured differently
    assert pair(success_threshold=0.5) is None
    assert pair(rollout_engine="vllm") is None  # another engine's numerics
    assert pair(val_before=0.1) == 0.1  # already known: kept


SFT_FROM_A_PROGRAM = """
name: sft-program
agent: examples.calculator.train:calculator_agent
data: examples.calculator.data:make_splits
data_args: {n_train: 6, n_val: 2, seed: 3}
trainer: {n_runners: 1, concurrency: 8}
algorithm: sft
sft:
  teacher: {script: examples.calculator.teacher_server:teacher_backend}
  steps: 2
  batch_size: 4
  val_sampling: {max_tokens: 32}
"""


def test_lightrail_train_distils_from_a_teacher_program_and_says_where_the_model_is(
    tiny_model, tmp_path, monkeypatch, capsys
):
    """``sft.teacher: {script: module:function}``: the function gets the training tasks and returns the backend the
    agent then runs against (no server to start); ``lightrail train`` ends by printing where SFT's outputs are."""
    from pathlib import Path

    from lightrail.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # references resolve from the project root
    path = tmp_path / "sft.yaml"
    path.write_text(SFT_FROM_A_PROGRAM)
    run = tmp_path / "run"
    assert main(["train", str(path), "--out", str(run), "--model", str(tiny_model)]) == 0
    out = capsys.readouterr().out
    assert "held-out success: not measured -> 0." in out  # SFT validates after training (before: validate_before)
    assert re.search(rf"^model: +{re.escape(str(run / 'model'))}$", out, re.M)
    assert re.search(rf"^metrics: +{re.escape(str(run / 'metrics.jsonl'))}$", out, re.M)
    assert "reward curve:" not in out  # SFT draws none
    report = json.loads((run / "report.json").read_text())

    async def teacher_runs():
        store = SQLiteStore(run / "store.db")
        try:
            return [r for r in await store.query_rollouts() if r.mode == "train"]
        finally:
            await store.close()

    runs = asyncio.run(teacher_runs())
    assert len(runs) == 6  # every training task, once, answered by the program
    assert report["kept_rollouts"] == sum(r.reward == 1.0 for r in runs) > 0


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm=[grpo, sft]", "algorithm: the one chain is ['sft', 'grpo']"),
        ("sft.steps=many", "sft.steps: Expected `int`"),
        ("sft.teacher={endpoint: http://x/v1, model: t, bogus: 1}", "sft.teacher: unknown setting(s) ['bogus']"),
        ("sft.traces={since: yesterday}", "sft.traces.since: Expected `float | null`"),
        (
            "sft.teacher={script: no_such_module:teacher}",
            "sft.teacher.script: 'no_such_module:teacher': no module named",
        ),
        (
            "sft.teacher={script: examples.calc_agent.teacher}",
            "sft.teacher.script: 'examples.calc_agent.teacher' must look like",
        ),
        (
            "sft.teacher={script: 'examples.calc_agent.teacher:teacher', model: t}",
            "sft.teacher: a script teacher takes no other setting",
        ),
        ("sft.teacher={script: 5}", "sft.teacher.script: expected 'module:function', got 5"),
        (
            "sft={teacher: {script: 'examples.calc_agent.teacher:teacher'}, traces: {since: 1.0}}",
            "sft: give teacher (distillation) or traces (rejection sampling), not both",
        ),
        ("sft.config={kl_coef: 0.1}", "sft.config.kl_coef: SFT has no KL term"),
        ("sft.config={autocast: float16}", "sft.config.autocast: expected one of ['bfloat16'], got 'float16'"),
        ("sft.config={autocast: bfloat16, dtype: float64}", "autocast keeps float32 master weights"),
        ("sft.batch=3", "sft: unknown setting(s) ['batch']; did you mean 'batch_size'?"),
    ],
)
def test_config_sft_section_errors_name_the_field(tmp_path, override, message):
    from lightrail.trainer.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, [override])
    assert message in str(err.value)


def test_config_sft_teacher_null_next_to_traces_is_rejection_sampling(tmp_path):
    from lightrail.trainer.config import _sft_kwargs, load_config

    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\n")
    config = load_config(path, ["sft={teacher: null, traces: {since: 1.0}}"])
    kwargs = _sft_kwargs(config)
    assert "teacher" not in kwargs and kwargs["traces"] == TraceFilter(since=1.0)


def test_config_sft_mixed_precision_reaches_the_updater(tmp_path):
    from lightrail.trainer.config import _sft_kwargs, load_config

    path = tmp_path / "c.yaml"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: sft\n")
    config = load_config(path, ["sft.config={autocast: bfloat16}"])
    assert _sft_kwargs(config)["config"].autocast == "bfloat16"


def test_a_teacher_program_that_returns_no_backend_is_named(tmp_path, monkeypatch):
    from pathlib import Path

    from lightrail.trainer.config import ConfigError, load_config, train

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    (tmp_path / "nameless_teacher.py").write_text(
        "from lightrail.gateway.fake import ScriptedBackend\n\n\n"
        "def teacher(tasks, seed):\n"
        "    backend = ScriptedBackend(lambda request: 'Answer: 0')\n"
        "    backend.model_names = lambda: []\n"
        "    return backend\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "sft.yaml"
    path.write_text(SFT_FROM_A_PROGRAM)
    for script, message in [
        ("examples.calculator.teacher:demonstrations", "returned a list, not a gateway backend"),
        ("examples.calculator.data:make_splits", "make_splits cannot be called as (train_tasks, seed=...)"),
        ("nameless_teacher:teacher", "returned a ScriptedBackend that lists no model names"),
    ]:
        config = load_config(path, [f"sft.teacher={{script: '{script}'}}", "model=tiny", f"out_dir={tmp_path}"])
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            train(config)


def test_lora_sft_exports_the_merged_policy_it_trained(tiny_model, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from lightrail.algorithms import LoraSettings

    store, _ = asyncio.run(_hand_built_store(tmp_path / "store.db"))
    sft = SFT(
        tiny_model, steps=3, batch_size=4, config=UpdateConfig(lr=1e-2, lora=LoraSettings(r=4)),
        out_dir=tmp_path / "sft", checkpoint_every=0, min_reward=0.5,
    )  # fmt: skip

    async def go():
        ctx = TrainerContext(store=store, train_tasks=[])
        await sft.setup(ctx)
        try:
            await sft.run(ctx)
            return {k: v.clone() for k, v in sft._updater.state_dict_for_serving().items()}
        finally:
            await sft.close()

    served = asyncio.run(go())
    exported = AutoModelForCausalLM.from_pretrained(sft.report["model"]).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model).state_dict()
    assert set(exported) == set(served)
    assert all(torch.equal(exported[k], served[k]) for k in served)
    assert any(not torch.equal(exported[k], base[k]) for k in base)  # the adapter moved the weights
    losses = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in losses if m["kind"] == "train"] == [1, 2, 3]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_distilled_student_beats_the_base_and_grpo_continues_from_it(tmp_path, monkeypatch):
    """The longer variant (the figures are bench/sft.py's): the small model distilled from the teacher's successful
    traces solves held-out problems the base model cannot, and GRPO chained in the same config trains on from it."""
    from rich.console import Console

    from examples.calculator.demo import DemoSettings, build_model
    from examples.calculator.teacher_server import TeacherServer
    from lightrail.trainer.config import load_config, train

    train_tasks, val_tasks = _problems_for(400, 60)
    small = build_model(DemoSettings(model="small", out=tmp_path / "small"), train_tasks, Console(quiet=True))
    with TeacherServer(train_tasks + val_tasks) as teacher:
        monkeypatch.setenv("TEACHER_KEY", teacher.token)
        path = tmp_path / "chain.yaml"
        path.write_text(textwrap.dedent(CHAIN).replace("TEACHER_URL", teacher.url))
        overrides = [
            f"out_dir={tmp_path / 'run'}", f"model={small}", "data_args={n_train: 400, n_val: 60, seed: 3}",
            "trainer={n_runners: 2, concurrency: 8}", "sft.n_samples=1", "sft.steps=200", "sft.batch_size=32",
            "sft.validate_before=true", "sft.val_sampling={max_tokens: 48}", "sft.config={lr: 1.0e-3, warmup_steps: 10}",
            "grpo.steps=4", "grpo.tasks_per_step=8", "grpo.n_samples=4",
            "grpo.sampling={temperature: 1.0, max_tokens: 48}", "grpo.val_sampling={max_tokens: 48}",
        ]  # fmt: skip
        report = train(load_config(path, overrides)).report
    sft = report["stages"]["sft"]
    assert sft["val_before"] == 0.0 and sft["val_after"] > 0.1, sft
    assert report["steps"] == 4 and report["val_before"] == 0.0


def _problems_for(n_train: int, n_val: int):
    from examples.calculator.data import make_splits

    return make_splits(n_train, n_val, seed=3)
