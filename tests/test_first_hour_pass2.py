"""The first hour, second pass: the Python API as good as the CLI, and no traceback a user did not ask for.

Model names resolve the same in Python as in a config; `Trainer.fit` returns a `FitResult` and prints the summary
``lightrail train`` prints, its store in the run's folder; Ctrl-C, a syntax error in the agent and an unknown model
are one line; a store server killed under ``lightrail train`` stops the run in seconds; ``--store`` reads a URL, a
file or a folder the same way in every command. Real processes throughout: the command in a subprocess, real
store servers, runners and the tiny model on the CPU.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_first_hour import AGENT, assert_one_line, run, store_server  # noqa: F401  (a fixture)
from tests.trainer.test_config import CONFIG, ROOT, _write

LIGHTRAIL = [sys.executable, "-m", "lightrail"]


# -- models: one resolution, in Python as in a config ---------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "small", "smollm2"])
def test_every_model_name_resolves_when_an_algorithm_is_made(name):
    """``GRPO("tiny")`` is the prepared folder, as ``model: tiny`` is: no hub id handed to transformers (which
    spent ~70 s retrying a download before a 100-line OSError)."""
    from lightrail.algorithms.apo import APO
    from lightrail.algorithms.grpo import GRPO
    from lightrail.algorithms.sft import SFT
    from lightrail.engine.models import list_models

    started = time.monotonic()
    expected = {m.name: m.path for m in list_models()}[name]
    assert GRPO(name).model == expected
    assert SFT(name).model == expected
    assert APO(name, prompts={"prompt_template": "Solve it."}).model == expected
    assert (expected / "config.json").is_file()
    assert time.monotonic() - started < 120  # built or prepared once, never downloaded


def test_a_missing_model_folder_is_one_line_when_the_run_starts(tmp_path):
    from lightrail.algorithms.grpo import GRPO
    from lightrail.engine.models import check_model_dir

    grpo = GRPO(tmp_path / "not-yet")  # a chain's next stage: written by the one before
    with pytest.raises(FileNotFoundError, match=r"model '.*not-yet': the folder does not exist; give tiny, small"):
        check_model_dir(grpo.model)


def test_a_policy_updater_takes_a_model_name():
    from lightrail.engine.models import list_models
    from lightrail.model.updater import PolicyUpdater

    updater = PolicyUpdater("tiny")
    tiny = {m.name: m.path for m in list_models()}["tiny"]
    assert updater.model.config.vocab_size == json.loads((tiny / "config.json").read_text())["vocab_size"]


# -- Trainer.fit: a typed result, the summary, the store in the run's folder ----------------------------------


def test_fit_returns_its_result_prints_the_summary_and_keeps_the_store_in_the_run_folder(tmp_path, monkeypatch):
    from rich.console import Console

    from examples.calculator.data import make_splits
    from lightrail.algorithms import UpdateConfig
    from lightrail.algorithms.grpo import GRPO
    from lightrail.trainer import Trainer
    from lightrail.trainer.result import FitResult

    monkeypatch.chdir(tmp_path)  # the default store must not land in ./runs/<timestamp>
    out = tmp_path / "a-long-run-folder-name-that-would-wrap-at-eighty-columns" / "grpo"
    train, val = make_splits(4, 2, seed=1)
    grpo = GRPO(
        "tiny", config=UpdateConfig(lr=1e-3), steps=1, tasks_per_step=2, n_samples=2, val_every=0,
        sampling={"temperature": 1.0, "max_tokens": 8}, val_sampling={"temperature": 0.0, "max_tokens": 8},
        out_dir=out,
    )  # fmt: skip
    printed = io.StringIO()
    console = Console(file=printed, width=80)  # what rich does when piped: 80 columns
    result = Trainer(n_runners=1, concurrency=4, algorithm=grpo, console=console).fit(
        "examples.calculator.train:calculator_agent", train, val
    )
    assert isinstance(result, FitResult)
    with pytest.raises(AttributeError):
        result.val_after = 1.0  # type: ignore[misc]  # frozen
    assert result.val_before is not None and 0.0 <= result.val_before <= 1.0
    assert result.val_after == grpo.report["val_after"] and 0.0 <= result.val_after <= 1.0
    assert result.checkpoint == out / "checkpoints" / "step-1" and result.checkpoint.is_dir()
    assert result.report_path == out / "report.json" and result.report_path.is_file()
    assert result.store == str(out / "store.db") and (out / "store.db").is_file()
    assert not (tmp_path / "runs").exists()
    text = printed.getvalue()
    assert result.summary() in text  # the lines `lightrail train` prints, unwrapped at 80 columns
    assert f"store:        {out / 'store.db'}\n" in text and f"checkpoint:   {result.checkpoint}\n" in text


def test_lightrail_dev_names_its_own_flag_for_a_missing_token(tmp_path):
    (tmp_path / "my_agents.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    done = run(["dev", "--agent", "my_agents:solve", "--tasks", "tasks.jsonl", "--runners", "0"], tmp_path)
    line = assert_one_line(
        done, "runners started elsewhere need the store's token", "--store-token or $LIGHTRAIL_TOKEN"
    )
    assert "Trainer(" not in line


# -- one line, not a traceback --------------------------------------------------------------------------------

BROKEN_AGENT = "import lightrail\n\n\ndef solve(task):\n    return 1.0 +\n"


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["train", "config.yaml"], id="train"),
        pytest.param(["dev", "--agent", "my_agents:solve", "--tasks", "tasks.jsonl"], id="dev"),
    ],
)
def test_a_syntax_error_in_the_agent_is_one_line_with_file_and_line(command, tmp_path):
    (tmp_path / "my_agents.py").write_text(BROKEN_AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    _write(tmp_path, CONFIG.replace("examples.calculator.train:calculator_agent", "my_agents:solve"))
    done = run(command, tmp_path, PYTHONPATH=str(ROOT))
    assert_one_line(done, f"lightrail {command[0]}: {tmp_path / 'my_agents.py'}:5: invalid syntax", "--debug")
    debug = run([*command, "--debug"], tmp_path, PYTHONPATH=str(ROOT))  # the traceback, when asked for
    assert debug.returncode != 0 and "Traceback" in debug.stderr and "SyntaxError" in debug.stderr


@pytest.mark.parametrize(
    "model, where",
    [("tiny2", "config.yaml: model:"), ("no/such/folder", "model:")],  # a path may be another machine's: at start
)
def test_an_unknown_model_is_one_line_naming_the_config(model, where, tmp_path):
    _write(tmp_path, CONFIG)
    done = run(["train", "config.yaml", "--model", model], tmp_path, PYTHONPATH=str(ROOT))
    assert_one_line(done, f"{where} '{model}' is neither a known model (tiny, small, smollm2)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # nothing made


# -- Ctrl-C and a dead child under `lightrail train` ----------------------------------------------------------

LONG = CONFIG.replace("  steps: 1\n", "  steps: 50\n  checkpoint_every: 1\n  guard: {max_empty_steps: 0}\n")
"""A run long enough to be interrupted, killed or watched. The tiny random model's groups often score alike, so the
run guard could stop it on its own (exit code 3) after three such steps, before the signal a test sends lands: these
tests are about the signal, so the guard never stops this run."""


def _children(pid: int) -> list[int]:
    """Every process ``pid`` started (any thread of it), recursively."""
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except FileNotFoundError:
            continue
        for kid in kids:
            found += [kid, *_children(kid)]
    return found


def _running(pids: list[int]) -> list[int]:
    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    return [pid for pid in pids if alive(pid)]


def _as_from_a_terminal() -> None:
    """SIGINT as a terminal's foreground command gets it: an ignored SIGINT is inherited across exec (and Python then
    leaves it ignored), and a process earlier in the suite may have left it so in pytest's (the full suite failed
    both Ctrl-C tests this way, the file alone passed)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_training(tmp_path: Path, run_dir: Path, config_text: str = LONG) -> tuple[subprocess.Popen[str], list[int]]:
    """``lightrail train`` in a process group of its own, once its first checkpoint is written; and its children."""
    config = _write(tmp_path, config_text)
    trainer = subprocess.Popen(
        [*LIGHTRAIL, "train", str(config), "--out", str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=_as_from_a_terminal,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "step-1" / "loop_state.json").exists():
        assert trainer.poll() is None, trainer.communicate()
        assert time.monotonic() < deadline, "no checkpoint after 300 s"
        time.sleep(0.1)
    return trainer, _children(trainer.pid)


def _ends_all(trainer: subprocess.Popen[str], children: list[int], within_s: float) -> tuple[str, str, float]:
    started = time.monotonic()
    try:
        out, err = trainer.communicate(timeout=60)
    finally:
        trainer.kill()
    took = time.monotonic() - started
    deadline = time.monotonic() + 5  # the lifeline's poll: a second at most
    while _running(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _running(children) == [], "left running"
    assert took <= within_s, (took, err)
    return out, err, took


def test_ctrl_c_stops_with_one_line_that_resumes_from_the_step_it_names(tmp_path):
    run_dir = tmp_path / "run"
    trainer, children = _start_training(tmp_path, run_dir)
    assert len(children) >= 2  # the store server and the runner (and multiprocessing's resource tracker)
    os.killpg(trainer.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, err, _ = _ends_all(trainer, children, within_s=30)
    assert trainer.returncode == 130
    line = assert_one_line(subprocess.CompletedProcess([], trainer.returncode, "", err), "lightrail train: interrupted")
    step = int(line.split("continue from step ", 1)[1].split()[0])
    assert (run_dir / "checkpoints" / f"step-{step}").is_dir()
    command = line.split(" with: ", 1)[1]
    assert command == f"lightrail train {tmp_path / 'config.yaml'} --out {run_dir} --resume"

    resumed = subprocess.run(
        [*LIGHTRAIL, *command.split()[1:], "--steps", str(step + 1)], cwd=ROOT, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"GRPO: resuming from step {step} ({run_dir / 'checkpoints' / f'step-{step}'})" in resumed.stdout
    assert "held-out success:" in resumed.stdout
    assert json.loads((run_dir / "report.json").read_text())["steps"] == step + 1


def test_a_second_ctrl_c_during_the_stop_is_still_one_line(tmp_path):
    """Ctrl-C pressed twice (the second while the first is stopping the run): one line, exit code 130, nothing left
    running (the event loop ends with the gateway still serving: its cancelled lifespan is not logged as an error)."""
    run_dir = tmp_path / "run"
    trainer, children = _start_training(tmp_path, run_dir)
    os.killpg(trainer.pid, signal.SIGINT)
    time.sleep(0.3)
    with contextlib.suppress(ProcessLookupError):  # (already gone: the first one was enough)
        os.killpg(trainer.pid, signal.SIGINT)
    _, err, _ = _ends_all(trainer, children, within_s=30)
    assert trainer.returncode == 130
    assert_one_line(subprocess.CompletedProcess([], 130, "", err), "lightrail train: interrupted")


def test_a_store_server_killed_under_training_stops_the_run_in_seconds(tmp_path):
    """The dead-child drill: the run's own store server SIGKILLed; the trainer says so in one line and stops, its
    runners with it, within 10 s (it went on for 14 minutes before)."""
    run_dir = tmp_path / "run"
    trainer, children = _start_training(tmp_path, run_dir)
    [server] = [pid for pid in children if "store\0serve" in Path(f"/proc/{pid}/cmdline").read_text()]
    os.kill(server, signal.SIGKILL)
    _, err, _ = _ends_all(trainer, children, within_s=10)
    assert trainer.returncode == 1
    assert_one_line(
        subprocess.CompletedProcess([], 1, "", err),
        f"lightrail train: the store server (pid {server}) exited unexpectedly with code -9 (SIGKILL)",
        f"(traceback in {run_dir / 'error.log'})",
    )
    assert "ChildExited" in (run_dir / "error.log").read_text()  # the traceback, kept with the run


def test_a_runner_that_dies_stops_the_run_naming_it(tmp_path):
    run_dir = tmp_path / "run"
    trainer, children = _start_training(tmp_path, run_dir)
    [runner] = [pid for pid in children if "multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_text()]
    os.kill(runner, signal.SIGKILL)
    _, err, _ = _ends_all(trainer, children, within_s=10)
    assert trainer.returncode == 1
    assert f"runner process lightrail-runner-0 (pid {runner}) exited unexpectedly with code -9 (SIGKILL)" in err


def _loads_torch(pid: int) -> bool:
    return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()


def test_an_update_rank_that_dies_stops_the_run_naming_it(tmp_path):
    """The processes an algorithm starts are watched too (`TrainerContext.watch_child`): a data-parallel update rank
    killed between steps stops the run in seconds, with one line naming it, nothing left running."""
    run_dir = tmp_path / "run"
    two_ranks = LONG.replace("config: {lr: 1.0e-3}", "config: {lr: 1.0e-3, ranks: 2}")
    trainer, children = _start_training(tmp_path, run_dir, two_ranks)
    [rank] = [
        pid for pid in children if "multiprocessing" in Path(f"/proc/{pid}/cmdline").read_text() and _loads_torch(pid)
    ]  # fmt: skip  (the runner does not load torch)
    os.kill(rank, signal.SIGKILL)
    _, err, _ = _ends_all(trainer, children, within_s=10)
    assert trainer.returncode == 1
    # the watch's line, or the update's own when the next update step began first (the rollouts take ~0.2 s here)
    assert_one_line(subprocess.CompletedProcess([], 1, "", err), f"rank 1 (pid {rank}) ", "SIGKILL")


# -- --store: a URL, a file, or a folder meaning its store.db, in every command -------------------------------


def test_store_forms_read_the_same_store(store_server, tmp_path):  # noqa: F811 (the fixture)
    """A run folder (with or without a trailing slash), its store.db, and a server URL serving it all name the same
    rollouts; ``--store newdir/`` makes ``newdir/store.db``, never a file named ``newdir``."""
    from lightrail.store import SQLiteStore, resolve_store
    from lightrail.types import RolloutSpec, Task

    folder = tmp_path / "run"
    folder.mkdir()

    async def fill() -> None:
        store = SQLiteStore(str(folder / "store.db"))
        await store.enqueue([RolloutSpec(rollout_id="ro-first-hour", task=Task(input={"q": 1}))])
        await store.close()

    import asyncio

    asyncio.run(fill())
    assert resolve_store(str(folder)) == resolve_store(f"{folder}/") == str(folder / "store.db")
    assert resolve_store("http://127.0.0.1:1") == "http://127.0.0.1:1"
    for form in ("run", "run/", "run/store.db", f"sqlite://{folder}/"):
        done = run(["rollouts", "--store", form], tmp_path)
        assert done.returncode == 0 and "ro-first-hour" in done.stdout, (form, done.stderr)

    # a new folder with a slash: its store.db, for a command that creates a store
    served = subprocess.Popen([*LIGHTRAIL, "store", "serve", "--db", "newdir/", "--port", "0"], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert served.stdout is not None and "listening on" in served.stdout.readline()
    finally:
        served.terminate()
        served.wait(30)
    assert (tmp_path / "newdir" / "store.db").is_file()
    # a gateway serving a run folder's store: its store.db (it failed with "unable to open database file")
    port = _free_port()
    gateway = subprocess.Popen([*LIGHTRAIL, "gateway", "serve", "--fake", "--store", "run", "--port", str(port)],
                               cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert gateway.stdout is not None and "listening on" in gateway.stdout.readline(), gateway.stderr
        # the gateway's port given as a store: one line saying what answers there is not a store
        for command in (["runs"], ["rollouts"], ["failures"], ["show", "ro-1"], ["token", "list"]):
            assert_one_line(
                run([*command, "--store", f"http://127.0.0.1:{port}"], tmp_path),
                f"http://127.0.0.1:{port} answers but is not a lightrail store server",
            )
    finally:
        gateway.terminate()
        gateway.wait(30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["newdir", "run"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(["runs"], id="runs"),
        pytest.param(["rollouts"], id="rollouts"),
        pytest.param(["show", "ro-1"], id="show"),
        pytest.param(["failures"], id="failures"),
        pytest.param(["token", "list"], id="token"),
        pytest.param(["runner", "--agent", "my_agents:solve"], id="runner"),
        pytest.param(["dev", "--agent", "my_agents:solve", "--tasks", "tasks.jsonl"], id="dev"),
        pytest.param(["gateway", "serve", "--fake", "--port", "0"], id="gateway"),
        pytest.param(["dashboard", "--port", "0"], id="dashboard"),
    ],
)
def test_a_missing_store_token_names_the_flag_and_the_variable(command, store_server, tmp_path):  # noqa: F811
    url, _ = store_server
    (tmp_path / "my_agents.py").write_text(AGENT)
    (tmp_path / "tasks.jsonl").write_text('{"q": 1}\n')
    line = assert_one_line(run([*command, "--store", url], tmp_path), "no token was given")
    assert "--store-token" in line and "$LIGHTRAIL_TOKEN" in line, line


# -- cosmetics a newcomer notices -----------------------------------------------------------------------------


def test_charts_tick_whole_steps_and_fit_a_long_title():
    import re

    from lightrail.dashboard.charts import line_chart

    title = "train–inference mismatch (k3 KL before each update)"  # the dashboard's longest: it was cut off
    svg = str(line_chart(title, {"kl": [(1, 0.1), (2, 0.3), (3, 0.2)]}))
    ticks = re.findall(r'class="tick" text-anchor="middle">([^<]*)<', svg)
    assert ticks == ["1", "2", "3"]  # not 1, 1.5, 2, 2.5, 3
    # from the chart's left edge (it began at the plot's, 44 px in, and ran past the right edge at 11 px a ~6.3 px glyph)
    assert f'<text x="4" y="14" class="chart-title">{title}</text>' in svg and 4 + len(title) * 6.3 <= 360 - 4
    longer = str(line_chart(title + " per agent and policy", {"kl": [(1, 0.1)]}))
    assert 'class="chart-title" textLength="352" lengthAdjust="spacingAndGlyphs">' in longer  # squeezed, not cut
    short = str(line_chart("KL and loss", {"kl": [(0.0, 0.1), (0.5, 0.2)]}))  # fractional x stays fractional
    assert "textLength" not in short and ">0.5<" in short


def test_the_reward_curve_keeps_its_legend_off_the_lines_and_its_steps_whole(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from lightrail.algorithms import grpo

    figures: list = []
    real = plt.close
    plt.close = lambda fig=None: figures.append(fig)  # keep the figure to look at
    try:
        history = [{"kind": "train", "step": s, "reward_mean": 0.2 * s, "success_rate": 0.1 * s} for s in (1, 2, 3)]
        grpo._plot([*history, {"kind": "val", "step": 3, "val_success": 0.6}], tmp_path / "curve.png")
    finally:
        plt.close = real
    [fig] = figures
    ax = fig.axes[0]
    fig.canvas.draw()
    legend = ax.get_legend().get_window_extent()
    assert legend.y0 >= ax.get_window_extent().y1  # above the axes, over no line
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert (tmp_path / "curve.png").is_file()
    real(fig)
