"""The dashboard in headless Chromium (Debian's, driven by Playwright) against a store filled by a real GRPO run:
sign in, click runs -> run -> failed rollouts -> rollout -> span -> call, compare what is shown with the store;
live updates; HTML from the agent shown as text; keyboard and labels. Screenshots go to the ``screenshots``
folder (its path is printed)."""

from __future__ import annotations

import re

import pytest

from lightrail.types import Attr, RolloutSpec, RolloutStatus, Task
from tests.dashboard._helpers import XSS, read_store

# the first test may install Debian's chromium (apt-get: a few minutes on a fresh machine)
pytestmark = pytest.mark.timeout(1200)


def sign_in(page, server, token: str, path: str = "/ui/") -> None:
    page.goto(server.url + path)
    assert "/ui/login" in page.url  # no cookie yet: the sign-in form
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(re.escape(server.url + path) + "$"))


def test_click_through_runs_rollout_span_and_call(page, server, trained, screenshots):
    store = trained / "store.db"
    rollouts = read_store(store, lambda s: s.query_rollouts())
    sign_in(page, server, server.read_token)
    run_row = page.get_by_role("row").filter(has_text=str(trained))
    assert run_row.get_by_role("cell").nth(4).inner_text() == str(len(rollouts))
    page.screenshot(path=str(screenshots / "runs.png"), full_page=True)

    run_row.get_by_role("link", name=str(trained)).click()
    charts = page.locator("svg[role=img]")
    # the store's reward per version, and four from the run's metrics.jsonl (the last: train-inference mismatch)
    assert charts.count() == 5
    assert "val success" in charts.nth(1).get_attribute("aria-label")
    assert "mismatch" in charts.nth(4).get_attribute("aria-label")
    page.screenshot(path=str(screenshots / "run.png"), full_page=True)

    page.get_by_role("link", name="Failed rollouts").click()
    failed = [r for r in rollouts if r.status is RolloutStatus.FAILED][::-1]
    ids = page.locator("table.rollouts tbody tr td:first-child").all_inner_texts()
    assert ids == [r.rollout_id for r in failed]
    page.screenshot(path=str(screenshots / "rollouts.png"), full_page=True)

    chosen = failed[0]
    page.get_by_role("link", name=chosen.rollout_id).click()
    attempts, spans = read_store(store, lambda s: _attempt_and_spans(s, chosen.rollout_id))
    assert page.locator("dl.facts dd").first.inner_text() == "failed"
    assert page.locator("table").first.locator("tbody tr").count() == len(attempts)
    assert f"{attempts[-1].error.type}: {attempts[-1].error.message}" in page.locator("table").first.inner_text()

    rows = page.locator("ol.timeline > li")
    assert rows.count() == len(spans)
    llm = rows.filter(has_text="llm call").first
    llm.locator("summary").click()  # open the span: its attributes are shown
    calls = sorted((s for s in spans if s.name == Attr.SPAN_LLM_CALL), key=lambda s: (s.start_time, s.seq))
    assert f'"{Attr.POLICY_VERSION}": {calls[0].attributes[Attr.POLICY_VERSION]}' in llm.locator("pre").inner_text()

    llm.get_by_role("link", name="call 1").click()
    call = page.locator("#call-1")
    request = calls[0].attributes[Attr.REQUEST]
    assert call.locator(".role-user pre.content").first.inner_text() == request["messages"][1]["content"]
    call.get_by_text("generated tokens with their logprobs").click()
    tokens = call.locator(".tok")
    assert tokens.count() == len(calls[0].attributes[Attr.CHOICES][0]["token_ids"])
    first_logprob = calls[0].attributes[Attr.CHOICES][0]["logprobs"][0]
    assert tokens.first.get_attribute("title") == f"logprob {first_logprob:.3f}"
    page.screenshot(path=str(screenshots / "rollout.png"), full_page=True)


async def _attempt_and_spans(store, rollout_id):
    attempts = await store.query_attempts(rollout_id)
    return attempts, await store.query_spans(rollout_id, attempts[-1].attempt_id)


def test_html_from_the_agent_is_shown_as_text_never_run(page, server, trained):
    rollouts = read_store(trained / "store.db", lambda s: s.query_rollouts())
    target = next(r for r in rollouts if r.task.input.get("question") == XSS)
    sign_in(page, server, server.read_token, f"/ui/rollouts/{target.rollout_id}")
    shown = page.locator("#call-1 .role-user pre.content").first
    assert shown.inner_text() == XSS  # the markup is there, as text
    assert page.title().startswith("Rollout ")  # the script and the onerror handler would have renamed the page
    assert page.locator("main script, main img").count() == 0  # and no element was made of the agent's text
    page.goto(server.url + "/ui/rollouts?mode=val")  # the task column of the table shows it as text too
    assert XSS[:40] in page.locator("table.rollouts").inner_text()
    assert page.locator("main script, main img").count() == 0


def test_pages_update_live_without_a_reload(page, server, trained):
    sign_in(page, server, server.read_token, "/ui/rollouts?status=queued")
    page.evaluate("window.__stillHere = true")  # gone if the page reloads
    assert page.locator("table.rollouts tbody tr").count() == 0

    async def enqueue(store):
        return await store.enqueue([RolloutSpec(task=Task(input={"question": "7+7"}), rollout_id="ro-live-1")])

    read_store(trained / "store.db", enqueue)
    page.locator("table.rollouts").get_by_role("link", name="ro-live-1").wait_for()
    assert page.evaluate("window.__stillHere") is True
    assert "updated" in page.locator("#live-status").inner_text()

    async def cancel(store):
        return await store.cancel(["ro-live-1"])

    read_store(trained / "store.db", cancel)  # leaves the queued filter: the row goes away by itself
    page.locator("table.rollouts").get_by_role("link", name="ro-live-1").wait_for(state="detached")


_UNLABELLED = """() => [...document.querySelectorAll('input:not([type=hidden]), select, button')]
    .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.textContent.trim())
    .map(e => e.outerHTML)"""


def test_keyboard_and_labels(page, server):
    sign_in(page, server, server.read_token, "/ui/")
    for path in ("/ui/", "/ui/failures", "/ui/resources", "/ui/rollouts?status=succeeded"):
        page.goto(server.url + path)
        assert page.evaluate(_UNLABELLED) == [], path  # every control has a name
        assert page.evaluate("[...document.querySelectorAll('th')].every(th => th.getAttribute('scope'))"), path
        assert page.locator("h1").count() == 1 and page.locator("nav[aria-label]").count() >= 1, path
    page.keyboard.press("Tab")  # the first stop skips the navigation
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("location.hash") == "#main"
    first = page.locator("table.rollouts tbody a").first
    rollout_id = first.inner_text()
    first.focus()
    page.keyboard.press("Enter")  # links open from the keyboard
    page.wait_for_url(f"**/ui/rollouts/{rollout_id}")
    summary = page.locator("ol.timeline summary").first
    summary.focus()
    page.keyboard.press("Enter")  # and spans open too
    assert page.locator("ol.timeline details").first.get_attribute("open") is not None
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # focus is visible
