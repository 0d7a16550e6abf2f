# The framework showcases' own environments, from nothing; sourced by scripts/test after scripts/_env.sh (the demo
# does not need them). CrewAI pins an older openai and mcp than the other frameworks, Semantic Kernel an older
# pydantic and mcp than the main environment: their runners run in environments of their own (.venv-crewai,
# .venv-sk; `runner_python` in their configs). Sets LIGHTRAIL_CREWAI_PYTHON and LIGHTRAIL_SK_PYTHON.
# Idempotent: an environment that already has the pinned set is reused in a second.
set -euo pipefail
FW_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FW_VENV="${LIGHTRAIL_VENV:-$FW_ROOT/.venv}"
CREW_VENV="${LIGHTRAIL_CREWAI_VENV:-$FW_VENV-crewai}"
SK_VENV="${LIGHTRAIL_SK_VENV:-$FW_VENV-sk}"

_lightrail_framework_venv() {  # VENV CONSTRAINTS EXTRAS
  local venv="$1" constraints="$2" extras="$3"
  local stamp="$venv/.lightrail-installed"
  local want
  want="$(cat "$FW_ROOT/pyproject.toml" "$constraints" | sha256sum | cut -c1-16)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[lightrail] installing $extras into $venv (first run takes a few minutes)" >&2
    [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -c "$constraints" -e "$FW_ROOT[openai,otel,$extras]"
    echo "$want" > "$stamp"
  fi
}
_lightrail_framework_venv "$CREW_VENV" "$FW_ROOT/constraints-crewai.txt" crewai
_lightrail_framework_venv "$SK_VENV" "$FW_ROOT/constraints-sk.txt" semantic-kernel
export LIGHTRAIL_CREWAI_PYTHON="$CREW_VENV/bin/python"
export LIGHTRAIL_SK_PYTHON="$SK_VENV/bin/python"
