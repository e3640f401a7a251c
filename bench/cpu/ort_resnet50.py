"""ONNX Runtime CPU reference for the conv benchmark: ResNet-50 (torchvision, random weights)
at batch 1, FP32, median latency over 30 runs, for the given intra-op thread counts.

  python3 bench/cpu/ort_resnet50.py 1 16

Compare with `kiln_bench_cpu_nn --resnet50` (conv + FC layers, best tactic per layer) run with the
same number of threads (KILN_NUM_THREADS, OMP_NUM_THREADS).
"""
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort
import torch
import torchvision


def main() -> None:
    threads = [int(t) for t in sys.argv[1:]] or [1]
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    with tempfile.NamedTemporaryFile(suffix=".onnx") as f:
        torch.onnx.export(model, x, f.name, opset_version=17, input_names=["input"],
                          dynamo=False)
        for n in threads:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = n
            sess = ort.InferenceSession(f.name, opts, providers=["CPUExecutionProvider"])
            feed = {"input": x.numpy().astype(np.float32)}
            for _ in range(5):
                sess.run(None, feed)
            times = []
            for _ in range(30):
                t0 = time.perf_counter()
                sess.run(None, feed)
                times.append((time.perf_counter() - t0) * 1e3)
            print(f"onnxruntime {ort.__version__} ResNet-50 batch 1 fp32, {n} threads: "
                  f"median {statistics.median(times):.2f} ms, min {min(times):.2f} ms")


if __name__ == "__main__":
    main()
