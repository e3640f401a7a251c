#!/usr/bin/env python3
"""kiln FP16 engines against PyTorch on the same GPU, model, batch and precision, in one run
(issue 4's bars). For each model and batch: build the kiln engine (`kiln build --fp16`, FP32 when
this kiln has no FP16 yet), check kiln's outputs against PyTorch's FP32 outputs, then time kiln
(`kiln run --json`: CUDA events around the whole enqueue) and PyTorch eager, torch.compile default
and torch.compile(mode="reduce-overhead") (CUDA events around one call). Warm-up first, median of
--iterations (>= 50) runs, random inputs (never all zero). ResNet-50 is also built cold and warm
(timing cache) for the build-time bars.

  python3 bench/cuda/bench_vs_torch.py --kiln .bundle/bin/kiln --models-dir DIR --out OUT.json
      [--models resnet50,bert_base,gpt2] [--batches 1,32] [--modes eager,default,reduce-overhead]
      [--iterations 50] [--no-kiln]

DIR comes from bench/cuda/export_models.py. Ratios are kiln / PyTorch reduce-overhead: latency at
batch 1 (<= 1.0 is the bar) and throughput at batch 32 (>= 1.0 is the bar).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_models as em  # noqa: E402

FP16_TOL = 2e-2  # relative L2 of an FP16 engine against the FP32 reference
FP32_TOL = 1e-3


def log(*a):
    print(*a, flush=True)


def rel_l2(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def load_inputs(model_dir, name, batch):
    from onnx import numpy_helper, TensorProto

    out = {}
    for n, _, _ in em.input_specs(name):
        t = TensorProto()
        with open(os.path.join(model_dir, f"b{batch}", f"{n}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        out[n] = numpy_helper.to_array(t)
    return out


def torch_args(name, feed, dtype):
    args = []
    for n, _, _ in em.input_specs(name):
        t = torch.from_numpy(feed[n]).cuda()
        if t.is_floating_point():
            t = t.to(dtype)
            if name == "resnet50":
                t = t.contiguous(memory_format=torch.channels_last)
        args.append(t)
    return args


def time_cuda(fn, iterations, warmup):
    """Median and all samples (ms) of CUDA events around one call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(iterations):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return float(np.median(samples)), samples


def kiln_builder(kiln, onnx_path, engine, profile, cache, fp16, timeout):
    cmd = [kiln, "build", onnx_path, "-o", engine, "--backend", "cuda", "--profile"]
    cmd += profile.split() + ["--timing-cache", cache]
    if fp16:
        cmd.append("--fp16")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, time.time() - t0, f"kiln build timed out after {timeout} s"
    dt = time.time() - t0
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        return None, dt, (err[0] if err else f"rc {p.returncode}")
    return engine, dt, None


def build_engine(a, name, batch, model_dir, info, work, cold=False):
    """(engine path or None, precision, build seconds, error). Tries --fp16, then FP32 when this
    kiln rejects FP16 (KILN-E1006: precision not implemented yet)."""
    onnx_path = os.path.join(model_dir, "model.onnx")
    engine = os.path.join(work, f"{name}_b{batch}.kiln")
    cache = os.path.join(work, f"{name}.timing_cache")
    if cold and os.path.exists(cache):
        os.remove(cache)
    profile = info["profiles"][str(batch)]
    path, dt, err = kiln_builder(a.kiln, onnx_path, engine, profile, cache, True, a.build_timeout)
    if path:
        return path, "fp16", dt, None
    if err and "KILN-E1006" in err:
        path, dt, err2 = kiln_builder(a.kiln, onnx_path, engine, profile, cache, False,
                                    a.build_timeout)
        if path:
            return path, "fp32 (this kiln has no --fp16 yet)", dt, None
        err = err2
    return None, None, dt, err


