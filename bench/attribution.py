"""Attribution per framework: the fraction of an agent's LLM calls whose recorded call span names the agent that
made it (`named_fraction`), and per-agent policies' misrouted calls (issue 41).

    nice -n 19 .venv/bin/python bench/attribution.py [--quick] [--tasks N] [--only FRAMEWORK] [--arm KEY] [--policies]

Each arm runs a real agent through a real lightrail runner (`Trainer.dev_async`: a store server process, runner
processes, under the framework's own interpreter where it has one) and the gateway over the embedded engine serving
a tiny random model (built with the showcase's tokenizer corpus, as ``lightrail train model=tiny`` does; answers of
16 tokens). The tiny model never answers right, so each agent makes the calls its framework makes of a model that
talks nonsense; a prompt past the model's context is refused and still recorded (and counted). A call is *named*
when `build_episode`'s agent name for it (what training selects calls by) is the agent that really made it, read
off the request it sent (its system prompt, instructions or prompt text; the tests' own readers), independently
of the tracing under test. Frameworks and the positions of their tracing switches:

* ``langgraph`` (``examples/sql_agent``): runners' OpenTelemetry on (the config's), ``otel_off``;
* ``langchain`` (plain LangChain, ``tests/tracing/test_langchain.py``'s ``async_runnables``: a ``@chain``, a run
  name, a chat model's ``name``, a graph node): runners' OpenTelemetry off (no tracer needed), ``otel_on``;
* ``agents_sdk`` (``examples/rag_agent``): default, ``sdk_tracing_off`` (``OPENAI_AGENTS_DISABLE_TRACING=true``),
  ``otel_off``;
* ``autogen`` (``examples/calc_agent``): default, ``runtime_tracing_off`` (``AUTOGEN_DISABLE_RUNTIME_TRACING``),
  ``otel_off``;
* ``crewai`` (``examples/crew_agent``, ``.venv-crewai``): default, ``telemetry_off`` (``CREWAI_DISABLE_TELEMETRY``,
  ``CREWAI_DISABLE_TRACKING``, ``OTEL_SDK_DISABLED``), ``otel_off``;
* ``semantic_kernel`` (``examples/sk_agent``, ``.venv-sk``): diagnostics unset (``train.py`` turns them on),
  ``diagnostics_off`` (``SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS=false``), ``otel_off``;
* ``explicit`` (plain Python, `bench/_attribution_agents.py`: ``as_agent``, ``endpoint_for``, a raw HTTP POST to
  the agent route): runners' OpenTelemetry off, ``otel_on``;
* ``genai`` (the Agents SDK traced only by OpenTelemetry's official GenAI instrumentations, in-process runner):
  default, ``otel_sdk_disabled`` (``OTEL_SDK_DISABLED=true``).

LangSmith's switches (``LANGCHAIN_TRACING_V2``, ``LANGSMITH_TRACING``) are off by default, so LangChain's default
position is their "off" one. ``--policies`` adds ``misrouted_calls``: one GRPO step with ``grpo.policies`` (one
policy per agent) on each of the four multi-agent showcases (LangGraph, Agents SDK, AutoGen, CrewAI), the per-agent
policy tests' own overrides, summed; 6-8 minutes per showcase on a loaded 2-core machine, so not in the default.

Printed (last line of stdout, one JSON object): ``named_fraction_<framework>[_<position>]``, ``calls_<...>``,
``named_fraction_min`` (the smallest, over every arm) and ``named_fraction_min_arm``, ``named_fraction_min_sdk``
(the smallest over the arms whose runners trace as the framework needs, i.e. every arm but the ``otel_off`` ones of
the frameworks that name calls through OpenTelemetry), ``misrouted_calls`` (with ``--policies``), the 1-minute load
and ``python_loop_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "tests" / "examples"))  # the showcase tests' helpers (`one_step`, `showcase_by_sample`)

from bench._util import SMOKE_HELP, log, machine_facts  # noqa: E402

KEYS = ("tasks_per_arm", "named_fraction_explicit", "calls_explicit", "named_fraction_min", "named_fraction_min_arm",
        "arms_without_calls", "bench_s")  # fmt: skip

SAMPLING = {"temperature": 1.0, "max_tokens": 16}
CREWAI_PYTHON = os.environ.get("LIGHTRAIL_CREWAI_PYTHON", str(REPO / ".venv-crewai" / "bin" / "python"))
SK_PYTHON = os.environ.get("LIGHTRAIL_SK_PYTHON", str(REPO / ".venv-sk" / "bin" / "python"))
SK_DIAGNOSTICS = "SEMANTICKERNEL_EXPERIMENTAL_GENAI_ENABLE_OTEL_DIAGNOSTICS"


def _request(call: Any) -> dict:
    from lightrail.types import Attr

    request = call.span.attributes[Attr.REQUEST]
    return json.loads(request) if isinstance(request, str) else request


# -- who really made a call: read off its request (the showcase tests' readers) ------------------------------------


def _sql_node(call: Any) -> str:
    from test_sql_agent import _node_of

    return _node_of(_request(call)["messages"])


def _rag_agent(call: Any) -> str:
    from test_rag_agent import _agent_by_instructions

    return _agent_by_instructions(call)


def _calc_agent(call: Any) -> str:
    from test_calc_agent import _expected_agent

    return _expected_agent(call.span)


def _crew_role(call: Any) -> str:
    from test_crew_agent import _role_of

    return _role_of(call.span)


def _sk_solver(call: Any) -> str:
    return "solver"  # one agent: a call is named when it names the solver


_LANGCHAIN_PROMPTS = {"plan": "planner", "criticize": "critic", "judge": "judge", "graph": "draft"}


def _langchain_runnable(call: Any) -> str:
    """`async_runnables` sends one prompt per runnable (``plan``, ``criticize``, ``judge``, ``graph``)."""
    return _LANGCHAIN_PROMPTS[_request(call)["messages"][-1]["content"]]


def _explicit_agent(call: Any) -> str:
    from bench._attribution_agents import explicit_made_by

    return explicit_made_by(_request(call))


# -- arms ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One framework in one position of its tracing switches."""

    framework: str
    position: str
    """``""`` for the default position."""
    agent: str
    made_by: Callable[[Any], str]
    tasks: Callable[[int], list[dict]]
    corpus: str | None = None
    """The data module whose ``tokenizer_corpus`` the tiny model's tokenizer is trained on (None: the plain tiny)."""
    otel: bool = True
    env: dict[str, str | None] = field(default_factory=dict)
    """Environment variables of the arm (None: unset), inherited by its runner processes."""
    python: str | None = None
    needs_otel: bool = False
    """The framework names its calls through OpenTelemetry only (its ``otel_off`` arm is reported, not targeted)."""

    @property
    def key(self) -> str:
        return self.framework + (f"_{self.position}" if self.position else "")


