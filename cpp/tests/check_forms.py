"""ctest: the forms table is well formed (unique names, known arches, kernel names that follow
the naming rule, headers that exist) and the generator renders it."""
import pathlib
import subprocess
import sys
import tempfile
import json

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gen_kernels  # noqa: E402

table = gen_kernels.load_table()
names = [f.name for f in table.FORMS]
assert len(names) == len(set(names)), "duplicate form names"
kernels = [k.name for f in table.FORMS for k in f.kernels]
assert len(kernels) == len(set(kernels)), "duplicate kernel names"
for f in table.FORMS:
    assert (ROOT / "cpp/kernels" / f.header).is_file(), f.header
    assert set(f.native) <= set(table.ALL_ARCHES) and set(f.validated) <= set(table.ALL_ARCHES)
    for k in f.kernels:
        assert k.name.startswith("cake_"), k.name
with tempfile.TemporaryDirectory() as d:
    subprocess.run([sys.executable, str(ROOT / "tools/gen_kernels.py"), "--out", d, "--archs", "90a;100a"], check=True)
    forms = json.loads(pathlib.Path(d, "forms.json").read_text())
    assert [f["name"] for f in forms["forms"]] == names
    for f in table.FORMS:
        text = pathlib.Path(d, f"{f.name}.cu").read_text()
        assert all(f'"C" __global__' in text and k.name in text for k in f.kernels)
print(f"forms table ok: {len(names)} forms, {len(kernels)} kernels")
