# engine.refit (issue 20 from Python): new weights from a state_dict (torch tensors or numpy
# arrays), an ONNX path, ONNX bytes or an onnx.ModelProto give the outputs of a fresh build with
# those weights, bit for bit on the CPU; running contexts take them at their next run and never
# run half of them; wrong weights raise the catalog error naming the first mismatch and change
# nothing.
import threading

import onnx
import pytest
import torch

import kiln

PROFILE = {"input_0": ((1, 8), (4, 8), (16, 8))}


class Net(torch.nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear: the LayerNorm's scale and bias are derived weights
    (the norm fusion's NormParam step, and FP16 casts under fp16), so a refit replays steps."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = torch.nn.Linear(8, 16)
        self.ln = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.ln(self.fc1(x))))


def export(module):
    return kiln._export(module, (torch.randn(4, 8),), "torchscript", None, ["logits"], None, None,
                        PROFILE)[0]


NET_A, NET_B = Net(0).eval(), Net(1).eval()
ONNX_A, ONNX_B = export(NET_A), export(NET_B)
X = torch.randn(5, 8, generator=torch.Generator().manual_seed(7))


def build(onnx_bytes, fp16=False):
    return kiln.build(onnx_bytes, backend="cpu", profiles=PROFILE, fp16=fp16)


def run(engine, x=X):
    return engine.create_execution_context()(x)


@pytest.fixture(scope="module", params=[False, True], ids=["fp32", "fp16"])
def fp16(request):
    return request.param


@pytest.fixture(scope="module")
def outputs(fp16):
    """Outputs of fresh builds with weights A and B."""
    a, b = run(build(ONNX_A, fp16)), run(build(ONNX_B, fp16))
    assert not torch.equal(a, b)
    return a, b


def test_the_state_dict_names_are_the_initializers():
    names = [i.name for i in onnx.load_model_from_string(ONNX_A).graph.initializer]
    assert sorted(names) == sorted(NET_A.state_dict())


@pytest.mark.parametrize("form", ["numpy", "torch", "path", "bytes", "model_proto"])
def test_refit_gives_a_fresh_build_with_the_new_weights(form, fp16, outputs, tmp_path):
    out_a, out_b = outputs
    engine = build(ONNX_A, fp16)
    ctx = engine.create_execution_context()
    assert torch.equal(ctx(X), out_a)
    state = NET_B.state_dict()
    if form == "numpy":
        weights = {k: v.numpy() for k, v in state.items()}
    elif form == "torch":
        weights = state
    elif form == "path":
        weights = tmp_path / "b.onnx"
        weights.write_bytes(ONNX_B)
    elif form == "bytes":
        weights = ONNX_B
    else:
        weights = onnx.load_model_from_string(ONNX_B)
    report = engine.refit(weights)
    assert report["generation"] == 1 and engine.weights_generation == 1
    assert report["initializers"] == 4 + 2 and report["constants_refit"] >= 6
    assert report["steps"] > 0  # the LayerNorm parameters (and FP16 casts) were replayed
    # The context made before the refit runs with B at its next run; a new one does too.
    assert torch.equal(ctx(X), out_b)
    assert torch.equal(run(engine), out_b)
    # And with a batch size the context has not run yet (new shapes after the switch).
    assert torch.equal(ctx(X[:2]), run(build(ONNX_B, fp16), X[:2]))


