#!/usr/bin/env bash
# The GPU device run, dry, on a machine without a GPU: a Python 3.12 venv made the way the device
# is (numpy, pytest, h5py, matplotlib and setuptools from the registry; no MPI library; the carried wheels
# installed by device_run.sh exactly as there), then the whole device run. Every GPU step must
# end SKIP "no CUDA GPU" and every other step PASS. (No torch: PyPI's torch for 3.12 is a CUDA
# build of several GB; the device has its own.)
#   bash tests/gpu/dry_run.sh            # about a minute once the venv exists
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY312="${PYTHON312:-}"
for candidate in $(pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12 python3.12; do
    [[ -n "$PY312" ]] && break
    "$candidate" -V >/dev/null 2>&1 && PY312="$candidate"
done
if [[ -z "$PY312" ]]; then
    echo "dry_run: no python3.12 here (the device's Python); set PYTHON312" >&2
    exit 2
fi
VENV="$ROOT/build/gpu-dry-run-venv"
OUT_DIR="$ROOT/build/gpu-dry-run"
if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY312" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check numpy pytest h5py matplotlib setuptools
fi
PYTHON="$VENV/bin/python" bash tests/gpu/fetch_wheels.sh >/dev/null  # afresh: the list may have grown
rm -rf "$OUT_DIR"
rc=0
PYTHON="$VENV/bin/python" OUT="$OUT_DIR" bash tests/gpu/device_run.sh "$@" || rc=$?
# Dry: a GPU step may only skip for want of a GPU, every other step must pass.
"$VENV/bin/python" tests/gpu/device_steps.py --check-dry "$OUT_DIR/summary.txt" || rc=1
echo "dry run: exit $rc"
exit "$rc"
