# kiln._fast, the C hot path of ExecutionContext.run (issue 24), against the pure ctypes path it
# stands in for: it is loaded and used when this build made it, both paths give the same values
# and the same errors, runs stay zero-copy, bindings made by either path never leak into the
# other's, KILN_PYTHON_FAST=0 or a missing module leave the package on ctypes alone, and the one
# abi3 binary runs under the other CPython versions found here.
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import kiln
from kiln import _lib


BUILT = os.environ.get("KILN_PYTHON_FAST_BUILT") == "1"  # set by tests/python/CMakeLists.txt


def contexts(engine):
    """A context on the fast path and one kept to ctypes (its runner dropped before any run)."""
    fast = engine.create_execution_context()
    assert fast._fast is not None
    slow = engine.create_execution_context()
    slow._fast = None
    return fast, slow


def failure(fn, *args, **kwargs):
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    e = info.value
    if isinstance(e, kiln.KilnError):
        return (e.code, e.number, e.name, e.message, e.remedy)
    return (type(e), str(e))


@pytest.fixture(autouse=True)
def needs_fast():
    if _lib.fast is None:
        assert not BUILT, f"this build made kiln._fast, yet the package runs without it: " \
                          f"{_lib.fast_origin}"
        pytest.skip(f"kiln._fast not built here ({_lib.fast_origin})")


def test_loaded_beside_the_library_and_used(engine, mlp):
    assert _lib.fast_origin == os.path.join(os.path.dirname(os.environ["KILN_LIBRARY"]),
                                            "_fast.abi3.so")
    assert _lib.fast.C_API_VERSION == _lib.API_VERSION
    ctx = engine.create_execution_context()
    x = torch.randn(4, 8)
    out = torch.empty(4, 4)
    assert ctx._fast.runs == 0
    ctx.run([x], outputs={"logits": out})
    ctx.run({"input_0": x}, outputs={"logits": out})
    y = ctx(x)
    z = ctx.run(x)["logits"]
    assert ctx._fast.runs == 4  # every one of them taken by the C path
    for got in (out, y, z):
        torch.testing.assert_close(got, mlp(x).detach(), rtol=1e-4, atol=1e-5)


def test_both_paths_give_identical_values(engine):
    fast, slow = contexts(engine)
    for batch in (1, 4, 16, 4, 2):
        x = torch.randn(batch, 8)
        a, b = fast.run([x]), slow.run([x])
        assert a.keys() == b.keys() == {"logits"}
        assert torch.equal(a["logits"], b["logits"])
        assert torch.equal(fast(x), slow(x))
        outs = [torch.empty(batch, 4), torch.empty(batch, 4)]
        fast.run({"input_0": x}, outputs={"logits": outs[0]})
        slow.run({"input_0": x}, outputs={"logits": outs[1]})
        assert torch.equal(outs[0], outs[1])
    assert fast._fast.runs == 15


def test_two_outputs_on_both_paths():
    class Two(torch.nn.Module):
        def forward(self, x, y):
            return x + y, x * y

    e = kiln.build(Two(), (torch.randn(2, 3), torch.randn(2, 3)), backend="cpu")
    fast, slow = contexts(e)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    a, b = fast(x, y), slow(x, y)
    assert isinstance(a, tuple) and len(a) == 2
    for got, want in zip(a, b):
        assert torch.equal(got, want)
    torch.testing.assert_close(a[0], x + y)
    torch.testing.assert_close(a[1], x * y)
    r = fast.run({"input_1": y, "input_0": x})
    assert list(r) == ["output_0", "output_1"] and torch.equal(r["output_1"], b[1])
    assert fast._fast.runs == 2


def test_zero_copy_on_the_fast_path(engine, mlp):
    ctx = engine.create_execution_context()
    x = torch.randn(3, 8)
    out = torch.full((3, 4), float("nan"))
    ptr = out.data_ptr()
    result = ctx.run([x], outputs={"logits": out})
    assert result["logits"] is out and out.data_ptr() == ptr
    torch.testing.assert_close(out, mlp(x).detach(), rtol=1e-4, atol=1e-5)
    x.mul_(2)  # the engine reads the caller's memory in place: the change shows in the next run
    ctx.run([x], outputs={"logits": out})
    assert out.data_ptr() == ptr
    torch.testing.assert_close(out, mlp(x).detach(), rtol=1e-4, atol=1e-5)
    assert ctx._fast.runs == 2


