# Data-dependent output dims from Python (docs/architecture.md "Data-dependent shapes"): an engine
# NonZero -> Transpose returns y cut to each run's count of non-zeros (0 included), on one context
# over runs whose counts differ, against numpy's nonzero.
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import kiln

PROFILE = {"x": ((1, 4), (3, 4), (6, 4))}


def nonzero_model() -> bytes:
    """y = transpose(nonzero(x)) (int64 [n, 2]) and z = relu(x) (float [rows, 4])."""
    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["nz"]),
         helper.make_node("Transpose", ["nz"], ["y"], perm=[1, 0]),
         helper.make_node("Relu", ["x"], ["z"])],
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, ["n", 2]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["rows", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def engine():
    return kiln.build(nonzero_model(), backend="cpu", profiles=PROFILE)


def expected(x: torch.Tensor) -> np.ndarray:
    return np.transpose(np.nonzero(x.numpy())).astype(np.int64)


def sparse(rows: int, nonzeros: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(rows * 4)
    x[torch.randperm(rows * 4, generator=g)[:nonzeros]] = torch.rand(nonzeros, generator=g) + 0.5
    return x.view(rows, 4)


def check(ctx, x, out):
    want = expected(x)
    y = out["y"]
    assert tuple(y.shape) == want.shape, (tuple(y.shape), want.shape)
    assert y.dtype == torch.int64
    np.testing.assert_array_equal(y.numpy(), want)
    assert ctx.shape("y") == want.shape
    torch.testing.assert_close(out["z"], torch.relu(x))


def test_engine_names_its_data_dependent_outputs(engine):
    assert engine.data_dependent_outputs == ("y",)
    assert [t.shape for t in engine.outputs] == [(-1, 2), (-1, 4)]


def test_outputs_are_cut_to_each_runs_count(engine):
    ctx = engine.create_execution_context()
    # The same input shape with different counts (0 and all included), then other shapes.
    cases = [(3, 5), (3, 0), (3, 12), (3, 1), (3, 0), (6, 24), (1, 0), (1, 3), (6, 7), (3, 5)]
    for seed, (rows, nonzeros) in enumerate(cases):
        x = sparse(rows, nonzeros, seed)
        out = ctx.run({"x": x})
        check(ctx, x, out)
        assert out["y"].shape[0] == nonzeros
        # The bound: every element of x non-zero.
        assert ctx.max_shape("y") == (rows * 4, 2)
        assert ctx.max_shape("z") == ctx.shape("z") == (rows, 4)
    assert ctx._fast is None  # the Python path cuts them


def test_same_input_memory_rewritten_between_runs(engine):
    # The engine reads the bound input in place: the second run's count follows the new values.
    ctx = engine.create_execution_context()
    x = sparse(4, 9, 1)
    check(ctx, x, ctx.run([x]))
    x.zero_()
    out = ctx.run([x])
    assert out["y"].shape == (0, 2)
    check(ctx, x, out)
    x[2, 3] = 1.0
    check(ctx, x, ctx.run([x]))


def test_call_returns_cut_outputs(engine):
    ctx = engine.create_execution_context()
    for seed, nonzeros in enumerate((2, 0, 8)):
        x = sparse(2, nonzeros, seed)
        y, z = ctx(x)
        np.testing.assert_array_equal(y.numpy(), expected(x))
        torch.testing.assert_close(z, torch.relu(x))


def test_preallocated_output_at_its_bound(engine):
    ctx = engine.create_execution_context(cuda_graphs=False)
    x = sparse(5, 6, 3)
    ctx.bind("x", x)
    bound = ctx.max_shape("y")
    assert bound == (20, 2) and ctx.shape("y") == bound  # before the first run
    out = torch.full(bound, -1, dtype=torch.int64)
    result = ctx.run([x], outputs={"y": out})
    check(ctx, x, result)
    # A view of the caller's tensor: its leading elements, the rest untouched.
    assert result["y"].data_ptr() == out.data_ptr()
    assert (out.view(-1)[12:] == -1).all()
    x2 = sparse(5, 0, 4)
    result = ctx.run([x2], outputs={"y": out})
    assert result["y"].shape == (0, 2)
    # An output given at the run's count instead of the bound is refused.
    with pytest.raises(kiln.KilnError) as info:
        ctx.run([sparse(5, 3, 5)], outputs={"y": torch.empty(3, 2, dtype=torch.int64)})
    assert info.value.code == "KILN-E5014"


def test_bind_execute_by_hand(engine):
    ctx = engine.create_execution_context()
    x = sparse(2, 3, 7)
    ctx.bind("x", x)
    y = torch.empty(ctx.max_shape("y"), dtype=torch.int64)
    z = torch.empty(ctx.max_shape("z"))
    ctx.bind("y", y)
    ctx.bind("z", z)
    ctx.execute()
    n = ctx.shape("y")[0]
    assert n == 3
    np.testing.assert_array_equal(y[:n].numpy(), expected(x))
    # The context is free again after the query: another thread may take it.
    import threading
    seen = []
    t = threading.Thread(target=lambda: seen.append(ctx.run([x])["y"].shape))
    t.start()
    t.join()
    assert seen == [(3, 2)]


def test_engines_without_data_dependent_dims_keep_their_path():
    import torch.nn as nn
    engine = kiln.build(nn.Linear(4, 2).eval(), torch.randn(2, 4), backend="cpu")
    assert engine.data_dependent_outputs == ()
