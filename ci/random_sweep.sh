#!/usr/bin/env bash
# Random sweeps past the suite's 64 draws (both families' `-k random` GPU tests), in chunks of
# seeds, each chunk with its own pytest summary: a call's time limit then cuts off at most the
# chunk in flight, and every finished chunk is counted.
#   usage: bash ci/random_sweep.sh FIRST:END [CHUNK] [SECONDS]
# Runs seeds FIRST..END-1, CHUNK at a time (default 200), and starts no chunk that the last
# chunk's time says would end more than SECONDS (default 480) after the start. One table row per
# chunk and the ids of failed tests go to stdout and to $OUT/sweep.md (/tmp/sweep.md without OUT).
# Exit status: 0 when every chunk ran and passed, 1 when a test failed, none ran (all skipped: no
# GPU) or a chunk was left out.
set -uo pipefail
usage="usage: bash ci/random_sweep.sh FIRST:END [CHUNK] [SECONDS]"
range=${1:?$usage}
chunk=${2:-200}
limit=${3:-480}
first=${range%%:*}
end=${range##*:}
for n in "$first" "$end" "$chunk" "$limit"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
done
(( first < end && chunk > 0 )) || { echo "$usage (FIRST < END, CHUNK > 0)" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
log=${OUT:-/tmp}/sweep.md
mkdir -p "$(dirname "$log")" || exit 1
modules=(tests/test_mxfp4_moe_gpu.py tests/test_grouped_gemm_gpu.py)
echo "| seeds | pytest summary | time |" | tee -a "$log"
echo "|---|---|---|" | tee -a "$log"
status=0
last=0
a=$first
while (( a < end )); do
  b=$(( a + chunk < end ? a + chunk : end ))
  # The last chunk's time, scaled to this chunk's seeds, says whether this one can finish.
  (( SECONDS + last * (b - a) / chunk > limit )) && {
    echo "| $a:$end | not run: the time limit ($limit s) would pass | - |" | tee -a "$log"
    status=1
    break
  }
  t0=$SECONDS
  out=$(CAKE_TEST_RANDOM_SEEDS=$a:$b "$PY" -m pytest -q -m gpu -k random -rf \
        -p no:cacheprovider "${modules[@]}" 2>&1)
  rc=$?
  last=$(( SECONDS - t0 ))
  summary=$(printf '%s\n' "$out" | tail -n 1)
  echo "| $a:$b | $summary | $last s |" | tee -a "$log"
  printf '%s\n' "$out" | grep '^FAILED' | sed 's/^/|  | /; s/$/ |  |/' | tee -a "$log"  # rows of the table
  # All skipped (no GPU) is not a pass.
  (( rc == 0 )) && [[ $summary == *" passed"* ]] || status=1
  a=$b
done
exit $status
