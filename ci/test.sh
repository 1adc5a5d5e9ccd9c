#!/usr/bin/env bash
# Install cake-moe and run the CPU test suite: host-side C++ tests (ctest) and pytest.
# GPU tests (marker `gpu`) are skipped without a GPU and reported as such; ci/gpu.sh runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch is the only run-time dependency; keep an installed one, else take 2.13.0.
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q ".[test]"

echo "== ctest (host-side C++) =="
cmake -S . -B build/host-tests -DCAKE_MOE_HOST_TESTS_ONLY=ON -DPython_EXECUTABLE="$(command -v "$PY")" >/dev/null
cmake --build build/host-tests -j 2 >/dev/null
(cd build/host-tests && ctest --output-on-failure)

echo "== mypy (the annotations py.typed promises) =="
"$PY" -m mypy

echo "== pytest =="
# run from outside the source tree so the installed package (not python/) is imported
rc=0
(cd tests/.. && "$PY" -m pytest -q -p no:cacheprovider tests) || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests"; exit 1
fi
exit "$rc"
