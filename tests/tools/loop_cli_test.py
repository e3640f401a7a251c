"""`kiln build --max-loop-trips` and a Loop whose trip count is a graph input (issue 21): built
with a bound of 4, `kiln run` with M = 0..4 gives y0 + 0 + 1 + ... + (M-1) and the M partial
sums as the scan output; M = 5 fails with KILN-E5016 naming the Loop; a bound of 0 refuses the
Loop at import with KILN-E2004, which names the option."""
import argparse
import os
import subprocess
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def model(path):
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["y", "fi"], ["y_out"]),
         helper.make_node("Identity", ["y_out"], ["scan"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("scan", TensorProto.FLOAT, [2])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "y0"], ["y", "ys"], name="sum_loop", body=body)],
        "runtime_loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("y0", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
         helper.make_tensor_value_info("ys", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)]), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = os.path.join(tmp, "loop.onnx")
        model(onnx_path)
        engine = os.path.join(tmp, "loop.kiln")
        p = subprocess.run([a.kiln, "build", onnx_path, "-o", engine, "--max-loop-trips", "4"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        y0 = np.array([0.5, -1.0], np.float32)
        y0_pb = os.path.join(tmp, "y0.pb")
        with open(y0_pb, "wb") as f:
            f.write(numpy_helper.from_array(y0, "y0").SerializeToString())
        for m in range(6):
            m_pb = os.path.join(tmp, f"m{m}.pb")
            with open(m_pb, "wb") as f:
                f.write(numpy_helper.from_array(np.array(m, np.int64), "M").SerializeToString())
            out = os.path.join(tmp, f"out{m}")
            p = subprocess.run([a.kiln, "run", engine, "--input", f"M={m_pb}", "--input",
                                f"y0={y0_pb}", "--iterations", "1", "--warmup", "0",
                                "--duration", "0", "--save-outputs", out],
                               capture_output=True, text=True, timeout=120)
            if m > 4:
                assert p.returncode != 0, f"M = {m} ran past the bound of 4: {p.stdout}"
                assert "KILN-E5016" in p.stderr and "sum_loop" in p.stderr, p.stderr
                continue
            assert p.returncode == 0, p.stderr
            want_ys = []
            y = y0.astype(np.float64)
            for t in range(m):
                y = y + t
                want_ys.append(y.copy())
            got_y = np.load(os.path.join(out, "y.npy"))
            got_ys = np.load(os.path.join(out, "ys.npy"))
            np.testing.assert_allclose(got_y, y, rtol=1e-6)
            assert got_ys.shape == (m, 2), (m, got_ys.shape)
            if m:
                np.testing.assert_allclose(got_ys, np.array(want_ys), rtol=1e-6)
        p = subprocess.run([a.kiln, "build", onnx_path, "-o", engine + "0", "--max-loop-trips", "0"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode != 0, "a bound of 0 built the Loop"
        assert "KILN-E2004" in p.stderr and "--max-loop-trips" in p.stderr, p.stderr
    print("ok: M = 0..4 match, M = 5 is KILN-E5016, --max-loop-trips 0 is KILN-E2004")


if __name__ == "__main__":
    main()
