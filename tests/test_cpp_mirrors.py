"""Python constants that mirror C++ ones hold the C++ values: each constant of the table below is
read from the kernel headers (``constexpr ... kName = expr;``), evaluated, and compared with its
Python mirror; and every ``moe::kName`` a Python source names is in the table. (CPU: it reads the
source tree.)"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_KERNELS = _ROOT / "cpp" / "kernels"
_CONSTEXPR = re.compile(r"(?:static\s+)?constexpr\s+[\w:]+\s+(k\w+)\s*=\s*([^;]+);")

# (module, Python name, C++ name)
MIRRORS = [
    ("cake_moe.mxfp4_moe._wrapper", "_MAX_ROUTE_CHUNKS", "kMaxRouteChunks"),
    ("cake_moe.mxfp4_moe._wrapper", "_MAX_SPLIT_UNITS", "kMaxSplitUnits"),
    ("cake_moe.mxfp4_moe._wrapper", "_TILE_HEADER_INTS", "kTileHeaderInts"),
    ("cake_moe.mxfp4_moe._wrapper", "_TILE_CHOICE_AT", "kTileChoiceAt"),
    ("cake_moe.mxfp4_moe._wrapper", "_SPLIT_PARK_BYTES", "kSplitParkBytes"),
    ("cake_moe.mxfp4_moe._decide", "ROUTE_CHUNK_MIN", "kRouteChunkMin"),
    ("cake_moe.mxfp4_moe._tile_cost", "SPLIT_GAIN_PCT", "kSplitGainPct"),
    ("cake_moe.mxfp4_moe._decide", "MAX_FEW_ROUTES", "kMaxFewRoutes"),
    ("cake_moe.mxfp4_moe._wrapper", "_ROUTE_THREADS", "kRouteThreads"),
    ("cake_moe.grouped_gemm._checks", "_MAX_TILES", "kTileCap"),
    ("tests.mxfp4_moe_checks", "TILE_CHOICE_AT", "kTileChoiceAt"),
    ("tests.mxfp4_moe_checks", "SPLIT_FLAGS_AT", "kSplitFlagsAt"),
    ("tests.test_mxfp4_moe_prepare", "SLOT_MASK", "kSlotMask"),
    ("tests.test_mxfp4_moe_prepare", "SLOT3_BITS", "kSlot3Bits"),
    ("tests.test_mxfp4_moe_prepare", "SLOT3_SHIFTS", "kSlot3Shifts"),
]


def _cpp_definitions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(_KERNELS.rglob("*")):
        if path.suffix in (".hpp", ".cuh"):
            for name, expr in _CONSTEXPR.findall(path.read_text()):
                found.setdefault(name, set()).add(" ".join(expr.split()))
    return found


def _cpp_value(name: str, defs: dict[str, set[str]]) -> int:
    """The value of C++ constant ``name``: one definition, an integer expression of decimal or
    hexadecimal literals (``u`` / ``l`` suffixes, shifts, + - * / | &) and other such constants."""
    exprs = defs.get(name, set())
    assert len(exprs) == 1, f"{name}: {len(exprs)} definitions in cpp/kernels ({sorted(exprs)})"
    expr = re.sub(r"\b0[xX]([0-9a-fA-F]+)[uU]?[lL]*\b", lambda m: str(int(m.group(1), 16)), next(iter(exprs)))
    expr = re.sub(r"\b(\d+)[uU]?[lL]*\b", r"\1", expr)
    expr = re.sub(r"\bk\w+\b", lambda m: str(_cpp_value(m.group(), defs)), expr)
    assert re.fullmatch(r"[\d\s()+\-*/<>|&]+", expr), f"{name} = {expr}: not a plain integer expression"
    return int(eval(expr.replace("/", "//")))   # (only digits and operators, checked above)


@pytest.mark.parametrize("module,name,cpp_name", MIRRORS)
def test_python_mirror_holds_the_cpp_value(module, name, cpp_name):
    value = getattr(importlib.import_module(module), name)
    assert value == _cpp_value(cpp_name, _cpp_definitions()), f"{module}.{name} mirrors {cpp_name}"


def test_every_named_mirror_is_checked():
    """A Python source of the package or the tests that names ``moe::kName`` (the mark of a
    mirror) has it in MIRRORS."""
    sources = [*(_ROOT / "python" / "cake_moe").rglob("*.py"), *(_ROOT / "tests").glob("*.py")]
    named = {m for path in sources if path.name != Path(__file__).name
             for m in re.findall(r"\bmoe::(k\w+)", path.read_text())}
    assert named and named <= {cpp for _, _, cpp in MIRRORS}, sorted(named - {cpp for _, _, cpp in MIRRORS})
