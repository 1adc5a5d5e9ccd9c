#!/usr/bin/env bash
# GPU suite for the H200 (sm_90a): build on the GPU machine with its own nvcc, then ctest,
# pytest -m gpu, compute-sanitizer on the kernels, the demo and a benchmark smoke.
# Logs go to $OUT; the last lines are a short table and "N passed, N failed". Each step's line
# is also appended to $OUT/summary.txt as it finishes, so a run cut short says what it did.
#   usage: bash ci/gpu.sh [pytest -k expression]
# CAKE_GPU_REQUIRE=H200: stop before building (exit 3) unless the GPU's name holds that text, so
# figures meant for one card never come from another. CAKE_GPU_TESTS=0: skip ctest, pytest and
# the sanitizers (a benchmarks-only run: build, demo, the grids).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cake-moe-gpu}
mkdir -p "$OUT"
export CUDACXX=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export CAKE_MOE_CUDA_ARCHS=${CAKE_MOE_CUDA_ARCHS:-90a}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
K=${1:-}
declare -a NAMES RESULTS
# (summary.txt also says when each step ended, in seconds from the start: a run cut short by a
# time limit tells what the next one needs)
record() { NAMES+=("$1"); RESULTS+=("$2"); printf '%-10s %s [%d s]\n' "$1" "$2" "$(( $(date +%s) - t0 ))" >>"$OUT/summary.txt"; }
# a warm machine keeps $OUT and /tmp: no table, log or test report of an earlier run may pass for
# this one's (a pytest that dies before writing its report must not be counted from the last one)
rm -f "$OUT/summary.txt" "$OUT/token_errors.txt" "$OUT"/bench_* \
  /tmp/cake-pytest.xml /tmp/cake-demo.log /tmp/host_overhead.log /tmp/host_moe.log
if [ -n "${CAKE_GPU_REQUIRE:-}" ]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *"$CAKE_GPU_REQUIRE"*) ;;
    *) echo "the GPU is '${gpu:-none found}', not an $CAKE_GPU_REQUIRE (CAKE_GPU_REQUIRE): nothing run"; exit 3 ;;
  esac
fi
passed=0; failed=0

t0=$(date +%s)
# always a clean build (~10 s on the H200 machine): the machine may keep a build directory whose
# objects are newer than the copied sources (a previous call built other sources), and ninja
# would take them for up to date
rm -rf build
if CMAKE_BUILD_PARALLEL_LEVEL=16 "$PY" -m pip install --no-build-isolation --no-deps -v . >"$OUT/build.log" 2>&1; then
  record build "ok ($(( $(date +%s) - t0 )) s, arches $CAKE_MOE_CUDA_ARCHS)"
else
  record build "FAILED (see build.log)"; tail -40 "$OUT/build.log"
  printf '\n%s\n' "0 passed, 1 failed"; exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$OUT/misc.log" 2>&1

if [ "${CAKE_GPU_TESTS:-1}" != 0 ]; then
# host-side C++ tests (not the device code on emulated CTAs: CI runs those, and no result of
# theirs depends on the machine)
if cmake -S . -B build/host-tests -DCAKE_MOE_HOST_TESTS_ONLY=ON -DPython_EXECUTABLE="$(command -v "$PY")" >>"$OUT/misc.log" 2>&1 \
   && cmake --build build/host-tests -j 16 --target test_host >>"$OUT/misc.log" 2>&1 \
   && (cd build/host-tests && ctest -LE emulated >>"$OUT/misc.log" 2>&1); then
  record ctest "ok: $(grep -Eo '[0-9]+% tests passed.*' "$OUT/misc.log")"
else
  record ctest "FAILED (misc.log)"
fi

# GPU tests (and the CPU ones, which must pass here too, but the inductor builds of the two CPU
# compile tests: 73 s and 58 s of a cold inductor on the H200 machine, CPU only, run by CI)
# (family-B outputs also log their per-token errors: the data behind TOKEN_BUDGET; the 25
# slowest tests are listed at the log's end)
CAKE_TEST_TOKEN_ERRORS="$OUT/token_errors.txt" "$PY" -m pytest -q -p no:cacheprovider tests ${K:+-k "$K"} --durations=25 \
  --deselect "tests/test_mxfp4_moe_cpu_plans.py::test_compiled_run_leaves_the_bound_tensors_as_the_graph_expects[inductor]" \
  --deselect "tests/test_grouped_gemm_autograd.py::test_compiled_moe_mlp_gives_the_eager_bits[inductor]" \
  --junitxml=/tmp/cake-pytest.xml >"$OUT/pytest.log" 2>&1
record pytest "$(tail -1 "$OUT/pytest.log")"
read -r p f < <("$PY" - /tmp/cake-pytest.xml <<'PYEOF'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
s = r if r.tag == "testsuite" else r.find("testsuite")
t, fl, e, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
print(t - fl - e - sk, fl + e)
PYEOF
)
passed=$((passed + ${p:-0})); failed=$((failed + ${f:-1}))
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -20

