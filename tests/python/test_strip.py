# Weight-stripped engines from Python (issue 20): Engine.serialize/save(strip_weights=True) leave
# out the weights the engine's program remakes; kiln.load/deserialize refuse them without weights
# (KILN-E4010) and, given the model's weights in any form Engine.refit takes, give the engine a
# build of those weights makes: the same bytes for the same ONNX model, the same outputs bit for
# bit. Wrong weights raise the refit's catalog error and load nothing.
import onnx
import pytest
import torch

import kiln

PROFILE = {"input_0": ((1, 8), (4, 8), (16, 8))}


class Net(torch.nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear (the LayerNorm's parameters are derived weights)."""

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


def run(engine):
    return engine.create_execution_context()(X)


@pytest.fixture(scope="module", params=[False, True], ids=["fp32", "fp16"])
def fp16(request):
    return request.param


@pytest.fixture(scope="module")
def engines(fp16):
    """(full bytes, stripped bytes, outputs with A, outputs with B) of a build with weights A."""
    engine = build(ONNX_A, fp16)
    full = engine.serialize()
    stripped = engine.serialize(strip_weights=True)
    assert engine.serialize() == full, "stripping a copy changed the engine"
    out_b = run(build(ONNX_B, fp16))
    return full, stripped, run(engine), out_b


def test_a_stripped_engine_is_smaller_and_refused_without_weights(engines, fp16, tmp_path):
    full, stripped, _, _ = engines
    # At least the two weight matrices (fc1 8x16, fc2 16x4; FP16 engines store them as f16) are
    # left out.
    assert len(full) - len(stripped) >= (2 if fp16 else 4) * (8 * 16 + 16 * 4)
    for load in (lambda: kiln.deserialize(stripped),
                 lambda: (tmp_path / "s.kiln").write_bytes(stripped) and
                 kiln.load(tmp_path / "s.kiln")):
        with pytest.raises(kiln.KilnError) as e:
            load()
        assert e.value.code == "KILN-E4010"
        assert "kiln refit" in e.value.message
        assert "--weights" in e.value.remedy


def _weights(form, net, onnx_bytes, tmp_path):
    state = net.state_dict()
    if form == "numpy":
        return {k: v.numpy() for k, v in state.items()}
    if form == "torch":
        return state
    if form == "path":
        path = tmp_path / "weights.onnx"
        path.write_bytes(onnx_bytes)
        return str(path)
    if form == "bytes":
        return onnx_bytes
    return onnx.load_model_from_string(onnx_bytes)


@pytest.mark.parametrize("form", ["numpy", "torch", "path", "bytes", "model_proto"])
def test_stripped_engine_with_its_weights_is_the_full_engine(form, engines, tmp_path):
    full, stripped, out_a, _ = engines
    engine = kiln.deserialize(stripped, weights=_weights(form, NET_A, ONNX_A, tmp_path))
    assert torch.equal(run(engine), out_a)
    assert engine.weights_generation == 0
    if form in ("path", "bytes", "model_proto"):
        # The same ONNX model: the same model hash, so the very bytes the build wrote.
        assert engine.serialize() == full
    # From a file too, and save() then writes the full engine, which loads without weights.
    path = tmp_path / "stripped.kiln"
    path.write_bytes(stripped)
    engine = kiln.load(path, weights=_weights(form, NET_A, ONNX_A, tmp_path))
    engine.save(tmp_path / "full.kiln")
    assert torch.equal(run(kiln.load(tmp_path / "full.kiln")), out_a)


def test_other_weights_give_their_build(engines):
    _, stripped, _, out_b = engines
    assert torch.equal(run(kiln.deserialize(stripped, weights=NET_B.state_dict())), out_b)
    assert torch.equal(run(kiln.deserialize(stripped, weights=ONNX_B)), out_b)


def test_save_strip_weights_round_trip(engines, fp16, tmp_path):
    _, _, out_a, _ = engines
    engine = build(ONNX_A, fp16)  # another build: its report's timings differ from the fixture's
    full, stripped = engine.serialize(), engine.serialize(strip_weights=True)
    engine.save(tmp_path / "s.kiln", strip_weights=True)
    assert (tmp_path / "s.kiln").read_bytes() == stripped
    loaded = kiln.load(tmp_path / "s.kiln", weights=ONNX_A)
    assert loaded.serialize() == full
    assert torch.equal(run(loaded), out_a)
    # A filled engine written stripped again is the same stripped file.
    assert loaded.serialize(strip_weights=True) == stripped


def _mismatches():
    state = {k: v.clone() for k, v in NET_A.state_dict().items()}
    missing = dict(state)
    del missing["fc2.bias"]
    shape = dict(state, **{"fc1.weight": state["fc1.weight"][:, :4].contiguous()})
    dtype = dict(state, **{"ln.weight": state["ln.weight"].half()})
    return [
        ("missing", missing, "KILN-E4008", "'fc2.bias'"),
        ("shape", shape, "KILN-E4008", "'fc1.weight'"),
        ("dtype", dtype, "KILN-E4008", "'ln.weight'"),
        ("another_architecture", export(torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()),
         "KILN-E4008", "missing from the new weights"),
        ("not_weights", 42, "KILN-E1001", "int"),
    ]


@pytest.mark.parametrize("case", _mismatches(), ids=lambda c: c[0])
def test_wrong_weights_give_the_refit_errors_and_leave_the_file(case, engines, tmp_path):
    _, weights, code, named = case
    _, stripped, _, _ = engines
    path = tmp_path / "s.kiln"
    path.write_bytes(stripped)
    with pytest.raises(kiln.KilnError) as e:
        kiln.load(path, weights=weights)
    assert e.value.code == code
    assert named in e.value.message
    assert e.value.remedy
    assert path.read_bytes() == stripped
