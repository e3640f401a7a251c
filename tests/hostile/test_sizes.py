"""Hostile sizes (issue 17, checked size arithmetic): models, profiles and run-time shapes whose
dims, element counts or byte sizes are past kiln's limits (docs/limits.md) or overflow 64 bits.
Each is refused cleanly at import or build (or before anything is allocated at run time) with the
catalog code that names the tensor and the value; none may crash or plan "peak 0 B"."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

INT64_MAX = 9223372036854775807
E_TENSOR = "KILN-E2015"   # a tensor past the limits (import, shape rules)
E_PROFILE = "KILN-E3008"  # the profile's shapes past the limits (build)


def model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "sizes", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m.SerializeToString()


def f32(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def i64(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def build_refused(h, onnx_bytes, code, extra=(), value=None):
    path = h.write("model.onnx", onnx_bytes)
    r = h.refused(["build", path, "-o", h.path("out.kiln"), "--backend", "cpu"] + list(extra),
                  code=code)
    if value is not None and value not in r.err + r.out:
        raise hostile.CaseFailure("the refusal does not name %s:\n%r" % (value, r))
    return r


def relu_model(dims):
    return model([helper.make_node("Relu", ["x"], ["y"])], [f32("x", dims)], [f32("y", None)])


def case_static_dim_2_62(h):
    build_refused(h, relu_model([1, 2**62]), E_TENSOR, value=str(2**62))


def case_static_dims_2_32_squared(h):
    build_refused(h, relu_model([2**32, 2**32]), E_TENSOR, value="4294967296")


def case_huge_initializer_without_data(h):
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2**32, 2**32])  # no data
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [f32("x", [1])], [f32("y", None)],
              inits=[w])
    build_refused(h, m, E_TENSOR, value="'w'")


def case_profile_max_2_62(h):
    m = relu_model(["batch", 3, 8, 8])
    build_refused(h, m, E_PROFILE,
                  extra=["--profile", "x:1x3x8x8,1x3x8x8,%dx3x8x8" % 2**62], value=str(2**62))


def case_profile_max_int64_max(h):
    m = relu_model(["batch", 3, 8, 8])
    build_refused(h, m, E_PROFILE,
                  extra=["--profile", "x:1x3x8x8,1x3x8x8,%dx3x8x8" % INT64_MAX],
                  value=str(INT64_MAX))


def case_constant_of_shape_2_40(h):
    m = model([helper.make_node("ConstantOfShape", ["shape"], ["c"],
                                value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
               helper.make_node("Add", ["x", "c"], ["y"])],
              [f32("x", [1])], [f32("y", None)], inits=[i64("shape", [2**40])])
    build_refused(h, m, E_TENSOR, value=str(2**40))


def case_expand_2_40(h):
    m = model([helper.make_node("Expand", ["x", "shape"], ["y"])], [f32("x", [1])],
              [f32("y", None)], inits=[i64("shape", [2**40])])
    build_refused(h, m, E_TENSOR, value=str(2**40))


def case_tile_2_40(h):
    m = model([helper.make_node("Tile", ["x", "reps"], ["y"])], [f32("x", [2, 3])],
              [f32("y", None)], inits=[i64("reps", [2**40, 1])])
    build_refused(h, m, E_TENSOR, value=str(2**41))


def case_tile_overflowing_int64(h):
    m = model([helper.make_node("Tile", ["x", "reps"], ["y"])], [f32("x", [8, 3])],
              [f32("y", None)], inits=[i64("reps", [2**62, 2**62])])
    build_refused(h, m, E_TENSOR)


def case_pad_2_40(h):
    m = model([helper.make_node("Pad", ["x", "pads"], ["y"])], [f32("x", [1, 3])],
              [f32("y", None)], inits=[i64("pads", [0, 0, 0, 2**40])])
    build_refused(h, m, E_TENSOR, value=str(2**40 + 3))


def case_range_2_60(h):
    m = model([helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
               helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT)],
              [f32("x", [1])], [f32("y", None)],
              inits=[i64("start", 0), i64("limit", 2**60), i64("delta", 1)])
    build_refused(h, m, E_TENSOR, value=str(2**60))


def case_resize_by_1e9(h):
    scales = numpy_helper.from_array(np.array([1, 1, 1e9, 1e9], dtype=np.float32), "scales")
    m = model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
              [f32("x", [1, 3, 8, 8])], [f32("y", None)], inits=[scales])
    build_refused(h, m, E_TENSOR, value="8000000000")


def case_conv_pads_2_40(h):
    w = numpy_helper.from_array(np.zeros((4, 3, 3, 3), dtype=np.float32), "w")
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[2**40, 0, 2**40, 0])],
              [f32("x", [1, 3, 8, 8])], [f32("y", None)], inits=[w])
    build_refused(h, m, E_TENSOR, value=str(2**41 + 6))


def case_memory_budget_overflow(h):
    path = h.write("model.onnx", relu_model([1, 4]))
    h.refused(["build", path, "-o", h.path("out.kiln"), "--backend", "cpu", "--memory-budget",
               "99999999999T"], code="KILN-E1001")


def _built_engine(h, dims, profile=None):
    path = h.write("model.onnx", relu_model(dims))
    args = ["build", path, "-o", h.path("model.kiln"), "--backend", "cpu"]
    if profile:
        args += ["--profile", profile]
    r = h.run(args, timeout=120)
    if r.rc != 0:
        raise hostile.CaseFailure("the valid model did not build:\n%r" % r)
    return h.path("model.kiln")


def case_run_shapes_int64_max_dynamic(h):
    engine = _built_engine(h, ["batch", 3, 8, 8], "x:1x3x8x8,2x3x8x8,4x3x8x8")
    h.freeze()
    r = h.refused(["run", engine, "--shapes", "x:%dx3x8x8" % INT64_MAX, "--iterations", "1"],
                  code="KILN-E5002")
    if str(INT64_MAX) not in r.err:
        raise hostile.CaseFailure("the refusal does not name the value:\n%r" % r)


def case_run_shapes_int64_max_static(h):
    engine = _built_engine(h, [1, 3, 8, 8])
    h.freeze()
    h.refused(["run", engine, "--shapes", "x:%dx3x8x8" % INT64_MAX, "--iterations", "1"],
              code="KILN-E5003")
    h.refused(["run", engine, "--shapes", "x:1x3x8x%d" % INT64_MAX, "--iterations", "1"],
              code="KILN-E5003")


if __name__ == "__main__":
    hostile.main(globals())
