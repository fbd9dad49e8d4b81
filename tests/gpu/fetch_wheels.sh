#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks into one folder that travels with a device call (`carry`):
# the embedded MPI (mpich), mpi4py, ml_dtypes, threadpoolctl, pytest-mpi and python-hostlist, for
# CPython 3.12 on x86-64 Linux (the device's Python). About 16 MB. tests/gpu/device_run.sh
# installs them there. Keep the list in step with pyproject.toml's dependencies (a test checks).
#   bash tests/gpu/fetch_wheels.sh [DIR]        # default: .gpu-wheels in the checkout (git ignores it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-$ROOT/.gpu-wheels}"
PYTHON="${PYTHON:-python3}"
# One version of each: two of one name would stop the install there.
BINARY=(mpich==5.0.2 mpi4py==4.1.2 ml_dtypes==0.6.0 threadpoolctl==3.8.0 pytest-mpi==0.6)
PURE=(python-hostlist==2.3.0)  # an sdist only: built here into a py3-none-any wheel
mkdir -p "$DIR"
rm -f "$DIR"/*.whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64 any; do
    platforms+=(--platform "$p")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$DIR" "${BINARY[@]}"
"$PYTHON" -m pip wheel -q --no-deps -w "$DIR" "${PURE[@]}"
ls -1 "$DIR"
du -sh "$DIR" | cut -f1
