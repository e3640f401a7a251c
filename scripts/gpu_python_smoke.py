"""Runs ON the GPU machine: the Python package over the bundle's libkiln_c.so with torch's CUDA.

Builds a small CNN for the CUDA backend (FP16) from a torch.nn.Module, runs it on CUDA tensors on
torch's current stream, checks the output against PyTorch FP32, checks that an output written into
the caller's tensor keeps its data_ptr, and times context.run per call (CUDA-graph path) against a
bare torch call of the same model. It says which kiln it imported and whether kiln._fast ran the
calls, and checks that a context kept to the ctypes path gives the same bytes. Prints one JSON
line; the exit status is 1 when a check fails.
  source scripts/gpu_env.sh && PYTHONPATH=python KILN_LIBRARY=.bundle/lib/libkiln_c.so \
      /opt/torch/.venv/bin/python scripts/gpu_python_smoke.py
  scripts/gpu_pip_smoke.sh     # the same from a `pip install`ed package (no PYTHONPATH)
"""
import json
import sys
import time

import torch

import kiln


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(16, 16, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, 10)).eval()
    x_cpu = torch.randn(8, 3, 32, 32)
    t0 = time.perf_counter()
    engine = kiln.build(model, (x_cpu,), backend="cuda", fp16=True)
    build_s = time.perf_counter() - t0
    ctx = engine.create_execution_context()
    x = x_cpu.cuda()
    out = ctx.run([x])
    name = next(iter(out))
    with torch.no_grad():
        ref = model.cuda()(x)
    got = out[name].float()
    rel_l2 = ((got - ref).norm() / ref.norm()).item()
    y = torch.empty_like(out[name])
    ptr = y.data_ptr()
    ctx.run([x], outputs={name: y})
    torch.cuda.synchronize()
    same_ptr = y.data_ptr() == ptr and torch.allclose(y.float(), got, atol=1e-3, rtol=1e-3)
    plain = engine.create_execution_context()
    plain._fast = None  # kept to the ctypes path
    z = plain.run([x])[name]
    torch.cuda.synchronize()
    paths_agree = torch.equal(z, out[name])

    def per_call_us(fn, n=2000):
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / n * 1e6

    runs = ctx._fast.runs if ctx._fast is not None else 0
    kiln_us = per_call_us(lambda: ctx.run([x], outputs={name: y}))
    fast_runs = (ctx._fast.runs - runs) if ctx._fast is not None else 0
    with torch.no_grad():
        torch_us = per_call_us(lambda: model(x))
    print(json.dumps({"kiln": kiln.__file__, "fast_origin": kiln._lib.fast_origin,
                      "fast_runs": fast_runs, "paths_agree": paths_agree,
                      "torch": torch.__version__, "build_s": round(build_s, 3),
                      "rel_l2_vs_torch_fp32": rel_l2, "output_in_callers_tensor": same_ptr,
                      "kiln_run_us_per_call": round(kiln_us, 2),
                      "torch_eager_us_per_call": round(torch_us, 2)}))
    return 0 if rel_l2 < 2e-2 and same_ptr and paths_agree else 1


if __name__ == "__main__":
    sys.exit(main())
