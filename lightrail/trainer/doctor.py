"""``lightrail doctor CONFIG.yaml``: check a ``lightrail train`` config end to end before a long run.

One line per check, ✓ or ✗ and, on failure, what to do; the first failure stops the checks that depend on it:

    config parses ─► store opens (token, role) ─► agent imports ─► data gives a training task ─► model prepares
    and the gateway starts ─► ONE rollout of one training task through a real runner (`Trainer.dev`) ─► an LLM call
    through lightrail's endpoint ─► with token ids ─► a reward

Everything is what ``lightrail train`` itself uses (`load_config`, the model built or prepared as `train` does, the
configured rollout engine, the trainer's store and runners), so a config that passes here fails in training only
for reasons of training itself. The rollout is recorded in the configured store like any ``lightrail dev`` run; its
runner is a local process (under ``trainer.runner_python`` when set) even when the config asks for Ray actors or
runners started elsewhere.
Only argparse at import time (the main CLI imports this module to build ``--help``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

__all__ = ["add_parser", "doctor"]

OK, FAIL = "✓", "✗"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``doctor`` on the main CLI's subparsers."""
    parser = subparsers.add_parser(
        "doctor",
        help="check a train config end to end (store, agent, model, gateway, one rollout) before a long run",
        description=(
            "Check that CONFIG can train: it parses; the store opens (a store server accepts the token and its role "
            "suffices); the agent imports; the data gives a training task; the model prepares and the gateway "
            "starts; one rollout of one training task runs through a real runner, its LLM calls go through "
            "lightrail's endpoint with token ids, and a reward comes back. One line per check, with what to do "
            "when it fails. Exits 0 when every check passes, 1 otherwise."
        ),
        epilog="examples:\n  lightrail doctor examples/sql_agent/config.yaml\n"
        "  lightrail doctor config.yaml --set store=http://store-host:4747",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", metavar="CONFIG.yaml", help="the run's configuration (as for lightrail train)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="override a field by dotted path, as lightrail train does (repeatable)",
    )
    parser.set_defaults(handler=_doctor)


class _Failed(Exception):
    """A check failed; its line is printed, the checks after it do not run."""


class _Checks:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.passed = 0

    def ok(self, what: str) -> None:
        self.passed += 1
        print(f"{OK} {what}", file=self.out, flush=True)

    def fail(self, what: str, todo: str) -> _Failed:
        print(f"{FAIL} {what}: {todo}", file=self.out, flush=True)
        return _Failed(what)


def _doctor(args: argparse.Namespace) -> int:
    return doctor(args.config, args.overrides)


def doctor(path: str, overrides: list[str] | tuple[str, ...] = (), out: Any = None) -> int:
    """Run the checks of ``lightrail doctor`` on the config at ``path``, printing one line each on ``out`` (stdout);
    0 when all pass, 1 otherwise."""
    checks = _Checks(out if out is not None else sys.stdout)
    try:
        _run_checks(checks, path, list(overrides))
    except _Failed:
        from lightrail._errors import counted

        passed = counted(checks.passed, "check")
        print(f"{passed} passed; fix the one marked {FAIL} and run lightrail doctor again", file=checks.out)
        return 1
    print(f"all {checks.passed} checks passed: lightrail train {path} should run", file=checks.out)
    return 0


def _run_checks(checks: _Checks, path: str, overrides: list[str]) -> None:
    import asyncio
    import os

    from lightrail._errors import one_line
    from lightrail.trainer.config import ConfigError, load_config

    try:
        config = load_config(path, overrides)
    except ConfigError as exc:
        raise checks.fail("config parses", f"{exc} (every field: lightrail train --config-reference)") from None
    checks.ok(f"config parses ({path})")

    from lightrail.store import redact_url
    from lightrail.store.base import StoreError
    from lightrail.trainer.trainer import TOKEN_ENV

    location = config.store_location
    token = os.environ.get(TOKEN_ENV)
    try:
        asyncio.run(_open_store(config, location, token))
    except (StoreError, OSError, ValueError) as exc:
        raise checks.fail(f"store opens ({redact_url(location)})", one_line(exc)) from None
    checks.ok(f"store opens ({redact_url(location)})")

    from lightrail._imports import import_object

    if config.trainer.runner_python:
        checks.ok(f"agent {config.agent}: imported by {config.trainer.runner_python} (checked by the rollout below)")
    else:
        try:
            import_object(config.agent)
        except Exception as exc:  # the user's module may raise anything at import
            raise checks.fail(f"agent {config.agent} imports", one_line(exc)) from None
        checks.ok(f"agent imports ({config.agent})")

    try:
        splits = import_object(config.data)
        train_tasks, _ = splits(**config.data_args)
        task = list(train_tasks)[0]
    except IndexError:
        raise checks.fail(f"data {config.data}", "it gives no training task; check data_args") from None
    except Exception as exc:
        raise checks.fail(f"data {config.data}", one_line(exc)) from None
    checks.ok(f"data gives training tasks ({config.data}, {len(train_tasks)} of them)")

    asyncio.run(_model_and_rollout(checks, config, task, token))


