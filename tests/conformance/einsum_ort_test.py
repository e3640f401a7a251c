"""Einsum on the CPU against ONNX Runtime (issue 21): one-node models over the equation forms
models use and the ones the parser must get right (explicit and implicit outputs, batched matrix
products, transposes, diagonals, sums, outer and inner products, three operands, '...' with
broadcasting, upper-case labels), float32 random inputs, checked with `kiln conformance` at
relative L2 1e-5. Then the refusals: a label with two extents, an output label in no operand.

  .venv/bin/python tests/conformance/einsum_ort_test.py --kiln build/tools/kiln/kiln
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

CASES = [
    ("matmul", "ij,jk->ik", [(3, 4), (4, 5)]),
    ("batched_matmul", "bij,bjk->bik", [(2, 3, 4), (2, 4, 6)]),
    ("attention_scores", "bhid,bhjd->bhij", [(2, 3, 5, 4), (2, 3, 7, 4)]),
    ("implicit_matmul", "ij,jk", [(3, 4), (4, 2)]),
    ("transpose", "ijk->kji", [(2, 3, 4)]),
    ("implicit_transpose", "ba", [(3, 5)]),
    ("diagonal", "ii->i", [(5, 5)]),
    ("batch_diagonal", "...ii->...i", [(2, 3, 4, 4)]),
    ("trace", "ii", [(6, 6)]),
    ("sum_all", "ij->", [(4, 7)]),
    ("sum_axis", "ijk->ik", [(3, 4, 5)]),
    ("inner_product", "i,i", [(9,), (9,)]),
    ("outer_product", "i,j->ij", [(3,), (4,)]),
    ("three_operands", "ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ellipsis_broadcast", "...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),
    ("ellipsis_middle", "b...d,d->b...", [(2, 3, 4, 6), (6,)]),
    ("upper_case", "Ab,bC->AC", [(2, 3), (3, 4)]),
    ("bilinear", "bn,anm,bm->ba", [(2, 3), (4, 3, 5), (2, 5)]),
]


def make_case(root, name, equation, shapes, seed):
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(len(shapes))]
    node = h.make_node("Einsum", names, ["y"], name="einsum", equation=equation)
    g = h.make_graph([node], name, [h.make_tensor_value_info(n, T.FLOAT, list(s))
                                    for n, s in zip(names, shapes)],
                     [h.make_tensor_value_info("y", T.FLOAT, None)])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    d = os.path.join(root, name)
    data = os.path.join(d, "test_data_set_0")
    os.makedirs(data)
    onnx.save(model, os.path.join(d, "model.onnx"))
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    y = ort.InferenceSession(os.path.join(d, "model.onnx"),
                             providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = np.einsum(equation, *feeds.values())
    assert np.allclose(y, want, rtol=1e-4, atol=1e-5), f"{name}: ORT and numpy disagree"
    for i, (n, v) in enumerate(feeds.items()):
        with open(os.path.join(data, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(v, n).SerializeToString())
    with open(os.path.join(data, "output_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(np.asarray(y), "y").SerializeToString())
    return os.path.join(d, "model.onnx")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    a = ap.parse_args()
    failures = []
    with tempfile.TemporaryDirectory() as d:
        root = os.path.join(d, "einsum")
        for i, (name, eq, shapes) in enumerate(CASES):
            make_case(root, name, eq, shapes, i)
        r = subprocess.run([a.kiln, "conformance", root, "--rel-l2", "1e-5", "-v"],
                           capture_output=True, text=True, timeout=600)
        print(r.stdout[-4000:], r.stderr[-2000:])
        if r.returncode != 0 or f"{len(CASES)} passed" not in r.stdout:
            failures.append("conformance")
        # Refusals at build, with the shape rule's message.
        bad = os.path.join(d, "bad")
        for name, eq, shapes, text in [
                ("extents", "ij,jk->ik", [(3, 4), (5, 2)], "differ"),
                ("unknown_label", "ij->iz", [(3, 4)], "in no operand"),
                ("rank", "ijk->i", [(3, 4)], "rank 2")]:
            os.makedirs(os.path.join(bad, name))
            names = [f"x{i}" for i in range(len(shapes))]
            g = h.make_graph([h.make_node("Einsum", names, ["y"], name="e", equation=eq)], name,
                             [h.make_tensor_value_info(n, T.FLOAT, list(s))
                              for n, s in zip(names, shapes)],
                             [h.make_tensor_value_info("y", T.FLOAT, None)])
            path = os.path.join(bad, name, "model.onnx")
            onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
            b = subprocess.run([a.kiln, "build", "--backend", "cpu", path, "-o",
                                os.path.join(bad, name, "e.kiln")],
                               capture_output=True, text=True, timeout=120)
            ok = b.returncode != 0 and "KILN-E" in b.stderr and text in b.stderr
            print(("ok   " if ok else "FAIL ") + f"{name}: refused ({text})")
            if not ok:
                print(b.stderr[-800:])
                failures.append(name)
    if failures:
        print("FAILED:", failures)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
