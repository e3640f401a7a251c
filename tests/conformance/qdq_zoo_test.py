"""Explicit quantization (issue 22, part 3, on the CPU): every zoo model quantized by ONNX Runtime's
own tool (quantize_static, QDQ format, int8 activations and per-channel int8 weights, calibrated on
the case's first data set) imports into kiln and agrees with ONNX Runtime's literal execution of
the same QDQ model (graph optimizations off: each QuantizeLinear/DequantizeLinear as the spec
defines it). A float rounding difference before a QuantizeLinear (BatchNormalization's, one ulp)
can move a value across a rounding boundary by one quantization step, so the bar is relative L2
1e-2 for the models listed in qdq_expected_pass.txt and 1e-1 for every model.

  .venv/bin/python tests/conformance/qdq_zoo_test.py --kiln build/tools/kiln/kiln --zoo zoo
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static


def read_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def write_pb(path, name, array):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(array, name).SerializeToString())


def make_case(src_dir, dst_dir):
    feeds = dict(read_pb(p) for p in sorted(glob.glob(os.path.join(src_dir, "test_data_set_0",
                                                                    "input_*.pb"))))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([feeds])

        def get_next(self):
            return next(self.it, None)

    os.makedirs(dst_dir)
    model = os.path.join(dst_dir, "model.onnx")
    quantize_static(os.path.join(src_dir, "model.onnx"), model, Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, feeds)
    data = os.path.join(dst_dir, "test_data_set_0")
    os.makedirs(data)
    for i, (name, value) in enumerate(feeds.items()):
        write_pb(os.path.join(data, f"input_{i}.pb"), name, value)
    for i, (o, value) in enumerate(zip(sess.get_outputs(), outs)):
        write_pb(os.path.join(data, f"output_{i}.pb"), o.name, value)
    ops = {n.op_type for n in onnx.load(model, load_external_data=False).graph.node}
    return "QuantizeLinear" in ops and "DequantizeLinear" in ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--zoo", required=True)
    ap.add_argument("--expected", default=os.path.join(os.path.dirname(__file__),
                                                       "qdq_expected_pass.txt"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(d, "qdq")
        os.makedirs(root)
        cases = sorted(c for c in os.listdir(a.zoo)
                       if os.path.exists(os.path.join(a.zoo, c, "model.onnx")))
        for c in cases:
            if not make_case(os.path.join(a.zoo, c), os.path.join(root, c)):
                print(f"FAIL {c}: the quantizer left no QuantizeLinear/DequantizeLinear pair")
                return 1
        # Every model within 1e-1; the listed ones within 1e-2 (exit 1 only on a listed failure).
        loose = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-1", "-v"],
                               capture_output=True, text=True, timeout=900)
        print(loose.stdout[-3000:], loose.stderr[-2000:])
        tight = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-2", "--expected",
                                a.expected, "-v"], capture_output=True, text=True, timeout=900)
        print(tight.stdout[-3000:], tight.stderr[-2000:])
        if loose.returncode != 0 or tight.returncode != 0:
            print(f"FAIL: within 1e-1 rc {loose.returncode}, listed within 1e-2 rc "
                  f"{tight.returncode}")
            return 1
        n = sum(1 for line in tight.stdout.splitlines() if line.startswith("PASS"))
        if n < 7:
            print(f"FAIL: only {n} models within 1e-2")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
