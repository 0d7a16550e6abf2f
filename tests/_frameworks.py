"""Markers for tests that need an optional agent framework or its environment: without it they are skipped with
the reason (the extra to install, the environment to build), instead of failing the whole suite at collection."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

__all__ = [
    "CREWAI_PYTHON",
    "SK_PYTHON",
    "needs_agents_sdk",
    "needs_autogen",
    "needs_crewai_env",
    "needs_langgraph",
    "needs_sk_env",
]

ROOT = Path(__file__).resolve().parents[1]
CREWAI_PYTHON = os.environ.get("LIGHTRAIL_CREWAI_PYTHON", str(ROOT / ".venv-crewai" / "bin" / "python"))
SK_PYTHON = os.environ.get("LIGHTRAIL_SK_PYTHON", str(ROOT / ".venv-sk" / "bin" / "python"))


def _needs(module: str, extra: str) -> pytest.MarkDecorator:
    missing = importlib.util.find_spec(module) is None
    return pytest.mark.skipif(missing, reason=f"needs {module}: pip install 'lightrail[{extra}]'")


needs_langgraph = _needs("langgraph", "langchain")
needs_agents_sdk = _needs("agents", "openai-agents")
needs_autogen = _needs("autogen_agentchat", "autogen")
needs_crewai_env = pytest.mark.skipif(
    not Path(CREWAI_PYTHON).exists(),
    reason=f"needs CrewAI's own environment at {CREWAI_PYTHON} (scripts/_env.sh builds it; or set LIGHTRAIL_CREWAI_PYTHON)",
)
needs_sk_env = pytest.mark.skipif(
    not Path(SK_PYTHON).exists(),
    reason=f"needs Semantic Kernel's own environment at {SK_PYTHON} (scripts/_env.sh builds it; or set LIGHTRAIL_SK_PYTHON)",
)
