"""Rollouts that succeed but capture nothing to train on are named with their cause: in `lightrail dev`'s table and
summary, in the failure digest (`lightrail failures`), and by `lightrail doctor` (`lightrail.inspection.capture`).

The real ``lightrail`` command in subprocesses, in a temporary folder, with agents written there that use the real
openai client: one calls its own server (a real HTTP server on 127.0.0.1) instead of ``llm.endpoint``, one returns
None without a reward, one works.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from rich.console import Console

from lightrail.inspection.capture import CaptureCause, capture_problems
from lightrail.inspection.report import print_failure_digest
from lightrail.store import open_store
from lightrail.types import Attr, RetryPolicy, Rollout, RolloutStatus, Span, SpanStatus, StatusCode, Task

AGENTS = """
import os

from openai import OpenAI

from lightrail import rollout


def ask(base_url, api_key, model):
    client = OpenAI(base_url=base_url, api_key=api_key or "none", max_retries=0)
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "2 + 2 = ?"}])
    return reply.choices[0].message.content


@rollout
def own_client(task, llm):
    ask(os.environ["OWN_BASE_URL"], "mine", "gpt-4o-mini")  # its own base_url: lightrail's gateway never sees it
    return 1.0


@rollout
def no_reward(task, llm):
    ask(llm.endpoint, llm.api_key, llm.model)
    return None


@rollout
def templated(task, prompt_template, llm):
    ask(llm.endpoint, llm.api_key, llm.model)
    return float(prompt_template.format(q=task["q"]) == f"Say {task['q']}.")


@rollout
def works(task, llm):
    ask(llm.endpoint, llm.api_key, llm.model)
    return 1.0
