#!/usr/bin/env bash
# Are the sm_90a kernels of the working tree the same machine code as at another revision?
# For device-code edits meant to change nothing (a refactor, a host-only guard), checked on a
# machine without a GPU: each form is compiled for sm_90a from both trees with the build's nvcc
# flags, and the instruction lines of `cuobjdump -sass` are compared.
#
#   ci/sass_diff.sh REV [FORM ...]     (no FORM: every form with an sm_90a image)
#
# NVCC (default: nvcc on PATH) and CUOBJDUMP (default: cuobjdump on PATH) name the tools; any
# CUDA 13 nvcc will do (the wheel's 13.5 or a system 13.0), as long as both sides use the same.
# Prints one line per form, `same` or `DIFF` (with the differing line count), and exits 1 if any
# form differs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,12p "$0"; exit 2; }
rev=$1; shift
NVCC=${NVCC:-nvcc}
CUOBJDUMP=${CUOBJDUMP:-cuobjdump}
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'git worktree remove --force "$work/base" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/base" "$rev" >/dev/null 2>&1

sass() {  # root tu out: the instruction lines of the sm_90a cubin of `tu`, headers from `root`
  local root=$1 tu=$2 out=$3
  "$NVCC" -std=c++17 -O3 -I "$root/cpp/kernels" -I "$root/cpp" --expt-relaxed-constexpr -Wno-deprecated-gpu-targets \
    -cubin -gencode arch=compute_90a,code=sm_90a "$tu" -o "$out.cubin"
  "$CUOBJDUMP" -sass "$out.cubin" | grep -E '^\s+/\*[0-9a-f]+\*/ ' | sed -E 's#^\s+/\*[0-9a-f]+\*/ +##' > "$out"
}

"$PY" tools/gen_kernels.py --out "$work/gen" --archs 90a >/dev/null
"$PY" "$work/base/tools/gen_kernels.py" --out "$work/gen-base" --archs 90a >/dev/null
[ $# -gt 0 ] || set -- $(ls "$work/gen" | sed -n 's/\.cu$//p')
status=0
for form in "$@"; do
  [ -f "$work/gen/$form.cu" ] || { echo "$form: not a form here"; status=1; continue; }
  [ -f "$work/gen-base/$form.cu" ] || { echo "$form: not a form at $rev"; status=1; continue; }
  rm -f "$work/here.sass" "$work/base.sass"
  sass "$PWD" "$work/gen/$form.cu" "$work/here.sass" & here=$!   # the two trees' compiles side by side
  sass "$work/base" "$work/gen-base/$form.cu" "$work/base.sass" & base=$!
  ok=1; wait "$here" || ok=0; wait "$base" || ok=0
  [ "$ok" = 1 ] || { echo "$form: compile failed"; status=1; continue; }
  if cmp -s "$work/here.sass" "$work/base.sass"; then
    echo "$form: same ($(wc -l < "$work/here.sass") instructions)"
  else
    echo "$form: DIFF ($(diff "$work/base.sass" "$work/here.sass" | grep -c '^[<>]') lines differ)"; status=1
  fi
done
exit $status