def test_rebinding_on_the_fast_path(engine, mlp):
    # New tensors, other shapes, in-place resizes and swapped storage under the same tensor
    # object: the C path rebinds each time, never runs on a stale binding.
    ctx = engine.create_execution_context()
    x = torch.randn(4, 8)
    out = torch.empty(4, 4)
    ctx.run([x], outputs={"logits": out})
    for batch in (2, 16, 1):
        y = torch.randn(batch, 8)
        torch.testing.assert_close(ctx(y), mlp(y).detach(), rtol=1e-4, atol=1e-5)
    x.set_(torch.randn(4, 8))  # same object, new memory
    ctx.run([x], outputs={"logits": out})
    torch.testing.assert_close(out, mlp(x).detach(), rtol=1e-4, atol=1e-5)
    x.resize_(2, 8)  # same object, new shape: its output no longer fits `out`
    e = failure(ctx.run, [x], outputs={"logits": out})
    assert e[0] == "KILN-E5014"
    torch.testing.assert_close(ctx(x), mlp(x).detach(), rtol=1e-4, atol=1e-5)
    assert ctx._fast.runs == 6


def test_paths_do_not_see_each_others_stale_bindings(engine, mlp):
    ctx = engine.create_execution_context()
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    out = torch.empty(4, 4)
    ctx.run([a], outputs={"logits": out})  # C path binds a
    ctx.run(iter([b]), outputs={"logits": out})  # an iterator: the Python path binds b
    assert ctx._fast.runs == 1
    torch.testing.assert_close(out, mlp(b).detach(), rtol=1e-4, atol=1e-5)
    ctx.run([a], outputs={"logits": out})  # C path: a again, though it bound a last
    torch.testing.assert_close(out, mlp(a).detach(), rtol=1e-4, atol=1e-5)
    ctx.bind("input_0", b)  # the parts of run, by hand
    ctx.bind("logits", out)
    ctx.execute()
    torch.testing.assert_close(out, mlp(b).detach(), rtol=1e-4, atol=1e-5)
    ctx.run([a], outputs={"logits": out})
    torch.testing.assert_close(out, mlp(a).detach(), rtol=1e-4, atol=1e-5)
    assert ctx._fast.runs == 3


BAD_RUNS = [
    ([torch.randn(4, 8, dtype=torch.float64)], None),
    ([torch.ones(4, 8, dtype=torch.int32)], None),
    ([torch.randn(4, 8)], {"logits": torch.empty(4, 4, dtype=torch.float16)}),
    ([torch.randn(4, 9)], None),
    ([torch.randn(4, 8, 1)], None),
    ([torch.randn(17, 8)], None),
    ([torch.randn(4, 8)], {"logits": torch.empty(5, 4)}),
    ([torch.randn(4, 8), torch.randn(4, 8)], None),
    ({"nope": torch.randn(4, 8)}, None),
    ([torch.randn(4, 8)], {"other": torch.empty(4, 4)}),
    ([torch.empty(4, 8, device="meta")], None),
    ([torch.randn(8, 4).t()], None),
    ([torch.randn(4, 16)[:, ::2]], None),
    ([torch.randn(4, 8)], {"logits": torch.empty(4, 8)[:, :4]}),
    ([torch.randn(4, 8).to_sparse()], None),
    (["not a tensor"], None),
    ([torch.randn(4, 8).numpy()], None),
]


@pytest.mark.parametrize("case", range(len(BAD_RUNS)))
def test_both_paths_raise_the_same_errors(engine, mlp, case):
    inputs, outputs = BAD_RUNS[case]
    fast, slow = contexts(engine)
    x = torch.randn(4, 8)
    for ctx in (fast, slow):
        ctx.run([x])  # something bound first: the bad run must not leave it half replaced
    got, want = failure(fast.run, inputs, outputs), failure(slow.run, inputs, outputs)
    assert got == want
    if isinstance(got[0], str):
        assert got[0].startswith("KILN-E") and got[4]  # a catalog code and its remedy
    # Both contexts are usable afterwards, and the fast one is back on the C path.
    runs = fast._fast.runs
    torch.testing.assert_close(fast(x), slow(x), rtol=0, atol=0)
    torch.testing.assert_close(fast(x), mlp(x).detach(), rtol=1e-4, atol=1e-5)
    assert fast._fast.runs == runs + 2


