"""``lightrail learn`` rounds end to end on a tiny model: served sessions recorded by a real gateway over a SQLite
store, rewarded later by feedback, learned from off-policy, gated through real runner processes, promoted or
refused, swapped into a serving engine, rolled back.

The model is the tiny random Llama fine-tuned for a few seconds to answer "yes" more often than "no": its greedy
reply is "yes" (the gate's held-out task is to say "yes", which the initial policy passes), and its samples at
temperature 1 say either, so rewards vary. Rewarding "yes" keeps the greedy reply and the candidate is promoted;
inverted rewards (rewarding "no") move it and the gate refuses the candidate.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from gate_agents import QUESTIONS
from openai import AsyncOpenAI

from lightrail.continuous.learn import GateSettings, LearnConfig, learn_round
from lightrail.engine.promotions import PolicyRegistry, PolicyWatcher
from lightrail.store import SQLiteStore
from lightrail.store.sessions import Feedback, give_feedback

SAMPLED = {"temperature": 1.0, "max_tokens": 4}
GREEDY = {"temperature": 0.0, "max_tokens": 4}


async def _serve(model: Path, db: Path, calls: list[tuple[str, str, dict]]) -> list[str]:
    """Send ``(session, question, sampling)`` calls to a recording gateway serving ``model``; returns the replies."""
    from lightrail.engine import Engine
    from lightrail.gateway.recording import SESSION_HEADER, SessionRecorder
    from lightrail.gateway.server import GatewayServer

    engine = Engine.from_pretrained(model)
    store = SQLiteStore(db)
    replies = []
    try:
        async with GatewayServer(engine, store, sessions=SessionRecorder(store)) as server:
            client = AsyncOpenAI(base_url=server.url, api_key="none", max_retries=0)
            for session, question, sampling in calls:
                reply = await client.chat.completions.create(
                    model="policy",
                    messages=[{"role": "user", "content": question}],
                    extra_headers={SESSION_HEADER: session},
                    **sampling,
                )
                replies.append(reply.choices[0].message.content or "")
            await asyncio.sleep(0.1)  # sessions are opened off the serving path
    finally:
        await engine.close()
        await store.close()
    return replies


async def _feedback(db: Path, rewards: dict[str, float]) -> None:
    store = SQLiteStore(db)
    try:
        for session, reward in rewards.items():
            await give_feedback(store, Feedback(session_id=session, reward=reward))
    finally:
        await store.close()


def _config(tmp_path: Path, model: Path, **overrides) -> LearnConfig:
    replies = asyncio.run(
        _serve(model, tmp_path / "targets.db", [(f"t{i}", q, GREEDY) for i, q in enumerate(QUESTIONS[:4])])
    )
    assert replies == ["yes"] * 4, replies  # the initial policy passes its own held-out set
    val = tmp_path / "val.json"
    val.write_text(json.dumps([{"question": q, "target": "yes"} for q in QUESTIONS[:4]]))
    settings = dict(
        store=str(tmp_path / "prod.db"),
        policies=str(tmp_path / "policies"),
        agent="gate_agents:echo_agent",
        data="gate_agents:held_out",
        data_args={"path": str(val)},
        model=str(model),
        min_sessions=8,
        updates=4,
        config={"lr": 2.5e-3},  # between 2e-3 and 3e-3 both cases hold; 5e-3 also breaks the rewarded "yes"
        gate=GateSettings(n_runners=1, concurrency=1, sampling=GREEDY),
    )
    return LearnConfig(**{**settings, **overrides})


def _served_round(tmp_path: Path, config: LearnConfig, *, reward_yes: float, n: int = 16, rewarded: int = 12) -> dict:
    calls = [(f"s{i}", QUESTIONS[i % len(QUESTIONS)], {**SAMPLED, "seed": i}) for i in range(n)]
    replies = asyncio.run(_serve(Path(config.model), Path(config.store), calls))
    assert 0 < replies.count("yes") < n, replies  # samples vary: rewards carry a signal
    rewards = {f"s{i}": reward_yes if r == "yes" else 1.0 - reward_yes for i, r in enumerate(replies[:rewarded])}
    asyncio.run(_feedback(Path(config.store), rewards))
    return rewards


def test_a_round_learns_only_from_rewarded_sessions_and_the_gate_refuses_a_regression(tmp_path, yes_model):
    config = _config(tmp_path, yes_model)
    rewards = _served_round(tmp_path, config, reward_yes=0.0)  # inverted: "no" rewarded, the held-out task says yes

    metrics = learn_round(config)
    assert metrics["sessions"] == len(rewards)  # the 4 sessions without feedback were not read
    assert metrics["updated"] and metrics["outcome"] == "rejected", metrics
    assert metrics["val_current"] == 1.0 and metrics["val_candidate"] < 1.0
    registry = PolicyRegistry(config.policies)
    assert registry.current().version == 0  # still serving the initial policy
    assert (Path(config.policies) / f"v{metrics['candidate']:04d}" / "config.json").exists()  # kept to inspect
    assert json.loads((Path(config.policies) / "metrics.jsonl").read_text().splitlines()[-1])["outcome"] == "rejected"

    # nothing is read twice: no new feedback, no round; feedback for one more session, a round of one
    assert learn_round(config, force=True)["outcome"] == "waiting"
    asyncio.run(_feedback(Path(config.store), {"s13": 1.0}))
    again = learn_round(config, force=True)
    assert again["sessions"] == 1 and again["round"] == 2


def test_a_round_that_keeps_the_held_out_success_is_promoted_served_and_rolled_back(tmp_path, yes_model):
    config = _config(tmp_path, yes_model)
    _served_round(tmp_path, config, reward_yes=1.0)

    metrics = learn_round(config)
    assert metrics["outcome"] == "promoted" and metrics["val_candidate"] == 1.0, metrics
    registry = PolicyRegistry(config.policies)
    promoted = registry.current()
    assert promoted.version == metrics["candidate"] == 1 and promoted.val_success == 1.0

    async def serve_and_roll_back() -> list[int]:
        from lightrail.engine import Engine

        engine = Engine.from_pretrained(yes_model)  # a gateway started before the promotion serves v0
        watcher = PolicyWatcher(registry, engine, poll_s=0.05)
        versions = [engine.policy_version]
        try:
            assert await watcher.check()  # v1 swapped in
            versions.append(engine.policy_version)
            restored = registry.rollback()
            assert restored.path == str(yes_model.resolve()) and restored.kind == "rollback"
            assert await watcher.check() and not await watcher.check()
            versions.append(engine.policy_version)
        finally:
            await engine.close()
        return versions

    assert asyncio.run(serve_and_roll_back()) == [0, 1, 2]  # versions only grow: the rollback is v2
    assert [p.version for p in registry.history()] == [0, 1, 2]


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("policies: p\nagent: a:b\ndata: d:e\n", "store"),  # a required field missing is named
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\nmin_session: 3\n", "min_session"),  # a typo is named
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\nconfig: {lr: fast}\n", "config.lr"),
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\nconfig: {lora: {r: many}}\n", "config.lora.r"),
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\nmin_sessions: 0\n", "min_sessions"),
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\nmethod: dpo\n", "method"),
        ("store: s\npolicies: p\nagent: a:b\ndata: d:e\ncredit: per_tern\n", r"credit: expected one of \['identical'"),
    ],
)
def test_a_bad_learn_config_is_refused_naming_the_field(tmp_path, yaml_text, message):
    from lightrail.continuous.learn import load_learn_config
    from lightrail.trainer.config import ConfigError

    path = tmp_path / "learn.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_learn_config(str(path))
    path.write_text("store: s\npolicies: p\nagent: a:b\ndata: d:e\n")
    assert load_learn_config(str(path), ["gate.tolerance=0.1"]).gate.tolerance == 0.1
