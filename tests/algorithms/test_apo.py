"""`APO` through the real trainer, runner processes, gateway and embedded engine (a tiny model): beam bookkeeping,
parallel candidates, budgets and resume with a scripted optimizer LLM (a fake: a real HTTP gateway over
`ScriptedBackend`), and the demonstrations path, whose worked examples must come from successful traces."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path

import pytest
import uvicorn

from lightrail import Trainer
from lightrail.algorithms import APO
from lightrail.algorithms.rejection import TraceFilter
from lightrail.engine.models import build_tiny_model
from lightrail.gateway import ScriptedBackend, create_gateway_app
from lightrail.store import MemoryStore, open_store
from lightrail.types import LLM, RolloutStatus

SEED = "Solve the problem."


class FakeOptimizer:
    """A scripted optimizer LLM served over real HTTP (the gateway app over `ScriptedBackend`, in a thread): the
    critique call gets a fixed text; each edit call returns the next ``LEVEL-n`` prompt of ``levels``."""

    def __init__(self, levels: list[int]) -> None:
        self.levels = iter(levels)
        self.critiques = 0
        self.edits = 0
        self.backend = ScriptedBackend(self._reply)
        app = create_gateway_app(self.backend, MemoryStore())
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/v1"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on"))
        self._thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self._sock])))
        self._thread.start()
        while not self.server.started:
            threading.Event().wait(0.01)

    def _reply(self, request) -> str:
        text = request.messages[-1]["content"]
        if "Write an improved prompt" in text:
            self.edits += 1
            return f"Here it is:\n<prompt>{SEED} LEVEL-{next(self.levels)}</prompt>"
        self.critiques += 1
        assert "reward" in text and "<prompt>" in text  # the critique prompt carries the prompt and the runs
        return "The prompt never says how carefully to work."

    @property
    def llm(self) -> LLM:
        return LLM(endpoint=self.url, model="scripted-fake", routed=False)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(30)


@pytest.fixture
def optimizer():
    fakes: list[FakeOptimizer] = []

    def make(levels: list[int]) -> FakeOptimizer:
        fakes.append(FakeOptimizer(levels))
        return fakes[-1]

    yield make
    for fake in fakes:
        fake.stop()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("apo") / "model", size="tiny", seed=0)


def _problems(n_train: int, n_val: int):
    from examples.calculator.data import make_splits

    return make_splits(n_train, n_val, seed=3)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _stored(db: Path) -> tuple[list, dict]:
    """Every rollout in the store, and the attempts of each."""

    async def go():
        store = open_store(str(db))
        try:
            rollouts = await store.query_rollouts()
            return rollouts, {r.rollout_id: await store.query_attempts(r.rollout_id) for r in rollouts}
        finally:
            await store.close()

    return asyncio.run(go())


def _fit(apo: APO, db: Path, agent: str, train, val) -> None:
    Trainer(n_runners=1, concurrency=6, store=str(db), algorithm=apo).fit(agent, train, val)


def _settings(tmp_path: Path, model: Path, fake: FakeOptimizer, **overrides):
    return dict(
        model=model, prompts={"prompt_template": SEED}, optimizer=fake.llm, beam_width=2, gradient_children=2,
        demonstrations=False, batch_size=2, sampling={"max_tokens": 4}, val_sampling={"max_tokens": 4},
        out_dir=tmp_path / "run", **overrides,
    )  # fmt: skip


def test_beam_parallel_rounds_and_budgets(tmp_path, tiny_model, optimizer):
    fake = optimizer([3, 7, 5, 9, 2, 8])
    train, val = _problems(12, 2)
    apo = APO(**_settings(tmp_path, tiny_model, fake, rounds=5, max_rollouts=13, max_optimizer_calls=8))
    _fit(apo, tmp_path / "store.db", "apo_agents:level_agent", train, val)

    lines = _metrics(tmp_path / "run")
    cands = {(m["round"], m["candidate"]): m for m in lines if m["kind"] == "candidate"}
    rounds = [m for m in lines if m["kind"] == "round"]
    # round 0: the seed; round 1: its two gradient children; round 2: the beam (c2, c1) + children of c2 only
    # (the optimizer budget of 8 calls allows 4 children of 2 calls each) on 1 task each (7 rollouts were left of
    # 13: 2 tasks x 4 candidates would not fit); then 1 rollout is left, less than a round: the search stops
    assert [m["candidates"] for m in rounds] == [["c0"], ["c0", "c1", "c2"], ["c2", "c1", "c3", "c4"]]
    assert {c: m["parent"] for (r, c), m in cands.items() if r == 2} == {"c1": "c0", "c2": "c0", "c3": "c2", "c4": "c2"}
    assert {c: m["score"] for (r, c), m in cands.items() if r == 1} == {"c0": 0.0, "c1": 0.3, "c2": 0.7}
    assert [m["beam"] for m in rounds] == [["c0"], ["c2", "c1"], ["c4", "c2"]]  # the best 2 of each round, kept
    assert all(m["kept"] == (m["candidate"] in rounds[m["round"]]["beam"]) for m in cands.values())
    assert (fake.critiques, fake.edits) == (4, 4) and apo.report["optimizer_calls"] == 8  # exactly the call budget
    assert apo.report["best_prompt"] == {"prompt_template": f"{SEED} LEVEL-9"}
    best = json.loads((tmp_path / "run" / "best_prompt.json").read_text())
    assert best["candidate"] == "c4" and best["score"] == pytest.approx(0.9)
    from lightrail.trainer.result import summary  # what `lightrail train` prints at the end of an APO run

    assert "best prompt: candidate c4 (score 0.90)" in summary(apo.report, "store.db").splitlines()

    rollouts, _ = _stored(tmp_path / "store.db")
    search = [r for r in rollouts if r.mode == "train"]
    assert len(search) == apo.report["rollouts"] == 2 + 6 + 4 <= 13
    assert all(r.status == RolloutStatus.SUCCEEDED for r in rollouts)
    for r in range(3):  # every candidate of a round was enqueued before any rollout of the round ended
        of_round = [x for x in search if x.metadata["apo_round"] == r]
        assert max(x.created_at for x in of_round) <= min(x.ended_at for x in of_round)
    # each rollout names its candidate and parent, and ran with that candidate's resources version
    versions = {m["candidate"]: m["resources_version"] for m in cands.values()}
    assert all(x.resources_version == versions[x.metadata["apo_candidate"]] for x in search)
    assert {x.metadata["apo_candidate"]: x.metadata["apo_parent"] for x in search}["c3"] == "c2"
    assert apo.report["val_before"] == 0.0 and apo.report["val_after"] == 0.0  # reward 0.9 < success threshold 1


class CrashAfterProposals(APO):
    """Dies in round 2 right after its children were proposed (the optimizer was paid), before evaluating them."""

    async def _expand(self, ctx, r):
        children = await super()._expand(ctx, r)
        if r == 2:
            raise RuntimeError("simulated crash")
        return children


def test_resume_after_a_crash_reevaluates_nothing(tmp_path, tiny_model, optimizer):
    fake = optimizer([3, 7, 5, 9, 2, 8, 6, 4])
    train, val = _problems(12, 2)
    settings = _settings(tmp_path, tiny_model, fake, rounds=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(CrashAfterProposals(**settings), tmp_path / "store.db", "apo_agents:level_agent", train, val)
    calls_before = (fake.critiques, fake.edits)
    assert calls_before == (6, 6)  # round 1: 2 children of c0; round 2: 2 children of c2 and of c1
    before, attempts_before = _stored(tmp_path / "store.db")

    resumed = APO(**settings)  # the same settings, the same run folder and store
    _fit(resumed, tmp_path / "store.db", "apo_agents:level_agent", train, val)
    assert (fake.critiques, fake.edits) == calls_before  # round 2's proposals were reused, not asked again
    after, attempts_after = _stored(tmp_path / "store.db")
    old = {r.rollout_id for r in before}
    # rounds 0 and 1 and the seed's validation ran once: same rollouts, each with its single attempt
    assert all(len(attempts_after[r]) == 1 == len(attempts_before[r]) for r in old)
    new = [r for r in after if r.rollout_id not in old]
    assert {r.metadata["apo_round"] for r in new} == {2, "val"}  # only round 2 and the best's validation are new
    assert {r.metadata["apo_candidate"] for r in new if r.metadata["apo_round"] == 2} == {
        "c1", "c2", "c3", "c4", "c5", "c6",
    }  # fmt: skip
    lines = _metrics(tmp_path / "run")
    keys = [m["key"] for m in lines]
    assert len(keys) == len(set(keys))  # nothing recorded twice
    assert [m["round"] for m in lines if m["kind"] == "round"] == [0, 1, 2]
    assert resumed.report["best_prompt"] == {"prompt_template": f"{SEED} LEVEL-9"}
    assert resumed.report["rollouts"] == 2 + 3 * 2 + 6 * 2


def test_demonstrations_come_from_successful_traces(tmp_path, tiny_model):
    train, val = _problems(12, 2)
    apo = APO(
        tiny_model, prompts={"prompt_template": SEED}, rounds=1, beam_width=1, demo_children=2, demo_k=2,
        batch_size=6, sampling={"temperature": 1.0, "max_tokens": 6}, val_sampling={"max_tokens": 4},
        out_dir=tmp_path / "run",
    )  # fmt: skip
    _fit(apo, tmp_path / "store.db", "apo_agents:parity_or_examples_agent", train, val)

    rollouts, _ = _stored(tmp_path / "store.db")
    by_id = {r.rollout_id: r for r in rollouts}
    state = json.loads((tmp_path / "run" / "apo_state.json").read_text())
    children = [c for c in state["candidates"] if c["origin"] == "demos"]
    assert children and all(c["parent"] == "c0" for c in children)
    for child in children:
        for demo in child["demos"]:
            source = by_id[demo["rollout_id"]]
            assert source.status == RolloutStatus.SUCCEEDED and source.reward == 1.0  # a successful trace
            assert source.metadata["apo_round"] == 0 and source.metadata["apo_candidate"] == "c0"
            assert f"User: {source.task.input['question']}" in demo["text"]  # its own conversation
            assert "Assistant: " in demo["text"]
    assert len(children) == 2  # at least two tasks succeeded in round 0: two different picks
    assert len({tuple(d["rollout_id"] for d in c["demos"]) for c in children}) == len(children)  # siblings differ
    best = apo.report["best_prompt"]["prompt_template"]
    chosen = next(c for c in children if c["id"] == apo.report["best_candidate"])
    assert best.startswith(SEED) and "Worked examples:" in best
    assert all(d["text"] in best for d in chosen["demos"])
    # a demonstration's task is never in the batch its candidate is scored on
    round1 = [r for r in rollouts if r.metadata.get("apo_round") == 1]
    demo_tasks = {d["task_id"] for c in children for d in c["demos"]}
    assert round1 and not demo_tasks & {r.task.task_id for r in round1}
    assert apo.report["val_after"] == 1.0
    # the exported file holds the prompt exactly (the tiny model's text can hold a "\r" that read_text would turn
    # into "\n")
    assert (tmp_path / "run" / "best_prompt.prompt_template.txt").read_bytes().decode() == best


def test_a_pool_smaller_than_the_slots_proposes_each_pick_once(tmp_path, tiny_model):
    apo = APO(tiny_model, prompts={"prompt_template": SEED}, demo_children=3, demo_k=2, out_dir=tmp_path)
    seed = apo._new_candidate(parent=None, round=0, origin="seed", instructions={"prompt_template": SEED})
    pool = [{"rollout_id": "r1", "task_id": "t1", "reward": 1.0, "text": "User: 2+2?\nAssistant: 4"}]
    children = [apo._demo_child(seed, 1, slot, pool) for slot in range(3)]
    assert children[0] is not None and children[1:] == [None, None]  # one success: one child, not three copies
    assert list(apo.candidates) == [seed.id, children[0].id]  # nothing recorded that would be scored twice


def test_config_section(tmp_path):
    from lightrail.trainer.config import ConfigError, load_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "agent: a:b\ndata: c:d\nalgorithm: apo\n"
        "apo: {prompts: {prompt_template: hi}, rounds: 2, optimizer: {endpoint: 'http://x/v1', model: m}}\n"
    )
    assert load_config(path).algorithm == "apo"
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: apo\napo: {prompts: {prompt_template: hi}, rounds: two}\n")
    with pytest.raises(ConfigError, match="apo.rounds"):
        load_config(path)
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: apo\napo: {prompts: {p: hi}, optimizer: {model: m}}\n")
    with pytest.raises(ConfigError, match="apo.optimizer"):
        load_config(path)
    path.write_text("agent: a:b\ndata: c:d\nalgorithm: apo\napo: {prompts: {p: hi}, beam: 2}\n")
    with pytest.raises(ConfigError, match=r"apo: unknown setting\(s\) \['beam'\]"):
        load_config(path)
    from lightrail.algorithms.apo import kwargs_from_config

    (tmp_path / "my_prompts").mkdir()
    section = kwargs_from_config({"prompts": {"p": "hi"}, "prompts_dir": str(tmp_path / "my_prompts"),
                                  "out_dir": str(tmp_path / "x")})["section"]  # fmt: skip
    apo = APO("m", section)
    assert apo.prompts_dir == tmp_path / "my_prompts" and apo.out_dir == tmp_path / "x"  # strings in YAML
    assert kwargs_from_config({"prompts": {"p": "hi"}, "prompts_dir": None})["section"].prompts_dir is None
    for bad in ({"prompts_dir": 3}, {"out_dir": None}):
        with pytest.raises(ValueError, match=f"apo.{next(iter(bad))}: Expected `str"):
            kwargs_from_config({"prompts": {"p": "hi"}, **bad})
    traces = kwargs_from_config({"prompts": {"p": "hi"}, "demo_traces": {"store": "old.db", "modes": ["val"]}})
    assert traces["demo_traces"] == TraceFilter(store="old.db", modes=("val",))
    with pytest.raises(ValueError, match="apo.demo_traces"):
        kwargs_from_config({"prompts": {"p": "hi"}, "demo_traces": {"stores": "old.db"}})


def test_demonstrations_as_messages_found_by_bootstrap(tmp_path, tiny_model):
    train, val = _problems(16, 2)
    apo = APO(
        tiny_model, prompts={"prompt_template": SEED, "examples": "[]"}, demo_format="messages",
        demo_template="examples", rounds=1, beam_width=1, demo_children=1, demo_k=2, batch_size=3,
        bootstrap_rollouts=16, sampling={"temperature": 0.5, "max_tokens": 6}, val_sampling={"max_tokens": 4},
        out_dir=tmp_path / "run",
    )  # fmt: skip
    _fit(apo, tmp_path / "store.db", "apo_agents:few_shot_agent", train, val)

    lines = _metrics(tmp_path / "run")
    (boot,) = [m for m in lines if m["kind"] == "bootstrap"]
    assert boot["rollouts"] == 16 and boot["successes"] >= 1  # round 0 found none (cool sampling): bootstrap ran
    assert [m["successes"] for m in lines if m["kind"] == "candidate" and m["round"] == 0] == [0]
    assert apo.report["rollouts"] == 3 + 16 + 2 * 3  # the bootstrap counts in the rollout budget
    rollouts, _ = _stored(tmp_path / "store.db")
    by_id = {r.rollout_id: r for r in rollouts}
    state = json.loads((tmp_path / "run" / "apo_state.json").read_text())
    (child,) = [c for c in state["candidates"] if c["origin"] == "demos"]
    assert apo.report["best_candidate"] == child["id"]
    examples = json.loads(apo.report["best_prompt"]["examples"])
    assert examples == [m for d in child["demos"] for m in d["messages"]]  # the demos' own turns, in order
    for demo in child["demos"]:
        source = by_id[demo["rollout_id"]]
        assert source.metadata["apo_round"] == "bootstrap" and source.reward == 1.0
        assert demo["messages"][0] == {"role": "user", "content": source.task.input["question"]}
        assert demo["messages"][-1]["role"] == "assistant"
    assert apo.report["best_prompt"]["prompt_template"] == SEED  # the text template is left alone


def test_demonstrations_from_another_runs_traces(tmp_path, tiny_model):
    """``demo_traces``: a search whose own rollouts never succeed builds its candidates from the successful
    rollouts of an earlier run's store (a stronger model's or production's, here an earlier APO run's bootstrap)."""
    train, val = _problems(16, 2)
    settings = dict(
        prompts={"prompt_template": SEED, "examples": "[]"}, demo_format="messages", demo_template="examples",
        rounds=1, beam_width=1, demo_children=1, demo_k=2, batch_size=3, val_sampling={"max_tokens": 4},
    )  # fmt: skip
    earlier = APO(tiny_model, **settings, bootstrap_rollouts=16, sampling={"temperature": 0.5, "max_tokens": 6},
                  out_dir=tmp_path / "earlier")  # fmt: skip
    _fit(earlier, tmp_path / "earlier.db", "apo_agents:few_shot_agent", train, val)
    earlier_rollouts, _ = _stored(tmp_path / "earlier.db")
    succeeded = {r.rollout_id for r in earlier_rollouts if r.reward == 1.0 and r.mode == "train"}
    assert succeeded

    traces = TraceFilter(store=str(tmp_path / "earlier.db"))
    apo = APO(tiny_model, **settings, demo_traces=traces, sampling={"temperature": 0.5, "max_tokens": 6},
              out_dir=tmp_path / "run")  # fmt: skip
    _fit(apo, tmp_path / "store.db", "apo_agents:few_shot_agent", train, val)

    lines = _metrics(tmp_path / "run")
    assert not [m for m in lines if m["kind"] == "bootstrap"]
    (found,) = [m for m in lines if m["kind"] == "demo_traces"]
    assert found["successes"] == found["demonstrations"] == len(succeeded)
    state = json.loads((tmp_path / "run" / "apo_state.json").read_text())
    (child,) = [c for c in state["candidates"] if c["origin"] == "demos"]
    assert {d["rollout_id"] for d in child["demos"]} <= succeeded  # the earlier run's successes
    own, _ = _stored(tmp_path / "store.db")
    assert not {d["rollout_id"] for d in child["demos"]} & {r.rollout_id for r in own}
    # the earlier run's tasks had other ids: a demonstrated problem is still kept out of the batch it is scored on
    demonstrated = {json.dumps(r.task.input, sort_keys=True) for r in earlier_rollouts
                    if r.rollout_id in {d["rollout_id"] for d in child["demos"]}}  # fmt: skip
    round1 = [r for r in own if r.metadata.get("apo_round") == 1]
    assert round1 and not demonstrated & {json.dumps(r.task.input, sort_keys=True) for r in round1}
    assert not {d["task_id"] for d in child["demos"]} & {r.task.task_id for r in earlier_rollouts}  # renamed
    assert apo.report["best_candidate"] == child["id"] and apo.report["val_after"] == 1.0


class CrashWhileRecording(APO):
    """Dies in the middle of writing round 1's results: its rollouts are finished in the store, the run folder's
    state still says the round is pending."""

    def _record(self, key, metrics):
        super()._record(key, metrics)
        if key == "candidate:1:c1" and not getattr(self, "crashed", False):
            self.crashed = True
            raise RuntimeError("simulated crash")


def test_resume_mid_round_reuses_finished_rollouts(tmp_path, tiny_model, optimizer):
    fake = optimizer([3, 7, 5, 9, 2, 8])
    train, val = _problems(12, 2)
    settings = _settings(tmp_path, tiny_model, fake, rounds=1)
    with pytest.raises(RuntimeError, match="simulated crash"):
        _fit(CrashWhileRecording(**settings), tmp_path / "store.db", "apo_agents:level_agent", train, val)
    before, _ = _stored(tmp_path / "store.db")
    resumed = APO(**settings)
    _fit(resumed, tmp_path / "store.db", "apo_agents:level_agent", train, val)
    after, attempts = _stored(tmp_path / "store.db")
    assert (fake.critiques, fake.edits) == (2, 2)  # no proposal asked twice
    round1 = [r for r in after if r.metadata["apo_round"] == 1]
    assert {r.rollout_id for r in round1} <= {r.rollout_id for r in before}  # round 1 was not run again
    assert len(round1) == 3 * 2 and all(len(attempts[r.rollout_id]) == 1 for r in round1)
    keys = [m["key"] for m in _metrics(tmp_path / "run")]
    assert len(keys) == len(set(keys)) and "candidate:1:c2" in keys
    assert resumed.report["best_candidate"] == "c2" and resumed.report["rollouts"] == 2 + 6
