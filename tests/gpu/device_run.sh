#!/usr/bin/env bash
# The GPU machine's run, from a bare machine: install the carried wheels, then every GPU check
# (tests/gpu/device_steps.py), each step under its own time limit, a log per step and one
# summary line per step. Without a GPU (the dry run, tests/gpu/dry_run.sh) the GPU steps skip
# with "no CUDA GPU" and everything else must pass.
#
#   bash tests/gpu/fetch_wheels.sh                       # here, once: the wheels into .gpu-wheels
#   bash tests/gpu/device_run.sh [--part check|speed|bench|all] [--only STEP,...]
#
# --part speed: only the per-op bench (the plugin beside the rest) and the training rounds, within
# the 7-minute budget: one call for the numbers before a change, one after.
#
# From the device tool: carry [".gpu-wheels"], command `bash tests/gpu/device_run.sh`; the
# summary, the logs (logs.tar.gz) and the benchmark files land in $OUT (else build/device-out).
# The device has no MPI library: the mpich wheel goes in with --prefix (a --target install leaves
# out its lib/), its lib/ on LD_LIBRARY_PATH and bin/ (mpiexec) on PATH; the other wheels and
# hpc_c10d itself (built from this checkout, so torch and pytest find its entry points, as after
# a user's install) go into a --target folder on PYTHONPATH, ahead of anything the machine has.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
WHEELS="${HPC_C10D_GPU_WHEELS:-$ROOT/.gpu-wheels}"
OUT_DIR="${OUT:-$ROOT/build/device-out}"
STAGE="$(mktemp -d "${TMPDIR:-/tmp}/hpc-c10d-device.XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$OUT_DIR"

shopt -s nullglob
mpich=("$WHEELS"/mpich-*.whl)
others=()
for w in "$WHEELS"/*.whl; do [[ "$(basename "$w")" == mpich-* ]] || others+=("$w"); done
if (( ${#mpich[@]} != 1 || ${#others[@]} == 0 )); then
    echo "device_run: no carried wheels in $WHEELS (bash tests/gpu/fetch_wheels.sh, then carry .gpu-wheels)" >&2
    exit 2
fi
install=(-m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check)
"$PYTHON" "${install[@]}" --prefix "$STAGE/mpich" "${mpich[0]}" || exit 2
"$PYTHON" "${install[@]}" --target "$STAGE/site" "${others[@]}" || exit 2
"$PYTHON" "${install[@]}" --no-build-isolation --target "$STAGE/site" "$ROOT" || exit 2
export PATH="$STAGE/mpich/bin:$STAGE/site/bin:$PATH"
export LD_LIBRARY_PATH="$STAGE/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PYTHONPATH="$STAGE/site${PYTHONPATH:+:$PYTHONPATH}"
export MPIEXEC="$STAGE/mpich/bin/mpiexec" PYTHONUNBUFFERED=1
exec "$PYTHON" tests/gpu/device_steps.py --out "$OUT_DIR" "$@"
