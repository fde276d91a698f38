#!/usr/bin/env bash
# The main job, on a machine with a GPU: build and install, verify every operator against its CPU
# reference, then benchmark the default suite (tessera against torch, when installed) into
# report/ (table, CSV, JSON, one SVG plot per operator).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/cuda/bin:$PATH"
PY="${PYTHON:-python3}"
"$PY" -m pip install -q scikit-build-core nanobind
TESSERA_CUDA_ARCHITECTURES="${TESSERA_CUDA_ARCHITECTURES:-80;90a}" "$PY" -m pip install -q --no-build-isolation .
tessera info
tessera verify
tessera bench --out report/tessera
if "$PY" -c "import torch" 2>/dev/null; then
  "$PY" benchmarks/elementwise.py --out report/elementwise
fi
