#!/usr/bin/env python3
"""Refit against cold and warm builds, as whole `kiln` processes (issue 20).

For each model: weights B are made with perturb_weights.py; then the median wall time of
`kiln build` cold (no timing cache), `kiln build` warm (the timing cache of the cold build), and
`kiln refit ENGINE_A --weights B.onnx -o OUT`, with refit's own read/replay/write split. It also
checks that the refit engine is byte-identical to a warm build of B (same tactics from the same
timing cache; A and B are named alike so the headers match).

  bench/refit/refit_bench.py [--kiln build/tools/kiln/kiln] [--backend cpu|cuda] [--fp16]
                             [--out bench/results/refit_cpu.json] MODEL_DIR...
  MODEL_DIR: a directory with model.onnx and info.json (zoo/resnet_tiny, zoo/generated/resnet50)
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def profile_args(info_path):
    with open(info_path) as f:
        info = json.load(f)
    x = lambda v: "x".join(map(str, v))
    args = []
    for name, p in info.get("profile", {}).items():
        args += ["--profile", f"{name}:{x(p['min'])},{x(p['opt'])},{x(p['max'])}"]
    return args


def timed(cmd):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return elapsed, r.stdout


def bench_model(model_dir, a, work):
    name = os.path.basename(os.path.normpath(model_dir))
    # A and B live in directories of the model's name: the engine header's model name matches.
    dir_a = os.path.join(work, "a", name)
    dir_b = os.path.join(work, "b", name)
    os.makedirs(dir_a)
    os.makedirs(dir_b)
    model_a = os.path.join(dir_a, "model.onnx")
    model_b = os.path.join(dir_b, "model.onnx")
    os.symlink(os.path.abspath(os.path.join(model_dir, "model.onnx")), model_a)
    subprocess.run([a.python, os.path.join(HERE, "perturb_weights.py"),
                    os.path.join(model_dir, "model.onnx"), model_b], check=True,
                   stdout=subprocess.DEVNULL)
    cache = os.path.join(work, f"{name}.cache")
    engine_a = os.path.join(work, f"{name}_a.kiln")
    build = [a.kiln, "build", "--backend", a.backend] + (["--fp16"] if a.fp16 else []) + \
        profile_args(os.path.join(model_dir, "info.json")) + ["--timing-cache", cache]
    cold, warm, refit = [], [], []
    for _ in range(a.cold_runs):
        if os.path.exists(cache):
            os.remove(cache)
        cold.append(timed(build + [model_a, "-o", engine_a])[0])
        for _ in range(a.warm_runs):
            warm.append(timed(build + [model_a, "-o", engine_a])[0])
    out = os.path.join(work, f"{name}_refit.kiln")
    split = []
    for _ in range(a.refit_runs):
        t, stdout = timed([a.kiln, "refit", engine_a, "--weights", model_b, "-o", out, "--json"])
        refit.append(t)
        split.append(json.loads(stdout))
    engine_b = os.path.join(work, f"{name}_b.kiln")
    timed(build + [model_b, "-o", engine_b])
    with open(out, "rb") as f1, open(engine_b, "rb") as f2:
        identical = f1.read() == f2.read()
    med = lambda v: round(statistics.median(v), 4)
    last = split[-1]
    return {
        "model": name,
        "onnx_bytes": os.path.getsize(os.path.join(model_dir, "model.onnx")),
        "cold_build_s": med(cold),
        "warm_build_s": med(warm),
        "refit_s": med(refit),
        "refit_read_s": med([s["read_seconds"] for s in split]),
        "refit_replay_s": med([s["replay_seconds"] for s in split]),
        "refit_write_s": med([s["write_seconds"] for s in split]),
        "warm_over_refit": round(statistics.median(warm) / statistics.median(refit), 1),
        "constants_refit": last["constants_refit"],
        "weight_steps": last["steps"],
        "bytes_refit": last["bytes_refit"],
        "refit_identical_to_warm_build_of_b": identical,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--kiln", default="build/tools/kiln/kiln")
    ap.add_argument("--python", default=sys.executable, help="a Python with onnx and numpy")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--fp16", action="store_true")
    ap.add_argument("--cold-runs", type=int, default=3)
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--refit-runs", type=int, default=7)
    ap.add_argument("--out", help="write the results (with the command) as JSON here")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kiln_refit_bench_")
    try:
        rows = []
        for m in a.models:
            row = bench_model(m, a, work)
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.out:
        result = {
            "command": " ".join(["bench/refit/refit_bench.py"] + sys.argv[1:]),
            "machine": f"{os.cpu_count()} cores (shared), {os.uname().machine}",
            "method": "median wall time of whole kiln processes; cold = empty timing cache, "
                      "warm = the cold build's cache; refit = kiln refit A --weights B -o OUT",
            "results": rows,
        }
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