def test_refit_matches_pytorch_in_fp32():
    engine = build(ONNX_A)
    engine.refit(NET_B.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(run(engine), NET_B(X), rtol=1e-5, atol=1e-5)


def test_a_tensor_given_as_a_strided_view_or_fp32_scalar_array_is_copied_dense(outputs, fp16):
    if fp16:
        pytest.skip("one precision is enough for the memory layouts")
    out_a, out_b = outputs
    state = {k: v.clone() for k, v in NET_B.state_dict().items()}
    # fc1.weight given as the transpose of a contiguous transpose: same values, strided memory.
    state["fc1.weight"] = state["fc1.weight"].t().contiguous().t()
    assert not state["fc1.weight"].is_contiguous()
    state["fc2.weight"] = state["fc2.weight"].requires_grad_(True)
    engine = build(ONNX_A)
    engine.refit(state)
    assert torch.equal(run(engine), out_b)


def test_serialize_and_save_give_the_refit_engine(outputs, fp16, tmp_path):
    out_a, out_b = outputs
    engine = build(ONNX_A, fp16)
    original = engine.serialize()
    engine.refit(NET_B.state_dict())
    refit = engine.serialize()
    assert refit != original
    assert torch.equal(run(kiln.deserialize(refit)), out_b)
    engine.save(tmp_path / "b.kiln")
    assert torch.equal(run(kiln.load(tmp_path / "b.kiln")), out_b)
    # Back to A from its ONNX bytes: the very engine the build made (same model hash, same bytes).
    engine.refit(ONNX_A)
    assert engine.weights_generation == 2
    assert engine.serialize() == original
    assert torch.equal(run(engine), out_a)


def _mismatches():
    state = {k: v.clone() for k, v in NET_B.state_dict().items()}
    missing = dict(state)
    del missing["fc2.bias"]
    extra = dict(state, **{"fc3.weight": torch.zeros(4, 4)})
    shape = dict(state, **{"fc1.weight": state["fc1.weight"][:, :4].contiguous()})
    dtype = dict(state, **{"ln.weight": state["ln.weight"].half()})
    float64 = {k: v.double().numpy() for k, v in state.items()}
    return [
        ("missing", missing, "KILN-E4008", "'fc2.bias'"),
        ("extra", extra, "KILN-E4008", "'fc3.weight'"),
        ("shape", shape, "KILN-E4008", "'fc1.weight'"),
        ("dtype", dtype, "KILN-E4008", "'ln.weight'"),
        # float64 is a dtype kiln has: the first initializer is named with both dtypes.
        ("float64", float64, "KILN-E4008", "is f64[16,8] in the new weights"),
        ("another_architecture", export(torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()),
         "KILN-E4008", "missing from the new weights"),
        ("not_weights", 42, "KILN-E1001", "int"),
    ]


@pytest.mark.parametrize("case", _mismatches(), ids=lambda c: c[0])
def test_wrong_weights_name_the_first_mismatch_and_change_nothing(case, outputs, fp16):
    _, weights, code, named = case
    out_a, _ = outputs
    engine = build(ONNX_A, fp16)
    ctx = engine.create_execution_context()
    before = ctx(X)
    original = engine.serialize()
    with pytest.raises(kiln.KilnError) as e:
        engine.refit(weights)
    assert e.value.code == code
    assert named in e.value.message
    assert e.value.remedy
    assert engine.weights_generation == 0
    assert torch.equal(ctx(X), before) and torch.equal(before, out_a)
    assert engine.serialize() == original


def test_missing_is_named_before_a_wrong_shape(fp16):
    """Every initializer the engine reads is checked first, in the program's order; the message
    names one mismatch, the first."""
    state = {k: v.clone() for k, v in NET_B.state_dict().items()}
    del state["fc2.bias"]
    state["fc3.weight"] = torch.zeros(2)
    engine = build(ONNX_A, fp16)
    with pytest.raises(kiln.KilnError) as e:
        engine.refit(state)
    assert "'fc2.bias'" in e.value.message and "fc3.weight" not in e.value.message


def test_running_contexts_never_see_half_updated_weights(outputs, fp16):
    """One thread runs a context in a loop (the GIL is released inside each run) while this one
    refits A <-> B: every output is exactly A's or exactly B's."""
    out_a, out_b = outputs
    engine = build(ONNX_A, fp16)
    weights = [NET_A.state_dict(), {k: v.numpy() for k, v in NET_B.state_dict().items()}]
    ctx = engine.create_execution_context()
    seen = []
    errors = []
    stop = threading.Event()

    def runner():
        try:
            while not stop.is_set():
                seen.append(ctx(X).clone())
        except BaseException as e:  # reported below
            errors.append(e)

    thread = threading.Thread(target=runner)
    thread.start()
    try:
        for i in range(20):
            engine.refit(weights[(i + 1) % 2])
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors
    assert engine.weights_generation == 20
    assert seen
    for out in seen:
        assert torch.equal(out, out_a) or torch.equal(out, out_b)
    # 20 refits end on A's weights, which the context runs next.
    assert torch.equal(ctx(X), out_a)


def test_two_contexts_switch_at_their_own_next_run(outputs, fp16):
    out_a, out_b = outputs
    engine = build(ONNX_A, fp16)
    first, second = engine.create_execution_context(), engine.create_execution_context()
    assert torch.equal(first(X), out_a) and torch.equal(second(X), out_a)
    engine.refit(NET_B.state_dict())
    assert torch.equal(first(X), out_b)
    assert torch.equal(second(X), out_b)


def test_a_refit_from_another_thread_while_the_context_is_idle():
    engine = build(ONNX_A)
    ctx = engine.create_execution_context()
    before = ctx(X)
    done = []
    t = threading.Thread(target=lambda: done.append(engine.refit(NET_B.state_dict())))
    t.start()
    t.join(60)
    assert done and done[0]["generation"] == 1
    assert not torch.equal(ctx(X), before)
