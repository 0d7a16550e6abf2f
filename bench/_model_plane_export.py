"""Shipping a trained policy: does ``lightrail export`` + ``lightrail gateway serve --model OUT`` answer exactly as the
training engine did?

A LoRA policy is trained for a few SFT steps (`PolicyUpdater.step`, the real update) to call the calculator on the
calculator demo's training problems, checkpointed the way GRPO checkpoints (``<run>/checkpoints/step-N``), exported
with ``--merge`` and served by ``lightrail gateway serve --model OUT`` in its own process. Each of the demo's
held-out problems (system prompt, calculator tool, question, as ``examples/calculator/agent.py`` asks them) is then
answered greedily over HTTP with the real ``openai`` client, and by an in-process `Engine` holding the trained
weights (``Engine.update_weights(updater.state_dict_for_serving())``, what GRPO serves during training).

Figures: ``export_greedy_match`` (fraction of held-out prompts whose greedy answer, text and tool calls, is
identical; must be 1.0), next to its baseline ``base_greedy_match`` (the same comparison for the untrained base
model: how often the answers would agree anyway, so 1.0 above is not a comparison that cannot fail);
``export_s`` (wall time of the export) next to ``checkpoint_save_s`` (the `PolicyUpdater.save` it starts from);
``export_prompts``. ``--quick``: the tiny model, 8 prompts; otherwise SmolLM2-135M-Instruct (``prepare_model
("smollm2")``), 32 prompts.

    python bench/_model_plane_export.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ and examples/ when run from a checkout

from bench._util import REPO, free_port, log  # noqa: E402
from examples.calculator.agent import CALCULATOR, SYSTEM  # noqa: E402
from examples.calculator.data import make_splits  # noqa: E402

MAX_TOKENS = 48


def _messages(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def _rows(tokenizer: Any, problems: list[dict]) -> list[Any]:
    """SFT rows: the demo's prompt, then a well-formed calculator call on the problem's expression."""
    from lightrail.types import TrainingRow

    rows = []
    for p in problems:
        text = tokenizer.apply_chat_template(
            _messages(p["question"]), tools=[CALCULATOR], add_generation_prompt=True, tokenize=False
        )
        call = json.dumps({"name": "calculator", "arguments": {"expression": p["expression"]}})
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        reply = tokenizer(f"<tool_call>\n{call}\n</tool_call><|im_end|>", add_special_tokens=False)["input_ids"]
        n = len(prompt) + len(reply)
        rows.append(
            TrainingRow(
                input_ids=prompt + reply,
                loss_mask=[0] * len(prompt) + [1] * len(reply),
                old_logprobs=[0.0] * n,
                advantages=[0.0] * n,
            )
        )
    return rows


def _engine_answers(base: Path, state: dict | None, questions: list[str]) -> list[tuple]:
    from lightrail.engine import Engine
    from lightrail.types import ChatRequest, SamplingParams

    async def go() -> list[tuple]:
        engine = Engine.from_pretrained(base, device="cpu")
        try:
            if state is not None:
                await engine.update_weights(state)
            answers = []
            for q in questions:
                request = ChatRequest(
                    model="policy",
                    messages=_messages(q),
                    tools=[CALCULATOR],
                    sampling=SamplingParams(temperature=0, max_tokens=MAX_TOKENS),
                )
                choice = (await engine.chat(request)).choices[0]
                answers.append((choice.text or "", [(c.name, c.arguments) for c in choice.tool_calls]))
            return answers
        finally:
            await engine.close()

    return asyncio.run(go())


def _gateway_answers(out: Path, questions: list[str], tmp: Path) -> list[tuple]:
    import openai

    port, token = free_port(), "bench-token"
    cmd = [
        sys.executable, "-m", "lightrail", "gateway", "serve", "--model", str(out), "--store", str(tmp / "serve.db"),
        "--port", str(port), "--token", token,
    ]  # fmt: skip
    with open(tmp / "gateway.log", "wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"gateway did not start:\n{(tmp / 'gateway.log').read_text()[-3000:]}")
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                        break
                except OSError:
                    time.sleep(0.5)
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=token, max_retries=0, timeout=300)
            answers = []
            for q in questions:
                message = (
                    client.chat.completions.create(
                        model="policy", messages=_messages(q), tools=[CALCULATOR], temperature=0, max_tokens=MAX_TOKENS
                    )
                    .choices[0]
                    .message
                )
                calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
                answers.append((message.content or "", calls))
            return answers
        finally:
            proc.terminate()
            proc.wait(30)


def measure(quick: bool, smoke: bool = False) -> dict:
    from transformers import AutoTokenizer

    from lightrail.engine.models import build_tiny_model, prepare_model
    from lightrail.model import LoraSettings, PolicyUpdater, UpdateConfig
    from lightrail.model.export import export_checkpoint

    n_val, steps = (2, 2) if smoke else (8, 12) if quick else (32, 8)
    train, val = make_splits(16, n_val, seed=0)
    questions = [p["question"] for p in val]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        base = build_tiny_model(tmp / "tiny") if quick or smoke else prepare_model("smollm2")
        log(f"model {base.name}: {steps} LoRA SFT steps on {len(train)} training problems")
        updater = PolicyUpdater(str(base), UpdateConfig(lr=2e-3, lora=LoraSettings(r=16, alpha=32)))
        rows = _rows(AutoTokenizer.from_pretrained(base), train)
        for _ in range(steps):
            updater.step(rows, objective="sft")
        t0 = time.perf_counter()
        updater.save(tmp / "run" / "checkpoints" / f"step-{steps}")
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = export_checkpoint(tmp / "run", tmp / "export", merge=True)
        export_s = time.perf_counter() - t0
        log(f"exported in {export_s:.1f} s; answering {len(questions)} held-out problems three ways")
        trained = _engine_answers(base, updater.state_dict_for_serving(), questions)
        served = _gateway_answers(out, questions, tmp)
        untrained = _engine_answers(base, None, questions)
    match = sum(a == b for a, b in zip(served, trained, strict=True)) / len(questions)
    base_match = sum(a == b for a, b in zip(untrained, trained, strict=True)) / len(questions)
    result = {
        "export_greedy_match": round(match, 4),
        "base_greedy_match": round(base_match, 4),
        "export_s": round(export_s, 2),
        "checkpoint_save_s": round(save_s, 2),
        "export_prompts": len(questions),
    }
    log(
        f"greedy match, exported model served by the gateway vs training engine: {match:.2f} "
        f"(untrained base vs training engine: {base_match:.2f}); export {export_s:.1f} s (checkpoint save {save_s:.1f} s)"
    )
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    print(json.dumps(measure(parser.parse_args().quick)))
