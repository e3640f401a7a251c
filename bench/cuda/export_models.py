#!/usr/bin/env python3
"""Exports the GPU benchmark's models to ONNX with a dynamic batch (run on the GPU machine, torch
2.11): ResNet-50 (torchvision, 224x224), BERT-base (transformers BertModel, seq 128) and GPT-2
small (GPT2Model, seq 128), all from their configs with seeded random weights (no download).

  python3 bench/cuda/export_models.py --out DIR [--models resnet50,bert_base,gpt2] [--batches 1,32]

Writes DIR/<model>/model.onnx, DIR/<model>/b<B>/<input>.pb (TensorProto inputs, never all zero)
and DIR/<model>/info.json (inputs, outputs, kiln profile spec per batch). bench_vs_torch.py
rebuilds the same PyTorch modules with make_model() (same seed, same weights) to time them.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

SEQ = 128
MODELS = ("resnet50", "bert_base", "gpt2")


class _LastHidden(torch.nn.Module):
    """Keeps only last_hidden_state: one output, the tensor every consumer of these models uses."""

    def __init__(self, inner, with_mask):
        super().__init__()
        self.inner = inner
        self.with_mask = with_mask

    def forward(self, input_ids, attention_mask=None):
        if self.with_mask:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        # An all-ones mask rather than none: without one, newer transformers look for packed
        # sequences in the position ids with torch.diff, which the ONNX exporter cannot export.
        ones = torch.ones_like(input_ids)
        return self.inner(input_ids=input_ids, attention_mask=ones).last_hidden_state


def make_model(name, attn="eager"):
    """The module (eval mode, FP32, CPU) with deterministic weights. `attn` picks transformers'
    attention implementation: "eager" exports plain MatMul/Softmax, "sdpa" is PyTorch's fastest."""
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        return torchvision.models.resnet50(weights=None).eval()
    if name == "bert_base":
        from transformers import BertConfig, BertModel

        cfg = BertConfig()  # bert-base-uncased's shape: 12 layers, 768 hidden, 12 heads
        cfg._attn_implementation = attn
        return _LastHidden(BertModel(cfg, add_pooling_layer=False), with_mask=True).eval()
    if name == "gpt2":
        from transformers import GPT2Config, GPT2Model

        cfg = GPT2Config(use_cache=False)  # GPT-2 small: 12 layers, 768 hidden, 12 heads
        cfg._attn_implementation = attn
        return _LastHidden(GPT2Model(cfg), with_mask=False).eval()
    raise ValueError(f"unknown model {name}")


def input_specs(name):
    """[(input name, shape without batch, dtype, sampler)]"""
    if name == "resnet50":
        return [("input", (3, 224, 224), np.float32)]
    if name == "bert_base":
        return [("input_ids", (SEQ,), np.int64), ("attention_mask", (SEQ,), np.int64)]
    return [("input_ids", (SEQ,), np.int64)]


def make_inputs(name, batch, seed=1):
    """Inputs as numpy arrays, never all zero: images ~N(0,1), token ids over the vocabulary, the
    attention mask all ones except some padding at the end of odd rows."""
    rng = np.random.default_rng(seed + batch)
    out = {}
    for inp, shape, dtype in input_specs(name):
        full = (batch,) + shape
        if inp == "input":
            out[inp] = rng.standard_normal(full).astype(np.float32)
        elif inp == "input_ids":
            out[inp] = rng.integers(1, 30000 if name == "bert_base" else 50000, full).astype(np.int64)
        else:
            m = np.ones(full, np.int64)
            m[1::2, SEQ - 16:] = 0
            out[inp] = m
    return out


def output_name(name):
    return "logits" if name == "resnet50" else "last_hidden_state"


def export(name, out_dir, batches):
    import onnx
    from onnx import numpy_helper

    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model = make_model(name, attn="eager")
    names = [n for n, _, _ in input_specs(name)]
    sample = make_inputs(name, 2)
    args = tuple(torch.from_numpy(sample[n]) for n in names)
    dyn = {n: {0: "batch"} for n in names}
    dyn[output_name(name)] = {0: "batch"}
    t0 = time.time()
    path = os.path.join(d, "model.onnx")
    # The TorchScript exporter (dynamo=False on torch 2.x, the only one on 1.x): dynamic_axes and
    # a plain opset-17 graph of the ops kiln fuses.
    kw = {"dynamo": False} if int(torch.__version__.split(".")[0]) >= 2 else {}
    with torch.no_grad():
        torch.onnx.export(model, args, path, input_names=names, output_names=[output_name(name)],
                          dynamic_axes=dyn, opset_version=17, do_constant_folding=True, **kw)
    export_s = time.time() - t0
    info = {"name": name, "inputs": [], "output": output_name(name), "export_s": export_s,
            "torch": torch.__version__, "onnx": onnx.__version__, "profiles": {}}
    for n, shape, dtype in input_specs(name):
        info["inputs"].append({"name": n, "shape": ["batch"] + list(shape),
                               "dtype": np.dtype(dtype).name})
    for b in batches:
        bd = os.path.join(d, f"b{b}")
        os.makedirs(bd, exist_ok=True)
        for n, arr in make_inputs(name, b).items():
            t = numpy_helper.from_array(arr, n)
            with open(os.path.join(bd, f"{n}.pb"), "wb") as f:
                f.write(t.SerializeToString())
        # A static profile per batch: each engine is tuned for exactly the shape it is timed at.
        info["profiles"][str(b)] = " ".join(
            f"{n}:{'x'.join(str(v) for v in (b,) + tuple(s))}" for n, s, _ in input_specs(name))
    with open(os.path.join(d, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"exported {name} in {export_s:.1f} s -> {path}", flush=True)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,32")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",") if b]
    rc = 0
    for name in [m for m in a.models.split(",") if m]:
        try:
            export(name, a.out, batches)
        except Exception as e:  # one model failing must not stop the others
            print(f"export of {name} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