def _val(module: str, **data_args: Any) -> Callable[[int], list[dict]]:
    def tasks(n: int) -> list[dict]:
        import importlib

        splits = importlib.import_module(module).splits
        return splits(seed=0, n_train=2, n_val=n, **data_args)[1][:n]

    return tasks


def _questions(n: int) -> list[dict]:
    return [{"question": f"question {i}"} for i in range(n)]


def arms() -> list[Arm]:
    sql = dict(agent="examples.sql_agent.train:sql_agent", made_by=_sql_node,
               tasks=_val("examples.sql_agent.data"), corpus="examples.sql_agent.data")  # fmt: skip
    rag = dict(agent="examples.rag_agent.train:rag_agent", made_by=_rag_agent, needs_otel=True,
               tasks=_val("examples.rag_agent.data"), corpus="examples.rag_agent.data")  # fmt: skip
    calc = dict(agent="examples.calc_agent.train:calc_agent", made_by=_calc_agent, needs_otel=True,
                tasks=_val("examples.calc_agent.data", tools="local", max_turns=2, one_shot=False),
                corpus="examples.calc_agent.data")  # fmt: skip
    crew = dict(agent="examples.crew_agent.train:crew_agent", made_by=_crew_role, python=CREWAI_PYTHON,
                needs_otel=True, tasks=_val("examples.crew_agent.data"), corpus="examples.crew_agent.data")  # fmt: skip
    sk = dict(agent="examples.sk_agent.train:sk_agent", made_by=_sk_solver, python=SK_PYTHON,
              tasks=_val("examples.sk_agent.data"), corpus="examples.sk_agent.data")  # fmt: skip
    chains = dict(agent="tests.tracing.test_langchain:async_runnables", made_by=_langchain_runnable,
                  tasks=_questions)  # fmt: skip
    explicit = dict(agent="bench._attribution_agents:explicit_names", made_by=_explicit_agent, tasks=_questions)
    return [
        Arm("langgraph", "", **sql),
        Arm("langgraph", "otel_off", otel=False, **sql),
        Arm("langchain", "", otel=False, **chains),
        Arm("langchain", "otel_on", **chains),
        Arm("agents_sdk", "", **rag),
        Arm("agents_sdk", "sdk_tracing_off", env={"OPENAI_AGENTS_DISABLE_TRACING": "true"}, **rag),
        Arm("agents_sdk", "otel_off", otel=False, **rag),
        Arm("autogen", "", **calc),
        Arm("autogen", "runtime_tracing_off", env={"AUTOGEN_DISABLE_RUNTIME_TRACING": "true"}, **calc),
        Arm("autogen", "otel_off", otel=False, **calc),
        Arm("crewai", "", **crew),
        Arm(
            "crewai",
            "telemetry_off",
            env={"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_DISABLE_TRACKING": "true", "OTEL_SDK_DISABLED": "true"},
            **crew,
        ),  # fmt: skip
        Arm("crewai", "otel_off", otel=False, **crew),
        Arm("semantic_kernel", "", env={SK_DIAGNOSTICS: None}, **sk),
        Arm("semantic_kernel", "diagnostics_off", env={SK_DIAGNOSTICS: "false"}, **sk),
        Arm("semantic_kernel", "otel_off", otel=False, env={SK_DIAGNOSTICS: None}, **sk),
        Arm("explicit", "", otel=False, **explicit),
        Arm("explicit", "otel_on", **explicit),
    ]


