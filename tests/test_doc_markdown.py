"""The code in README.md and docs/*.md works when copied: every ```python block runs, and every ``lightrail ...``
command in a shell block names a subcommand and flags the real command line accepts.

A python block runs as a script in a temporary folder against a real store server (token ``s3cret``) and a real
gateway (the scripted fake backend, recording sessions) on free ports of 127.0.0.1, which replace the documented
127.0.0.1:4747 and 127.0.0.1:8900. A block meant to be read in context, not run, says so right before its fence:
``<!-- not run: reason -->``. Shell commands are parsed with the parser ``lightrail.cli`` builds, not run.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from lightrail.cli import build_parser
from lightrail.store.client import SyncStoreClient
from tests._served import Served, free_port, served

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```", re.S | re.M)


def blocks(*langs: str) -> list[tuple[str, str, str | None]]:
    """``(page:line, body, why not run)`` of every fenced block in one of ``langs``."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _FENCE.finditer(text):
            if m.group("lang") in langs:
                where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start('body'))}"
                found.append((where, m.group("body"), m.group("why")))
    return found


PYTHON = [b for b in blocks("python") if b[2] is None]


def test_blocks_are_found():
    every = blocks("python")
    assert len(every) >= 3 and PYTHON and len(PYTHON) < len(every)  # some run, some are marked


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[Served, Served]]:
    """A store server and a recording fake gateway, as the README's quick start starts them (on free ports)."""
    folder = tmp_path_factory.mktemp("servers")
    lightrail = [sys.executable, "-m", "lightrail"]
    store_port, gateway_port = free_port(), free_port()
    store_cmd = [*lightrail, "store", "serve", "--db", str(folder / "store.db"), "--port", str(store_port)]
    with served([*store_cmd, "--token", "s3cret"], store_port, folder / "store.log", 60) as store:
        gateway_cmd = [*lightrail, "gateway", "serve", "--fake", "--port", str(gateway_port), "--record"]
        gateway_cmd += ["--store", store.root, "--store-token", "s3cret"]
        with served(gateway_cmd, gateway_port, folder / "gateway.log", 60) as gateway:
            yield store, gateway


def open_session(store: Served, gateway: Served, session_id: str) -> None:
    """A served call filed under ``session_id``, waited on until the store holds it (what feedback rewards)."""
    OpenAI(base_url=gateway.url, api_key="none").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "2+2?"}], user=session_id
    )
    client = SyncStoreClient(store.root, token="s3cret")
    try:
        deadline = time.monotonic() + 30
        while not client.query_spans(f"session-{session_id}"):
            assert time.monotonic() < deadline, f"session {session_id} not recorded"
            time.sleep(0.2)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("where", "body"),
    # a block that starts runner processes (Trainer) takes ~90 s on 2 busy cores: slow, run by `pytest -m slow`
    [pytest.param(w, b, id=w, marks=[pytest.mark.slow] if "Trainer(" in b else []) for w, b, _ in PYTHON],
)
def test_python_block_runs(where, body, servers, tmp_path):
    store, gateway = servers
    for session_id in re.findall(r'session_id="([^"]+)"', body):
        open_session(store, gateway, session_id)
    script = body.replace("http://127.0.0.1:4747", store.root).replace("http://127.0.0.1:8900", gateway.root)
    (tmp_path / "block.py").write_text(script)
    done = subprocess.run(
        [sys.executable, "block.py"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{where}:\n{done.stdout}\n{done.stderr}"


def commands() -> list[tuple[str, list[str]]]:
    """Every ``lightrail ...`` command line in the shell blocks, split as a shell would (comments, ``&`` dropped)."""
    found = []
    for where, body, _ in blocks("bash", "sh", "shell", "console", ""):
        for line in body.replace("\\\n", " ").splitlines():
            line = re.sub(r"^\$\s*", "", line.strip())
            if line.startswith("lightrail "):
                words = shlex.split(line, comments=True)
                words = words[: next((i for i, w in enumerate(words) if w in {"&", "&&", "|", ">", ";"}), None)]
                found.append((where, [w.rstrip("&") for w in words[1:] if w != "&"]))
    return found


COMMANDS = commands()


def parse(argv: list[str]) -> argparse.Namespace:
    """``lightrail ARGV`` parsed as the real command does; an unknown subcommand or flag raises."""
    parser = build_parser()

    def error(message: str) -> None:
        raise AssertionError(message)

    stack = [parser]
    while stack:  # every (sub)parser reports instead of exiting
        p = stack.pop()
        p.error = error  # type: ignore[method-assign,assignment]
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return parser.parse_args(argv)


def test_commands_are_found():
    assert len(COMMANDS) > 10


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[f"{w}:{' '.join(a[:2])}" for w, a in COMMANDS])
def test_shell_command_parses(where, argv):
    if "--help" in argv or "-h" in argv:
        argv = [a for a in argv if a not in {"--help", "-h"}]
    args = parse(argv)
    assert getattr(args, "handler", None), f"{where}: lightrail {' '.join(argv)} names no command"


def test_a_renamed_flag_fails_the_parse():
    with pytest.raises(AssertionError, match="--no-such-flag"):
        parse(["store", "serve", "--no-such-flag", "1"])
