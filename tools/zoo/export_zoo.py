#!/usr/bin/env python3
"""Exports, checks and lists the kiln model zoo.

Run with the venv made by scripts/python_env.sh (Debian's torch + pinned onnx/onnxruntime):

  .venv/bin/python tools/zoo/export_zoo.py              # export the small zoo into zoo/<name>/
  .venv/bin/python tools/zoo/export_zoo.py --large      # resnet50, bert_base -> zoo/generated/
  .venv/bin/python tools/zoo/export_zoo.py --check      # onnxruntime vs. saved references
  .venv/bin/python tools/zoo/export_zoo.py --list-ops   # op types per model (markdown)

Layout of one model directory (the ONNX backend-test layout):
  model.onnx
  test_data_set_0/input_<i>.pb, output_<i>.pb   (TensorProto, named after the graph's I/O)
  test_data_set_1/...                            (other batch size, other seq length)
  info.json                                      (I/O, dynamic dims, profile, tolerance, ops)

Reference outputs are PyTorch FP32 outputs (eval mode, one thread, fixed seeds), so a second
export reproduces them bit for bit.
"""

import argparse
import collections
import dataclasses
import io
import json
import math
import os
import shutil
import sys
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnx
import torch
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models as zm  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ZOO_DIR = os.path.join(REPO_ROOT, "zoo")
GENERATED_DIR = os.path.join(ZOO_DIR, "generated")
OPSET = 17
FP32_REL_L2_TOL = 1e-4

Dim = object  # an int, or a str naming a dynamic dimension ("batch", "seq")


@dataclasses.dataclass
class TensorSpec:
    name: str
    dtype: str  # numpy dtype name
    shape: Sequence[Dim]


@dataclasses.dataclass
class ModelSpec:
    name: str
    family: str
    description: str
    build: Callable[[], torch.nn.Module]
    inputs: List[TensorSpec]
    outputs: List[TensorSpec]
    # Values of the dynamic dims for test_data_set_0, test_data_set_1, ...
    data_sets: List[Dict[str, int]]
    # min/opt/max per dynamic dim; the per-input profile is derived from it.
    dim_ranges: Dict[str, Tuple[int, int, int]]
    make_inputs: Callable[[np.random.Generator, Dict[str, int], "ModelSpec"], List[np.ndarray]]
    seed: int
    large: bool = False
    post_process: Optional[Callable[[onnx.ModelProto], onnx.ModelProto]] = None
    notes: str = ""
    extra: Dict[str, int] = dataclasses.field(default_factory=dict)
    # Std of the random weights is fan_in_gain / sqrt(fan_in): sqrt(2) for ReLU-family CNNs.
    fan_in_gain: float = 1.0


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def concrete(shape, dims):
    return tuple(dims[d] if isinstance(d, str) else d for d in shape)