async def _open_store(config: Any, location: str, token: str | None) -> None:
    """Open the configured store as the trainer would and check it serves a trainer (for a store server: the token
    is accepted and its role may enqueue, read, cancel and publish)."""
    from lightrail.store import check_store, open_store, store_kind

    if store_kind(location) == "sqlite":
        config.run_dir.mkdir(parents=True, exist_ok=True)
    store = open_store(location, token=token)
    try:
        await check_store(store, ("enqueue", "query_rollouts", "cancel", "put_resources"),
                          token_hint="the store's admin token in $LIGHTRAIL_TOKEN")  # fmt: skip
    finally:
        await store.close()


async def _model_and_rollout(checks: _Checks, config: Any, task: Any, token: str | None) -> None:
    from lightrail._errors import one_line
    from lightrail.algorithms.run.policy import ServedPolicy
    from lightrail.model.rollout_engines import make_rollout_engine
    from lightrail.store import MemoryStore
    from lightrail.trainer.config import ConfigError, _build_model, _check_formats

    grpo = config.grpo
    try:
        model = _build_model(config, config.data.partition(":")[0])
        _check_formats(model, config)
        engine = make_rollout_engine(
            grpo.rollout_engine, model, served_name=grpo.served_name, out_dir=config.run_dir, lora_rank=None,
            engine_options=grpo.engine_options, vllm=grpo.vllm,
        )  # fmt: skip
    except (ConfigError, ValueError, OSError, RuntimeError, ImportError) as exc:
        raise checks.fail(f"model {config.model} prepares", one_line(exc)) from None
    try:
        try:
            await engine.start()
        except (ValueError, OSError, RuntimeError, ImportError) as exc:
            raise checks.fail(f"model {config.model} starts", one_line(exc)) from None
        where = config.gateway
        try:  # where training's gateway will listen: a busy port or a bad advertise_url fails here
            await (await ServedPolicy.start(engine.backend, MemoryStore(), where)).close()
        except (OSError, ValueError, RuntimeError) as exc:
            raise checks.fail("gateway starts", f"{one_line(exc)} (see the gateway section)") from None
        port = f"{where.host}:{where.port}" if where.port else f"a free port of {where.host}"
        checks.ok(f"model prepares ({model}) and the gateway starts on {port}")
        await _one_rollout(checks, config, task, token, engine.backend)
    finally:
        await engine.close()


async def _one_rollout(checks: _Checks, config: Any, task: Any, token: str | None, backend: Any) -> None:
    import io

    from rich.console import Console

    from lightrail._errors import counted, one_line
    from lightrail.inspection.capture import CaptureCause
    from lightrail.store.base import StoreError
    from lightrail.trainer.trainer import Trainer

    runners = config.trainer
    options: dict[str, Any] = {"otel": runners.otel, "runner_python": runners.runner_python}
    sampling = config.grpo.validation_sampling()
    try:
        trainer = Trainer(
            n_runners=1, concurrency=1, store=config.store_location, token=token,
            runs_dir=config.run_dir / "doctor", console=Console(file=io.StringIO()), **options,
        )  # fmt: skip
        report = await trainer.dev_async(
            config.agent, [task], _prompts(config), llm=backend, sampling=sampling, timeout_s=300
        )
    except (ImportError, ValueError, RuntimeError, StoreError, OSError) as exc:
        raise checks.fail("one rollout runs", one_line(exc)) from None
    [row] = report.rows
    if row.status.value != "succeeded":
        raise checks.fail(
            f"one rollout runs ({row.status.value})",
            f"{row.error or 'it did not finish'} (lightrail show {row.rollout_id} --store {report.store})",
        )
    checks.ok(f"one rollout runs through a runner ({row.rollout_id}, {row.seconds or 0:.1f}s)")
    causes = {p.cause: p.message for p in row.capture}
    if CaptureCause.NO_LLM_CALL in causes:
        raise checks.fail("an LLM call through lightrail's endpoint", causes[CaptureCause.NO_LLM_CALL])
    checks.ok(f"{counted(row.llm_calls, 'LLM call')} recorded through lightrail's endpoint")
    if CaptureCause.NO_TOKEN_IDS in causes:
        raise checks.fail("token ids", causes[CaptureCause.NO_TOKEN_IDS])
    checks.ok("with token ids")
    if CaptureCause.NO_REWARD in causes:
        raise checks.fail("a reward came back", causes[CaptureCause.NO_REWARD])
    checks.ok(f"a reward came back ({row.reward:.3g})")


def _prompts(config: Any) -> dict[str, Any] | None:
    """The templates prompt optimization starts from (``apo.prompts``), which its agent takes as resources."""
    from lightrail.trainer.config import recipe
    from lightrail.types import PromptTemplate

    if config.algorithm != "apo":
        return None
    prompts = recipe(config).arguments(config, None)["section"].prompts or {}
    return {name: PromptTemplate(template=text) for name, text in prompts.items()}