GENAI_POSITIONS = {"": {}, "otel_sdk_disabled": {"OTEL_SDK_DISABLED": "true"}}


# -- measuring ----------------------------------------------------------------------------------------------------


def named_fraction(pairs: list[tuple[str | None, str]]) -> float | None:
    """The fraction of calls, given as ``(recorded agent name, agent that made it)``, whose recorded name is the
    agent that made it; None when there were no calls (nothing measured, not 0 or 1)."""
    if not pairs:
        return None
    return sum(1 for recorded, maker in pairs if recorded == maker) / len(pairs)


def _set_environment(env: dict[str, str | None]) -> None:
    """Set each variable of ``env``; None unsets it."""
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@contextlib.contextmanager
def _environment(env: dict[str, str | None]) -> Iterator[None]:
    before = {name: os.environ.get(name) for name in env}
    try:
        _set_environment(env)
        yield
    finally:
        _set_environment(before)


_models: dict[str | None, Path] = {}


def _model(corpus: str | None, work: Path) -> Path:
    """The tiny random model, its tokenizer trained with ``corpus``'s ``tokenizer_corpus`` (built once per run)."""
    if corpus not in _models:
        import importlib

        from lightrail.engine.models import build_tiny_model

        extra = list(importlib.import_module(corpus).tokenizer_corpus()) if corpus else None
        _models[corpus] = build_tiny_model(work / f"model-{corpus or 'plain'}", size="tiny", seed=0, extra_corpus=extra)
    return _models[corpus]


async def _dev(arm: Arm, n: int, engine: Any, db: Path, work: Path) -> Any:
    from rich.console import Console

    from lightrail.trainer import Trainer

    trainer = Trainer(
        n_runners=1, concurrency=4, store=str(db), runner_python=arm.python, otel=arm.otel, runs_dir=work / "runs",
        console=Console(file=sys.stderr), loggers=[],
    )  # fmt: skip
    return await trainer.dev_async(arm.agent, arm.tasks(n), llm=engine, sampling=SAMPLING, timeout_s=900)


