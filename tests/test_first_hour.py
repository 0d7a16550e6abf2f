"""The first hour of a new user: every ``lightrail`` command given a bad store URL, a missing folder, a wrong token,
a busy port, a missing agent module or a malformed config exits non-zero within 30 s with one line that names the
problem (no traceback), and creates nothing it should not.

The real command in a subprocess, in a temporary folder, against real servers on 127.0.0.1.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

LIGHTRAIL = [sys.executable, "-m", "lightrail"]
_STRIPPED = ("LIGHTRAIL_STORE", "LIGHTRAIL_TOKEN", "LIGHTRAIL_STORE_TOKEN", "LIGHTRAIL_GATEWAY_TOKEN")


def run(args: list[str], cwd: Path, timeout_s: float = 30.0, **env: str) -> subprocess.CompletedProcess[str]:
    """``lightrail ARGS`` in ``cwd`` with none of the user's LIGHTRAIL_* settings, bounded by ``timeout_s``."""
    clean = {k: v for k, v in os.environ.items() if k not in _STRIPPED}
    return subprocess.run(
        [*LIGHTRAIL, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True, timeout=timeout_s
    )


def assert_one_line(done: subprocess.CompletedProcess[str], *expected: str) -> str:
    """A failure a user can act on: exit code != 0, nothing but one line on stderr, naming ``expected``."""
    assert done.returncode != 0, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for part in expected:
        assert part in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- a store named wrong ---------------------------------------------------------------------------------------

BAD_STORES = [
    pytest.param("htp://x", "unsupported store URL scheme 'htp://'", id="unknown-scheme"),
    pytest.param("127.0.0.1:4747", "has no scheme (for a store server: http://127.0.0.1:4747)", id="no-scheme"),
]
STORE_COMMANDS = [
    pytest.param(["runner", "--agent", "x:y"], id="runner"),
    pytest.param(["gateway", "serve", "--fake", "--port", "0"], id="gateway"),
    pytest.param(["dashboard", "--port", "0"], id="dashboard"),
    pytest.param(["runs"], id="runs"),
    pytest.param(["rollouts"], id="rollouts"),
    pytest.param(["failures"], id="failures"),
    pytest.param(["show", "ro-1"], id="show"),
    pytest.param(["token", "list"], id="token"),
    pytest.param(["dev", "--agent", "x:y", "--tasks", "tasks.jsonl"], id="dev"),
]


@pytest.mark.parametrize("store, problem", BAD_STORES)
@pytest.mark.parametrize("command", STORE_COMMANDS)
def test_a_bad_store_url_is_one_line_naming_the_accepted_forms(command, store, problem, tmp_path):
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    done = run([*command, "--store", store], tmp_path)
    assert_one_line(done, problem, "http(s)://HOST:PORT")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks.jsonl"]  # no file named after the URL


def test_store_serve_refuses_a_bad_database_url(tmp_path):
    assert_one_line(run(["store", "serve", "--db", "htp://x"], tmp_path), "unsupported store URL scheme")
    assert_one_line(run(["store", "serve", "--db", "127.0.0.1:4747"], tmp_path), "has no scheme")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["runs"], ["failures"], ["dashboard", "--port", "0"]])
def test_reading_a_store_in_a_missing_folder_creates_nothing(command, tmp_path):
    """Commands that only read say there is no store there; they never create an empty one."""
    assert_one_line(run([*command, "--store", "nodir/store.db"], tmp_path), "no store at nodir/store.db")
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_store_is_named(tmp_path):
    (tmp_path / "notes.db").write_text("not a database\n")
    done = run(["store", "serve", "--db", "notes.db", "--port", "0"], tmp_path)
    assert_one_line(done, "cannot open the SQLite store notes.db")
    assert done.stdout == ""  # never "listening" for a store that did not open


# -- servers: the address once serving, a busy port in one line -------------------------------------------------


def test_the_readme_first_command_serves_in_a_new_folder(tmp_path):
    """``lightrail store serve --db runs/store.db`` in an empty folder: the folder is created, and the address is
    printed once the store answers on it."""
    proc = subprocess.Popen(
        [*LIGHTRAIL, "store", "serve", "--db", "runs/store.db", "--token", "s3cret", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("lightrail store listening on http://127.0.0.1:"), (line, proc.stderr)
        url = line.rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(url + "/health", timeout=5) as answer:  # serving the moment it says so
            assert answer.status == 200
        assert (tmp_path / "runs" / "store.db").is_file()
    finally:
        proc.terminate()
        proc.wait(30)
    assert "Traceback" not in (proc.stderr.read() if proc.stderr else "")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["store", "serve", "--db", "s.db"], id="store"),
        pytest.param(["gateway", "serve", "--store", "s.db", "--fake"], id="gateway"),
        pytest.param(["dashboard", "--store", "memory:"], id="dashboard"),
    ],
)
def test_a_busy_port_is_one_line_and_no_address(command, busy_port, tmp_path):
    done = run([*command, "--port", str(busy_port)], tmp_path)
    assert_one_line(done, f"cannot listen on 127.0.0.1:{busy_port}: Address already in use")
    assert "listening" not in done.stdout


