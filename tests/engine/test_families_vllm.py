"""The seeds' model families through vLLM's CPU build (slow): a model that writes its family's tool call is served
by vLLM started with the parser flags lightrail derives from its chat template, and the agent gets the call.

Needs ``.venv-vllm`` (see tests/gateway/test_gateway_vllm.py); skipped only when that interpreter does not exist.
Shares its steps with ``bench/real_models.py --vllm``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bench.real_models import CALL, embedded_round_trip, trained_family_model, vllm_round_trip  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
VLLM_PYTHON = Path(os.environ.get("LIGHTRAIL_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


@pytest.mark.parametrize("family", ["qwen2.5", "llama3.2"])  # Hermes, Llama 3 JSON
async def test_a_family_tool_call_round_trips_through_vllm_and_the_embedded_engine(family, tmp_path):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM interpreter at {VLLM_PYTHON} (set LIGHTRAIL_VLLM_PYTHON or create .venv-vllm)")
    path = trained_family_model(family, tmp_path)
    assert await embedded_round_trip(path), f"the embedded engine did not hand the agent {CALL}"
    assert await vllm_round_trip(path, str(VLLM_PYTHON), tmp_path / "vllm"), f"vLLM did not hand the agent {CALL}"
