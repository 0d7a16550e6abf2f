"""Every benchmark under ``bench/`` still runs: ``python bench/NAME.py --smoke`` (tiny sizes, seconds) exits 0 and
its last stdout line is one JSON object holding the keys the bench declares.

The benches are found by listing ``bench/`` (every ``*.py`` not named ``_*``), so a new bench is covered without
editing this file. Each declares, at module level and as literals (read here with `ast`, nothing imported):

* ``KEYS``: the keys its JSON line always has;
* ``NEEDS`` (optional): a component that may be absent here -> the keys of the part that needs it. ``--smoke``
  leaves such a part out when its component is missing; this test then skips ``NAME[needs COMPONENT]`` with the
  reason (the venv or binary to provide), and requires the part's keys whenever the component is there. A bench
  whose every key needs a component is not run without it.

The components are found the way the rest of the suite finds them (``tests/_frameworks.py``, ``tests/_postgres.py``,
``$LIGHTRAIL_LLAMAFACTORY_PYTHON``, ``$LIGHTRAIL_VLLM_PYTHON``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests._frameworks import CREWAI_PYTHON, SK_PYTHON
from tests._postgres import find_bindir

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
TIMEOUT_S = 600
"""A smoke run takes seconds to a minute on 2 free cores, several on a machine loaded 10x; past this it is hung."""
SLOW = {
    "attribution": "a store server and a runner per arm, two arms",
    "false_alarms": "a quick demo: model, a short warm start, 1 GRPO step",
    "continuous": "a warm start, then a store server, a gateway and `lightrail learn` serving users for 15 s",
    "learning": "the demo twice (--seeds 2): model, warm start, GRPO",
    "real_models": "overfits a model family to a tool call until its loss is below 5e-4",
    "agl_compat": "a migration script through dev and a training step, and its baseline, as subprocesses",
    "silent": "eleven drills and a healthy run, each a trainer session with a runner process",
    "update": "six kinds of update pass on a 6-layer model, each warmed up first",
}
"""Smoke runs kept out of the default suite (``-m slow``): the slowest, 28-60 s each at a load of 3-6 on 2 cores."""


def _file(env: str, default: Path, how: str) -> tuple[Callable[[], bool], str]:
    path = os.environ.get(env) or str(default)
    return (lambda: Path(path).is_file()), f"no interpreter at {path} ({how}; or set {env})"


def _module(name: str, extra: str) -> tuple[Callable[[], bool], str]:
    return (lambda: importlib.util.find_spec(name) is not None), f"{name} is not installed (pip install '.[{extra}]')"


COMPONENTS: dict[str, tuple[Callable[[], bool], str]] = {
    "vllm": _file(
        "LIGHTRAIL_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python", "tests/gateway/test_gateway_vllm.py builds it"
    ),
    "llamafactory": _file(
        "LIGHTRAIL_LLAMAFACTORY_PYTHON",
        REPO / ".venv-llamafactory" / "bin" / "python",
        "scripts/_env_llamafactory.sh builds it",
    ),
    "crewai": ((lambda: Path(CREWAI_PYTHON).is_file()), f"no CrewAI environment at {CREWAI_PYTHON} (scripts/_env.sh)"),
    "semantic_kernel": (
        (lambda: Path(SK_PYTHON).is_file()),
        f"no Semantic Kernel environment at {SK_PYTHON} (scripts/_env.sh)",
    ),
    "postgres": (
        (lambda: find_bindir() is not None),
        "no PostgreSQL (initdb) on PATH or under /usr/lib/postgresql/*/bin",
    ),
    "verl": _file("LIGHTRAIL_VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python", "scripts/_env_verl.sh builds it"),
    "agl": _file("LIGHTRAIL_AGL_PYTHON", REPO / ".venv-agl" / "bin" / "python", "scripts/_env_agl.sh builds it"),
    "chromium": (
        (lambda: Path("/usr/bin/chromium").is_file()),
        "no Chromium at /usr/bin/chromium (apt-get install chromium)",
    ),
    "ray": _module("ray", "ray"),
    "langgraph": _module("langgraph", "langchain"),
    "agents_sdk": _module("agents", "openai-agents"),
    "autogen": _module("autogen_agentchat", "autogen"),
}
"""Component -> (is it here?, the reason a skip gives when it is not)."""


def declared(path: Path) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """A bench's ``KEYS`` and ``NEEDS``, read from its source as literals."""
    values: dict[str, object] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in ("KEYS", "NEEDS") and node.value is not None:
                    values[target.id] = ast.literal_eval(node.value)
    if "KEYS" not in values:
        raise AssertionError(f"{path.relative_to(REPO)}: no module-level KEYS (the keys its JSON line always has)")
    needs = values.get("NEEDS", {})
    assert isinstance(needs, dict) and set(needs) <= set(COMPONENTS), f"{path.name}: NEEDS names {needs}"
    return tuple(values["KEYS"]), needs  # type: ignore[arg-type]


def missing(needs: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The components of ``needs`` absent here, with the reason."""
    return {c: COMPONENTS[c][1] for c in needs if not COMPONENTS[c][0]()}


BENCHES = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))
CASES = [pytest.param(p, None, id=p.stem, marks=[pytest.mark.slow] if p.stem in SLOW else []) for p in BENCHES] + [
    pytest.param(p, c, id=f"{p.stem}[needs {c}]") for p in BENCHES for c in missing(declared(p)[1])
]
"""One case per bench, and one (skipped, with its reason) per part whose component is absent here."""


@pytest.mark.parametrize(("path", "component"), CASES)
def test_bench_runs_in_smoke_mode_and_prints_its_keys(path: Path, component: str | None, tmp_path: Path) -> None:
    keys, needs = declared(path)
    absent = missing(needs)
    if component is not None:
        pytest.skip(f"{path.name}: the part needing {component} is not checked: {absent[component]}")
    if not keys and set(absent) == set(needs):
        pytest.skip(f"{path.name}: every key needs a missing component: {'; '.join(absent.values())}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.setdefault("LIGHTRAIL_TORCH_THREADS", "1")
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(path), "--smoke"],
        cwd=tmp_path,  # runs/ and other outputs land in the test's folder
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    seconds = time.monotonic() - t0
    assert done.returncode == 0, (
        f"{path.name} --smoke exited {done.returncode} after {seconds:.0f} s:\n{done.stderr[-4000:]}"
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"{path.name} --smoke printed nothing on stdout:\n{done.stderr[-2000:]}"
    figures = json.loads(lines[-1])
    expected = set(keys).union(*(needs[c] for c in needs if c not in absent))
    lacking = sorted(expected - set(figures))
    assert not lacking, f"{path.name} --smoke: its JSON line lacks {lacking} (it has {sorted(figures)})"
