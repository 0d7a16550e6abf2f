"""The rollout-engine seam without vLLM: choosing an engine, refusing settings vLLM cannot honour, attaching to a
server that serves another model, and the files a sync hands to vLLM (a peft adapter folder, a safetensors file of
the serving weights) holding exactly the trainer's policy.

The served-name check attaches to a real lightrail gateway on 127.0.0.1 serving `ScriptedBackend` (a named fake
standing in for vLLM's OpenAI server). Syncs into real vLLM: tests/model/test_vllm_rollouts.py (slow).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from safetensors.torch import load_file

from lightrail.algorithms import GRPO, LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.algorithms.settings import GRPOSection
from lightrail.gateway import ScriptedBackend
from lightrail.gateway.server import GatewayServer
from lightrail.model.rollout_engines import EmbeddedRollouts, make_rollout_engine
from lightrail.model.vllm_rollouts import VLLMRollouts, write_lora_adapter, write_serving_weights
from lightrail.store import MemoryStore
from tests.algorithms.grpo_helpers import tiny_llama

LORA = LoraSettings(r=4, alpha=8, target_modules=("q_proj", "v_proj"))


def test_rollout_engine_choice_and_vllm_sampling_are_checked_up_front(tmp_path):
    with pytest.raises(ValueError, match=r"^grpo.rollout_engine: expected one of \['embedded', 'vllm'\], got 'sglang'"):
        GRPO(tmp_path, rollout_engine="sglang")
    with pytest.raises(ValueError, match="top_p=1"):
        GRPO(tmp_path, rollout_engine="vllm", sampling={"temperature": 0.7, "top_p": 0.9})
    with pytest.raises(ValueError, match="unknown vllm option"):
        make_rollout_engine("vllm", tmp_path, served_name="p", out_dir=tmp_path, lora_rank=8, vllm={"pyhton": "x"})
    assert isinstance(make_rollout_engine("embedded", tmp_path, served_name="p", out_dir=tmp_path, lora_rank=None),
                      EmbeddedRollouts)  # fmt: skip


def test_several_policies_on_vllm_need_lora(tmp_path):
    """Each policy on vLLM is a LoRA adapter on one server: full weights are refused in one line, from the
    constructor's ``config`` and from a section's; with LoRA (or the embedded engine) the run is accepted."""
    policies = {"write": ["writer"], "check": ["checker"]}
    for config in (None, UpdateConfig(seed=0)):
        with pytest.raises(ValueError, match=r"^grpo.policies: with rollout_engine vllm each policy is a LoRA adapter"):
            GRPO(tmp_path, config=config, policies=policies, rollout_engine="vllm")
    with pytest.raises(ValueError, match=r"^grpo.policies: .* set grpo.config.lora"):
        GRPOSection(policies=policies, rollout_engine="vllm", config={"lr": 1e-3})
    grpo = GRPO(tmp_path, config=UpdateConfig(lora=LORA), policies=policies, rollout_engine="vllm")
    assert grpo.policies is not None and grpo.policies.names == ["write", "check"]
    GRPO(tmp_path, config=UpdateConfig(seed=0), policies=policies)  # the embedded engine serves full weights


def test_attaching_to_a_server_without_the_served_name_fails_clearly(tmp_path):
    async def attach(name: str) -> None:
        async with GatewayServer(ScriptedBackend(model="other-model"), MemoryStore()) as server:
            rollouts = VLLMRollouts(tmp_path, served_name=name, workdir=tmp_path / "w", url=server.url)
            await rollouts.start()
            assert rollouts.policy_version == 0 and rollouts.backend.current == name
            await rollouts.close()

    with pytest.raises(RuntimeError, match="serves \\['other-model'\\], not 'policy'"):
        asyncio.run(attach("policy"))
    asyncio.run(attach("other-model"))  # the right name attaches


def _lora_updater() -> PolicyUpdater:
    updater = PolicyUpdater(tiny_llama(seed=0), UpdateConfig(lora=LORA, seed=0))
    with torch.no_grad():
        for name, p in updater.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)  # a trained-looking adapter (B starts at zero)
    return updater


def test_the_adapter_folder_is_the_trained_adapter(tmp_path):
    from peft import PeftModel

    updater = _lora_updater()
    path = write_lora_adapter(updater, tmp_path / "policy-v1")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in path.iterdir()}
    loaded = PeftModel.from_pretrained(tiny_llama(seed=0), str(path)).eval()
    ids = torch.arange(1, 20)[None]
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, updater.model.eval()(ids).logits, atol=1e-5)
        with updater.model.disable_adapter():  # and the adapter matters: without it the logits differ
            assert not torch.allclose(loaded(ids).logits, updater.model(ids).logits, atol=1e-3)


def test_serving_weights_file_holds_the_merged_policy_once_per_tensor(tmp_path):
    updater = _lora_updater()
    state = updater.state_dict_for_serving()
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()  # tied
    written = load_file(str(write_serving_weights(updater, tmp_path / "v1") / "model.safetensors"))
    assert set(written) == set(state) - {"lm_head.weight"}  # the tied head is written once, as the embeddings
    for name, value in written.items():
        assert torch.equal(value, state[name]), name
