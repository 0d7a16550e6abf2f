"""`lightrail export`: a checkpoint written the way GRPO writes it becomes a model folder that transformers, peft,
``lightrail gateway serve`` and vLLM serve with exactly the weights the training engine served.

The tiny model is fine-tuned for a few steps (`PolicyUpdater.step`, SFT objective, high learning rate) to answer
a handful of prompts with fixed replies, so the trained weights change its greedy answers: an export that lost the
training (wrote the base weights, the wrong step, an unmerged adapter) answers differently and the tests fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lightrail.algorithms import LoraSettings, PolicyUpdater, UpdateConfig
from lightrail.cli import main as lightrail_main
from lightrail.engine import Engine, build_tiny_model
from lightrail.model.export import EXPORT_INFO, ExportError, export_checkpoint
from lightrail.types import ChatRequest, SamplingParams, TrainingRow
from tests._served import free_port
from tests._served import served as serve_cmd

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("LIGHTRAIL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")

TAUGHT = {
    "Tom has 3 apples and gets 4 more. How many now?": "Answer: 7",
    "What is 12+30?": "Answer: 42",
    "Say hello.": "Hello! How can I help you today?",
}
# Greedy answers are compared on the taught prompts and on prompts the model never saw.
PROMPTS = [*TAUGHT, "Ana has 9 pens and gives away 2. How many are left?", "What is the capital of Peru?"]
STEPS = 14


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _sft_rows(tokenizer) -> list[TrainingRow]:
    rows = []
    for prompt, reply in TAUGHT.items():
        text = tokenizer.apply_chat_template(_messages(prompt), add_generation_prompt=True, tokenize=False)
        p = tokenizer(text, add_special_tokens=False)["input_ids"]
        r = tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
        n = len(p) + len(r)
        rows.append(
            TrainingRow(
                input_ids=p + r, loss_mask=[0] * len(p) + [1] * len(r), old_logprobs=[0.0] * n, advantages=[0.0] * n
            )
        )
    return rows


class Trained:
    """A run directory with checkpoints at step 1 and the last step, and the updater's served state at each."""

    def __init__(self, base: Path, run: Path, lora: LoraSettings | None) -> None:
        self.base, self.run, self.lora = base, run, lora
        updater = PolicyUpdater(str(base), UpdateConfig(lr=1e-3 if lora is None else 2e-3, lora=lora))
        rows = _sft_rows(AutoTokenizer.from_pretrained(base))
        self.served: dict[int, dict[str, torch.Tensor]] = {}
        for step in range(1, STEPS + 1):
            assert not updater.step(rows, objective="sft")["skipped"]
            if step in (1, STEPS):
                # As GRPO._checkpoint does: the updater's atomic directory, then the loop state beside it.
                path = updater.save(run / "checkpoints" / f"step-{step}")
                (path / "loop_state.json").write_text(json.dumps({"step": step}))
                self.served[step] = {k: v.clone() for k, v in updater.state_dict_for_serving().items()}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", size="tiny", seed=0).resolve()


@pytest.fixture(scope="module")
def full_run(tiny_dir, tmp_path_factory) -> Trained:
    return Trained(tiny_dir, tmp_path_factory.mktemp("run-full"), None)


@pytest.fixture(scope="module")
def lora_run(tiny_dir, tmp_path_factory) -> Trained:
    return Trained(tiny_dir, tmp_path_factory.mktemp("run-lora"), LoraSettings(r=16, alpha=32))


def _trained(request, kind: str) -> Trained:
    return request.getfixturevalue("full_run" if kind == "full" else "lora_run")


def _model_with(base: Path, state: dict[str, torch.Tensor]):
    model = AutoModelForCausalLM.from_pretrained(base).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    return model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


# -- the exported weights -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["full", "merged", "adapter"])
def test_export_loads_with_transformers_and_gives_the_served_logits(kind, request, tmp_path):
    run = _trained(request, kind)
    out = export_checkpoint(run.run, tmp_path / "out", merge=kind == "merged")
    assert json.loads((out / EXPORT_INFO).read_text())["kind"] == kind

    if kind == "adapter":
        from peft import PeftModel

        config = json.loads((out / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(run.base) and not (out / "config.json").exists()
        exported = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"]), out
        )
    else:
        assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in out.iterdir()}
        exported = AutoModelForCausalLM.from_pretrained(out)
    exported.eval()

    tokenizer = AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template(_messages(PROMPTS[0]), add_generation_prompt=True, tokenize=False)
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    served = _logits(_model_with(run.base, run.served[STEPS]), ids)
    got = _logits(exported, ids)
    # Full and merged exports hold the served tensors themselves (bitwise); peft computes x @ W + s * x @ A @ B
    # unmerged, which differs from the merged matmul by float rounding only.
    torch.testing.assert_close(got, served, rtol=0, atol=0 if kind != "adapter" else 1e-5)
    base = _logits(AutoModelForCausalLM.from_pretrained(run.base).eval(), ids)
    assert (got - base).abs().max() > 0.1  # training moved the weights: comparing against them means something