def random_image(rng: np.random.Generator, shape) -> np.ndarray:
    """Image-like random input: a per-sample, per-channel offset and scale, a coarse random
    pattern (4x4 cells, nearest-upsampled) and fine noise. Samples differ in their global
    statistics, so the classifier outputs of a batch differ clearly from each other."""
    b, c, h, w = shape
    coarse = rng.standard_normal((b, c, 4, 4)).repeat(h // 4, axis=2).repeat(w // 4, axis=3)
    fine = rng.standard_normal((b, c, h, w))
    offset = rng.standard_normal((b, c, 1, 1)) * 0.5
    scale = rng.uniform(0.5, 1.5, size=(b, 1, 1, 1))
    return ((offset + coarse + 0.5 * fine) * scale).astype(np.float32)


def image_inputs(rng, dims, spec):
    return [random_image(rng, concrete(t.shape, dims)) for t in spec.inputs]


def bert_inputs(rng, dims, spec):
    """input_ids, attention_mask (real padding at the end of all but the first row),
    token_type_ids (segment A then segment B inside the valid part)."""
    vocab = spec.extra["vocab"]
    b, s = dims["batch"], dims["seq"]
    lengths = [s] + [int(rng.integers(max(1, s // 4), s)) for _ in range(b - 1)]
    ids = rng.integers(1, vocab, size=(b, s), dtype=np.int64)
    mask = np.zeros((b, s), dtype=np.int64)
    types = np.zeros((b, s), dtype=np.int64)
    for r, n in enumerate(lengths):
        mask[r, :n] = 1
        ids[r, n:] = 0  # [PAD]
        types[r, (n + 1) // 2:n] = 1
    return [ids, mask, types]


def token_inputs(rng, dims, spec):
    vocab = spec.extra["vocab"]
    return [rng.integers(0, vocab, size=(dims["batch"], dims["seq"]), dtype=np.int64)]


# --------------------------------------------------------------------------------------
# Post-processing
# --------------------------------------------------------------------------------------


def retie_lm_head(model: onnx.ModelProto) -> onnx.ModelProto:
    """Restores the tied lm head of gpt_tiny in the graph.

    torch's constant folding turns Transpose(wte.weight) into a second, transposed copy of the
    embedding matrix, so the tie would be lost. Put the Transpose back, reading the same
    initializer the embedding Gather reads. Numerically identical; the file gets smaller.
    """
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    gathers = [n for n in g.node if n.op_type == "Gather" and n.input[0] in inits]
    wte_name = next(n.input[0] for n in gathers if inits[n.input[0]].dims[0] == 1000)
    wte = numpy_helper.to_array(inits[wte_name])
    for node in g.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.shape == wte.T.shape and np.array_equal(w, wte.T):
            dup = node.input[1]
            t_out = wte_name + "_transposed"
            transpose = onnx.helper.make_node("Transpose", [wte_name], [t_out], perm=[1, 0],
                                              name="/lm_head/Transpose")
            node.input[1] = t_out
            idx = list(g.node).index(node)
            g.node.insert(idx, transpose)
            if not any(dup in n.input for n in g.node):
                g.initializer.remove(inits[dup])
            return model
    raise RuntimeError("gpt_tiny: tied lm head MatMul not found")


# --------------------------------------------------------------------------------------
# The zoo
# --------------------------------------------------------------------------------------

IMG_SETS = [{"batch": 2}, {"batch": 3}]
IMG_RANGES = {"batch": (1, 4, 16)}
TEXT_SETS = [{"batch": 2, "seq": 16}, {"batch": 3, "seq": 13}]
TEXT_RANGES = {"batch": (1, 4, 8), "seq": (1, 32, 128)}


def image_spec(name, family, desc, build, seed, hw=64, cin=3, out=(10,), fan_in_gain=math.sqrt(2),
               **kw):
    return ModelSpec(
        name=name, family=family, description=desc, build=build,
        inputs=[TensorSpec("input", "float32", ["batch", cin, hw, hw])],
        outputs=[TensorSpec("output", "float32", ["batch", *out])],
        data_sets=kw.pop("data_sets", IMG_SETS), dim_ranges=kw.pop("dim_ranges", IMG_RANGES),
        make_inputs=image_inputs, seed=seed, fan_in_gain=fan_in_gain, **kw)


def bert_spec(name, seed, large=False, data_sets=TEXT_SETS, dim_ranges=TEXT_RANGES, **cfg):
    return ModelSpec(
        name=name, family="bert", large=large,
        description=("BERT-style encoder (HF BertModel layout): word+position+token-type embeddings, "
                     "post-norm layers, additive padding mask, erf GELU, tanh pooler"),
        build=lambda: zm.BertEncoder(**cfg),
        inputs=[TensorSpec("input_ids", "int64", ["batch", "seq"]),
                TensorSpec("attention_mask", "int64", ["batch", "seq"]),
                TensorSpec("token_type_ids", "int64", ["batch", "seq"])],
        outputs=[TensorSpec("last_hidden_state", "float32", ["batch", "seq", cfg["hidden"]]),
                 TensorSpec("pooler_output", "float32", ["batch", cfg["hidden"]])],
        data_sets=data_sets, dim_ranges=dim_ranges, make_inputs=bert_inputs, seed=seed,
        notes="attention_mask has real padding (zeros at the end of every row but the first).",
        extra={"vocab": cfg["vocab"]})


def gpt_spec():
    return ModelSpec(
        name="gpt_tiny", family="gpt2",
        description=("GPT-2-style decoder LM: wte+wpe, pre-norm blocks, Conv1D (addmm) projections, "
                     "causal mask via Where on a tril buffer, tanh GELU (gelu_new), tied lm head"),
        build=lambda: zm.GPT2Tiny(vocab=1000, hidden=64, layers=2, heads=4, max_pos=128),
        inputs=[TensorSpec("input_ids", "int64", ["batch", "seq"])],
        outputs=[TensorSpec("logits", "float32", ["batch", "seq", 1000])],
        data_sets=TEXT_SETS, dim_ranges=TEXT_RANGES, make_inputs=token_inputs, seed=107,
        post_process=retie_lm_head,
        notes=("lm head = MatMul(ln_f(h), Transpose(wte.weight)): the same initializer feeds the "
               "embedding Gather and the lm head (the Transpose is left unfolded on purpose)."),
        extra={"vocab": 1000})


def all_specs() -> List[ModelSpec]:
    specs = [
        image_spec("resnet_tiny", "resnet",
                   "ResNet-18 layout (7x7/2 stem, maxpool, 4 stages of BasicBlocks, widths 16-128, "
                   "1x1 downsample convs), global avgpool, flatten, Linear",
                   zm.ResNetTiny, seed=101),
        image_spec("mobilenetv3_tiny", "mobilenetv3",
                   "torchvision MobileNetV3-Small, width_mult 0.5: depthwise convs, hardswish, "
                   "squeeze-excitation with hardsigmoid, 10 classes",
                   zm.mobilenetv3_tiny, seed=102),
        image_spec("efficientnet_tiny", "efficientnet",
                   "torchvision EfficientNet-B0 layout at width 0.25 / depth 0.34: MBConv with SiLU, "
                   "squeeze-excitation (SiLU/sigmoid), depthwise convs, stochastic depth (identity "
                   "in eval), 10 classes",
                   zm.efficientnet_tiny, seed=103),
        image_spec("squeezenet_tiny", "squeezenet",
                   "SqueezeNet 1.1 layout at half width (torchvision Fire modules: squeeze 1x1, "
                   "expand 1x1 + 3x3, concat), ceil-mode maxpools, conv classifier, global avgpool",
                   zm.SqueezeNetTiny, seed=104),
        image_spec("vit_tiny", "vit",
                   "ViT (timm layout): 8x8 patch-embed conv, cls token concat, position embedding "
                   "add, 2 pre-norm blocks (LayerNorm, 4-head attention, erf-GELU MLP), dim 64",
                   zm.ViTTiny, seed=105, hw=32, fan_in_gain=1.0),
        bert_spec("bert_tiny", seed=106, vocab=1000, hidden=64, layers=2, heads=4, inter=256,
                  max_pos=128),
        gpt_spec(),
        image_spec("unet_tiny", "unet",
                   "U-Net, 3 levels: encoder double conv-BN-ReLU + maxpool; decoder upsampling by "
                   "ConvTranspose2d (level 3), bilinear Resize align_corners=False (level 2), "
                   "nearest Resize (level 1), skip concats; 2-class per-pixel logits",
                   zm.UNetTiny, seed=108, hw=32, out=(2, 32, 32)),
        # Large models: --large, written to zoo/generated/ (git-ignored).
        image_spec("resnet50", "resnet", "torchvision resnet50, random weights", zm.resnet50,
                   seed=201, hw=224, out=(1000,), large=True,
                   data_sets=[{"batch": 1}, {"batch": 2}], dim_ranges={"batch": (1, 8, 32)}),
        bert_spec("bert_base", seed=202, large=True, vocab=30522, hidden=768, layers=12, heads=12,
                  inter=3072, max_pos=512, data_sets=[{"batch": 1, "seq": 128}, {"batch": 2, "seq": 64}],
                  dim_ranges={"batch": (1, 8, 32), "seq": (1, 128, 512)}),
    ]
    return specs


def model_dir(spec: ModelSpec) -> str:
    return os.path.join(GENERATED_DIR if spec.large else ZOO_DIR, spec.name)


# --------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------


def build_model(spec: ModelSpec) -> torch.nn.Module:
    torch.manual_seed(spec.seed)
    model = spec.build()
    calibrate = None
    if spec.make_inputs is image_inputs:
        # BatchNorm statistics measured on 4 batches of 8 inputs like the test inputs.
        rng = np.random.default_rng(spec.seed + 1000)
        shape = concrete(spec.inputs[0].shape, {**spec.data_sets[0], "batch": 8})
        calibrate = lambda _: torch.from_numpy(random_image(rng, shape))
    zm.randomize_(model, spec.seed, fan_in_gain=spec.fan_in_gain, calibrate=calibrate)
    return model.eval()


def dynamic_axes(tensors: Sequence[TensorSpec]):
    return {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in tensors}


def tensor_info(t: TensorSpec):
    return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}


def op_counts(model: onnx.ModelProto) -> Dict[str, int]:
    c = collections.Counter(n.op_type for n in model.graph.node)
    return dict(sorted(c.items()))


def to_json(v, indent: int = 0) -> str:
    """json.dumps(indent=2), except that lists of scalars (shapes) stay on one line."""
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(v, dict) and v:
        items = [f"{inner}{json.dumps(k)}: {to_json(x, indent + 2)}" for k, x in v.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(v, list) and any(isinstance(x, (dict, list)) for x in v):
        return "[\n" + ",\n".join(inner + to_json(x, indent + 2) for x in v) + "\n" + pad + "]"
    return json.dumps(v)


def export_one(spec: ModelSpec) -> None:
    out = model_dir(spec)
    print(f"[export] {spec.name} -> {os.path.relpath(out, REPO_ROOT)}", flush=True)
    model = build_model(spec)
    rng = np.random.default_rng(spec.seed)
    sets = [spec.make_inputs(rng, dims, spec) for dims in spec.data_sets]

    example = tuple(torch.from_numpy(a) for a in sets[0])
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # PRESERVE (with the model in eval mode) exports inference-mode BatchNormalization nodes
        # instead of letting the exporter fold them into the convs: kiln's own Conv+BN folding
        # is one of the things this zoo tests. torch warns about folding; nothing is lost here.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, example, buf, opset_version=OPSET, do_constant_folding=True,
            training=torch.onnx.TrainingMode.PRESERVE,
            input_names=[t.name for t in spec.inputs], output_names=[t.name for t in spec.outputs],
            dynamic_axes={**dynamic_axes(spec.inputs), **dynamic_axes(spec.outputs)})
    proto = onnx.load_from_string(buf.getvalue())
    if spec.post_process:
        proto = spec.post_process(proto)
    onnx.checker.check_model(proto, full_check=True)

    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    onnx.save(proto, os.path.join(out, "model.onnx"))

    data_sets = []
    with torch.no_grad():
        for k, (dims, arrays) in enumerate(zip(spec.data_sets, sets)):
            outs = model(*(torch.from_numpy(a) for a in arrays))
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            outs = [o.detach().numpy().astype(np.float32) for o in outs]
            d = os.path.join(out, f"test_data_set_{k}")
            os.makedirs(d)
            for tensors, specs, kind in ((arrays, spec.inputs, "input"), (outs, spec.outputs, "output")):
                for i, (a, t) in enumerate(zip(tensors, specs)):
                    assert a.shape == concrete(t.shape, dims), (t.name, a.shape, dims)
                    with open(os.path.join(d, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(numpy_helper.from_array(a, t.name).SerializeToString())
            data_sets.append({
                "name": f"test_data_set_{k}", "dims": dims,
                "inputs": {t.name: list(a.shape) for t, a in zip(spec.inputs, arrays)},
                "outputs": {t.name: list(a.shape) for t, a in zip(spec.outputs, outs)},
            })

    profile = {}
    for t in spec.inputs:
        profile[t.name] = {k: [spec.dim_ranges[d][j] if isinstance(d, str) else d for d in t.shape]
                           for j, k in enumerate(("min", "opt", "max"))}
    info = {
        "name": spec.name,
        "family": spec.family,
        "description": spec.description,
        "opset": OPSET,
        "ir_version": proto.ir_version,
        "exported_with": {"torch": torch.__version__.split("+")[0], "onnx": onnx.__version__,
                          "do_constant_folding": True,
                          "training_mode": "PRESERVE (model in eval mode; the exporter does not fold "
                                           "BatchNormalization into Conv)"},
        "inputs": [tensor_info(t) for t in spec.inputs],
        "outputs": [tensor_info(t) for t in spec.outputs],
        "dynamic_dims": {d: dict(zip(("min", "opt", "max"), r)) for d, r in spec.dim_ranges.items()},
        "profile": profile,
        "param_count": sum(p.numel() for p in model.parameters()),
        "tolerance": {"fp32": {"metric": "relative_l2", "max": FP32_REL_L2_TOL}},
        "test_data_sets": data_sets,
        "op_types": op_counts(proto),
        "notes": spec.notes,
    }
    with open(os.path.join(out, "info.json"), "w") as f:
        f.write(to_json(info) + "\n")
    size = os.path.getsize(os.path.join(out, "model.onnx"))
    # How much the outputs depend on the input: spread across the batch relative to the
    # overall spread (near 0 would mean the references test little more than the biases).
    sens = min(float(o.std(axis=0).mean() / (o.std() + 1e-30)) for o in outs)
    print(f"[export] {spec.name}: {info['param_count']} params, model.onnx {size / 1e6:.2f} MB, "
          f"{len(proto.graph.node)} nodes, input sensitivity {sens:.2f}", flush=True)


# --------------------------------------------------------------------------------------
# Check and list
# --------------------------------------------------------------------------------------


def present_dirs(specs: Sequence[ModelSpec]) -> List[Tuple[ModelSpec, str]]:
    return [(s, model_dir(s)) for s in specs if os.path.isfile(os.path.join(model_dir(s), "model.onnx"))]


def load_pb(path: str) -> Tuple[str, np.ndarray]:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def sorted_pbs(d: str, kind: str) -> List[str]:
    names = [n for n in os.listdir(d) if n.startswith(kind + "_") and n.endswith(".pb")]
    return [os.path.join(d, n) for n in sorted(names, key=lambda n: int(n[len(kind) + 1:-3]))]


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    den = np.linalg.norm(want)
    return float(np.linalg.norm(got - want) / (den if den > 0 else 1.0))


def check(specs: Sequence[ModelSpec]) -> bool:
    import onnxruntime as ort

    rows, ok = [], True
    for spec, d in present_dirs(specs):
        with open(os.path.join(d, "info.json")) as f:
            tol = json.load(f)["tolerance"]["fp32"]["max"]
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(os.path.join(d, "model.onnx"), so,
                                    providers=["CPUExecutionProvider"])
        out_names = [o.name for o in sess.get_outputs()]
        for ds in sorted(n for n in os.listdir(d) if n.startswith("test_data_set_")):
            feeds = dict(load_pb(p) for p in sorted_pbs(os.path.join(d, ds), "input"))
            wants = dict(load_pb(p) for p in sorted_pbs(os.path.join(d, ds), "output"))
            gots = dict(zip(out_names, sess.run(out_names, feeds)))
            for name, want in wants.items():
                got = gots[name]
                err = rel_l2(got, want) if got.shape == want.shape else float("inf")
                passed = err < tol
                ok &= passed
                shape = "x".join(map(str, want.shape))
                rows.append((spec.name, ds[len("test_data_set_"):], name, shape, f"{err:.2e}",
                             f"{float(np.max(np.abs(got - want))):.2e}" if got.shape == want.shape else "-",
                             "PASS" if passed else "FAIL"))
    header = ("model", "set", "output", "shape", "rel_l2", "max_abs", "result")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    print(line(header))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    print(f"\n{sum(r[-1] == 'PASS' for r in rows)} passed, {sum(r[-1] == 'FAIL' for r in rows)} failed"
          f" (onnxruntime {ort.__version__}, CPUExecutionProvider, relative L2 < {FP32_REL_L2_TOL:g})")
    if not rows:
        print("no models found; export first")
        return False
    return ok


def list_ops(specs: Sequence[ModelSpec]) -> None:
    print("| model | nodes | op types (count) |")
    print("|---|---|---|")
    union = collections.Counter()
    for spec, d in present_dirs(specs):
        proto = onnx.load(os.path.join(d, "model.onnx"), load_external_data=False)
        counts = op_counts(proto)
        union.update(counts.keys())
        ops = ", ".join(f"{k} ({v})" for k, v in counts.items())
        print(f"| {spec.name} | {len(proto.graph.node)} | {ops} |")
    print(f"\nAll op types ({len(union)}): {', '.join(sorted(union))}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--large", action="store_true",
                    help="export the large models (resnet50, bert_base) into zoo/generated/")
    ap.add_argument("--check", action="store_true",
                    help="check every exported model with onnxruntime against its references")
    ap.add_argument("--list-ops", action="store_true", help="print the op types of each exported model")
    ap.add_argument("--models", default="", help="comma-separated subset of model names")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # deterministic references, gentle on a shared machine
    specs = all_specs()
    if args.models:
        wanted = set(args.models.split(","))
        unknown = wanted - {s.name for s in specs}
        if unknown:
            ap.error(f"unknown models: {', '.join(sorted(unknown))}")
        specs = [s for s in specs if s.name in wanted]

    if args.check or args.list_ops:
        if args.list_ops:
            list_ops(specs)
        if args.check:
            return 0 if check(specs) else 1
        return 0

    for spec in specs:
        if spec.large == args.large or (args.models and spec.name in args.models.split(",")):
            export_one(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
