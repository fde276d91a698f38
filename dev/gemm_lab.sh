#!/usr/bin/env bash
# Builds the GEMM lab (dev/gemm_lab.cu) here for sm_90a into devbin-lab/, or runs it on the device:
#   bash dev/gemm_lab.sh build            (here: nvcc, a minute or two)
#   bash dev/gemm_lab.sh gemv             (here: dev/gemv_lab.cu, the GEMV kernel's lab)
#   bash dev/gemm_lab.sh simt [SRC]       (here: dev/simt_lab.cu, the SIMT float32 kernel's lab,
#                                          SRC a variant of src/ops/matrix/gemm_simt.cu)
#   bash dev/gemm_lab.sh run [args...]    (device, with devbin-lab carried; ncu=1 profiles)
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-build}" in
  build)
    mkdir -p devbin-lab
    nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -lineinfo -Xptxas=-warn-spills -Iinclude -Isrc dev/gemm_lab.cu src/runtime/tma.cpp \
      src/runtime/check.cpp src/runtime/device.cpp src/runtime/tensor.cpp src/runtime/scratch.cpp -lcublas -ldl \
      -o devbin-lab/gemm_lab ;;
  gemv)
    mkdir -p devbin-lab
    nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -lineinfo -Xptxas=-warn-spills -Iinclude -Isrc dev/gemv_lab.cu src/runtime/tma.cpp src/runtime/check.cpp src/runtime/device.cpp src/runtime/tensor.cpp -lcublas -ldl \
      -o devbin-lab/gemv_lab ;;
  simt)
    mkdir -p devbin-lab /tmp/simt_variant/ops/matrix
    cp "${2:-src/ops/matrix/gemm_simt.cu}" /tmp/simt_variant/ops/matrix/gemm_simt.cu
    nvcc -O3 -DNDEBUG -std=c++17 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr \
      -lineinfo -Xptxas=-warn-spills -Iinclude -I/tmp/simt_variant -Isrc -Idev dev/simt_lab.cu src/runtime/check.cpp \
      src/runtime/device.cpp src/runtime/tensor.cpp src/runtime/scratch.cpp -lcublas -ldl \
      -o "devbin-lab/simt_lab${3:-}" ;;
  run)
    shift
    if [ "${ncu:-0}" = 1 ]; then  # the first cuBLAS kernel and ours, every section
      ncu --clock-control none --set full -k "regex:gemm|xmma|sm90" -c 2 -o "${OUT:-/tmp}/lab" \
        devbin-lab/gemm_lab --rounds 1 "$@" >/dev/null
      ncu -i "${OUT:-/tmp}/lab.ncu-rep" --page details --print-units base | grep -vE "^ +-+|^$|OPT|----" \
        | grep -vE "^ {10}" | cut -c1-120
    else
      devbin-lab/gemm_lab "$@"
    fi ;;
esac
