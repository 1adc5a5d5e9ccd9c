#!/usr/bin/env bash
# Same-run A/B on the GPU machine: build and install each source tree in turn and run the same
# command against each build, so every ratio compares two builds measured minutes apart on one GPU.
#   usage: bash ci/ab.sh TREE_A TREE_B [TREE ...] -- COMMAND [ARGS ...]
# A tree is a directory holding a copy of the sources. Make them on the GPU machine: the working
# tree it receives is capped at 64 MiB, so bring each variant as a patch (git diff main BRANCH >
# ab_X.patch, untracked) and copy the checkout once per tree there:
#   for t in main X; do mkdir -p /tmp/ab/$t; tar --exclude=./build -cf - . | tar -xf - -C /tmp/ab/$t; done
#   (cd /tmp/ab/X && patch -p1 < ab_X.patch)
# COMMAND runs from /tmp (the installed
# package, not the checkout) with $AB_LABEL set to the tree's directory name; its output goes to
# $OUT/ab_<label>.log and its last 40 lines are printed (a tree named again: <label>_2, ...).
set -uo pipefail
OUT=${OUT:-/tmp/cake-moe-ab}
mkdir -p "$OUT"
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do trees+=("$(cd "$1" && pwd)"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#trees[@]} -ge 1 ] && [ $# -ge 1 ] || { echo "usage: bash ci/ab.sh TREE_A TREE_B -- COMMAND" >&2; exit 2; }
export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export CAKE_MOE_CUDA_ARCHS=${CAKE_MOE_CUDA_ARCHS:-90a} CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-16}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
declare -A runs
for tree in "${trees[@]}"; do
  label=$(basename "$tree")
  # a tree named again (A B A: A's spread in the same call) gets its run number in the label, so
  # its logs and $AB_LABEL outputs do not overwrite the first run's
  runs[$label]=$(( ${runs[$label]:-0} + 1 ))
  [ "${runs[$label]}" -gt 1 ] && label="${label}_${runs[$label]}"
  # a clean build (~10 s there): a kept build directory can hold objects newer than the copied
  # sources (mtimes travel with the copy), which ninja would take for up to date
  rm -rf "$tree/build"
  if ! (cd "$tree" && "$PY" -m pip install --no-build-isolation --no-deps . >"$OUT/ab_${label}_build.log" 2>&1); then
    echo "== $label: BUILD FAILED (ab_${label}_build.log)"; tail -20 "$OUT/ab_${label}_build.log"; continue
  fi
  (cd /tmp && AB_LABEL=$label "$@" >"$OUT/ab_${label}.log" 2>&1); rc=$?
  echo "== $label: rc=$rc"; tail -40 "$OUT/ab_${label}.log"
done