"""


class _OwnModel(BaseHTTPRequestHandler):
    """An OpenAI-compatible server of the agent's own: every chat completion answers "4", without token ids."""

    def do_GET(self) -> None:  # noqa: N802
        self._send({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self._send({
            "id": "chatcmpl-own", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "4"}}],
        })  # fmt: skip

    def _send(self, answer: dict) -> None:
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def own_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OwnModel)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def lightrail(args: list[str], cwd: Path, timeout_s: float = 120.0, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTRAIL_STORE") and k != "LIGHTRAIL_TOKEN"}
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), env.get("PYTHONPATH", "")])
    env["COLUMNS"] = "300"
    return subprocess.run(
        [sys.executable, "-m", "lightrail", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
    )


def dev(
    tmp_path: Path, agent: str, tasks: list[dict], llm: str = "fake", **env: str
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "capture_agents.py").write_text(AGENTS)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return lightrail(
        ["dev", "--agent", f"capture_agents:{agent}", "--tasks", "tasks.jsonl", "--llm", llm,
         "--runners", "1", "-k", "2", "--store", "store.db"],
        tmp_path, **env,
    )  # fmt: skip


def test_dev_names_an_agent_that_calls_its_own_base_url(tmp_path, own_url):
    done = dev(tmp_path, "own_client", [{"q": 1}] * 3, OWN_BASE_URL=own_url)
    out = done.stdout
    assert "no LLM call recorded: the agent did not call llm.endpoint (it may use its own client or base_url)" in out
    assert "not trainable: 3 rollouts captured nothing to train on (3 no LLM call)" in out
    assert "3 capture problems in succeeded rollouts" in out
    assert "3x no LLM call in 3 rollouts: the agent did not call llm.endpoint" in out  # its own digest group
    assert done.returncode == 1  # succeeded, yet nothing to train on: loud

    failures = lightrail(["failures", "--store", "store.db"], tmp_path, timeout_s=30)
    assert failures.returncode == 0, failures.stderr
    assert "3 capture problems in succeeded rollouts" in failures.stdout
    assert "3x no LLM call in 3 rollouts: the agent did not call llm.endpoint" in failures.stdout

    page = dashboard_page(tmp_path, "store.db", "/ui/failures")  # the dashboard's digest counts them apart
    assert "No failed attempts; 3 capture problems in succeeded rollouts" in page
    assert "<code>no LLM call</code>" in page


def dashboard_page(cwd: Path, store: str, path: str) -> str:
    """``path`` as `lightrail dashboard --store STORE` serves it."""
    import time
    import urllib.error
    import urllib.request

    command = [sys.executable, "-m", "lightrail", "dashboard", "--store", store, "--port", "0", "--token", "t0k"]
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip().rsplit(" ", 1)[-1]
        request = urllib.request.Request(url + path, headers={"Authorization": "Bearer t0k"})
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    return answer.read().decode()
            except urllib.error.URLError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        process.terminate()
        process.wait(10)


def test_dev_names_an_agent_that_returns_no_reward(tmp_path):
    done = dev(tmp_path, "no_reward", [{"q": 1}, {"q": 2}])
    out = done.stdout
    assert "no reward: the agent returned None and emitted no reward" in out
    assert "not trainable: 2 rollouts captured nothing to train on (2 no reward)" in out
    assert "2x no reward in 2 rollouts: the agent returned None and emitted no reward" in out
    assert "no LLM call" not in out and done.returncode == 1  # its calls went through lightrail's endpoint

    # what training prints after every validation: the same groups, from the store
    async def validation_digest() -> str:
        store = open_store(str(tmp_path / "store.db"))
        try:
            console = Console(file=io.StringIO(), width=300)
            await print_failure_digest(store, await store.query_rollouts(), title="validation", console=console)
            return console.file.getvalue()
        finally:
            await store.close()

    digest = asyncio.run(validation_digest())
    assert "validation: no failed attempts; 2 capture problems in succeeded rollouts" in digest
    assert "2x no reward in 2 rollouts: the agent returned None and emitted no reward" in digest


def test_dev_names_calls_without_token_ids(tmp_path, own_url):
    """A gateway in front of a server that returns no token ids records the calls, but nothing is trainable."""
    done = dev(tmp_path, "works", [{"q": 1}], llm=own_url)
    assert "1 call without token ids: the backend does not return them (not trainable" in done.stdout
    assert "not trainable: 1 rollout captured nothing to train on (1 no token ids)" in done.stdout
    assert done.returncode == 1


def test_dev_of_a_working_agent_names_nothing(tmp_path):
    done = dev(tmp_path, "works", [{"q": 1}, {"q": 2}])
    assert done.returncode == 0, done.stderr
    assert "2 rollouts in" in done.stdout and "2 succeeded" in done.stdout
    assert "not trainable" not in done.stdout and "not captured" not in done.stdout
    assert "failure digest: no failed attempts" in done.stdout


def _rollout(reward: float | None) -> Rollout:
    return Rollout(
        rollout_id="ro-1", task=Task(input=1), mode="val", sample_index=0, resources_version=1,
        policy=RetryPolicy(), status=RolloutStatus.SUCCEEDED, created_at=0.0, reward=reward,
    )  # fmt: skip


def _call(token_ids: bool, ok: bool = True) -> Span:
    return Span(
        rollout_id="ro-1", attempt_id="at-1", seq=1, name=Attr.SPAN_LLM_CALL,
        attributes={Attr.TOKEN_IDS_AVAILABLE: token_ids},
        status=SpanStatus(code=StatusCode.OK if ok else StatusCode.ERROR),
    )  # fmt: skip


def test_capture_problems_from_hand_built_spans():
    untrainable = capture_problems(_rollout(1.0), [_call(False), _call(False), _call(False), _call(True)])
    assert [(p.cause, p.message.split(":")[0]) for p in untrainable] == [
        (CaptureCause.NO_TOKEN_IDS, "3 calls without token ids")
    ]
    assert "the backend does not return them (not trainable" in untrainable[0].message
    assert capture_problems(_rollout(1.0), [_call(True), _call(False, ok=False)]) == []  # a failed call is no cause
    framework = Span(rollout_id="ro-1", attempt_id="at-1", seq=2, name="openai.chat", attributes={Attr.KIND: "llm"})
    [elsewhere] = capture_problems(_rollout(0.0), [framework])
    assert elsewhere.cause is CaptureCause.NO_LLM_CALL and "1 LLM call seen over OpenTelemetry" in elsewhere.message
    assert capture_problems(_rollout(0.0), [], expects_llm=False) == []  # no endpoint was given
    assert [p.cause for p in capture_problems(_rollout(None), [_call(True)])] == [CaptureCause.NO_REWARD]


DATA = """
def splits(n=2):
    return [{"q": i} for i in range(n)], [{"q": 9}]


def empty():
    return [], []
"""


def doctor(tmp_path: Path, agent: str, *overrides: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "capture_agents.py").write_text(AGENTS)
    (tmp_path / "capture_data.py").write_text(DATA)
    (tmp_path / "config.yaml").write_text(
        f"name: doctor\nagent: capture_agents:{agent}\ndata: capture_data:splits\nmodel: tiny\n"
        "trainer: {n_runners: 1, concurrency: 1}\ngrpo: {val_sampling: {max_tokens: 4}}\n"
    )
    args = ["doctor", "config.yaml"] + [f"--set={item}" for item in overrides]
    return lightrail(args, tmp_path, timeout_s=300, **env)


def lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stdout.splitlines() if line.startswith(("✓", "✗"))]


