"""Conformance cases from small torch-2.x modules: the exporters' forms of common blocks.

Writes OUT/<block>_<ts|dynamo>/model.onnx with test_data_set_0 and _1 (the batches in $BATCHES,
default 2,3: a dynamic batch; BATCHES=3,3 gives a static profile, where kiln's attention layout
rewrites apply) and torch's FP32 outputs, for `kiln conformance OUT`. Blocks: torchvision's
VisionTransformer, nn.MultiheadAttention batch_first and sequence-first, with a causal mask,
nn.TransformerEncoder both ways. Weights random (seeded), none zero-initialised.

    python3 bench/blocks/torch_blocks.py OUT [vit,mha_bf,...]   # needs torch >= 2.5 and onnxscript
    kiln conformance OUT --rel-l2 1e-4
"""
import os, sys, torch, torchvision
from onnx import numpy_helper
out = sys.argv[1]
torch.manual_seed(0)
class MHA(torch.nn.Module):
    def __init__(s, batch_first=True, kdim=None):
        super().__init__(); s.bf = batch_first
        s.a = torch.nn.MultiheadAttention(64, 4, batch_first=batch_first)
    def forward(s, x):
        return s.a(x, x, x, need_weights=False)[0]
class MHACausal(MHA):
    def forward(s, x):
        n = x.shape[1]
        m = torch.triu(torch.full((n, n), float("-inf")), 1)
        return s.a(x, x, x, attn_mask=m, need_weights=False)[0]
class Enc(torch.nn.Module):
    def __init__(s, bf):
        super().__init__(); s.e = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=bf, dropout=0.0), 2, enable_nested_tensor=False)
    def forward(s, x): return s.e(x)
models = {
  "vit": (lambda: torchvision.models.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128), (3, 64, 64), 0),
  "mha_bf": (lambda: MHA(True), (10, 64), 0),
  "mha_sf": (lambda: MHA(False), (10, 64), 1),
  "mha_causal": (lambda: MHACausal(True), (10, 64), 0),
  "enc_bf": (lambda: Enc(True), (12, 64), 0),
  "enc_sf": (lambda: Enc(False), (12, 64), 1),
}
only = sys.argv[2].split(",") if len(sys.argv) > 2 else list(models)
for name in only:
    make, shape, bdim = models[name]
    m = make().eval()
    for prm in m.parameters():  # torchvision zero-initialises some (ViT's head): make all count
        if prm.dim() >= 1: torch.nn.init.normal_(prm, std=0.2)
    def inp(b):
        s = list(shape); s.insert(bdim, b); return torch.randn(*s)
    for ex in ["ts", "dynamo"]:
        d = os.path.join(out, f"{name}_{ex}"); os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "model.onnx"); x = inp(2)
        try:
            if ex == "ts":
                torch.onnx.export(m, (x,), p, input_names=["x"], output_names=["y"],
                    dynamic_axes={"x": {bdim: "b"}, "y": {bdim: "b"}}, opset_version=17,
                    do_constant_folding=True, dynamo=False)
            else:
                b = torch.export.Dim("b", min=1, max=1024)
                torch.onnx.export(m, (x,), p, input_names=["x"], output_names=["y"],
                    dynamic_shapes=({bdim: b},), dynamo=True)
        except Exception as e:
            print("FAILED", d, repr(e)[:200]); continue
        for i, bsz in enumerate([int(b) for b in os.environ.get("BATCHES", "2,3").split(",")]):
            t = os.path.join(d, f"test_data_set_{i}"); os.makedirs(t, exist_ok=True)
            xi = inp(bsz)
            with torch.no_grad(): yi = m(xi)
            open(os.path.join(t, "input_0.pb"), "wb").write(numpy_helper.from_array(xi.numpy(), "x").SerializeToString())
            open(os.path.join(t, "output_0.pb"), "wb").write(numpy_helper.from_array(yi.numpy(), "y").SerializeToString())
        print("case", d)