async def run_arm(arm: Arm, n: int, work: Path) -> list[tuple[str | None, str]]:
    """Run ``arm`` on ``n`` tasks; ``(recorded agent name, agent that made it)`` of every call of every rollout."""

    from lightrail.adapters import build_episode
    from lightrail.engine import Engine
    from lightrail.store import SQLiteStore

    engine = await asyncio.to_thread(Engine.from_pretrained, _model(arm.corpus, work))
    db = work / f"{arm.key}.db"
    try:
        for tries in range(3, 0, -1):
            try:
                with _environment(arm.env):
                    report = await _dev(arm, n, engine, db, work)
                break
            except RuntimeError as exc:  # `StoreServerProcess` waits 30 s: on a machine loaded ~10x, not enough
                if "store server did not start" not in str(exc) or tries == 1:
                    raise
                log(f"{arm.key}: {exc}; again")
                db.unlink(missing_ok=True)
    finally:
        await engine.close()
    statuses = [row.status.value for row in report.rows]
    store = SQLiteStore(db)
    pairs: list[tuple[str | None, str]] = []
    refused = 0
    try:
        for row in report.rows:
            by_attempt: dict[str, list] = {}
            for span in await store.query_spans(row.rollout_id):
                by_attempt.setdefault(span.attempt_id, []).append(span)
            for spans in by_attempt.values():  # an attempt retried (timed out on a loaded machine) made calls too
                for call in build_episode(spans).calls:
                    pairs.append((call.agent_name, arm.made_by(call)))
                    refused += call.prompt_ids is None
    finally:
        await store.close()
    wrong = sorted({p for p in pairs if p[0] != p[1]}, key=str)
    log(f"{arm.key}: {len(pairs)} calls ({refused} refused as too long), rollouts {statuses}, "
        f"named {named_fraction(pairs)}" + (f", misnamed (recorded, maker): {wrong}" if wrong else ""))  # fmt: skip
    return pairs


