"""The public surface changes on purpose only, and ``import lightrail`` stays light."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import lightrail

PUBLIC = [
    "Algorithm",
    "Attempt",
    "AttemptStatus",
    "GRPO",
    "LLM",
    "LitAgent",
    "MemoryStore",
    "PromptTemplate",
    "Resources",
    "RetryPolicy",
    "Rollout",
    "RolloutSpec",
    "RolloutStatus",
    "Runner",
    "SQLiteStore",
    "Span",
    "Store",
    "StoreClient",
    "Task",
    "Trainer",
    "Transition",
    "VERL",
    "__version__",
    "as_agent",
    "emit_event",
    "emit_exception",
    "emit_message",
    "emit_reward",
    "feedback",
    "open_store",
    "rollout",
    "span",
]


def test_all_is_pinned():
    assert sorted(lightrail.__all__) == sorted(PUBLIC)


def test_every_public_name_resolves():
    assert sorted(lightrail._EXPORTS) == sorted(set(lightrail.__all__) - {"__version__"})
    for name in lightrail.__all__:
        assert getattr(lightrail, name) is not None, name
    from lightrail.algorithms.grpo import GRPO

    assert lightrail.GRPO is GRPO
    from lightrail.agent import LitAgent, Runner, rollout
    from lightrail.tracing import as_agent, emit_event, emit_exception, emit_message, emit_reward, span
    from lightrail.trainer import Algorithm, Trainer

    assert (lightrail.LitAgent, lightrail.Runner, lightrail.rollout) == (LitAgent, Runner, rollout)
    assert (lightrail.emit_reward, lightrail.emit_event) == (emit_reward, emit_event)
    assert (lightrail.emit_message, lightrail.emit_exception, lightrail.span) == (emit_message, emit_exception, span)
    assert lightrail.as_agent is as_agent
    assert (lightrail.Trainer, lightrail.Algorithm) == (Trainer, Algorithm)


PROBE = """
import json, sys, time
t0 = time.perf_counter()
import lightrail
elapsed = time.perf_counter() - t0
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "opentelemetry", "asyncpg", "psycopg"})
print(json.dumps({"elapsed": elapsed, "heavy": heavy}))
"""


def test_import_is_light_and_fast():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    result = json.loads(out)
    assert result["heavy"] == []
    assert result["elapsed"] < 1.0, result


def test_agent_facing_imports_stay_light():
    """What a runner process imports to run an agent must not pull in the model plane either."""
    probe = PROBE.replace(
        "import lightrail\n", "import lightrail\nfrom lightrail import Runner, emit_reward, rollout\n"
    )
    result = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert result["heavy"] == []


def test_algorithm_names_stay_light():
    """``from lightrail import GRPO`` names the algorithm; torch loads when it runs (``setup``), not on import."""
    probe = PROBE.replace("import lightrail\n", "import lightrail\nfrom lightrail import GRPO\n")
    result = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert result["heavy"] == []


def test_the_command_line_parser_stays_light():
    """Every ``lightrail`` command (``store serve``, ``runner``) builds the whole parser first: a command module
    that imports torch would cost every store server and runner seconds of start-up (it did: 0.4 s -> 5 s)."""
    probe = PROBE.replace("import lightrail\n", "import lightrail.cli\nlightrail.cli.build_parser()\n")
    result = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert result["heavy"] == []


def test_algorithms_exports_load_on_first_use():
    import lightrail.algorithms as algorithms

    assert sorted(algorithms._EXPORTS) == sorted(algorithms.__all__)
    for name in algorithms.__all__:
        assert getattr(algorithms, name).__name__ == name or name == "LossNorm"


def test_grpo_config_is_a_deprecated_name_of_update_config():
    import lightrail.algorithms as algorithms
    from lightrail.model import updater

    for module in (algorithms, updater):
        with pytest.warns(DeprecationWarning, match="GRPOConfig is deprecated: use UpdateConfig"):
            assert module.GRPOConfig is updater.UpdateConfig
    assert "GRPOConfig" not in algorithms.__all__
