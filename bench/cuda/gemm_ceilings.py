"""What the vendor libraries reach on this GPU for BERT-base's matrix products at batch 32 x 128
tokens (M = 4096), all in one process: FP16 (torch.addmm with the bias), INT8 (torch._int_mm:
cuBLASLt's IMMA, int32 result), FP8 E4M3 (torch._scaled_mm: FP16 result, with and without the
bias, and with fast accumulation). Each is timed as 100 products in one CUDA graph replay. The
ratios between the columns are the ceilings kiln's INT8/FP8 engines (issue 22) work under when
they use these libraries.

Usage: python3 bench/cuda/gemm_ceilings.py OUT.json   (needs PyTorch with CUDA)
"""
import json
import sys

import torch
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
def bench(fn, reps=100):
    for _ in range(10): fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            for _ in range(reps): fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1000.0  # us
rows = []
M = 4096
for K, N, what in [(768, 2304, "qkv"), (768, 768, "attn_out"), (768, 3072, "fc1"), (3072, 768, "fc2"),
                   (1024, 4096, "other1"), (4096, 4096, "big")]:
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    w = torch.randn(N, K, device="cuda", dtype=torch.float16)
    bias = torch.randn(N, device="cuda", dtype=torch.float16)
    r = {"what": what, "M": M, "K": K, "N": N}
    r["fp16_us"] = bench(lambda: torch.addmm(bias, a, w.t()))
    a8 = torch.randint(-127, 127, (M, K), device="cuda", dtype=torch.int8)
    w8 = torch.randint(-127, 127, (N, K), device="cuda", dtype=torch.int8)
    try:
        r["int8_int32out_us"] = bench(lambda: torch._int_mm(a8, w8.t()))
    except Exception as e:
        r["int8_err"] = str(e)[:200]
    af = a.to(torch.float8_e4m3fn); wf = w.to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    try:
        r["fp8_f16out_us"] = bench(lambda: torch._scaled_mm(af, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.float16))
        r["fp8_f16out_bias_us"] = bench(lambda: torch._scaled_mm(af, wf.t(), scale_a=one, scale_b=one, bias=bias, out_dtype=torch.float16))
        r["fp8_fast_accum_us"] = bench(lambda: torch._scaled_mm(af, wf.t(), scale_a=one, scale_b=one, out_dtype=torch.float16, use_fast_accum=True))
    except Exception as e:
        r["fp8_err"] = str(e)[:200]
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    r["quant_int8_torch_us"] = bench(lambda: (x * 10).round().clamp(-127, 127).to(torch.int8))
    fl = 2.0 * M * K * N
    for k in list(r):
        if k.endswith("_us") and not k.startswith("quant"):
            r[k.replace("_us", "_tops")] = round(fl / r[k] / 1e6, 1)
    rows.append(r)
    print(json.dumps(r), flush=True)
json.dump(rows, open(sys.argv[1], "w"), indent=1)
