"""Explicit quantization (issue 22, part 3, on the CPU): every zoo model quantized by ONNX Runtime's
own tool (quantize_static, QDQ format, int8 activations and per-channel int8 weights, calibrated on
the case's first data set) imports into kiln and agrees with ONNX Runtime's literal execution of
the same QDQ model (graph optimizations off: each QuantizeLinear/DequantizeLinear as the spec
defines it). A few models are quantized a second way too (uint8 activations, per-tensor weights:
the case name ends in _u8). kiln runs them fused: every Conv/Gemm/MatMul between the model's Q/DQ
is one INT8 layer with the model's scales (passes/qdq_fusion.cc), which the test checks in the
engine against its own count of such layers in the ONNX graph.

A float rounding difference before a QuantizeLinear (BatchNormalization's, or an INT8 layer's exact
integer sum against ONNX Runtime's float sum of the dequantized products, one ulp) can move a value
across a rounding boundary by one quantization step, and later layers carry that step on, so the
bar is relative L2 1e-2 for the models listed in qdq_expected_pass.txt and 1e-1 for every model.

  .venv/bin/python tests/conformance/qdq_zoo_test.py --kiln build/tools/kiln/kiln --zoo zoo
"""
import argparse
import glob
import json
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


# A second quantization for these: uint8 activations (zero points 0..255), per-tensor weights.
U8_MODELS = ("bert_tiny", "mobilenetv3_tiny", "resnet_tiny")


def make_case(src_dir, dst_dir, u8=False):
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
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8 if u8 else QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=not u8)
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


def fusable_layers(model_path):
    """The Conv/Gemm/MatMul nodes kiln should make INT8 with the model's scales, counted here
    independently of kiln: input 0 is DQ(Q(x)) with per-tensor scales, input 1 a DQ of an int8
    initializer with zero points 0, per tensor or per output channel."""
    g = onnx.load(model_path, load_external_data=False).graph
    # Constants: initializers and Constant nodes (PyTorch's export writes scales as the latter).
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            inits[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    producer = {o: n for n in g.node for o in n.output}

    def arr(name):
        return inits.get(name)

    def through_cast(n):
        # PyTorch puts a Cast to the same type between QuantizeLinear and DequantizeLinear.
        if n is not None and n.op_type == "Cast":
            return producer.get(n.input[0])
        return n

    def attr(n, name, default):
        for a in n.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    count = 0
    for n in g.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        dq = producer.get(n.input[0])
        q = through_cast(producer.get(dq.input[0])) \
            if dq is not None and dq.op_type == "DequantizeLinear" else None
        wdq = producer.get(n.input[1])
        if q is None or q.op_type != "QuantizeLinear" or wdq is None or \
                wdq.op_type != "DequantizeLinear" or wdq.input[0] not in inits:
            continue
        scale = arr(dq.input[1])
        if scale is None or scale.size != 1:
            continue
        w = arr(wdq.input[0])
        if w.dtype != np.int8:
            continue
        if len(wdq.input) > 2 and np.any(arr(wdq.input[2]) != 0):
            continue
        ws = arr(wdq.input[1])
        if n.op_type == "Conv":
            out_axis = 0
        elif w.ndim != 2:
            continue
        else:
            out_axis = 0 if n.op_type == "Gemm" and attr(n, "transB", 0) else 1
        if ws.size != 1 and (attr(wdq, "axis", 1) % w.ndim != out_axis or
                             ws.size != w.shape[out_axis]):
            continue
        count += 1
    return count


def int8_layers_in_engine(kiln, model_path, work):
    """Builds the model and returns (layers INT8 from the model's scales with an i8- tactic, the
    precision report's calibration line)."""
    engine = os.path.join(work, "engine.kiln")
    report = os.path.join(work, "precision.json")
    subprocess.run([kiln, "build", model_path, "-o", engine, "--precision-report", report],
                   check=True, capture_output=True, timeout=600)
    inspect = subprocess.run([kiln, "inspect", engine, "--json"], check=True,
                             capture_output=True, text=True, timeout=120)
    layers = json.loads(inspect.stdout)["layer_reports"]
    n = sum(1 for l in layers if "from the model's Q/DQ scales" in l["precision_reason"] and
            l["precision"] == "i8" and l["tactic"].startswith("i8-"))
    with open(report) as f:
        return n, json.load(f)["calibration"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln")
    ap.add_argument("--zoo", required=True)
    ap.add_argument("--make-only", metavar="DIR",
                    help="write the QDQ cases (model.onnx and ONNX Runtime's outputs) to DIR and "
                         "stop, to run them elsewhere: kiln conformance --backend cuda DIR")
    ap.add_argument("--expected", default=os.path.join(os.path.dirname(__file__),
                                                       "qdq_expected_pass.txt"))
    a = ap.parse_args()
    if not a.make_only and not a.kiln:
        ap.error("--kiln is required unless --make-only")
    with tempfile.TemporaryDirectory() as d:
        root = a.make_only or os.path.join(d, "qdq")
        os.makedirs(root, exist_ok=True)
        cases = sorted(c for c in os.listdir(a.zoo)
                       if os.path.exists(os.path.join(a.zoo, c, "model.onnx")))
        for c in cases:
            variants = [(c, False)] + ([(c + "_u8", True)] if c in U8_MODELS else [])
            for name, u8 in variants:
                if not make_case(os.path.join(a.zoo, c), os.path.join(root, name), u8):
                    print(f"FAIL {name}: the quantizer left no QuantizeLinear/DequantizeLinear pair")
                    return 1
        if a.make_only:
            print(f"wrote {len(os.listdir(root))} QDQ cases to {root}")
            return 0
        # The engine's INT8 layers are the model's: as many as the graph has fusable layers.
        for name in sorted(os.listdir(root)):
            model = os.path.join(root, name, "model.onnx")
            want = fusable_layers(model)
            got, calibration = int8_layers_in_engine(a.kiln, model, d)
            print(f"{name}: {got} INT8 layers from the model's Q/DQ scales (the graph has {want}); "
                  f"calibration: {calibration}")
            if want == 0 or got != want:
                print(f"FAIL {name}: {got} INT8 layers in the engine, {want} fusable in the model")
                return 1
        # Every model within 1e-1; the listed ones within 1e-2 (exit 1 only on a listed failure).
        loose = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-1", "-v"],
                               capture_output=True, text=True, timeout=900)
        print(loose.stdout[-3000:], loose.stderr[-2000:])
        tight = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-2", "--expected",
                                a.expected, "-v"], capture_output=True, text=True, timeout=900)
        print(tight.stdout[-3000:], tight.stderr[-2000:])
        # The literal execution (no fusion: each Q/DQ an op, the products in float) still agrees
        # within 1e-2 on every model but unet_tiny, resnet_tiny included.
        literal = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-2", "--disable-pass",
                                  "qdq_fusion", "-v"], capture_output=True, text=True,
                                 timeout=900)
        print(literal.stdout[-3000:], literal.stderr[-2000:])
        literal_fail = [line.split()[1] for line in literal.stdout.splitlines()
                        if line.startswith("FAIL")]
        if loose.returncode != 0 or tight.returncode != 0 or literal_fail != ["unet_tiny"]:
            print(f"FAIL: within 1e-1 rc {loose.returncode}, listed within 1e-2 rc "
                  f"{tight.returncode}, literal execution beyond 1e-2: {literal_fail}")
            return 1
        n = sum(1 for line in tight.stdout.splitlines() if line.startswith("PASS"))
        if n < 9:
            print(f"FAIL: only {n} cases within 1e-2")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
