#!/usr/bin/env python3
"""Weight-stripped engine files against full ones (issue 20), as whole `kiln` processes.

For each model and precision: a cold `kiln build` fills a timing cache; then, with that cache (the
same tactics), `kiln build` writes the full engine and `kiln build --strip-weights` the stripped
one; `kiln refit STRIPPED --weights MODEL -o FILLED` fills it, and FILLED must be byte-identical to
the full engine (the script fails otherwise). Reports the three file sizes and the seconds of the
stripped build and of the fill.

  bench/refit/strip_sizes.py [--kiln build/tools/kiln/kiln] [--fp16] [--out FILE.json] MODEL_DIR...
  MODEL_DIR: a directory with model.onnx and info.json (zoo/resnet_tiny, zoo/generated/resnet50)
"""
import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from refit_bench import profile_args  # noqa: E402


def run(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return time.perf_counter() - t


def bench(model_dir, fp16, kiln, work):
    name = os.path.basename(os.path.normpath(model_dir))
    model = os.path.join(model_dir, "model.onnx")
    cache = os.path.join(work, f"{name}.cache")
    base = [kiln, "build", model, "--backend", "cpu", "--timing-cache", cache] + \
        profile_args(os.path.join(model_dir, "info.json")) + (["--fp16"] if fp16 else [])
    path = lambda what: os.path.join(work, f"{name}_{what}.kiln")
    run(base + ["-o", path("cold")])
    full_s = run(base + ["-o", path("full")])
    stripped_s = run(base + ["--strip-weights", "-o", path("stripped")])
    fill_s = run([kiln, "refit", path("stripped"), "--weights", model, "-o", path("filled")])
    identical = filecmp.cmp(path("full"), path("filled"), shallow=False)
    if not identical:
        sys.exit(f"{name}: the filled engine differs from the full build")
    sizes = {w: os.path.getsize(path(w)) for w in ("full", "stripped", "filled")}
    for w in ("cold", "full", "stripped", "filled"):
        os.remove(path(w))
    return {
        "model": name, "precision": "fp16" if fp16 else "fp32",
        "onnx_bytes": os.path.getsize(model),
        "full_bytes": sizes["full"], "stripped_bytes": sizes["stripped"],
        "stripped_share": round(sizes["stripped"] / sizes["full"], 6),
        "filled_identical_to_full": identical,
        "build_full_warm_s": round(full_s, 3), "build_stripped_warm_s": round(stripped_s, 3),
        "refit_fill_s": round(fill_s, 3),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="build/tools/kiln/kiln")
    ap.add_argument("--fp16", action="store_true", help="also FP16 engines")
    ap.add_argument("--out")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    results = []
    work = tempfile.mkdtemp(prefix="kiln_strip_")
    try:
        for m in a.models:
            for fp16 in ([False, True] if a.fp16 else [False]):
                r = bench(m, fp16, a.kiln, work)
                print(json.dumps(r), flush=True)
                results.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        doc = {"command": "bench/refit/strip_sizes.py " + " ".join(sys.argv[1:]),
               "method": "kiln build (warm timing cache) with and without --strip-weights; "
                         "kiln refit STRIPPED --weights MODEL -o FILLED, FILLED compared byte "
                         "for byte with the full build; wall seconds of whole processes on the "
                         "shared 2-core development machine",
               "results": results}
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
