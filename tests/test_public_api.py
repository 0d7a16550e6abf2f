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


# -- every package face -----------------------------------------------------------------------------------------

FACES = [
    "lightrail.adapters",
    "lightrail.agent",
    "lightrail.algorithms",
    "lightrail.dashboard",
    "lightrail.engine",
    "lightrail.gateway",
    "lightrail.model",
    "lightrail.store",
    "lightrail.tracing",
    "lightrail.trainer",
]
LAZY_FACES = ["lightrail", "lightrail.algorithms", "lightrail.dashboard", "lightrail.engine", "lightrail.model",
              "lightrail.store"]  # fmt: skip
"""The faces that load their names on first use, through `lightrail._lazy.lazy_face`."""


@pytest.mark.parametrize("face", FACES)
def test_every_name_a_face_lists_resolves(face):
    import importlib

    module = importlib.import_module(face)
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{face}.{name}"
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match=f"module '{face}' has no attribute 'NoSuchName'"):
        module.NoSuchName  # noqa: B018


@pytest.mark.parametrize("face", LAZY_FACES)
def test_a_lazy_face_writes_its_export_list_once(face):
    """The face's ``if TYPE_CHECKING:`` imports are its export list: ``_EXPORTS`` and ``__all__`` are read from them,
    and each name is the object its defining module holds (not a copy kept by hand)."""
    import importlib

    from lightrail._lazy import exports_of

    module = importlib.import_module(face)
    table = exports_of(module.__file__)
    assert {name: source for name, (source, _) in table.items()} == module._EXPORTS
    assert set(table) <= set(module.__all__)
    for name, (source, attribute) in table.items():
        assert getattr(module, name) is getattr(importlib.import_module(source), attribute), f"{face}.{name}"


@pytest.mark.parametrize("face", LAZY_FACES)
def test_importing_a_lazy_face_stays_light(face):
    probe = PROBE.replace("import lightrail\n", f"import {face}\n")
    result = json.loads(
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    )
    assert result["heavy"] == [], face


def test_algorithms_exports_no_model_plane_name():
    """``lightrail.algorithms`` names the algorithms; the model plane's names are ``lightrail.model``'s. The old ones
    still resolve through ``lightrail.algorithms``, with a `DeprecationWarning` naming ``lightrail.model``."""
    import lightrail.algorithms as algorithms
    import lightrail.model as model

    assert not [n for n, source in algorithms._EXPORTS.items() if source.startswith("lightrail.model")]
    assert sorted(model.__all__) == sorted(
        ["LlamaFactorySettings", "LoraSettings", "LossNorm", "PolicyUpdater", "UpdateConfig", "drop_stale_rows",
         "loss_weights", "pack_micro_batches", "policy_loss", "token_entropy"]
    )  # fmt: skip
    for name in model.__all__:
        with pytest.warns(
            DeprecationWarning, match=f"lightrail.algorithms.{name} moved: import it from lightrail.model"
        ):
            assert getattr(algorithms, name) is getattr(model, name)
        assert name not in algorithms.__all__


def test_the_version_has_one_source():
    """``lightrail.__version__`` is the installed distribution's (pyproject.toml's ``version``), written nowhere in
    the package."""
    import importlib.metadata
    import re
    from pathlib import Path

    assert lightrail.__version__ == importlib.metadata.version("lightrail")
    package = Path(lightrail.__file__).parent
    assert not [p for p in package.rglob("*.py") if re.search(r"__version__\s*=\s*['\"]", p.read_text())]
