#!/usr/bin/env bash
# Creates .venv with the course's pinned stack and Horovod 0.28.1 built from source.
# Idempotent: when nothing it depends on changed and the build checks out, it returns in seconds.
# Called by `make setup` (and so by `make course`, `make test`, `make lab`).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-.venv}
PY=${PYTHON:-}
LOG_DIR=build/logs
mkdir -p "$LOG_DIR"

say()  { printf '[setup] %s\n' "$*"; }
# pip, minus the warnings some machines' pip configuration prints for every package.
pipq() {
  "$VPY" -m pip "$@" 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
  return "${PIPESTATUS[0]}"
}
fail() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# ---- 1. a Python 3.11 to build the venv from --------------------------------------------------
if [ -z "$PY" ]; then
  for candidate in python3.11 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      PY=$(command -v "$candidate"); break
    fi
  done
fi
[ -n "$PY" ] || fail "Python 3.11 not found (TensorFlow 2.15 and Horovod 0.28.1 need it). Install it (e.g. 'apt-get install python3.11 python3.11-venv python3.11-dev', pyenv, or conda: 'conda env create -f environment.yml') or pass PYTHON=/path/to/python3.11."
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || fail "$PY is not Python 3.11; pass PYTHON=/path/to/python3.11."

# ---- 2. GPU or CPU build? -----------------------------------------------------------------------
# A CUDA compiler alone is not enough (CPU machines may carry one): we need a GPU that the
# driver lists. MGPU_GPU=1 or 0 overrides the detection.
gpu=${MGPU_GPU:-auto}
if [ "$gpu" = auto ]; then
  gpu=0
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then gpu=1
    else say "a GPU is present but no CUDA toolchain (nvcc): building Horovod for the CPU only. Install the CUDA toolkit and run 'make setup' again for NCCL."; fi
  fi
fi
if [ "$gpu" = 1 ]; then
  TF_REQ="tensorflow[and-cuda]==2.15.1"; TF_DIST=tensorflow; KIND=gpu
else
  TF_REQ="tensorflow-cpu==2.15.1"; TF_DIST=tensorflow-cpu; KIND=cpu
fi

