# Builds the LLaMA-Factory environment that `sft: {backend: llamafactory}` trains in, from nothing; sourced by
# scripts/_env.sh, or run alone (`bash scripts/_env_llamafactory.sh`); prints the environment's python on stdout.
# Idempotent: a venv that already has the pinned set is reused in a second.
set -euo pipefail
LF_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LF_VENV="${LIGHTRAIL_LLAMAFACTORY_VENV:-${LIGHTRAIL_VENV:-$LF_ROOT/.venv}-llamafactory}"
LF_STAMP="$LF_VENV/.lightrail-installed"
LF_WANT="$(cat "$LF_ROOT/constraints-llamafactory.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"
if [ "$(cat "$LF_STAMP" 2>/dev/null)" != "$LF_WANT" ]; then
  echo "[lightrail] installing LLaMA-Factory into $LF_VENV (first run takes a few minutes)" >&2
  [ -x "$LF_VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$LF_VENV"
  "$LF_VENV/bin/python" -m pip install -q --upgrade pip >&2
  # torch first and alone, pinned to the CPU build, so nothing can pull a multi-GB CUDA build.
  "$LF_VENV/bin/python" -m pip install -q -c "$LF_ROOT/constraints-llamafactory.txt" "torch==2.13.0" >&2
  "$LF_VENV/bin/python" -m pip install -q -c "$LF_ROOT/constraints-llamafactory.txt" "llamafactory==0.9.5" >&2
  # llamafactory requires torchvision and torchaudio, whose PyPI builds link the CUDA torch: torchvision's import
  # then fails (and transformers imports it when present), torchaudio's extension cannot load. LLaMA-Factory's text
  # path never uses torchvision and imports torchaudio only for audio data, so torchvision goes and torchaudio
  # keeps its Python part (without the extension its import succeeds; audio loading would fail, and lightrail never
  # sends audio).
  "$LF_VENV/bin/python" -m pip uninstall -q -y torchvision >&2
  rm -f "$LF_VENV"/lib/python3*/site-packages/torchaudio/lib/*.so
  "$LF_VENV/bin/python" -c "import llamafactory.train.tuner, llamafactory.data" >&2
  echo "$LF_WANT" > "$LF_STAMP"
fi
export LIGHTRAIL_LLAMAFACTORY_PYTHON="$LF_VENV/bin/python"
if [ "${BASH_SOURCE[0]}" = "$0" ]; then echo "$LIGHTRAIL_LLAMAFACTORY_PYTHON"; fi
