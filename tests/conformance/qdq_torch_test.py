"""Explicit quantization from PyTorch's own quantization (issue 22, part 3): models quantized with
torch.ao.quantization (eager post-training quantization, fbgemm qconfig: uint8 activations,
per-channel int8 weights) and exported by torch.onnx (opset 13, QuantizeLinear -> Cast ->
DequantizeLinear around every quantized op) run in kiln with every Conv/Gemm fused into an INT8
layer with the model's scales, and agree with ONNX Runtime's literal execution of the same file
within relative L2 1e-1, and within 1e-2 for the models of TIGHT. resnet18 is not there: at
1.45e-2, the same fused or literal (--disable-pass qdq_fusion): kiln's GlobalAveragePool (which
sums in double) and ONNX Runtime's round a few averages differently, which puts 8 of the 512
quantized averages one step apart before the final Gemm. The export runs under the Python that has torch (--torch-python, 1.13
here); the comparison under the one with onnxruntime. Without torch the test says so and passes.

  .venv/bin/python tests/conformance/qdq_torch_test.py --kiln build/tools/kiln/kiln
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(__file__))
from qdq_zoo_test import fusable_layers, int8_layers_in_engine  # noqa: E402

# Weights are random (no download), so each model is calibrated on random inputs of its size.
EXPORT = r'''
import sys, torch, torch.nn as nn, torchvision
torch.manual_seed(0)
name, size, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8 * 8 * 8, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        x = self.relu(self.conv2(self.relu(self.conv(x))))
        return self.dequant(self.fc(x.flatten(1)))

if name == "small_net":
    m = SmallNet().eval()
else:
    m = getattr(torchvision.models.quantization, name)(weights=None, quantize=False).eval()
    m.fuse_model()
m.qconfig = torch.ao.quantization.get_default_qconfig("fbgemm")
p = torch.ao.quantization.prepare(m)
with torch.no_grad():
    for _ in range(4):
        p(torch.randn(2, 3, size, size))
q = torch.ao.quantization.convert(p)
torch.onnx.export(q, torch.randn(1, 3, size, size), path, opset_version=13)
'''

MODELS = [("small_net", 16), ("resnet18", 64), ("mobilenet_v2", 64)]
TIGHT = ("small_net", "mobilenet_v2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--work", help="keep the cases in this (new) directory")
    a = ap.parse_args()
    probe = subprocess.run([a.torch_python, "-c", "import torch, torchvision; "
                            "print(torch.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"skipped: no torch/torchvision under {a.torch_python}")
        return 0
    print(f"torch {probe.stdout.strip()} under {a.torch_python}")
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(a.work or d, "torch_qdq")
        for name, size in MODELS:
            case = os.path.join(root, name)
            data = os.path.join(case, "test_data_set_0")
            os.makedirs(data)
            model = os.path.join(case, "model.onnx")
            subprocess.run([a.torch_python, "-c", EXPORT, name, str(size), model], check=True,
                           capture_output=True, timeout=600)
            g = onnx.load(model).graph
            x = np.random.default_rng(1).standard_normal((1, 3, size, size)).astype(np.float32)
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            (y,) = sess.run(None, {g.input[0].name: x})
            with open(os.path.join(data, "input_0.pb"), "wb") as f:
                f.write(numpy_helper.from_array(x, g.input[0].name).SerializeToString())
            with open(os.path.join(data, "output_0.pb"), "wb") as f:
                f.write(numpy_helper.from_array(y, g.output[0].name).SerializeToString())
            want = fusable_layers(model)
            got, calibration = int8_layers_in_engine(a.kiln, model, d)
            print(f"{name}: {got} INT8 layers from the model's Q/DQ scales (the graph has {want});"
                  f" calibration: {calibration}")
            if want == 0 or got != want:
                print(f"FAIL {name}: {got} INT8 layers in the engine, {want} fusable in the model")
                return 1
        for bound, cases in (("1e-1", None), ("1e-2", TIGHT)):
            args = [a.kiln, "conformance", root, "--rel-l2", bound, "-v"]
            if cases:
                args += ["--filter", "/(" + "|".join(cases) + ")$"]
            r = subprocess.run(args, capture_output=True, text=True, timeout=900)
            print(r.stdout[-3000:], r.stderr[-2000:])
            if r.returncode != 0:
                print(f"FAIL: a PyTorch QDQ model is beyond relative L2 {bound} of ONNX Runtime")
                return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