def test_export_carries_the_tokenizer_and_chat_template(full_run, tmp_path):
    out = export_checkpoint(full_run.run, tmp_path / "out")
    base_tok, out_tok = AutoTokenizer.from_pretrained(full_run.base), AutoTokenizer.from_pretrained(out)
    assert out_tok.chat_template and out_tok.chat_template == base_tok.chat_template
    # In both places: chat_template.jinja (transformers >= 4.47) and tokenizer_config.json (older loaders).
    assert (out / "chat_template.jinja").read_text() == base_tok.chat_template
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == base_tok.chat_template
    assert out_tok("What is 12+30?")["input_ids"] == base_tok("What is 12+30?")["input_ids"]


def test_step_selects_the_checkpoint_and_the_default_is_the_newest(lora_run, tmp_path):
    ids = torch.tensor([[1, 5, 9, 30, 31, 32]])
    step1 = AutoModelForCausalLM.from_pretrained(export_checkpoint(lora_run.run, tmp_path / "s1", step=1, merge=True))
    newest = AutoModelForCausalLM.from_pretrained(export_checkpoint(lora_run.run, tmp_path / "new", merge=True))
    torch.testing.assert_close(_logits(step1, ids), _logits(_model_with(lora_run.base, lora_run.served[1]), ids))
    torch.testing.assert_close(_logits(newest, ids), _logits(_model_with(lora_run.base, lora_run.served[STEPS]), ids))
    # A checkpoint directory given directly works too.
    direct = export_checkpoint(lora_run.run / "checkpoints" / "step-1", tmp_path / "direct", merge=True)
    torch.testing.assert_close(_logits(AutoModelForCausalLM.from_pretrained(direct), ids), _logits(step1, ids))


# -- errors ---------------------------------------------------------------------------------------------------------


def _cli(capsys, *args: str) -> tuple[int, str]:
    code = lightrail_main(["export", *map(str, args)])
    err = capsys.readouterr().err.strip()
    return code, err