# compute-sanitizer: memcheck on every kernel family, racecheck on the shared-memory pipelines
sanitize() {  # name, tool, env, family
  if env $3 compute-sanitizer --tool "$2" --error-exitcode 7 "$PY" ci/sanitize.py "$4" >>"$OUT/sanitizer.log" 2>&1; then
    record "$1" "clean: $(grep -Eo 'ERROR SUMMARY: [0-9]+ errors|RACECHECK SUMMARY: [0-9]+ hazard[s]? displayed.*' "$OUT/sanitizer.log" | tail -1)"
    passed=$((passed + 1))
  else
    record "$1" "FAILED (sanitizer.log)"; failed=$((failed + 1)); tail -30 "$OUT/sanitizer.log"
  fi
}
sanitize memcheck memcheck "X=0" formats,grouped_gemm
sanitize memcheck-pt memcheck "CAKE_MOE_GG_FORCE_PORTABLE=1" grouped_gemm
sanitize memcheck-moe memcheck "X=0" mxfp4_moe
sanitize racecheck racecheck "X=0" grouped_gemm
sanitize racecheck-pt racecheck "CAKE_MOE_GG_FORCE_PORTABLE=1" grouped_gemm
sanitize racecheck-moe racecheck "X=0" mxfp4_moe
else
  # said in the summary, so a benchmarks-only run never reads as a tested one
  record tests "not run (CAKE_GPU_TESTS=0: no ctest, pytest or sanitizers)"
fi  # CAKE_GPU_TESTS

# the main job
if cake-moe demo >/tmp/cake-demo.log 2>&1; then record demo "$(tail -1 /tmp/cake-demo.log)"; passed=$((passed + 1))
else record demo "FAILED: $(tail -1 /tmp/cake-demo.log)"; failed=$((failed + 1)); fi
cat /tmp/cake-demo.log >>"$OUT/misc.log"
cake-moe info >>"$OUT/misc.log" 2>&1

# benchmarks (the PERF.md grids)
if cake-moe bench formats --out "$OUT/bench_formats" >>"$OUT/misc.log" 2>&1; then record bench-fmt "ok (bench_formats.md)"
else record bench-fmt "FAILED (misc.log)"; fi
# CAKE_BENCH_GG: 1 (default) the family-A grid with every tile timed, grid = the grid only, 0 = skip
if [ "${CAKE_BENCH_GG:-1}" != 0 ]; then
  sweep=--sweep; [ "${CAKE_BENCH_GG:-1}" = grid ] && sweep=
  if cake-moe bench grouped-gemm $sweep --out "$OUT/bench_gg" >>"$OUT/misc.log" 2>&1; then record bench-gg "ok (bench_gg.md)"
  else record bench-gg "FAILED (misc.log)"; fi
fi
# CAKE_BENCH_MOE: 1 (default) the family-B grid and the host-cost steps, 0 = skip them (a
# tests-only run: the formats benchmark above stays as the smoke)
if [ "${CAKE_BENCH_MOE:-1}" != 0 ]; then
  if cake-moe bench mxfp4-moe --out "$OUT/bench_moe" >>"$OUT/misc.log" 2>&1; then record bench-moe "ok (bench_moe.md)"
  else record bench-moe "FAILED (misc.log)"; fi
  # host microseconds per grouped-GEMM call: one-shot, prepared, the torch.library op, torch (the host's share is tracked)
  if "$PY" ci/host_overhead.py --profile none >/tmp/host_overhead.log 2>&1; then record host-us "ok (misc.log)"
  else record host-us "FAILED (misc.log)"; fi
  cat /tmp/host_overhead.log >>"$OUT/misc.log"
  # host microseconds per MXFP4 MoE plan() and plan.run(), against a run's device time
  if "$PY" ci/host_overhead.py --moe ep8,tp8 --moe-tokens 1,4096 >/tmp/host_moe.log 2>&1; then record host-moe "ok (misc.log)"
  else record host-moe "FAILED (misc.log)"; fi
  cat /tmp/host_moe.log >>"$OUT/misc.log"
fi

echo; echo "== device =="; head -1 "$OUT/misc.log"
echo "== benchmark (formats) =="; tail -n +3 "$OUT/bench_formats.md" 2>/dev/null
echo "== benchmark (grouped GEMM) =="; tail -4 "$OUT/bench_gg.md" 2>/dev/null
echo "== benchmark (MXFP4 MoE) =="; tail -n +3 "$OUT/bench_moe.md" 2>/dev/null
echo "== host us per call (grouped GEMM) =="; cat /tmp/host_overhead.log 2>/dev/null
echo "== host us per call (MXFP4 MoE) =="; tail -n +2 /tmp/host_moe.log 2>/dev/null
echo "== family-B outputs: relative RMS, whole / largest token / largest one-expert group (T, whole, token max, token p99, H, L, group) =="
if [ -s "$OUT/token_errors.txt" ]; then
  awk '{ if ($2 > w) w = $2; if ($7 > g) g = $7; if ($3 > m) { m = $3; line = $0 } }
       END { printf "%d outputs, whole <= %.2e, group <= %.2e, token <= %.2e (%s)\n", NR, w, g, m, line }' \
    "$OUT/token_errors.txt"
fi
echo "== demo =="; cat /tmp/cake-demo.log
echo "== summary =="
for i in "${!NAMES[@]}"; do printf '%-10s %s\n' "${NAMES[$i]}" "${RESULTS[$i]}"; done
printf '\n%s\n' "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
