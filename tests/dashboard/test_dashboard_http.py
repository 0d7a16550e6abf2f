"""The dashboard over HTTP (no browser): who may see it, what a bad request gets, and that every page answers
on a store filled by a real run, through the store server and through ``lightrail dashboard``."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import httpx
import pytest

from lightrail.types import LLM, PromptTemplate, Resources
from tests.dashboard._helpers import ADMIN_TOKEN, read_store


def get(server, path: str, token: str | None = None, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(server.url + path, headers=headers, follow_redirects=False, **kw)


def test_pages_need_a_token_that_may_read(server):
    for path in ("/ui/", "/ui/rollouts?status=failed", "/ui/resources", "/ui/failures"):
        for token in (None, "not-a-token", "lr_read_forged.secret"):
            answer = get(server, path, token)
            assert answer.status_code == 303, (path, token, answer.status_code)
            assert answer.headers["location"].startswith("/ui/login?next=")
        runner = get(server, path, server.runner_token)
        assert runner.status_code == 403 and "role is runner" in runner.text
        assert get(server, path, server.read_token).status_code == 200
        assert get(server, path, ADMIN_TOKEN).status_code == 200
    # the API keeps answering JSON 401s; the stylesheet and the sign-in form are public
    assert get(server, "/v1/counts").status_code == 401
    assert get(server, "/ui/static/dashboard.css").status_code == 200
    assert get(server, "/ui/login").status_code == 200


def test_signing_in_sets_a_strict_cookie_and_goes_only_to_dashboard_pages(server):
    with httpx.Client(base_url=server.url) as client:
        wrong = client.post("/ui/login", data={"token": "nope", "next": "/ui/failures"})
        assert (
            wrong.status_code == 401
            and "not valid here" in wrong.text
            and "lightrail_ui" not in wrong.headers.get("set-cookie", "")
        )
        runner = client.post("/ui/login", data={"token": server.runner_token, "next": "/ui/failures"})
        assert runner.status_code == 401
        ok = client.post("/ui/login", data={"token": server.read_token, "next": "/ui/failures"})
        assert ok.status_code == 303 and ok.headers["location"] == "/ui/failures"
        cookie = ok.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert client.get("/ui/failures").status_code == 200  # the cookie signs the next pages in
        cookie_only = {"Cookie": f"lightrail_ui={server.read_token}"}  # (httpx itself keeps it to Path=/ui)
        assert httpx.get(server.url + "/v1/counts", headers=cookie_only).status_code == 401  # but never the API
        elsewhere = client.post("/ui/logout", headers={"Origin": "https://evil.example"})
        assert elsewhere.status_code == 403  # another site cannot sign the user out (or in)
        planted = client.post("/ui/login", data={"token": server.read_token}, headers={"Sec-Fetch-Site": "cross-site"})
        assert planted.status_code == 403 and "set-cookie" not in planted.headers
        assert client.get("/ui/failures").status_code == 200
        for elsewhere in ("//evil.example/x", "https://evil.example/", "/v1/counts", "/ui\\..\\x"):
            answer = client.post("/ui/login", data={"token": server.read_token, "next": elsewhere})
            assert answer.headers["location"] == "/ui/", elsewhere
        client.post("/ui/logout")
        assert client.get("/ui/failures", follow_redirects=False).status_code == 303


def test_a_missing_rollout_or_a_bad_parameter_is_a_page_not_a_crash(server):
    missing = get(server, "/ui/rollouts/ro-does-not-exist", ADMIN_TOKEN)
    assert missing.status_code == 404 and "ro-does-not-exist" in missing.text and "<html" in missing.text
    assert get(server, "/ui/runs/no-such-run", ADMIN_TOKEN).status_code == 404
    for query, says in (("offset=abc", "offset must be a whole number"), ("status=exploded", "unknown status"),
                        ("limit=0", "limit must be between 1"), ("offset=99999999999999999999", "offset must be"),
                        ("offset=" + "9" * 400, "offset must be a whole number")):  # fmt: skip
        answer = get(server, f"/ui/rollouts?{query}", ADMIN_TOKEN)
        assert answer.status_code == 400 and says in answer.text, query
    assert "'self'" in missing.headers["content-security-policy"]


def test_an_attempt_the_rollout_does_not_have_is_a_404_page_naming_those_it_has(server, trained):
    rollouts = read_store(trained / "store.db", lambda s: s.query_rollouts_page(limit=50)).rollouts
    for some in rollouts:  # whatever attempts each has (none yet, one, retries), 99 is not among them
        answer = get(server, f"/ui/rollouts/{some.rollout_id}?attempt=99", ADMIN_TOKEN)
        assert answer.status_code == 404 and "<html" in answer.text, some
        assert re.search(rf"rollout {some.rollout_id} has attempts \[[\d, ]*\], not 99", answer.text), some
    succeeded = next(r for r in rollouts if r.status.value == "succeeded")
    assert get(server, f"/ui/rollouts/{succeeded.rollout_id}?attempt=1", ADMIN_TOKEN).status_code == 200


def test_the_rollouts_table_is_the_stores_page(server, trained):
    failed = read_store(trained / "store.db", lambda s: s.query_rollouts_page(status=["failed"], limit=3))
    answer = get(server, "/ui/rollouts?status=failed&limit=3", server.read_token)
    shown = re.findall(r'<a href="/ui/rollouts/(ro-[^"]+)">', answer.text)
    assert shown == [r.rollout_id for r in failed.rollouts]
    assert f"1–{len(failed.rollouts)} of {failed.total} rollouts" in answer.text
    assert "ValueError: bad question" in answer.text


def test_api_keys_never_reach_the_resources_page(server, trained):
    async def publish(store):
        return await store.put_resources(Resources(items={
            "llm": LLM(endpoint="http://127.0.0.1:9/v1", model="policy", api_key="sk-secret-key", routed=False),
            "prompt": PromptTemplate(template="Answer {question} briefly."),
        }))  # fmt: skip

    published = read_store(trained / "store.db", publish)
    page = get(server, "/ui/resources", ADMIN_TOKEN).text
    assert f"Version {published.version}" in page and "Answer {question} briefly." in page
    assert "sk-secret-key" not in page


def test_the_dashboard_command_serves_a_store_file_and_refuses_open_binds(trained):
    refused = subprocess.run([sys.executable, "-m", "lightrail", "dashboard", "--store", str(trained), "--host",
                              "0.0.0.0"], capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "refusing to bind 0.0.0.0 without a token" in refused.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "lightrail", "dashboard", "--store", str(trained), "--port", "0", "--token", "t0k"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        assert line.startswith("lightrail dashboard listening on http://127.0.0.1:"), line
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = httpx.get(url + "/ui/rollouts", headers={"Authorization": "Bearer t0k"})
                break
            except httpx.ConnectError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert answer.status_code == 200 and "rollouts, newest first" in answer.text
        assert httpx.get(url + "/ui/rollouts").status_code == 303
    finally:
        process.terminate()
        process.wait(10)


def test_the_dashboard_reads_a_store_server_with_a_read_token(server):
    from starlette.testclient import TestClient

    from lightrail.dashboard import create_dashboard_app
    from lightrail.store import open_store

    app = create_dashboard_app(lambda: open_store(server.url, token=server.read_token))
    with TestClient(app) as client:
        rollouts = client.get("/ui/rollouts?status=failed")
        assert rollouts.status_code == 200 and "ValueError: bad question" in rollouts.text
        first = re.search(r'<a href="/ui/rollouts/(ro-[^"]+)">', rollouts.text).group(1)
        detail = client.get(f"/ui/rollouts/{first}")
        assert detail.status_code == 200 and "Call 2" in detail.text and "Traceback" in detail.text
        assert client.get("/ui/").status_code == 200 and client.get("/ui/resources").status_code == 200


@pytest.mark.parametrize("path", ["/ui/", "/ui/failures", "/ui/resources"])
def test_every_page_renders_the_run(server, trained, path):
    answer = get(server, path, ADMIN_TOKEN)
    assert answer.status_code == 200
    if path == "/ui/":
        assert str(trained) in answer.text
    if path == "/ui/failures":
        # two validations x two failing tasks, one cause; the pattern is escaped HTML text
        assert "4 failed attempts in 1 group," in answer.text and "bad question &lt;n&gt; in &lt;str&gt;" in answer.text


def test_a_trained_call_shows_its_step_and_advantage(server, trained):
    from lightrail.types import Attr

    async def training(store):
        out = []
        for rollout in await store.query_rollouts():
            if rollout.mode == "train":
                spans = await store.query_spans(rollout.rollout_id)
                out += [(rollout, s) for s in spans if s.name == Attr.SPAN_TRAINING]
        return out

    annotated = read_store(trained / "store.db", training)
    rollouts = read_store(trained / "store.db", lambda s: s.query_rollouts())
    assert {rollout.rollout_id for rollout, _ in annotated} == {
        r.rollout_id for r in rollouts if r.mode == "train" and r.metadata.get("run") == str(trained)
    }  # one step of 2 tasks x 2 samples: every train rollout was trained on
    rollout, span = annotated[0]
    page = get(server, f"/ui/rollouts/{rollout.rollout_id}", ADMIN_TOKEN).text
    calls = span.attributes[Attr.TRAINING_CALLS]
    assert len(calls) == 2 and page.count("trained at step 1 · advantage") == 2
    for call in calls:
        assert f"advantage {call['advantage']:+.3f} · return {call['return']:.3g}" in page


def test_with_a_tokenizer_each_generated_token_is_shown_as_text(trained):
    from html import unescape

    from starlette.testclient import TestClient
    from transformers import AutoTokenizer

    from lightrail.dashboard import create_dashboard_app
    from lightrail.store import open_store
    from lightrail.types import Attr, RolloutStatus

    async def first_call(store):
        rollout = next(r for r in await store.query_rollouts() if r.status is RolloutStatus.SUCCEEDED)
        spans = await store.query_spans(rollout.rollout_id)
        return min((s for s in spans if s.name == Attr.SPAN_LLM_CALL), key=lambda s: (s.start_time, s.seq))

    call = read_store(trained / "store.db", first_call)
    ids = call.attributes[Attr.CHOICES][0]["token_ids"]
    assert ids
    model = trained.parent / "model"
    app = create_dashboard_app(lambda: open_store(str(trained / "store.db")), tokenizer=str(model))
    with TestClient(app) as client:
        page = client.get(f"/ui/rollouts/{call.rollout_id}").text
    first = page[page.index('id="call-1"') : page.index('id="call-2"')]
    shown = [
        unescape(t) for t in re.findall(r'<span class="tok shade-\d" title="logprob [^"]*">(.*?)</span>', first, re.S)
    ]
    tokenizer = AutoTokenizer.from_pretrained(model)
    assert shown == [tokenizer.decode([i]) for i in ids]  # the text of each token, not its id


def test_the_failure_digest_covers_a_time_window(server, trained):
    import time

    from lightrail.inspection.runs import failure_digest

    recent = get(server, "/ui/failures?minutes=60", ADMIN_TOKEN)
    assert "4 failed attempts in 1 group," in recent.text
    groups, read, candidates = read_store(trained / "store.db", lambda s: failure_digest(s, since=time.time() + 1))
    assert (groups, read, candidates) == ([], 0, 0)  # nothing was enqueued after now
    everything = read_store(trained / "store.db", lambda s: failure_digest(s))
    assert sum(g.count for g in everything[0]) == 4
    assert get(server, "/ui/failures?minutes=-5", ADMIN_TOKEN).status_code == 400


def test_the_rollouts_table_shows_each_rollouts_training_step(server, trained):
    rollouts = read_store(trained / "store.db", lambda s: s.query_rollouts())
    ours = [r for r in rollouts if r.metadata.get("run") == str(trained)]
    # GRPO tags its rollouts with the step: step 1's samples, and validation before (0) and after (1) it
    assert sorted({(r.mode, r.metadata["step"]) for r in ours}) == [("train", 1), ("val", 0), ("val", 1)]
    page = get(server, f"/ui/rollouts?run={trained}&mode=val&limit=100", ADMIN_TOKEN).text
    rows = re.findall(r'<a href="/ui/rollouts/(ro-[^"]+)">.*?<td>val</td>\s*<td class="num">(\d*)</td>', page, re.S)
    by_id = {r.rollout_id: r for r in ours}
    assert len(rows) == 8 and all(by_id[rid].metadata["step"] == int(step) for rid, step in rows)


def test_malformed_spans_from_an_agent_still_render(tmp_path):
    """Spans come from agents and frameworks (OTLP ingest): odd shapes are shown as they are, never a 500."""
    from lightrail.types import Attr, RolloutSpec, Span, Task

    async def odd(store):
        await store.enqueue([RolloutSpec(task=Task(input="odd"), rollout_id="ro/odd?")])
        lease = await store.lease("w-odd")
        attempt = lease.attempt
        weird_call = {
            Attr.REQUEST: {"messages": ["plain string", {"role": "user", "content": [{"type": "image"}, 3]},
                                        {"role": "assistant", "tool_calls": "not a list"},
                                        {"role": "assistant", "tool_calls": [{"function": "f(x)"}, 7]}]},
            Attr.RESPONSE: {"choices": [{"message": {"content": 5, "tool_calls": [{"function": {"name": None}}]},
                                         "logprobs": {"content": [{"token": "a", "logprob": "high"}]}}, "x"]},
            Attr.CHOICES: [{"token_ids": [1, "two"], "logprobs": ["low", None]}],
            Attr.RESPONSE_ID: "resp-odd", Attr.PROMPT_IDS: "not ids",
        }  # fmt: skip
        await store.add_spans([
            Span(rollout_id="ro/odd?", attempt_id=attempt.attempt_id, seq=1, name=Attr.SPAN_LLM_CALL,
                 attributes=weird_call, start_time=10.0, end_time=5.0),
            Span(rollout_id="ro/odd?", attempt_id=attempt.attempt_id, seq=2, name=Attr.SPAN_LLM_CALL,
                 attributes={Attr.REQUEST: "text", Attr.RESPONSE: [1, 2], Attr.CHOICES: {"a": 1}}),
            Span(rollout_id="ro/odd?", attempt_id=attempt.attempt_id, seq=3, name=Attr.SPAN_TRAINING,
                 attributes={Attr.TRAINING_CALLS: [{"response_id": "resp-odd", "advantage": "big", "return": []}, 4]}),
            Span(rollout_id="ro/odd?", attempt_id=attempt.attempt_id, seq=4, name=Attr.SPAN_REWARD,
                 attributes={Attr.REWARD: "lots"}),
        ])  # fmt: skip

    from starlette.testclient import TestClient

    from lightrail.dashboard import create_dashboard_app
    from lightrail.store import open_store

    read_store(tmp_path / "store.db", odd)
    with TestClient(create_dashboard_app(lambda: open_store(str(tmp_path / "store.db")))) as client:
        found = client.get("/ui/rollouts", params={"q": "ro/odd?"}, follow_redirects=False)
        assert found.status_code == 303 and found.headers["location"] == "/ui/rollouts/ro%2Fodd%3F"
        page = client.get(found.headers["location"])  # an id with a slash and a question mark opens too
    assert page.status_code == 200, page.text[-3000:]
    assert "plain string" in page.text and "not a list" in page.text and "f(x)" in page.text


def test_an_agents_messages_and_named_calls_show_in_the_dashboard_and_in_lightrail_show(tmp_path, capsys):
    """`emit_message` and `as_agent` in an agent run by a real runner through a real gateway: the message is on the
    rollout's timeline, the call says its agent, on the page and in ``lightrail show``."""
    from openai import AsyncOpenAI
    from starlette.testclient import TestClient

    from lightrail import Runner, as_agent, emit_message, rollout
    from lightrail.cli import main
    from lightrail.dashboard import create_dashboard_app
    from lightrail.gateway import GatewayServer, ScriptedBackend
    from lightrail.store import open_store
    from lightrail.types import LLM, Resources, RolloutSpec, Task

    @rollout
    async def thinker(task, llm):
        emit_message(f"thinking about {task['question']} <b>hard</b>", step=1)
        client = AsyncOpenAI(base_url=llm.endpoint, api_key=llm.api_key, max_retries=0)
        with as_agent("Deep Thinker"):
            await client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": "hi"}])
        await client.close()
        return 1.0

    async def run(store):
        async with GatewayServer(ScriptedBackend(), store, token="gw") as gateway:
            await store.put_resources(Resources(items={"llm": LLM(endpoint=gateway.url, model="m", api_key="gw")}))
            (queued,) = await store.enqueue([RolloutSpec(task=Task(input={"question": "2+2"}), resources_version=1)])
            await Runner(store, thinker, handle_signals=False).run(max_rollouts=1)
        return queued.rollout_id

    rollout_id = read_store(tmp_path / "store.db", run)
    with TestClient(create_dashboard_app(lambda: open_store(str(tmp_path / "store.db")))) as client:
        page = client.get(f"/ui/rollouts/{rollout_id}").text
    timeline = page[page.index('class="span') :]
    assert 'kind-message"' in timeline
    assert "thinking about 2+2 &lt;b&gt;hard&lt;/b&gt;" in timeline  # shown as text, escaped
    assert "llm call (Deep Thinker)" in timeline and "Call 1 · Deep Thinker" in page
    capsys.readouterr()
    assert main(["show", rollout_id, "--store", str(tmp_path / "store.db")]) in (0, None)
    shown = capsys.readouterr().out
    assert "message thinking about 2+2" in shown and "agent Deep Thinker" in shown