# ---- 3. up to date? -----------------------------------------------------------------------------
STAMP="$VENV/.mgpu-setup"
want=$( { echo "$KIND"; cat requirements.txt scripts/setup.sh pyproject.toml; } | sha256sum | cut -d' ' -f1)
check_build() {
  local out
  out=$("$VENV/bin/horovodrun" --check-build 2>&1) || return 1
  echo "$out" | grep -q '\[X\] TensorFlow' && echo "$out" | grep -q '\[X\] Gloo' || return 1
  if [ "$KIND" = gpu ]; then echo "$out" | grep -q '\[X\] NCCL' || return 1; fi
  echo "$out" > "$LOG_DIR/horovod-check-build.txt"
}
# Fast path (about a second): the stamp matches and the pinned versions are installed.
# `horovodrun --check-build` ran when the stamp was written; it takes ~15 s, so not every time.
installed_versions() {  # the versions that matter, as pip recorded them (no imports: fast)
  "$VENV/bin/python" -c 'import importlib.metadata as m, sys
print(*(m.version(p) for p in sys.argv[1:]))' "$TF_DIST" horovod keras nbgrader papermill 2>/dev/null
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/horovodrun" ] && \
   [ "$(installed_versions)" = "2.15.1 0.28.1 2.15.0 0.9.6 2.7.0" ]; then
  say "up to date ($VENV, $KIND build, checked by horovodrun --check-build: $LOG_DIR/horovod-check-build.txt)."
  exit 0
fi

# ---- 4. the venv and the pinned stack -----------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PY"
  "$PY" -m venv "$VENV" || fail "could not create a venv with $PY: install the venv module (e.g. 'apt-get install python3.11-venv')."
fi
VPY="$VENV/bin/python"
pipq install --quiet --upgrade "pip>=24" "setuptools>=69,<76" wheel
say "installing the pinned stack ($TF_REQ; this takes a few minutes the first time)"
grep -v -E '^(horovod|tensorflow-cpu)==' requirements.txt > "$LOG_DIR/requirements-no-horovod.txt"
pipq install --quiet "$TF_REQ" -r "$LOG_DIR/requirements-no-horovod.txt" \
  || fail "pip could not install the pinned stack (see the messages above): check the network or your pip index."
# `cmake` from PyPI when the system has none (Horovod's build needs cmake >= 3.13).
if ! command -v cmake >/dev/null 2>&1; then
  say "no cmake on PATH: installing it into $VENV from PyPI"
  pipq install --quiet "cmake>=3.13,<4"
fi
pipq install --quiet --no-deps -e .
pipq check >/dev/null || { pipq check >&2; fail "the installed packages conflict (listed above): remove $VENV and run 'make setup' again; if it persists, the pins in requirements.txt need fixing."; }

# ---- 5. Horovod 0.28.1 from source, against this TensorFlow --------------------------------------
hvd_version=$("$VPY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$hvd_version" != "0.28.1" ] || ! check_build; then
  command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
    || fail "no C++ compiler: Horovod is built from source. Install one ('apt-get install build-essential', or 'conda install gxx_linux-64') and run 'make setup' again."
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
         HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  if [ "$KIND" = gpu ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
    # TensorFlow's CUDA wheels ship NCCL; point Horovod's build at it unless the user did.
    nccl=$("$VPY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
    if [ -z "${HOROVOD_NCCL_HOME:-}" ] && [ -n "$nccl" ]; then export HOROVOD_NCCL_HOME="$nccl"; fi
  else
    # A CPU build: no GPU operations even if the shell asked for them.
    unset HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_BROADCAST HOROVOD_GPU_ALLGATHER
  fi
  say "building Horovod 0.28.1 ($KIND: Gloo$([ "$KIND" = gpu ] && echo ' + NCCL')); about 3 minutes on 2 cores, log in $LOG_DIR/horovod-build.log"
  pipq uninstall --quiet -y horovod >/dev/null 2>&1 || true
  if ! MAKEFLAGS="-j$(nproc)" "$VPY" -m pip install --no-build-isolation --no-cache-dir -v horovod==0.28.1 \
        > "$LOG_DIR/horovod-build.log" 2>&1; then
    log="$LOG_DIR/horovod-build.log"
    if grep -qiE 'cmake.*(not found|No such file)|CMake 3\.13 or higher' "$log"; then
      fail "Horovod build failed: cmake missing or too old. Install cmake >= 3.13 ('apt-get install cmake' or 'pip install cmake') and run 'make setup' again. Log: $log"
    elif grep -qiE 'Python\.h: No such file' "$log"; then
      fail "Horovod build failed: Python headers missing. Install them ('apt-get install python3.11-dev') and run 'make setup' again. Log: $log"
    elif grep -qiE "(g\+\+|c\+\+|gcc|compiler).*not found|No CMAKE_CXX_COMPILER" "$log"; then
      fail "Horovod build failed: no working C++ compiler. Install one ('apt-get install build-essential') and run 'make setup' again. Log: $log"
    elif grep -qiE 'nccl' "$log" && [ "$KIND" = gpu ]; then
      fail "Horovod build failed around NCCL. Install NCCL (or set HOROVOD_NCCL_HOME), or build for the CPU with 'MGPU_GPU=0 make setup'. Log: $log"
    elif grep -qiE 'tensorflow' "$log" && grep -qiE 'error' "$log"; then
      fail "Horovod build failed against TensorFlow: make sure TensorFlow 2.15.1 imports in $VENV ('$VPY -c \"import tensorflow\"') and run 'make setup' again. Log: $log"
    fi
    tail -n 25 "$log" >&2
    fail "Horovod build failed (last lines above). Full log: $log"
  fi
fi

# ---- 6. verify ------------------------------------------------------------------------------------
check_build || { "$VENV/bin/horovodrun" --check-build >&2 || true; fail "horovodrun --check-build does not list TensorFlow and Gloo$([ "$KIND" = gpu ] && echo ' and NCCL'): see above; remove $VENV and run 'make setup' again."; }
"$VPY" -c 'import keras, sys; sys.exit(not keras.__version__.startswith("2.15"))' \
  || fail "Keras is not 2.15 in $VENV: Keras 3 makes Horovod silently stop all-reducing. Run '$VPY -m pip install keras==2.15.0'."
echo "$want" > "$STAMP"
say "ready: $(TF_CPP_MIN_LOG_LEVEL=1 "$VPY" -c 'import tensorflow as tf, horovod; print(f"TensorFlow {tf.__version__}, Horovod {horovod.__version__}")' 2>/dev/null) ($KIND build). Check: $LOG_DIR/horovod-check-build.txt"
