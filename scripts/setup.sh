#!/usr/bin/env bash
# Creates .venv with one of the course's two stacks (by the Python found) and Horovod 0.28.1 built from source.
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

# ---- 1. a Python to build the venv from, and the stack it means -------------------------------
# 3.11 -> the pinned stack (requirements.txt: TensorFlow 2.15.1, Keras 2.15); 3.12 or 3.13 -> the current
# stack (requirements-current.txt: TensorFlow 2.20 with tf_keras). 3.11 is preferred when several exist.
supported() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12), (3, 13)))' >/dev/null 2>&1; }
if [ -z "$PY" ]; then
  pyenv_versions=${PYENV_ROOT:-$HOME/.pyenv}/versions
  for candidate in python3.11 "$pyenv_versions"/3.11.*/bin/python3.11 python3.12 python3.13 \
                   "$pyenv_versions"/3.12.*/bin/python3.12 "$pyenv_versions"/3.13.*/bin/python3.13 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && supported "$candidate"; then
      PY=$(command -v "$candidate"); break
    fi
  done
fi
[ -n "$PY" ] || fail "no Python 3.11, 3.12 or 3.13 found. Install one (e.g. 'apt-get install python3.12 python3.12-venv python3.12-dev', pyenv, or conda: 'conda env create -f environment.yml') or pass PYTHON=/path/to/python."
supported "$PY" || fail "$PY is not Python 3.11, 3.12 or 3.13 (the course's two stacks): pass PYTHON=/path/to/python3.11 or python3.12."
PYV=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ "$PYV" = 3.11 ]; then
  STACK=pinned; REQ=requirements.txt; TF_VERSION=2.15.1; KERAS_DIST=keras; KERAS_VERSION=2.15.0
else
  STACK=current; REQ=requirements-current.txt; TF_VERSION=2.20.0; KERAS_DIST=tf_keras; KERAS_VERSION=2.20.1
fi
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null)" != "$PYV" ]; then
  fail "$VENV was made with another Python than $PY ($PYV): remove it ('rm -rf $VENV') or pass VENV=another/folder."
fi

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
  TF_REQ="tensorflow[and-cuda]==$TF_VERSION"; TF_DIST=tensorflow; KIND=gpu
elif [ "$STACK" = pinned ]; then
  TF_REQ="tensorflow-cpu==$TF_VERSION"; TF_DIST=tensorflow-cpu; KIND=cpu
else  # from TensorFlow 2.20 on, the plain wheel is the CPU one (CUDA comes with [and-cuda])
  TF_REQ="tensorflow==$TF_VERSION"; TF_DIST=tensorflow; KIND=cpu
fi

# The grader (autograder/) runs every submission under a system-call filter compiled by libseccomp.
if [ "$(uname -s)" = Linux ] && ! "$PY" -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("seccomp") is None)'; then
  say "WARNING: libseccomp not found: the grader would run submissions without a system-call filter. Install it ('apt-get install libseccomp2')."
fi

# ---- 3. up to date? -----------------------------------------------------------------------------
STAMP="$VENV/.mgpu-setup"
want=$( { echo "$KIND $PYV"; cat "$REQ" scripts/setup.sh pyproject.toml mgpu/runtime/horovod_build.py patches/horovod-0.28.1/*.patch; } | sha256sum | cut -d' ' -f1)
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
print(*(m.version(p) for p in sys.argv[1:]))' "$TF_DIST" horovod "$KERAS_DIST" nbgrader papermill 2>/dev/null
}
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -x "$VENV/bin/horovodrun" ] && \
   [ "$(installed_versions)" = "$TF_VERSION 0.28.1 $KERAS_VERSION 0.9.6 2.7.0" ]; then
  say "up to date ($VENV, $STACK stack on Python $PYV, $KIND build, checked by horovodrun --check-build: $LOG_DIR/horovod-check-build.txt)."
  exit 0
fi

# ---- 4. the venv and the stack ------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV with $PY"
  "$PY" -m venv "$VENV" || fail "could not create a venv with $PY: install the venv module (e.g. 'apt-get install python$PYV-venv')."
fi
VPY="$VENV/bin/python"
pipq install --quiet --upgrade "pip>=24" "setuptools>=69,<76" wheel
say "installing the $STACK stack for Python $PYV ($TF_REQ; this takes a few minutes the first time)"
grep -v -E '^(horovod|tensorflow-cpu|tensorflow)==' "$REQ" > "$LOG_DIR/requirements-no-horovod.txt"
pipq install --quiet "$TF_REQ" -r "$LOG_DIR/requirements-no-horovod.txt" \
  || fail "pip could not install the $STACK stack (see the messages above): check the network or your pip index."
# `cmake` from PyPI when the system has none (Horovod's build needs cmake >= 3.13).
if ! command -v cmake >/dev/null 2>&1; then
  say "no cmake on PATH: installing it into $VENV from PyPI"
  pipq install --quiet "cmake>=3.13,<4"
fi
pipq install --quiet --no-deps -e .
pipq check >/dev/null || { pipq check >&2; fail "the installed packages conflict (listed above): remove $VENV and run 'make setup' again; if it persists, the pins in $REQ need fixing."; }

# ---- 5. Horovod 0.28.1 from its sdist with the course's patches, against this TensorFlow ----------
# mgpu.runtime.horovod_build keeps the built wheel in a cache keyed by Python, TensorFlow, kind and patches
# (MGPU_WHEEL_CACHE, default ~/.cache/mgpu/wheels): a venv made again installs it in seconds.
hvd_version=$("$VPY" -c 'import importlib.metadata as m; print(m.version("horovod"))' 2>/dev/null || true)
if [ "$hvd_version" != "0.28.1" ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ] || ! check_build; then
  command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 \
    || fail "no C++ compiler: Horovod is built from source. Install one ('apt-get install build-essential', or 'conda install gxx_linux-64') and run 'make setup' again."
  command -v patch >/dev/null 2>&1 || fail "no 'patch' program: the course patches Horovod's source. Install it ('apt-get install patch') and run 'make setup' again."
  "$VPY" -m mgpu.runtime.horovod_build --kind "$KIND" --log "$LOG_DIR/horovod-build.log" || fail "Horovod was not installed (the line above says why)."
fi

# ---- 6. verify ------------------------------------------------------------------------------------
check_build || { "$VENV/bin/horovodrun" --check-build >&2 || true; fail "horovodrun --check-build does not list TensorFlow and Gloo$([ "$KIND" = gpu ] && echo ' and NCCL'): see above; remove $VENV and run 'make setup' again."; }
"$VPY" -c 'import mgpu, keras, tensorflow as tf, sys  # tf.keras must be Keras 2: keras 2.x itself, or tf_keras
sys.exit(not (tf.keras.__name__.startswith("tf_keras") or keras.__version__.startswith("2.")))' 2>/dev/null \
  || fail "tf.keras is not the Keras 2 API in $VENV: Keras 3 makes Horovod silently stop all-reducing. Run '$VPY -m pip install $KERAS_DIST==$KERAS_VERSION'."
echo "$want" > "$STAMP"
say "ready: $(TF_CPP_MIN_LOG_LEVEL=1 "$VPY" -c 'import tensorflow as tf, horovod; print(f"TensorFlow {tf.__version__}, Horovod {horovod.__version__}")' 2>/dev/null) ($STACK stack, $KIND build). Check: $LOG_DIR/horovod-check-build.txt"
