# Builds the verl environment the parity tests and bench/verl_parity.py run verl's own loss functions in
# (`verl.trainer.ppo.core_algos`), from nothing; sourced by scripts/test, or run alone (`bash scripts/_env_verl.sh`);
# prints the environment's python on stdout. Idempotent: a venv that already has the pinned set is reused in a second.
# Not verl's training stack: verl itself without its dependencies, plus only what importing core_algos needs (verl's
# package __init__ imports ray and tensordict through verl.protocol, core_algos imports omegaconf, transformers via
# verl.utils.torch_functional, codetiming and orjson); no vllm, no flash-attn, no CUDA.
set -euo pipefail
VERL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERL_VENV="${LIGHTRAIL_VERL_VENV:-${LIGHTRAIL_VENV:-$VERL_ROOT/.venv}-verl}"
VERL_STAMP="$VERL_VENV/.lightrail-installed"
VERL_WANT="$(cat "$VERL_ROOT/constraints-verl.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [ "$(cat "$VERL_STAMP" 2>/dev/null)" != "$VERL_WANT" ]; then
  echo "[lightrail] installing verl's loss functions into $VERL_VENV (first run takes a few minutes)" >&2
  [ -x "$VERL_VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VERL_VENV"
  "$VERL_VENV/bin/python" -m pip install -q --upgrade pip >&2
  # torch first and alone, pinned to the CPU build, so nothing can pull a multi-GB CUDA build.
  "$VERL_VENV/bin/python" -m pip install -q -c "$VERL_ROOT/constraints-verl.txt" "torch==2.13.0" >&2
  # --no-deps: verl's requirements are its whole training stack (vllm-free, but datasets, peft, wandb, ...).
  "$VERL_VENV/bin/python" -m pip install -q --no-deps -c "$VERL_ROOT/constraints-verl.txt" "verl==0.9.1" >&2
  "$VERL_VENV/bin/python" -m pip install -q -c "$VERL_ROOT/constraints-verl.txt" \
    packaging numpy ray tensordict omegaconf transformers codetiming orjson >&2
  "$VERL_VENV/bin/python" -c "import verl.trainer.ppo.core_algos, verl.workers.config" >&2
  echo "$VERL_WANT" > "$VERL_STAMP"
fi
export LIGHTRAIL_VERL_PYTHON="$VERL_VENV/bin/python"
if [ "${BASH_SOURCE[0]}" = "$0" ]; then echo "$LIGHTRAIL_VERL_PYTHON"; fi
