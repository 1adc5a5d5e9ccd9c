#!/usr/bin/env bash
# Same-build A/B of a decision-table rule (python/cake_moe/mxfp4_moe/_decide.py is host-side
# Python, so no second build is needed): the installed package ("installed") against a copy of
# it whose _decide.py has one sed edit applied ("edited"), the benchmark run on each in turn,
# RUNS times, on the same seeded inputs.
#   usage: bash ci/ab_decide.sh SED_EXPR RUNS -- BENCH_ARGS...
#   e.g.   bash ci/ab_decide.sh 's/^SM90_PAIR_WIDE_MEMORY = False/SM90_PAIR_WIDE_MEMORY = True/' 2 -- \
#            --layouts ep8,tp8 --tokens 6144 6656 7168 8192 10240 12288
# Each run writes $OUT/ab_<installed|edited>_<run>.{md,json,log}; the edit must change the file
# (else exit 2).
set -uo pipefail
[ $# -ge 4 ] && [ "$3" = "--" ] || { echo "usage: bash ci/ab_decide.sh SED_EXPR RUNS -- BENCH_ARGS..." >&2; exit 2; }
edit=$1 runs=$2
shift 3
OUT=${OUT:-/tmp/cake-moe-ab}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
cd /tmp || exit 1  # the installed package, not a checkout's python/
pkg=$("$PY" -c "import cake_moe, os; print(os.path.dirname(cake_moe.__file__))") || exit 1
edited=$(mktemp -d)
cp -r "$pkg" "$edited/"
table="$edited/cake_moe/mxfp4_moe/_decide.py"
sed -i "$edit" "$table"
rm -rf "$(dirname "$table")/__pycache__"  # a cached _decide.pyc of the same size and second would win
if cmp -s "$table" "$pkg/mxfp4_moe/_decide.py"; then
  echo "ci/ab_decide.sh: '$edit' changed nothing in _decide.py" >&2
  exit 2
fi
bench='import sys; from cake_moe.cli import main; sys.argv[0] = "cake-moe"; sys.exit(main())'
for run in $(seq 1 "$runs"); do
  for variant in installed edited; do
    path=""
    [ "$variant" = edited ] && path=$edited
    echo "== $variant, run $run"
    PYTHONPATH=$path "$PY" -c "$bench" bench mxfp4-moe "$@" --out "$OUT/ab_${variant}_$run" \
      >"$OUT/ab_${variant}_$run.log" 2>&1 || { tail -20 "$OUT/ab_${variant}_$run.log"; exit 1; }
    grep -E "^\| (ep8|tp8)" "$OUT/ab_${variant}_$run.md" | head -20
  done
done