def test_errors_from_the_c_api_itself_on_the_fast_path(engine):
    # Shapes the binding checks refuse in C (not in Python) come back through the C path.
    ctx = engine.create_execution_context()
    ctx.run([torch.randn(4, 8)])
    e = failure(ctx.run, [torch.randn(17, 8)])
    assert e[0] == "KILN-E5002" and e[4]
    e = failure(ctx.run, [torch.randn(4, 8)], outputs={"logits": torch.empty(5, 4)})
    assert e[0] == "KILN-E5014" and "[4,4]" in e[3]


def run_child(code, **env_changes):
    env = dict(os.environ)
    env.update(env_changes)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.split()


CHILD = ("import conftest, kiln, torch\n"
         "e = kiln.build(conftest.Mlp().eval(), torch.randn(4, 8), backend='cpu')\n"
         "torch.manual_seed(1)\n"
         "c = e.create_execution_context()\n"
         "y = c(torch.randn(4, 8))\n"
         "print(kiln._lib.fast is None, c._fast is None, repr(kiln._lib.fast_origin)[1:4],\n"
         "      ' '.join(f'{v:.6f}' for v in y.flatten().tolist()))\n")


def test_kiln_python_fast_0_keeps_to_ctypes():
    off = run_child(CHILD, KILN_PYTHON_FAST="0")
    on = run_child(CHILD)
    assert off[:3] == ["True", "True", "off"]
    assert on[:2] == ["False", "False"]
    assert off[3:] == on[3:] and len(on) == 3 + 16  # the same logits either way


def test_without_the_module_the_package_runs_on_ctypes(tmp_path):
    # A folder holding libkiln_c.so alone (a link to this build's), as a package installed
    # without its extension would be.
    lib = tmp_path / "libkiln_c.so"
    lib.symlink_to(os.environ["KILN_LIBRARY"])
    out = run_child(CHILD, KILN_LIBRARY=str(lib))
    assert out[:3] == ["True", "True", "not"]
    assert out[3:] == run_child(CHILD)[3:]


def test_a_context_in_use_is_refused_on_both_paths(engine, mlp):
    # The runner's flag is the context's lock for both paths: held (as by a thread inside run),
    # every call is refused with KILN-E5011 and nothing runs.
    x = torch.randn(4, 8)
    for ctx in contexts(engine):
        assert ctx._lock.acquire(blocking=False)
        assert not ctx._lock.acquire(blocking=False)
        for call in (lambda: ctx.run([x]), lambda: ctx(x), lambda: ctx.bind("input_0", x)):
            e = failure(call)
            assert e[0] == "KILN-E5011" and "another thread" in e[3]
        ctx._lock.release()
        torch.testing.assert_close(ctx(x), mlp(x).detach(), rtol=1e-4, atol=1e-5)


def other_pythons():
    """CPython 3.9 to 3.13 interpreters other than this one: python3.N on PATH that run, and
    KILN_EXTRA_PYTHONS (paths separated by ':')."""
    found = [p for p in os.environ.get("KILN_EXTRA_PYTHONS", "").split(":") if p]
    for minor in range(9, 14):
        path = shutil.which(f"python3.{minor}")
        if path and subprocess.run([path, "-c", "pass"], capture_output=True).returncode == 0:
            found.append(path)
    mine = f"{sys.version_info.major}.{sys.version_info.minor}"
    versions = {}
    for path in found:
        v = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True).stdout.strip()
        if v and v != mine:
            versions.setdefault(v, path)
    return versions


def test_one_binary_serves_other_pythons(tmp_path, onnx_bytes, mlp):
    # The abi3 module built here runs an engine under every other CPython found (Debian 12 has
    # only 3.11: CI skips this; KILN_EXTRA_PYTHONS names more).
    pythons = other_pythons()
    if not pythons:
        pytest.skip("no other CPython 3.9-3.13 here (set KILN_EXTRA_PYTHONS)")
    model = tmp_path / "mlp.onnx"
    model.write_bytes(onnx_bytes)
    x = ((torch.arange(8, dtype=torch.float32) - 4) / 4).reshape(1, 8)
    want = mlp(x).detach().flatten()
    check = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fast_abi_check.py")
    for version, python in sorted(pythons.items()):
        p = subprocess.run([python, check, str(model)], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, f"{python}: {p.stdout}{p.stderr}"
        got = json.loads(p.stdout.splitlines()[-1])
        assert got["python"].startswith(version + ".")
        assert got["origin"] == _lib.fast_origin and got["runs"] == 2
        torch.testing.assert_close(torch.tensor(got["run"]), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(torch.tensor(got["call"]), want, rtol=1e-4, atol=1e-5)
        assert got["error"] == "KILN-E5003"  # batch 2 for an engine built for batch 1