# -- the agent: found in the working folder, or named where it was looked for -----------------------------------

AGENT = "def solve(task):\n    return 1.0 if task['q'] == 1 else 0.0\n"


@pytest.mark.parametrize("ref", ["my_agents:solve", "my_agents.py:solve", "./my_agents.py:solve"])
def test_the_runner_imports_the_agent_from_the_working_folder(ref, tmp_path):
    """Both spellings of a reference resolve from where the command runs, as `lightrail train` always did."""
    (tmp_path / "my_agents.py").write_text(AGENT)
    done = run(["runner", "--store", "store.db", "--agent", ref, "--idle-exit", "0.2"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_dev_runs_the_help_example_from_the_working_folder(tmp_path):
    """``lightrail dev --agent my_agents:solve`` (the example in its --help): runner processes find the module."""
    (tmp_path / "my_agents.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n{"q": 1}\n')
    done = run(["dev", "--agent", "my_agents:solve", "--tasks", "tasks.jsonl", "--runners", "1"], tmp_path, 60)
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "succeeded" in done.stdout


MISSING_AGENTS = [
    pytest.param("nomod:solve", "no module named 'nomod' in the working folder", id="module"),
    pytest.param("my_agents:nope", "my_agents (", id="attribute"),
    pytest.param("gone.py:solve", "no file ", id="file"),
    pytest.param("my_agents", "must look like 'module:object'", id="malformed"),
]


@pytest.mark.parametrize("ref, problem", MISSING_AGENTS)
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["runner", "--store", "store.db"], id="runner"),
        pytest.param(["dev", "--tasks", "tasks.jsonl", "--store", "store.db"], id="dev"),
    ],
)
def test_a_missing_agent_is_one_line_saying_what_and_where(command, ref, problem, tmp_path):
    (tmp_path / "my_agents.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    line = assert_one_line(run([*command, "--agent", ref], tmp_path), f"agent {ref!r}", problem)
    if "nope" in ref:
        assert "has no attribute 'nope'" in line and str(tmp_path / "my_agents.py") in line
    assert not (tmp_path / "store.db").exists()  # failed before touching the store


def test_train_names_a_missing_agent_module(tmp_path):
    (tmp_path / "config.yaml").write_text("algorithm: grpo\nmodel: tiny\ndata: nodata:splits\nagent: nomod:solve\n")
    assert_one_line(run(["train", "config.yaml"], tmp_path), "no module named 'nodata' in the working folder")


# -- checked at start: reachable, token accepted, role sufficient ----------------------------------------------

ADMIN = "s3cret"


@pytest.fixture(scope="module")
def store_server(tmp_path_factory):
    """A real store server on 127.0.0.1 with an admin token, and a read and a runner token minted on it."""
    from lightrail.store import SyncStoreClient
    from lightrail.store.server import serve_in_thread
    from lightrail.store.tokens import mint

    handle = serve_in_thread(tmp_path_factory.mktemp("store") / "store.db", token=ADMIN)
    admin = SyncStoreClient(handle.url, token=ADMIN)
    tokens = {}
    for role in ("read", "runner"):
        bearer, record = mint(role)
        admin.put_token(record)
        tokens[role] = bearer
    admin.close()
    yield handle.url, tokens
    handle.stop()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


CHECKED = {
    "runner": (["runner", "--agent", "my_agents:solve", "--store", "{url}"], "--store-token", "read"),
    "gateway": (["gateway", "serve", "--fake", "--port", "0", "--store", "{url}"], "--store-token", "read"),
    "dashboard": (["dashboard", "--port", "0", "--store", "{url}"], "--store-token", "runner"),
}


@pytest.mark.parametrize("command", CHECKED)
@pytest.mark.parametrize(
    "case, problem",
    [
        ("no-token", "refused the token (HTTP 401: missing bearer token): no token was given"),
        ("wrong-token", "refused the token (HTTP 401: invalid, expired or revoked bearer token)"),
        ("weak-role", "gave this token the role"),
    ],
)
def test_a_refused_token_or_role_is_one_line_at_start(command, case, problem, store_server, tmp_path):
    """Never a runner retrying a 401 forever, nor a gateway answering 503 'unavailable' to every call."""
    url, tokens = store_server
    args, flag, weak = CHECKED[command]
    args = [a.format(url=url) for a in args]
    if case == "wrong-token":
        args += [flag, "nope"]
    elif case == "weak-role":
        args += [flag, tokens[weak]]
    (tmp_path / "my_agents.py").write_text(AGENT)
    line = assert_one_line(run(args, tmp_path), problem)
    if case == "weak-role":
        assert "this needs" in line and "lightrail token create --role" in line
    assert "unavailable" not in line


@pytest.mark.parametrize("command", CHECKED)
@pytest.mark.parametrize(
    "kind, problem",
    [("http", "no store server answers at http://127.0.0.1:{port}"),
     ("postgresql", "cannot connect to PostgreSQL at 127.0.0.1:{port}/runs")],
)  # fmt: skip
def test_a_store_that_is_not_there_is_one_line_at_start(command, kind, problem, tmp_path):
    args, _, _ = CHECKED[command]
    port = closed_port()
    url = f"http://127.0.0.1:{port}" if kind == "http" else f"postgresql://lightrail:pw@127.0.0.1:{port}/runs"
    (tmp_path / "my_agents.py").write_text(AGENT)
    line = assert_one_line(run([a.format(url=url) for a in args], tmp_path), problem.format(port=port))
    assert "pw@" not in line  # a database password is never printed


def _connected_to(port: int) -> bool:
    """Whether a TCP connection to 127.0.0.1:``port`` is established (``/proc/net/tcp``: only the runner connects)."""
    with open("/proc/net/tcp") as table:
        rows = [line.split() for line in table.readlines()[1:]]
    return any(row[2] == f"0100007F:{port:04X}" and row[3] == "01" for row in rows)


def test_a_runner_whose_store_goes_away_says_so_and_gives_up(tmp_path):
    """Retries while the store is gone, saying so (at most every 30 s: tests/agent/test_runner.py), and exits
    after --give-up-after."""
    import time

    server = subprocess.Popen(
        [*LIGHTRAIL, "store", "serve", "--db", "store.db", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    url = server.stdout.readline().rsplit(" ", 1)[1].strip()
    (tmp_path / "my_agents.py").write_text(AGENT)
    runner = subprocess.Popen(
        [*LIGHTRAIL, "runner", "--store", url, "--agent", "my_agents:solve", "--give-up-after", "3"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(url.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while not _connected_to(port):  # the runner got past its start and is leasing (long polls), however slow
            assert runner.poll() is None and time.monotonic() < deadline, runner.stderr.read() if runner.stderr else ""
            time.sleep(0.1)
        server.terminate()
        server.wait(30)
        _, stderr = runner.communicate(timeout=40)
    finally:
        server.kill()
        runner.kill()
    assert runner.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    assert any("store unreachable for" in line and "giving up after 3 s" in line for line in lines), stderr
    assert lines[-1].startswith("lightrail runner: the store has been unreachable for"), lines[-1]


def test_runner_takes_the_store_from_the_environment_and_the_old_token_spelling(store_server, tmp_path):
    """``$LIGHTRAIL_STORE`` names the store as for every other command; ``--token`` still means the store's token
    (deprecated), so existing scripts keep working."""
    url, tokens = store_server
    (tmp_path / "my_agents.py").write_text(AGENT)
    done = run(["runner", "--agent", "my_agents:solve", "--token", tokens["runner"], "--idle-exit", "0.2"], tmp_path,
               LIGHTRAIL_STORE=url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("lightrail runner "), done.stderr
    assert f"leasing from {url}: my_agents:solve, 8 at a time" in done.stderr.splitlines()[0]
    assert "HTTP Request" not in done.stderr  # quiet by default: no line per request


# -- one vocabulary: every command described, every option explained -------------------------------------------


def _parsers():
    import argparse

    from lightrail.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str):
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")

    return list(walk(build_parser(), "lightrail"))


def test_every_command_has_a_description_an_example_and_help_on_every_option():
    import argparse

    problems = []
    for path, parser in _parsers():
        if not parser.description:
            problems.append(f"{path}: no description")
        if not parser.epilog or "lightrail" not in parser.epilog:
            problems.append(f"{path}: no example")
        for action in parser._actions:
            if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help:
                problems.append(f"{path}: {'/'.join(action.option_strings) or action.dest} has no help")
        if "(default: None)" in parser.format_help():
            problems.append(f"{path}: '(default: None)' in --help")
    assert len(_parsers()) >= 25  # every command and subcommand was walked
    assert problems == []


def test_the_store_is_spelled_the_same_everywhere():
    """``--store`` and ``--store-token`` wherever the store is meant; ``--token`` is a command's own server token
    or the deprecated spelling of ``--store-token``; one default concurrency for every command that runs agents."""
    from lightrail.agent.cli import DEFAULT_CONCURRENCY

    for path, parser in _parsers():
        options = {o: a for a in parser._actions for o in a.option_strings}
        if "--store" in options and path != "lightrail learn":
            assert "--store-token" in options, path
            assert "$LIGHTRAIL_STORE" in options["--store"].help, path
            assert "$LIGHTRAIL_TOKEN" in options["--store-token"].help, path
        if "--token" in options and "--store" in options and "serve" not in path and "dashboard" not in path:
            assert options["--token"].dest == "store_token" and "deprecated" in options["--token"].help, path
        if "--concurrency" in options and path != "lightrail demo":  # the demo's are tuned to its model
            assert options["--concurrency"].default == DEFAULT_CONCURRENCY, path
    long_running = {path: parser for path, parser in _parsers() if path.endswith(("serve", "dashboard", "runner"))}
    assert len(long_running) == 4
    for path, parser in long_running.items():  # quiet by default, louder on request
        [level] = [a for a in parser._actions if "--log-level" in a.option_strings]
        assert level.default == "warning", path


def test_version_and_help_are_one_command_away(tmp_path):
    from lightrail import __version__

    version = run(["--version"], tmp_path)
    assert version.returncode == 0 and version.stdout.strip() == f"lightrail {__version__}"
    demo = run(["demo", "--help"], tmp_path)
    assert demo.returncode == 0 and "(default: None)" not in demo.stdout
    gateway = run(["gateway", "serve", "--help"], tmp_path)
    assert "is answered by the model it serves" in gateway.stdout


# -- malformed configs and command lines -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, text, problem",
    [
        pytest.param(["train"], "algorithm: [grpo\n", "config.yaml:2:1: not valid YAML (expected ','", id="train-yaml"),
        pytest.param(
            ["train"], "algorithm: grpo\nbogus: 1\n", "config.yaml: unknown setting(s) ['bogus']", id="train-field"
        ),
        pytest.param(["learn", "--once"], "store: [x\n", "config.yaml:2:1: not valid YAML", id="learn-yaml"),
        pytest.param(["learn", "--once"], "bogus: 1\n", "config.yaml: unknown setting(s) ['bogus']", id="learn-field"),
    ],
)
def test_a_malformed_config_is_one_line_naming_the_file(command, text, problem, tmp_path):
    (tmp_path / "config.yaml").write_text(text)
    assert_one_line(run([*command[:1], "config.yaml", *command[1:]], tmp_path), problem)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]


@pytest.mark.parametrize(
    "args, problem",
    [
        (["show"], "lightrail show: the following arguments are required: ROLLOUT_ID (see lightrail show --help)"),
        (["runner", "--store", "s.db"], "required: --agent"),
        (["rollouts", "--limit", "x"], "argument --limit: invalid int value: 'x'"),
        (["nosuchcommand"], "invalid choice: 'nosuchcommand'"),
    ],
)
def test_a_malformed_command_line_is_one_line(args, problem, tmp_path):
    done = run(args, tmp_path)
    assert_one_line(done, problem)
    assert done.returncode == 2


def test_errors_from_trainer_dev_are_not_chained_behind_the_event_loop_check(tmp_path, monkeypatch):
    """A user's traceback shows their error, not "RuntimeError: no running event loop ... During handling"."""
    import traceback

    from lightrail.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LIGHTRAIL_TOKEN", raising=False)
    (tmp_path / "my_agents.py").write_text(AGENT)
    with pytest.raises(ValueError, match="runners started elsewhere need the store's token") as info:
        Trainer(n_runners=0, store=str(tmp_path / "store.db")).dev("my_agents:solve", [{"q": 1}])
    assert "no running event loop" not in "".join(traceback.format_exception(info.value))


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["runs"], id="runs"),
        pytest.param(["rollouts"], id="rollouts"),
        pytest.param(["failures"], id="failures"),
        pytest.param(["show", "ro-1"], id="show"),
        pytest.param(["token", "list"], id="token"),
        pytest.param(["dev", "--agent", "my_agents:solve", "--tasks", "tasks.jsonl"], id="dev"),
    ],
)
def test_a_wrong_store_token_is_one_line(command, store_server, tmp_path):
    url, _ = store_server
    (tmp_path / "my_agents.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    done = run([*command, "--store", url, "--store-token", "nope"], tmp_path)
    assert_one_line(done, f"the store server at {url} refused the token (HTTP 401")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_agents.py", "tasks.jsonl"]


@pytest.mark.parametrize("command", [["train", "config.yaml"], ["learn", "config.yaml", "--once"]])
def test_a_bad_store_in_a_config_is_one_line_before_anything_is_made(command, tmp_path):
    (tmp_path / "config.yaml").write_text(
        "store: 127.0.0.1:4747\npolicies: policies\nmodel: tiny\nagent: x:y\ndata: x:y\n"
        if command[0] == "learn"
        else "algorithm: grpo\nstore: 127.0.0.1:4747\nagent: x:y\ndata: x:y\nout_dir: runs/x\n"
    )
    assert_one_line(run(command, tmp_path), "config.yaml: store: store URL '127.0.0.1:4747' has no scheme")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]