def test_doctor_passes_a_working_config(tmp_path):
    done = doctor(tmp_path, "works")
    assert done.returncode == 0, (done.stdout, done.stderr)
    checks = lines(done)
    assert [line[0] for line in checks] == ["✓"] * 9, done.stdout
    assert "✓ config parses (config.yaml)" in checks
    assert "✓ store opens (runs/doctor/store.db)" in checks
    assert "✓ agent imports (capture_agents:works)" in checks
    assert "✓ 1 LLM call recorded through lightrail's endpoint" in checks
    assert "✓ with token ids" in checks and "✓ a reward came back (1)" in checks
    assert "all 9 checks passed" in done.stdout


def test_doctor_gives_a_prompt_optimization_agent_its_templates(tmp_path):
    done = doctor(tmp_path, "templated", "algorithm=apo", "apo={prompts: {prompt_template: 'Say {q}.'}}")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "✓ a reward came back (1)" in lines(done)


@pytest.mark.parametrize(
    ("agent", "failed"),
    [
        pytest.param(
            "own_client",
            "✗ an LLM call through lightrail's endpoint: no LLM call recorded: the agent did not call llm.endpoint "
            "(it may use its own client or base_url)",
            id="own-base-url",
        ),
        pytest.param(
            "no_reward",
            "✗ a reward came back: no reward: the agent returned None and emitted no reward",
            id="no-reward",
        ),
    ],
)
def test_doctor_names_what_was_not_captured(tmp_path, own_url, agent, failed):
    done = doctor(tmp_path, agent, OWN_BASE_URL=own_url)
    assert done.returncode == 1, done.stdout
    assert lines(done)[-1].startswith(failed), done.stdout
    assert "fix the one marked ✗ and run lightrail doctor again" in done.stdout


def test_doctor_stops_at_a_config_or_an_agent_that_does_not_load(tmp_path):
    done = doctor(tmp_path, "nowhere")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert lines(done)[-1].startswith("✗ agent capture_agents:nowhere imports: "), done.stdout
    assert len(lines(done)) == 3  # config, store, then the agent: nothing after it ran
    done = doctor(tmp_path, "works", "grpo.steps=many")
    assert lines(done) == [lines(done)[0]] and lines(done)[0].startswith("✗ config parses: config.yaml: grpo.steps: ")
    assert "Expected `int | null`, got `str`" in lines(done)[0]


def test_doctor_checks_a_store_servers_token_and_role(tmp_path):
    from lightrail.trainer.trainer import StoreServerProcess

    server = StoreServerProcess(tmp_path / "served.db", token="admin-secret")
    try:
        url = server.url
        done = doctor(tmp_path, "works", f"store={url}", LIGHTRAIL_TOKEN="wrong")
        assert done.returncode == 1 and len(lines(done)) == 2, done.stdout
        assert lines(done)[1].startswith(f"✗ store opens ({url}): "), done.stdout
        assert "LIGHTRAIL_TOKEN" in lines(done)[1]
        read = lightrail(
            ["token", "create", "--store", url, "--role", "read"], tmp_path, LIGHTRAIL_TOKEN="admin-secret"
        )
        assert read.returncode == 0, read.stderr
        done = doctor(tmp_path, "works", f"store={url}", LIGHTRAIL_TOKEN=read.stdout.strip())
        assert lines(done)[1].startswith(f"✗ store opens ({url}): ") and "read" in lines(done)[1], done.stdout
        done = doctor(tmp_path, "works", f"store={url}", LIGHTRAIL_TOKEN="admin-secret")
        assert done.returncode == 0 and f"✓ store opens ({url})" in lines(done), done.stdout
    finally:
        server.stop()


def test_only_an_endpoint_lightrail_records_is_expected_to_be_called():
    from lightrail.inspection.capture import llm_expected
    from lightrail.store import MemoryStore
    from lightrail.types import LLM, PromptTemplate, Resources

    async def expected() -> list[bool]:
        store = MemoryStore()
        judge = LLM(endpoint="http://judge:8000/v1", model="judge", routed=False)  # an outside judge: not recorded
        for items in (
            {"prompt": PromptTemplate(template="x")},
            {"judge": judge},
            {"llm": LLM(endpoint="http://g/v1", model="p")},
        ):
            await store.put_resources(Resources(items=items))
        expects = llm_expected(store)
        return [await expects(version) for version in (1, 2, 3, None, 99)]

    assert asyncio.run(expected()) == [False, False, True, True, False]
