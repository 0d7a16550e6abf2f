"""Fixtures of the dashboard tests: a store filled by a real short GRPO run (tiny model, gateway, runner process),
a store server with an admin and a read token in front of it, and headless Chromium (Debian's package, installed
here with apt-get when the machine lacks it) driven by Playwright."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.dashboard._helpers import ADMIN_TOKEN, CHROMIUM, TRAIN, VAL


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """The run folder of one GRPO step with validation before and after (2 of 4 val tasks raise; one asks a
    question holding HTML): store.db, metrics.jsonl, the run tag being the folder."""
    from lightrail import Trainer
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO
    from lightrail.engine.models import build_tiny_model

    root = tmp_path_factory.mktemp("dashboard")
    model = build_tiny_model(root / "model", size="tiny", seed=0)
    grpo = GRPO(
        model, steps=1, tasks_per_step=2, n_samples=2, val_every=0, checkpoint_every=0, config=UpdateConfig(lr=1e-3),
        sampling={"temperature": 1.0, "max_tokens": 6}, val_sampling={"temperature": 0.0, "max_tokens": 6},
        out_dir=root / "run",
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        Trainer(n_runners=1, concurrency=4, store=str(root / "run" / "store.db"), algorithm=grpo, loggers=[]).fit(
            "tests.inspection.inspect_agents:chatty", TRAIN, VAL
        )
    return root / "run"


@pytest.fixture(scope="session")
def server(trained):
    """A store server on the trained run's store with the dashboard under /ui (as ``lightrail store serve`` serves
    it), with an admin token; ``server.read_token`` may only read and ``server.runner_token`` may not read at all."""
    from lightrail.dashboard.app import dashboard_routes
    from lightrail.store.client import SyncStoreClient
    from lightrail.store.server import serve_in_thread
    from lightrail.store.tokens import mint

    handle = serve_in_thread(trained / "store.db", token=ADMIN_TOKEN, ui=dashboard_routes)
    with SyncStoreClient(handle.url, token=ADMIN_TOKEN) as admin:
        handle.read_token, record = mint("read")
        admin.put_token(record)
        handle.runner_token, record = mint("runner")
        admin.put_token(record)
    yield handle
    handle.stop()


def _chromium() -> str:
    """Debian's Chromium, installed now if missing (Playwright's own browser download cannot work offline)."""
    if not os.path.exists(CHROMIUM):
        if shutil.which("apt-get") is None:
            pytest.fail(f"{CHROMIUM} is missing and there is no apt-get to install Debian's chromium", pytrace=False)
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                pytest.fail(f"installing Debian's chromium failed: {done.stderr[-2000:]}", pytrace=False)
    return CHROMIUM


@pytest.fixture(scope="module")
def browser(server):
    """Chromium for one test module. Playwright's sync API keeps an event loop running on this thread while it is
    open: it starts after the run (the trainer runs its own loop) and ends with the module, before other modules'
    async tests need the thread."""
    from playwright.sync_api import sync_playwright

    executable = _chromium()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=executable,
            # as root in a container, with no network beyond loopback: no sandbox, no background fetches
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )  # fmt: skip
        yield chromium
        chromium.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory) -> Path:
    """Where the browser tests save their screenshots (printed at the end of a failing test's output)."""
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture
def page(browser, screenshots, request):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    page.screenshot(path=str(screenshots / f"{request.node.name}-last.png"), full_page=True)
    print(f"screenshots in {screenshots}")
    context.close()
