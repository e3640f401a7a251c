# `pip install .` of the package into a fresh venv that sees Debian's torch
# (--system-site-packages), then kiln imported from the venv (not from the checkout) builds and
# runs an engine (on kiln._fast when the build made it). The checkout's packaging files are copied
# first, so the test writes nothing into the source tree; KILN_LIBRARY hands setup.py this build's
# libkiln_c.so, and kiln._fast beside it.
import os
import shutil
import subprocess
import sys

from conftest import ROOT


def test_pip_install_into_a_venv(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), src / name)
    shutil.copytree(os.path.join(ROOT, "python", "kiln"), src / "python" / "kiln",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = dict(os.environ)
    assert os.path.isfile(env["KILN_LIBRARY"])
    p = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-index", str(src)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    env.pop("KILN_LIBRARY")
    env.pop("PYTHONPATH", None)
    code = ("import kiln, torch\n"
            "m = torch.nn.Linear(4, 3)\n"
            "e = kiln.build(m, torch.randn(2, 4), backend='cpu')\n"
            "x = torch.randn(2, 4)\n"
            "c = e.create_execution_context()\n"
            "d = (c(x) - m(x)).abs().max().item()\n"
            "print(kiln.__file__, d, kiln._lib.fast_origin, c._fast.runs if c._fast else 0)\n")
    p = subprocess.run([py, "-c", code], env=env, cwd=str(tmp_path), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    where, diff, fast, runs = p.stdout.split()
    package = os.path.dirname(where)
    assert where.startswith(str(venv)) and os.path.isfile(os.path.join(package, "libkiln_c.so"))
    assert float(diff) < 1e-5
    # kiln._fast, when this build made it, is installed and runs the call from the package.
    if os.environ.get("KILN_PYTHON_FAST_BUILT") == "1":
        assert fast == os.path.join(package, "_fast.abi3.so") and runs == "1", p.stdout
    for stub in ("__init__.pyi", "distributed.pyi", "py.typed"):
        assert os.path.isfile(os.path.join(os.path.dirname(where), stub))
