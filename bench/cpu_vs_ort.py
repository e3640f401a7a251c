#!/usr/bin/env python3
"""FP32 CPU latency of kiln against ONNX Runtime's CPU provider, same model, batch and threads,
in one run. Writes bench/results/cpu_vs_ort.json and prints a table (ratio = kiln / ORT median;
below 1 means kiln is faster).

Usage: .venv/bin/python bench/cpu_vs_ort.py [--models resnet50,bert_base,resnet_tiny,...]
       [--threads N] [--kiln build/tools/kiln/kiln]
Large models come from `tools/zoo/export_zoo.py --large` (zoo/generated/); the script makes
them when missing.
"""
import argparse, json, os, subprocess, sys, tempfile, time
import numpy as np
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# model -> (path, {input: shape}, kiln profile flags)
def models(names):
    out = {}
    for name in names:
        base = os.path.join(ROOT, "zoo", "generated" if name in ("resnet50", "bert_base") else "", name)
        info = json.load(open(os.path.join(base, "info.json")))
        shapes = {}
        for inp in info["inputs"]:
            dims = [1 if d == "batch" else (128 if d == "seq" else d) for d in inp["shape"]]
            shapes[inp["name"]] = (dims, inp["dtype"])
        out[name] = (os.path.join(base, "model.onnx"), shapes)
    return out

def feeds(shapes, rng):
    f = {}
    for name, (dims, dtype) in shapes.items():
        if dtype.startswith("int"):
            f[name] = rng.integers(0, 2, size=dims).astype(np.int64)
        else:
            f[name] = rng.standard_normal(dims).astype(np.float32)
    return f

def ort_median(path, feed, threads, iters):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        s.run(None, feed)
    times = []
    t_end = time.time() + 2.0
    while len(times) < iters or time.time() < t_end:
        t0 = time.perf_counter()
        s.run(None, feed)
        times.append((time.perf_counter() - t0) * 1000)
        if len(times) > 2000:
            break
    return float(np.median(times))

def kiln_median(kiln, path, shapes, threads, tmp):
    engine = os.path.join(tmp, os.path.basename(os.path.dirname(path)) + ".kiln")
    env = dict(os.environ, KILN_NUM_THREADS=str(threads), KILN_LOG_LEVEL="WARN")
    prof = []
    for name, (dims, _) in shapes.items():
        d = "x".join(map(str, dims))
        prof += ["--profile", f"{name}:{d},{d},{d}"]
    t0 = time.time()
    subprocess.run([kiln, "build", path, "-o", engine, "--json"] + prof, check=True, env=env,
                   stdout=subprocess.DEVNULL)
    build_s = time.time() - t0
    out = subprocess.run([kiln, "run", engine, "--json", "--duration", "2", "--iterations", "20"],
                         check=True, env=env, capture_output=True, text=True).stdout
    return json.loads(out)["latency_ms"]["median"], build_s

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet50,bert_base,resnet_tiny,bert_tiny,gpt_tiny,vit_tiny")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kiln", default=os.path.join(ROOT, "build", "tools", "kiln", "kiln"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "cpu_vs_ort.json"))
    a = ap.parse_args()
    names = a.models.split(",")
    if any(n in ("resnet50", "bert_base") for n in names) and not os.path.exists(
            os.path.join(ROOT, "zoo", "generated", "resnet50", "model.onnx")):
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "zoo", "export_zoo.py"), "--large"], check=True)
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, shapes) in models(names).items():
            feed = feeds(shapes, rng)
            o = ort_median(path, feed, a.threads, a.iters)
            k, build_s = kiln_median(a.kiln, path, shapes, a.threads, tmp)
            rows.append({"model": name, "batch": 1, "threads": a.threads, "ort_median_ms": o,
                         "kiln_median_ms": k, "ratio_kiln_over_ort": k / o, "kiln_build_s": build_s})
            print(f"{name:<16} ort {o:9.3f} ms   kiln {k:9.3f} ms   ratio {k / o:5.2f}   (kiln build {build_s:.1f} s)",
                  flush=True)
    result = {"command": " ".join(sys.argv), "onnxruntime": ort.__version__, "cpu_count": os.cpu_count(),
              "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    json.dump(result, open(a.out, "w"), indent=1)
    print(f"{'model':<16} {'ORT ms':>9} {'kiln ms':>9} {'kiln/ORT':>9}")
    for r in rows:
        print(f"{r['model']:<16} {r['ort_median_ms']:9.3f} {r['kiln_median_ms']:9.3f} {r['ratio_kiln_over_ort']:9.2f}")

if __name__ == "__main__":
    main()