def test_cli_errors_are_one_line_with_exit_code_2(full_run, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = _cli(capsys, full_run.run, "--step", 3, out)
    assert code == 2 and "no checkpoint for step 3" in err and "available steps: 1, 14" in err and "\n" not in err
    code, err = _cli(capsys, tmp_path, out)
    assert code == 2 and "is not a run directory" in err
    code, err = _cli(capsys, full_run.run / "checkpoints" / "step-1", "--step", 14, out)
    assert code == 2 and "single checkpoint" in err
    assert not out.exists()

    (tmp_path / "empty-run" / "checkpoints").mkdir(parents=True)
    code, err = _cli(capsys, tmp_path / "empty-run", out)
    assert code == 2 and "no complete checkpoint" in err

    assert _cli(capsys, full_run.run, out)[0] == 0
    code, err = _cli(capsys, full_run.run, out)
    assert code == 2 and "not empty; pass --force" in err
    assert _cli(capsys, full_run.run, "--step", 1, "--force", out)[0] == 0
    assert json.loads((out / EXPORT_INFO).read_text())["checkpoint"].endswith("step-1")
    code, err = _cli(capsys, full_run.run, "--force", full_run.run / "checkpoints")
    assert code == 2 and "which the export reads from" in err


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("damage", ["truncated", "missing", "bad-json"])
def test_a_corrupt_checkpoint_is_reported_not_exported(damage, full_run, tmp_path):
    ckpt = _copy_checkpoint(full_run.run / "checkpoints" / "step-14", tmp_path / "run" / "checkpoints" / "step-14")
    tensors = ckpt / "trainable.safetensors"
    if damage == "truncated":
        data = tensors.read_bytes()
        tensors.write_bytes(data[: len(data) // 2])
    elif damage == "missing":
        tensors.unlink()
    else:
        (ckpt / "updater.json").write_text('{"format": 1, "steps": ')
    with pytest.raises(ExportError, match=f"corrupt checkpoint {ckpt}") as info:
        export_checkpoint(tmp_path / "run", tmp_path / "out")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))  # nothing half-written


def test_a_missing_base_model_is_reported_and_can_be_given(full_run, tmp_path):
    ckpt = _copy_checkpoint(full_run.run / "checkpoints" / "step-14", tmp_path / "ckpt")
    meta = json.loads((ckpt / "updater.json").read_text())
    meta["base_model"]["path"] = str(tmp_path / "moved-away")
    (ckpt / "updater.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="base model .*moved-away.* not found"):
        export_checkpoint(ckpt, tmp_path / "out")
    other = build_tiny_model(tmp_path / "other", size="small", seed=1)
    with pytest.raises(ExportError, match="is not the one .* was trained from .hidden_size"):
        export_checkpoint(ckpt, tmp_path / "out", base_model=other)
    # An older checkpoint without the record: the base model is named by hand.
    del meta["base_model"]
    (ckpt / "updater.json").write_text(json.dumps(meta))
    with pytest.raises(ExportError, match="does not record its base model"):
        export_checkpoint(ckpt, tmp_path / "out")
    out = export_checkpoint(ckpt, tmp_path / "out", base_model=full_run.base)
    ids = torch.tensor([[1, 5, 9]])
    torch.testing.assert_close(
        _logits(AutoModelForCausalLM.from_pretrained(out), ids),
        _logits(_model_with(full_run.base, full_run.served[STEPS]), ids),
    )
    with pytest.raises(ExportError, match="tensors of .* do not match its base model"):  # no record: by the tensors
        export_checkpoint(ckpt, tmp_path / "out2", base_model=other)


# -- serving the export ---------------------------------------------------------------------------------------------


def _answers_over_http(url: str, model: str, prompts: list[str], api_key: str = "none") -> list[str]:
    import openai

    client = openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=120)
    return [
        client.chat.completions.create(model=model, messages=_messages(p), temperature=0, max_tokens=16)
        .choices[0]
        .message.content
        for p in prompts
    ]


def _engine_answers(base: Path, state: dict[str, torch.Tensor] | None, prompts: list[str]) -> list[str]:
    async def go() -> list[str]:
        engine = Engine.from_pretrained(base, device="cpu")
        try:
            if state is not None:
                await engine.update_weights(state)
            sampling = SamplingParams(temperature=0, max_tokens=16)
            return [
                (await engine.chat(ChatRequest(model="policy", messages=_messages(p), sampling=sampling)))
                .choices[0]
                .text
                for p in prompts
            ]
        finally:
            await engine.close()

    return asyncio.run(go())


@pytest.mark.parametrize("kind", ["full", "merged", "adapter"])
def test_gateway_serves_the_export_with_the_training_engines_greedy_answers(kind, request, tmp_path):
    run = _trained(request, kind)
    out = export_checkpoint(run.run, tmp_path / "out", merge=kind == "merged")
    port, token = free_port(), "t0ken"
    cmd = [
        sys.executable, "-m", "lightrail", "gateway", "serve", "--model", str(out), "--store", str(tmp_path / "s.db"),
        "--port", str(port), "--token", token,
    ]  # fmt: skip
    with serve_cmd(cmd, port, tmp_path / "gateway.log", timeout_s=120) as server:
        served = _answers_over_http(server.url, "policy", PROMPTS, api_key=token)
    trained = _engine_answers(run.base, run.served[STEPS], PROMPTS)
    assert served == trained
    assert trained[: len(TAUGHT)] == list(TAUGHT.values())  # the model learned its replies ...
    assert _engine_answers(run.base, None, PROMPTS) != trained  # ... which the base model does not give


@pytest.mark.slow
def test_vllm_serves_the_merged_export_with_the_training_engines_greedy_answers(lora_run, tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM interpreter at {VLLM_PYTHON} (set LIGHTRAIL_VLLM_PYTHON or create .venv-vllm)")
    out = export_checkpoint(lora_run.run, tmp_path / "out", merge=True)
    port = free_port()
    cmd = [
        str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(out), "--served-model-name",
        "policy", "--enforce-eager", "--dtype", "float32", "--max-model-len", "512", "--host", "127.0.0.1",
        "--port", str(port),
    ]  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with serve_cmd(cmd, port, tmp_path / "vllm.log", timeout_s=600, env=env) as server:
        served = _answers_over_http(server.url, "policy", PROMPTS)
    assert served == _engine_answers(lora_run.base, lora_run.served[STEPS], PROMPTS)
