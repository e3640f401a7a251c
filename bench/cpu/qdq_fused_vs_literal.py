"""A QDQ model on the CPU: fused (qdq_fusion: Conv/Gemm/MatMul between the model's Q/DQ run as
INT8 layers with the model's scales) against the literal execution of the same file
(--disable-pass qdq_fusion: every QuantizeLinear/DequantizeLinear an op, the products in FP32).
Both engines are built from one model and timed alternately in this one call (kiln run, rounds
interleaved so that the machine's load falls on both alike); the figure is the ratio of medians.

The default model is ResNet-50 from PyTorch's own quantization (torchvision's quantizable
resnet50, random weights, eager post-training quantization with the fbgemm qconfig on random
inputs, exported by torch.onnx at opset 13), made with --torch-python; --model takes any QDQ ONNX
file instead.

  python3 bench/cpu/qdq_fused_vs_literal.py --kiln build/tools/kiln/kiln --out bench/results/cpu_qdq_resnet50.json
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

EXPORT = r'''
import sys, torch, torchvision
torch.manual_seed(0)
size, path = int(sys.argv[1]), sys.argv[2]
m = torchvision.models.quantization.resnet50(weights=None, quantize=False).eval()
m.fuse_model()
m.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
p = torch.ao.quantization.prepare(m)
with torch.no_grad():
    for _ in range(2):
        p(torch.randn(1, 3, size, size))
torch.onnx.export(torch.ao.quantization.convert(p), torch.randn(1, 3, size, size), path,
                  opset_version=13)
'''


def run(kiln, engine, seconds, env):
    out = subprocess.run([kiln, "run", engine, "--json", "--layer-iterations", "0", "--warmup", "3",
                          "--iterations", "5", "--duration", str(seconds)],
                         check=True, capture_output=True, text=True, env=env, timeout=600)
    return json.loads(out.stdout)["latency_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--model", help="a QDQ ONNX model (default: export ResNet-50 with torch)")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0, help="per engine per round")
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args()
    env = dict(os.environ, OMP_WAIT_POLICY="passive")  # see bench/results/cpu_int8.txt
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        model = a.model
        if not model:
            model = os.path.join(d, "resnet50_qdq.onnx")
            subprocess.run([a.torch_python, "-c", EXPORT, str(a.size), model], check=True,
                           capture_output=True, timeout=900)
        engines = {}
        for name, extra in (("fused", []), ("literal", ["--disable-pass", "qdq_fusion"])):
            engines[name] = os.path.join(d, name + ".kiln")
            report = os.path.join(d, name + "_precision.json")
            subprocess.run([a.kiln, "build", model, "-o", engines[name], "--precision-report",
                            report] + extra, check=True, capture_output=True, timeout=900)
            with open(report) as f:
                engines[name + "_layers"] = json.load(f)["counts"]
        rounds = {"fused": [], "literal": []}
        for _ in range(a.rounds):
            for name in ("fused", "literal"):
                rounds[name].append(run(a.kiln, engines[name], a.seconds, env))
    med = {k: statistics.median(r["median"] for r in v) for k, v in rounds.items()}
    result = {
        "what": "QDQ model on the CPU: fused INT8 layers (qdq_fusion) vs literal Q/DQ ops with "
                "FP32 products (--disable-pass qdq_fusion), same model, same call, rounds "
                "interleaved",
        "model": a.model or f"torchvision quantizable resnet50, random weights, fbgemm PTQ, "
                            f"torch.onnx opset 13, 1x3x{a.size}x{a.size}",
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared), OMP_WAIT_POLICY=passive",
        "load_average_at_start": [round(x, 2) for x in load],
        "layer_precisions": {k: engines[k + "_layers"] for k in ("fused", "literal")},
        "median_ms_per_round": {k: [round(r["median"], 3) for r in v] for k, v in rounds.items()},
        "median_of_medians_ms": {k: round(v, 3) for k, v in med.items()},
        "speedup_fused_over_literal": round(med["literal"] / med["fused"], 3),
    }
    print(json.dumps(result, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
