#!/usr/bin/env bash
# Wheels of what a GPU machine with its own CUDA torch, transformers and peft lacks to run lightrail (bench/gpu_check.py),
# for a Python 3.12 manylinux x86_64 image with no network, into .whl/ (git-ignored; 6.8 MiB). The versions are the
# proven ones of constraints.txt; lightrail itself runs from the checkout (PYTHONPATH), torch stays the machine's.
# There:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   python3 bench/gpu_check.py
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT/.whl}"
PYTHON_VERSION="${GPU_PYTHON_VERSION:-3.12}"
# lightrail's core dependencies and the openai client (the agents' and the runners'), with theirs, less what such an
# image has already (httpx, anyio, h11, rich, jinja2, cloudpickle, pyyaml, matplotlib, tensorboard: KINDS.md's list)
NAMES=(msgspec httptools starlette uvicorn jsonschema jsonschema-specifications referencing rpds-py openai pydantic
       pydantic_core annotated-types typing-inspection jiter distro sniffio)
PINS=()
for name in "${NAMES[@]}"; do
  pin="$(grep -i "^${name}==" "$ROOT/constraints.txt" || true)"
  [ -n "$pin" ] || { echo "gpu_wheels: $name is not pinned in constraints.txt" >&2; exit 1; }
  PINS+=("$pin")
done
mkdir -p "$OUT"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$OUT" "${PINS[@]}"
du -sh "$OUT" >&2