def kiln_run(a, name, engine, model_dir, batch, work):
    outdir = os.path.join(work, f"{name}_b{batch}_out")
    shutil.rmtree(outdir, ignore_errors=True)
    cmd = [a.kiln, "run", engine, "--json", "--warmup", "10", "--iterations",
           str(a.iterations), "--duration", "0", "--layer-iterations", "5",
           "--save-outputs", outdir]
    for n, _, _ in em.input_specs(name):
        cmd += ["--input", f"{n}={os.path.join(model_dir, f'b{batch}', n + '.pb')}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.run_timeout)
    except subprocess.TimeoutExpired:
        return None, None, f"kiln run timed out after {a.run_timeout} s"
    if p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        return None, None, err[0] if err else f"rc {p.returncode}"
    j = json.loads(p.stdout)
    out_file = os.path.join(outdir, re.sub(r"[^A-Za-z0-9_-]", "_", em.output_name(name)) + ".npy")
    out = np.load(out_file) if os.path.exists(out_file) else None
    return j, out, None


def bench_model(a, name, rows, builds):
    model_dir = os.path.join(a.models_dir, name)
    info = json.load(open(os.path.join(model_dir, "info.json")))
    work = os.path.join(a.work, name)
    os.makedirs(work, exist_ok=True)
    ref_model = em.make_model(name, attn="eager").cuda()
    fast = em.make_model(name, attn="sdpa").cuda().half()
    if name == "resnet50":
        fast = fast.to(memory_format=torch.channels_last)
    compiled = {}
    for batch in a.batches:
        row = {"model": name, "batch": batch}
        feed = load_inputs(model_dir, name, batch)
        with torch.inference_mode():
            ref = ref_model(*torch_args(name, feed, torch.float32)).float().cpu().numpy()
            args16 = torch_args(name, feed, torch.float16)
            out16 = fast(*args16).float().cpu().numpy()
        row["torch_fp16_rel_l2_vs_fp32"] = rel_l2(out16, ref)

        # kiln: build, check, time.
        if not a.no_kiln:
            cold = name == "resnet50" and batch == max(a.batches)
            engine, prec, build_s, err = build_engine(a, name, batch, model_dir, info, work, cold)
            row["kiln_precision"] = prec
            row["kiln_build_s"] = build_s
            if cold and engine:
                _, _, warm_s, werr = build_engine(a, name, batch, model_dir, info, work, False)
                builds.append({"model": name, "batch": batch, "precision": prec,
                               "cold_s": build_s, "warm_s": warm_s if not werr else None,
                               "warm_error": werr})
            if not engine:
                row["kiln_error"] = err
                log(f"  kiln {name} b{batch}: build failed: {err}")
            else:
                j, out, rerr = kiln_run(a, name, engine, model_dir, batch, work)
                if rerr:
                    row["kiln_error"] = rerr
                    log(f"  kiln {name} b{batch}: run failed: {rerr}")
                else:
                    tol = FP16_TOL if prec == "fp16" else FP32_TOL
                    err_l2 = rel_l2(out, ref) if out is not None else float("inf")
                    row["kiln_rel_l2_vs_torch_fp32"] = err_l2
                    row["kiln_correct"] = bool(err_l2 <= tol)
                    row["kiln_compute_ms"] = j["compute_ms"]["median"]
                    row["kiln_latency_ms"] = j["latency_ms"]["median"]
                    row["kiln_enqueue_ms"] = j["enqueue_ms"]["median"]
                    row["kiln_max_kernel_ms"] = j.get("max_kernel_ms")
                    row["kiln_cuda_graph"] = j.get("cuda_graph")
                    row["kiln_timer"] = j.get("timer")
                    if a.layers_dir and j.get("layers"):
                        # Per-layer GPU times (eager, one event pair per layer) for finding where
                        # the time goes; kept beside the results, not in them.
                        os.makedirs(a.layers_dir, exist_ok=True)
                        with open(os.path.join(a.layers_dir, f"{name}_b{batch}_layers.json"),
                                  "w") as f:
                            json.dump({"model": name, "batch": batch, "layers": j["layers"]}, f)
                    log(f"  kiln {name} b{batch} ({prec}): {row['kiln_compute_ms']:.3f} ms, "
                        f"rel_l2 {err_l2:.2e}{'' if row['kiln_correct'] else ' WRONG'}")

        # PyTorch, FP16, same inputs.
        for mode in a.modes:
            try:
                if mode == "eager":
                    fn_model = fast
                else:
                    key = mode
                    if key not in compiled:
                        kw = {} if mode == "default" else {"mode": mode}
                        compiled[key] = torch.compile(fast, dynamic=False, **kw)
                    fn_model = compiled[key]
                t0 = time.time()
                with torch.inference_mode():
                    def call():
                        if mode == "reduce-overhead":
                            torch.compiler.cudagraph_mark_step_begin()
                        return fn_model(*args16)
                    med, samples = time_cuda(call, a.iterations, warmup=5 if mode == "eager" else 10)
                row[f"torch_{mode}_ms"] = med
                row[f"torch_{mode}_setup_s"] = time.time() - t0 - sum(samples) / 1000
                log(f"  torch {mode} {name} b{batch}: {med:.3f} ms")
            except Exception as e:  # a failed mode is reported, the rest still runs
                row[f"torch_{mode}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                log(f"  torch {mode} {name} b{batch} failed: {row[f'torch_{mode}_error']}")
        ro = row.get("torch_reduce-overhead_ms")
        if ro and row.get("kiln_compute_ms") and row.get("kiln_correct"):
            # kiln / reduce-overhead latency (bar at b1: <= 1.0); throughput ratio = inverse.
            row["latency_ratio_vs_reduce_overhead"] = row["kiln_compute_ms"] / ro
            row["throughput_ratio_vs_reduce_overhead"] = ro / row["kiln_compute_ms"]
        rows.append(row)
    del compiled
    torch._dynamo.reset()


def table(rows, builds):
    head = ("model", "batch", "kiln ms", "eager ms", "compile ms", "reduce-ovh ms", "kiln/ro",
            "check")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v):
        return f"{v:.3f}" if isinstance(v, (int, float)) else "-"
    for r in rows:
        check = ("ok" if r.get("kiln_correct") else
                 ("WRONG" if "kiln_correct" in r else (r.get("kiln_error") or "-")[:40]))
        ratio = r.get("latency_ratio_vs_reduce_overhead")
        lines.append("| " + " | ".join([
            r["model"], str(r["batch"]), f(r.get("kiln_compute_ms")), f(r.get("torch_eager_ms")),
            f(r.get("torch_default_ms")), f(r.get("torch_reduce-overhead_ms")),
            f"{ratio:.2f}" if ratio else "-", check]) + " |")
    for b in builds:
        lines.append(f"build {b['model']} b{b['batch']} ({b['precision']}): cold "
                     f"{b['cold_s']:.1f} s, warm {b['warm_s'] if b['warm_s'] is None else round(b['warm_s'], 2)} s")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="kiln")
    ap.add_argument("--models-dir")
    ap.add_argument("--out")
    ap.add_argument("--layers-dir", help="write each kiln engine's per-layer GPU times here")
    ap.add_argument("--table", metavar="JSON", help="only print the table of a results file")
    ap.add_argument("--work", default=None, help="engines and outputs (default: next to --out)")
    ap.add_argument("--models", default=",".join(em.MODELS))
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--modes", default="eager,default,reduce-overhead")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--build-timeout", type=int, default=120)
    ap.add_argument("--run-timeout", type=int, default=120)
    ap.add_argument("--no-kiln", action="store_true", help="time PyTorch only (dry run)")
    a = ap.parse_args()
    if a.table:
        r = json.load(open(a.table))
        log(table([x for x in r["rows"] if "batch" in x], r["builds"]))
        return 0
    if not a.models_dir or not a.out:
        ap.error("--models-dir and --out are required")
    a.batches = [int(b) for b in a.batches.split(",") if b]
    a.modes = [m for m in a.modes.split(",") if m]
    a.iterations = max(a.iterations, 50)
    a.work = a.work or os.path.join(os.path.dirname(os.path.abspath(a.out)), "bench_work")
    os.makedirs(a.work, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    # The FP32 reference must be FP32: no TF32 in cuDNN convolutions or cuBLAS matmuls.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, builds = [], []
    result = {
        "command": " ".join(["bench/cuda/bench_vs_torch.py"] + sys.argv[1:]),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "method": "CUDA events around one enqueue (kiln: whole Execute, graph replay; torch: one "
                  "call), median of >= 50 after warm-up; FP16; random non-zero inputs",
        "rows": rows,
        "builds": builds,
    }
    for name in [m for m in a.models.split(",") if m]:
        log(f"== {name}")
        try:
            bench_model(a, name, rows, builds)
        except Exception as e:
            log(f"{name} failed: {type(e).__name__}: {e}")
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        # Written after every model: a run cut short by its time bound keeps what it measured.
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    log("")
    log(table([r for r in rows if "batch" in r], builds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
