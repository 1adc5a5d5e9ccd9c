"""Runs test code in a fresh interpreter: for what one process cannot show (bits repeated in a
new process, environment switches read at import, lazy module loading, a damaged install).

Standard library only, so any test module, and code run through it, may import it."""
from __future__ import annotations

import os
import subprocess
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_python(code: str, *, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
               timeout: float | None = None, **extra_env: str) -> str:
    """Runs `code` with `python -c` and returns its stdout; fails the test on a non-zero exit.

    The child's environment is `env` (default: this process's) with `extra_env` added, and
    tests/ leads its PYTHONPATH so the code may import the case helpers by their plain names."""
    child = dict(os.environ if env is None else env, **extra_env)
    child["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS_DIR, child.get("PYTHONPATH")) if p)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child, cwd=cwd,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout
