"""`kiln inspect` tells the truth before a build (issue 21): it lists unsupported ops inside If/Loop
bodies as `kiln build` does (one KILN-E2004 naming them all), and it finds the layers that have no
kernel on the backend (a convolution over four spatial axes on the CPU), which `kiln build` then
refuses with KILN-E3003 naming the same layer; a 3-D convolution, which has one, inspects and
builds.
Models are generated here with onnx.helper."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh


def run(kiln, *args):
    return subprocess.run([kiln, *args], capture_output=True, text=True, timeout=120)


def conv3d_model(path):
    w = nh.from_array(np.random.default_rng(0).standard_normal((3, 2, 3, 3, 3)).astype(np.float32),
                      "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], name="conv3d", pads=[1] * 6),
                      h.make_node("Relu", ["y"], ["z"], name="relu")], "c3",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 8, 8])],
                     [h.make_tensor_value_info("z", T.FLOAT, None)], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def conv4d_model(path):
    w = nh.from_array(np.random.default_rng(1).standard_normal((2, 2, 2, 2, 2, 2)).astype(np.float32),
                      "w")
    g = h.make_graph([h.make_node("Conv", ["x", "w"], ["y"], name="conv4d")], "c4",
                     [h.make_tensor_value_info("x", T.FLOAT, [1, 2, 3, 3, 3, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, None)], [w])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def loop_if_model(path):
    # A Loop body holding an If whose then-branch runs Bernoulli (an op kiln does not implement).
    then_g = h.make_graph(
        [h.make_node("Bernoulli", ["scores"], ["sel"], name="coin")], "then", [],
        [h.make_tensor_value_info("sel", T.FLOAT, None)])
    else_g = h.make_graph(
        [h.make_node("Constant", [], ["e"], name="none",
                     value=nh.from_array(np.zeros((0, 3), np.int64)))], "else", [],
        [h.make_tensor_value_info("e", T.INT64, None)])
    body = h.make_graph(
        [h.make_node("If", ["cond_in"], ["picked"], name="maybe_nms", then_branch=then_g,
                     else_branch=else_g),
         h.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, [])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []),
         h.make_tensor_value_info("picked", T.INT64, None)])
    g = h.make_graph(
        [h.make_node("Loop", ["n", "c"], ["picks"], name="rounds", body=body),
         h.make_node("Relu", ["boxes"], ["boxes_relu"], name="relu")], "loopg",
        [h.make_tensor_value_info("n", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, []),
         h.make_tensor_value_info("boxes", T.FLOAT, [1, 4, 4]),
         h.make_tensor_value_info("scores", T.FLOAT, [1, 1, 4])],
        [h.make_tensor_value_info("picks", T.INT64, None),
         h.make_tensor_value_info("boxes_relu", T.FLOAT, None)])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", required=True)
    ap.add_argument("--zoo", required=True)
    a = ap.parse_args()
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as d:
        # A model every layer of which has a CPU kernel.
        r = run(a.kiln, "inspect", "--backend", "cpu", os.path.join(a.zoo, "resnet_tiny", "model.onnx"))
        check(r.returncode == 0 and "every layer has a cpu kernel" in r.stdout,
              f"resnet_tiny: exit 0 and every layer has a cpu kernel (rc {r.returncode})")

        # A 3-D convolution has a CPU kernel: inspect says so and build builds it.
        c3 = os.path.join(d, "conv3d.onnx")
        conv3d_model(c3)
        r = run(a.kiln, "inspect", "--backend", "cpu", c3)
        check(r.returncode == 0 and "every layer has a cpu kernel" in r.stdout,
              f"conv3d: every layer has a cpu kernel (rc {r.returncode})")
        b = run(a.kiln, "build", "--backend", "cpu", c3, "-o", os.path.join(d, "c3.kiln"))
        check(b.returncode == 0, f"conv3d: kiln build builds it (rc {b.returncode})")

        # A convolution over four spatial axes: supported as an op, no CPU kernel for its rank.
        t3 = os.path.join(d, "conv4d.onnx")
        conv4d_model(t3)
        r = run(a.kiln, "inspect", "--backend", "cpu", t3)
        check(r.returncode == 1, f"conv4d: exit 1 (rc {r.returncode})")
        check("every op is supported" in r.stdout and "without a cpu kernel" in r.stdout,
              "conv4d: ops supported, one layer without a cpu kernel")
        j = json.loads(run(a.kiln, "inspect", "--json", "--backend", "cpu", t3).stdout)
        missing = j.get("kernels", {}).get("missing", [])
        check(len(missing) == 1 and missing[0]["op"] == "Conv"
              and "f32[1,2,3,3,3,3]" in missing[0]["operands"],
              f"conv4d --json: the layer, its op and its rank-6 operands ({missing})")
        b = run(a.kiln, "build", "--backend", "cpu", t3, "-o", os.path.join(d, "c4.kiln"))
        check(b.returncode != 0 and "KILN-E3003" in b.stderr and missing
              and missing[0]["layer"] in b.stderr,
              "conv4d: kiln build refuses the same layer with KILN-E3003")
        r = run(a.kiln, "inspect", "--no-kernels", t3)
        check(r.returncode == 0 and "kernel" not in r.stdout, "conv4d --no-kernels: exit 0")
        r = run(a.kiln, "inspect", "--backend", "tpu", t3)
        check(r.returncode == 64 and "KILN-E1016" in r.stderr, "--backend tpu: refused at parse")

        # Unsupported ops nested in Loop > If are listed by inspect and by build's KILN-E2004.
        li = os.path.join(d, "loop_if.onnx")
        loop_if_model(li)
        j = json.loads(run(a.kiln, "inspect", "--json", li).stdout)
        ops = {u["op"]: u["nodes"] for u in j["unsupported"]}
        check({"Loop", "If", "Bernoulli"} <= set(ops),
              f"loop_if: Loop, If and Bernoulli listed ({sorted(ops)})")
        check(ops.get("Bernoulli") ==
              ["coin (in Loop 'rounds'.body > If 'maybe_nms'.then_branch)"],
              f"loop_if: the Bernoulli node named with its path ({ops.get('Bernoulli')})")
        check("kernels" not in j, "loop_if: no kernel check on a model that does not import")
        b = run(a.kiln, "build", "--backend", "cpu", li, "-o", os.path.join(d, "li.kiln"))
        check(b.returncode != 0 and "KILN-E2004" in b.stderr and "Bernoulli" in b.stderr
              and "maybe_nms" in b.stderr, "loop_if: kiln build's KILN-E2004 lists the nested ops")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
