"""Model-plane scale-out benchmark: vLLM rollouts with weight sync, data-parallel updates, servable exports.

Each part lives in its own module and is runnable alone; this script runs them in one go and prints one JSON object
as the last line of stdout (progress on stderr), with the machine's speed and load:

* ``bench/_model_plane_vllm.py`` (needs ``.venv-vllm``, see tests/gateway/test_gateway_vllm.py): ``vllm_sync_s``
  (LoRA update done -> the next gateway request answered by the new adapter; target < 3 s), ``vllm_full_sync_s``,
  ``vllm_version_correct`` (recorded policy versions checked by re-scoring against each version; target 1.0), and
  ``grpo_steps_per_min_vllm`` next to ``grpo_steps_per_min_embedded`` (same recipe, same run).
* ``bench/_model_plane_ddp.py``: ``ddp_max_abs_diff`` (2-rank vs 1-rank updated weights on the same rows; target
  <= 1e-5) and ``ddp_update_tokens_per_s_2`` next to ``ddp_update_tokens_per_s_1``.
* ``bench/_model_plane_export.py``: ``export_greedy_match`` (exported model served by ``lightrail gateway serve``
  vs the training engine on held-out prompts; target 1.0), next to the untrained base's match.

    .venv/bin/python bench/model_plane_scale.py --quick      # < 5 minutes on a quiet machine
    .venv/bin/python bench/model_plane_scale.py --only ddp   # one part (vllm | ddp | export)
    .venv/bin/python bench/model_plane_scale.py --smoke      # the tiny model; the vLLM part only with its venv
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._util import run_parts  # noqa: E402

PARTS = {"ddp": "bench._model_plane_ddp", "export": "bench._model_plane_export", "vllm": "bench._model_plane_vllm"}
KEYS = ("ddp_max_abs_diff", "ddp_update_tokens_per_s_2", "ddp_update_tokens_per_s_1", "export_greedy_match",
        "ddp_bench_s", "export_bench_s", "bench_s", "targets_met")  # fmt: skip
NEEDS = {"vllm": ("vllm_sync_s", "vllm_full_sync_s", "vllm_version_correct", "grpo_steps_per_min_vllm",
                  "grpo_steps_per_min_embedded")}  # fmt: skip


def targets(out: dict) -> dict[str, bool]:
    met = {}
    if "vllm_sync_s" in out:
        met["vllm_sync_s<3"] = out["vllm_sync_s"] < 3
        met["vllm_version_correct==1"] = out["vllm_version_correct"] == 1.0
    if "ddp_max_abs_diff" in out:
        met["ddp_ranks==2"] = out["ddp_ranks"] == 2
        met["ddp_max_abs_diff<=1e-5"] = out["ddp_max_abs_diff"] <= 1e-5
    if "export_greedy_match" in out:
        met["export_greedy_match==1"] = out["export_greedy_match"] == 1.0
    return met


if __name__ == "__main__":
    run_parts(__doc__, PARTS, targets, needs={"vllm": "vllm"})
