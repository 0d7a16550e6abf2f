# Builds the Agent Lightning 0.3.0 environment that tests/agl/test_names.py reads the reference's public names from
# (`dir()`/`inspect` of the installed package, never a copied list); sourced by scripts/test, or run alone
# (`bash scripts/_env_agl.sh`); prints the environment's python on stdout. Idempotent: a venv that already has
# the pinned package is reused in a second. agentlightning 0.3.0 needs no torch (its verl extra is not installed).
set -euo pipefail
AGL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AGL_VENV="${LIGHTRAIL_AGL_VENV:-${LIGHTRAIL_VENV:-$AGL_ROOT/.venv}-agl}"
AGL_STAMP="$AGL_VENV/.lightrail-installed"
AGL_WANT="$(cat "$AGL_ROOT/constraints-agl.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [ "$(cat "$AGL_STAMP" 2>/dev/null)" != "$AGL_WANT" ]; then
  echo "[lightrail] installing agentlightning 0.3.0 into $AGL_VENV (first run takes a few minutes)" >&2
  [ -x "$AGL_VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$AGL_VENV"
  "$AGL_VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$AGL_VENV/bin/python" -m pip install -q -c "$AGL_ROOT/constraints-agl.txt" "agentlightning==0.3.0" >&2
  # LiteLLM fetches its model-cost map over the network at import unless told to use the bundled copy
  LITELLM_LOCAL_MODEL_COST_MAP=True "$AGL_VENV/bin/python" -c "import agentlightning" >&2
  echo "$AGL_WANT" > "$AGL_STAMP"
fi
export LIGHTRAIL_AGL_PYTHON="$AGL_VENV/bin/python"
if [ "${BASH_SOURCE[0]}" = "$0" ]; then echo "$LIGHTRAIL_AGL_PYTHON"; fi