def run_genai(position: str, n: int, work: Path) -> list[tuple[str | None, str]]:
    env = {**os.environ, **GENAI_POSITIONS[position], "PYTHONPATH": str(REPO)}
    db = work / f"genai{position}.db"
    cmd = [
        sys.executable,
        str(REPO / "bench" / "_attribution_agents.py"),
        "genai",
        str(n),
        str(_model(None, work)),
        str(db),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the GenAI arm failed: {done.stderr[-2000:]}")
    pairs = [(recorded, maker) for recorded, maker in json.loads(done.stdout.strip().splitlines()[-1])]
    wrong = sorted({p for p in pairs if p[0] != p[1]}, key=str)
    log(f"genai{'_' + position if position else ''}: {len(pairs)} calls, named {named_fraction(pairs)}"
        + (f", misnamed (recorded, maker): {wrong}" if wrong else ""))  # fmt: skip
    return pairs


# -- per-agent policies: misrouted calls ------------------------------------------------------------------------


def _policy_runs() -> dict[str, tuple[Path, dict[str, list[str]], list[str]]]:
    """The per-agent-policy tests' runs (``tests/examples/test_*_agent.py``): config, policies, overrides."""
    from one_step import ONE_TINY_STEP, policy_overrides

    tiny = ["grpo.sampling={temperature: 1.0, max_tokens: 16}", "grpo.val_sampling={temperature: 0.0, max_tokens: 16}"]
    one_runner = ["trainer.n_runners=1", "trainer.concurrency=4"]
    sql = {"write": ["write_query"], "rewrite": ["rewrite_query"]}
    rag = {"research": ["researcher"], "edit": ["editor"]}
    calc = {"solve": ["solver"], "check": ["checker"]}
    crew = {"research": ["researcher"], "write": ["writer"]}
    return {
        "langgraph": (REPO / "examples/sql_agent/config.yaml", sql, [
            *ONE_TINY_STEP, "algorithm=grpo", "agent=sql_parity:sql_agent_parity", *one_runner,
            "data_args={seed: 0, n_train: 8, n_val: 2}", "grpo.n_samples=6", "grpo.sampling.max_tokens=16",
            "grpo.val_sampling.max_tokens=16", "grpo.agents=null",
            "grpo.policies={write: [write_query], rewrite: [rewrite_query]}", "grpo.config={lr: 1.0e-2, lora: {r: 4}}",
        ]),
        "agents_sdk": (REPO / "examples/rag_agent/config.yaml", rag, [
            *policy_overrides(rag, "showcase_by_sample:rag_agent_by_sample"),
            "data_args={seed: 0, n_train: 4, n_val: 2}", "trainer={n_runners: 1, concurrency: 4, otel: true}", *tiny,
        ]),
        "autogen": (REPO / "examples/calc_agent/config.yaml", calc, [
            *policy_overrides(calc, "showcase_by_sample:calc_agent_by_sample"), *one_runner,
            "data_args.n_train=4", "data_args.n_val=2", *tiny,
        ]),
        "crewai": (REPO / "examples/crew_agent/config.yaml", crew, [
            *policy_overrides(crew, "showcase_by_sample:crew_agent_by_sample"), f"trainer.runner_python={CREWAI_PYTHON}",
            *one_runner, "data_args={seed: 0, n_train: 8, n_val: 2}", *tiny,
        ]),
    }  # fmt: skip


def misrouted_calls(work: Path, only: list[str] | None) -> dict[str, int]:
    """``misrouted_<framework>`` of one GRPO step with per-agent policies on each showcase, and their sum."""
    from one_step import train_step_metrics

    from lightrail.trainer.config import load_config, train

    out: dict[str, int] = {}
    os.chdir(REPO)  # the configs' references (and relative runner_python) resolve from the root
    for name, (config_path, policies, overrides) in _policy_runs().items():
        if only and name not in only:
            continue
        t0 = time.monotonic()
        config = load_config(config_path, overrides=[*overrides, f"out_dir={work / ('policies-' + name)}"])
        assert config.grpo.policies == policies, config.grpo.policies
        step = train_step_metrics(train(config).report)
        out[f"misrouted_{name}"] = step["misrouted"]
        log(f"policies {name}: misrouted {step['misrouted']}, transitions per policy "
            f"{ {p: step[f'{p}/transitions'] for p in policies} } ({time.monotonic() - t0:.0f} s)")  # fmt: skip
    out["misrouted_calls"] = sum(out.values())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 tasks per arm (default 6)")
    parser.add_argument("--tasks", type=int, help="tasks per arm")
    frameworks = sorted({a.framework for a in arms()} | {"genai"})
    parser.add_argument("--only", choices=frameworks, action="append", help="this framework only (repeatable)")
    parser.add_argument("--arm", action="append", help="this arm only, by its key (e.g. crewai_otel_off; repeatable)")
    parser.add_argument("--policies", action="store_true", help="also misrouted_calls (~30 minutes)")
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP + " (the plain-Python arms, 1 task each)")
    args = parser.parse_args()
    if args.smoke:  # the arms every machine can run: one runner path, no framework's environment
        args.only, args.tasks = args.only or ["explicit"], 1
    n = args.tasks or (2 if args.quick else 6)
    out: dict[str, Any] = {"quick": args.quick, "tasks_per_arm": n, **machine_facts()}
    log(f"machine: {out}")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests" / "examples")])
    started = time.monotonic()
    fractions: dict[str, float | None] = {}
    sdk_keys: list[str] = []
    with tempfile.TemporaryDirectory(prefix="lightrail-attribution-") as tmp:
        work = Path(tmp)
        for arm in arms():
            if (args.only and arm.framework not in args.only) or (args.arm and arm.key not in args.arm):
                continue
            pairs = asyncio.run(run_arm(arm, n, work))
            fractions[arm.key] = named_fraction(pairs)
            out[f"calls_{arm.key}"] = len(pairs)
            if not (arm.needs_otel and not arm.otel):
                sdk_keys.append(arm.key)
        for position in GENAI_POSITIONS:
            key = "genai" + (f"_{position}" if position else "")
            if (args.only and "genai" not in args.only) or (args.arm and key not in args.arm):
                continue
            pairs = run_genai(position, n, work)
            fractions[key] = named_fraction(pairs)
            out[f"calls_{key}"] = len(pairs)
            sdk_keys.append(key)
        out.update({f"named_fraction_{key}": value for key, value in fractions.items()})
        measured = {key: value for key, value in fractions.items() if value is not None}
        if measured:
            lowest = min(measured, key=measured.__getitem__)
            out["named_fraction_min"], out["named_fraction_min_arm"] = round(measured[lowest], 4), lowest
            sdk = [measured[k] for k in sdk_keys if k in measured]
            out["named_fraction_min_sdk"] = round(min(sdk), 4) if sdk else None
        out["arms_without_calls"] = sorted(k for k, v in fractions.items() if v is None)
        if args.policies:
            out.update(misrouted_calls(work, args.only))
    out["bench_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
