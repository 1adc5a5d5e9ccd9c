"""CPU tests of the packaging and runtime: manifest integrity, checksum refusal, CLI."""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import cake_moe
from cake_moe import _runtime

from .fresh_interpreter import run_python

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXT = _runtime.ext()


def _table():
    sys.path.insert(0, str(ROOT / "tools"))
    import gen_kernels
    return gen_kernels.load_table()


def test_import_loads_no_kernel():
    assert run_python("import cake_moe, cake_moe._ext as e; print(e.loaded_image_count())").strip() == "0"


def test_import_without_nvcc_or_gpu_and_fast():
    """The installed package imports with nothing CUDA on PATH and no GPU, quickly."""
    code = ("import time, torch; t = time.perf_counter(); import cake_moe; "
            "print(time.perf_counter() - t, cake_moe._ext.loaded_image_count())")
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "CUDA_VISIBLE_DEVICES": ""}
    seconds, loaded = run_python(code, env=env).split()
    assert loaded == "0"
    assert float(seconds) < 1.0, f"import cake_moe took {seconds} s (after torch)"


def test_extension_links_no_cuda_or_torch_library():
    so = next(pathlib.Path(cake_moe.__file__).parent.glob("_ext*.so"))
    out = subprocess.run(["ldd", str(so)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("ldd unavailable")
    for lib in ("libcuda", "libcudart", "libtorch", "libc10"):
        assert lib not in out.stdout, out.stdout


def test_env_follows_os_environ(monkeypatch):
    """The per-call switch reader sees what os.environ sees: set, changed, non-ASCII, deleted."""
    name = "CAKE_MOE_TEST_ENV_READ"
    monkeypatch.delenv(name, raising=False)
    assert _runtime.env(name) is None
    for value in ("0", "", "1 ", "caf\u00e9"):
        monkeypatch.setenv(name, value)
        assert _runtime.env(name) == os.environ.get(name) == value
    monkeypatch.delenv(name)
    assert _runtime.env(name) is None


def test_library_ops_bump_what_they_write_and_record_no_graph():
    """The ops defined on cake_moe's Library fragment: a kernel that writes an argument marked
    ``(a!)`` bumps its version counter (autograd's check of saved tensors sees the write, as with
    an in-place op; an inference tensor has none to bump), and every op's result carries no
    autograd graph, whatever its inputs require."""
    import torch
    from cake_moe import _library
    writes = _library._bumping(lambda a, out: None, [1])   # a kernel writing through a pointer
    a, out = torch.ones(2), torch.zeros(2)
    version = out._version
    writes(a, out)
    assert out._version == version + 1 and a._version == 0
    with torch.inference_mode():
        out_inference = torch.zeros(2)
        writes(a, out_inference)
    written = [[a.alias_info is not None and a.alias_info.is_write for a in op.default._schema.arguments]
               for op in (torch.ops.cake_moe.grouped_gemm_wgrad_out, torch.ops.cake_moe.mxfp4_moe_run)]
    assert written == [[False] * 5 + [True], [False] * 5 + [True]]
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    q, s = torch.ops.cake_moe.mxfp8_quantize(x, False, 0)
    y = torch.ops.cake_moe.mxfp8_dequantize(q, s, False, torch.float32)
    assert not (q.requires_grad or s.requires_grad or y.requires_grad)


def test_manifest_lists_every_form_with_matching_digests():
    m = _runtime.manifest()
    assert m["schema"] == "cake_moe.manifest.v1"
    names = [f["name"] for f in m["forms"]]
    assert names == [f.name for f in _table().FORMS]
    images = {(form, arch): (sha, size) for form, arch, sha, size in EXT.images()}
    assert len(images) == sum(len(f["arches"]) for f in m["forms"])
    for f in m["forms"]:
        assert f["arches"] and set(f["arches"]) <= set(m["archs"])
        for arch, info in f["arches"].items():
            assert info["kind"] in ("native", "portable")
            data = EXT.image_bytes(f["name"], arch)
            assert hashlib.sha256(data).hexdigest() == info["sha256"] == images[(f["name"], arch)][0]
            assert len(data) == info["bytes"]
            assert EXT.verify_image(f["name"], arch)


def test_sha256_matches_hashlib():
    for blob in (b"", b"abc", bytes(range(256)) * 300):
        assert EXT.sha256_hex(blob) == hashlib.sha256(blob).hexdigest()


def test_corrupted_bytes_are_refused_before_loading():
    form, arch = EXT.images()[0][:2]
    data = bytearray(EXT.image_bytes(form, arch))
    data[len(data) // 2] ^= 0x40
    with pytest.raises(RuntimeError, match=f"{form}.*SHA-256"):
        EXT.load_image_bytes(form, arch, bytes(data))


def test_patched_extension_reports_and_refuses(tmp_path):
    """Corrupt one image inside a copy of the installed extension; the copy must notice."""
    pkg = pathlib.Path(cake_moe.__file__).parent
    shutil.copytree(pkg, tmp_path / "cake_moe")
    so = next((tmp_path / "cake_moe").glob("_ext*.so"))
    form, arch = EXT.images()[-1][:2]
    image = EXT.image_bytes(form, arch)
    blob = bytearray(so.read_bytes())
    at = blob.find(image)
    assert at >= 0
    blob[at + len(image) // 2] ^= 0x01
    so.write_bytes(bytes(blob))
    code = f"""
import cake_moe._ext as e
assert e.verify_image({form!r}, {arch!r}) is False
try:
    e.load_image_bytes({form!r}, {arch!r}, e.image_bytes({form!r}, {arch!r}))
except RuntimeError as err:
    print("refused:", err)
"""
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    printed = run_python(code, env=env, cwd=tmp_path)
    assert "refused:" in printed and form in printed and "SHA-256" in printed
    info = subprocess.run([sys.executable, "-m", "cake_moe", "info"], capture_output=True, text=True, env=env,
                          cwd=tmp_path)
    assert info.returncode == 1 and "SHA-BAD" in info.stdout and "1 failed" in info.stdout


def test_info_lists_all_forms_and_arches():
    out = subprocess.run([sys.executable, "-m", "cake_moe", "info"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    m = _runtime.manifest()
    for arch in m["archs"]:
        assert f"sm_{arch}" in out.stdout
    for f in m["forms"]:
        assert f["name"] in out.stdout
    n = sum(len(f["arches"]) for f in m["forms"])
    assert f"{n} checksums verified, 0 failed" in out.stdout


def test_forms_json_is_consistent_with_table():
    table = _table()
    m = _runtime.manifest()
    by_name = {f.name: f for f in table.FORMS}
    for f in m["forms"]:
        src = by_name[f["name"]]
        assert f["kernels"] == [k.name for k in src.kernels]
        for arch, info in f["arches"].items():
            assert info["validated"] == (arch in src.validated)
            assert info["kind"] == ("native" if arch in src.native else "portable")
    json.dumps(m)  # serialisable


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU fallback")
def test_demo_without_gpu_runs_reference():
    out = subprocess.run([sys.executable, "-m", "cake_moe", "demo", "--tokens", "8"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "no CUDA GPU" in out.stdout and "reference" in out.stdout


@pytest.mark.parametrize("change, message", [
    ({"a": 8}, "a must be 16-byte aligned"),
    ({"out": 4}, "out must be 16-byte aligned"),
    ({"offs": 2}, "offs must be 4-byte aligned"),
    ({"a_row_stride": 12}, "outer strides must be 0 or positive multiples of 8"),
    ({"b_expert_stride": -8}, "outer strides must be 0 or positive multiples of 8"),
    ({"op": 3}, "op must be 0"),
    ({"variant": 2}, "variant must be 0"),
    ({"device": -1}, "device index must be >= 0"),
    ({"workspace": 128, "workspace_bytes": 1024}, "workspace must be 256-byte aligned"),
])
def test_grouped_gemm_binding_refuses_bad_addresses_before_the_driver(change, message):
    """The binding takes device addresses and strides that Python validated; it still refuses a
    misaligned address or a bad stride itself, before any driver call (none exists here)."""
    args = dict(op=0, variant=0, device=0, a=1 << 20, a_row_stride=64, b=2 << 20, b_row_stride=64,
                b_expert_stride=64 * 64, out=3 << 20, offs=4 << 20, leading_zero=False, num_groups=2, n=64, k=64,
                rows=16, out_f32=False, workspace=0, workspace_bytes=0)
    args.update(change)
    with pytest.raises(ValueError, match=message):
        EXT.grouped_gemm_prepare(**args)
