#!/usr/bin/env python3
"""The model-family suite of issue 25: kiln FP16 engines against PyTorch eager, torch.compile
default and torch.compile(mode="reduce-overhead") on 16 models, each exported with the
TorchScript exporter and the dynamo exporter, batch 1 and 32, in one run on the GPU machine.

  source scripts/gpu_env.sh
  python3 bench/cuda/suite.py --kiln .bundle/bin/kiln --out $OUT/suite.json \
      [--models convnext_t,llama] [--exporters ts,dynamo] [--batches 1,32] \
      [--modes eager,default,reduce-overhead] [--deadline 60] [--budget 540] \
      [--resume bench/results/suite.json] [--iterations 50] [--device cuda|cpu]
      [--layers-dir $OUT/layers] [--build-variants] [--quant int8,fp8]
  python3 bench/cuda/suite.py --table suite.json       # the markdown table only

For each model: seeded random weights (torchvision constructors, transformers models from their
configs; nothing is downloaded; BatchNorm statistics measured on seeded inputs, as training
would have set them), both exports (an exporter failure is a row, not a crash), the
PyTorch FP32 reference per batch; per export and batch a kiln engine (`kiln build --backend cuda
--fp16 --deadline D`, a static profile for exactly that batch) whose output is checked against the
FP32 reference (relative L2 <= 2e-2) before it is timed (`kiln run --json`: CUDA events around
the whole enqueue, a graph replay); per batch PyTorch FP16 (sdpa attention, channels-last CNNs)
eager, compile default and reduce-overhead, timed with CUDA events (median of >= 50 after
warm-up), with their compile times. Export, kiln build and torch.compile seconds are recorded
beside the times.

The device gives 10 minutes per call: pick models with --models, bound the whole run with
--budget (no model is started past it; the JSON is rewritten after every row) and carry the last
JSON back with --resume: rows already measured there are kept and not measured again (--redo
measures them anyway; rows where kiln failed are always tried again). --device cpu (kiln's CPU
backend, FP32, PyTorch eager only) checks the script's own logic on a machine without a GPU;
torch 1.x has only the TorchScript exporter.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import torch

FP16_TOL = 2e-2  # relative L2 of an FP16 engine against the FP32 reference
FP16_SENSITIVE_FACTOR = 1.5  # kiln vs PyTorch's own FP16 error where that is above FP16_TOL
FP32_TOL = 1e-3
SEQ = 128


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------
# Models. Each entry: family, constructor (attn -> eval FP32 module), inputs (name, shape without
# batch, kind), output name. Transformers models keep one output (last_hidden_state).


class _Hidden(torch.nn.Module):
    """Keeps the last hidden state of a transformers model: one output, the tensor every consumer
    of these models uses. Without an attention mask an all-ones one is passed (newer transformers
    otherwise look for packed sequences with torch.diff, which the TorchScript exporter lacks)."""

    def __init__(self, inner, kind):
        super().__init__()
        self.inner = inner
        self.kind = kind

    def forward(self, x, attention_mask=None):
        if self.kind == "pixels":
            return self.inner(pixel_values=x).last_hidden_state
        if self.kind == "features":
            return self.inner(input_features=x).last_hidden_state
        if attention_mask is None:
            attention_mask = torch.ones_like(x)
        return self.inner(input_ids=x, attention_mask=attention_mask).last_hidden_state


def _tv(name):
    def make(attn):
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    return make


def hf_model(config_cls, model_cls, attn, get=None, **cfg):
    """A transformers model from its config class and keyword arguments (random weights, nothing
    downloaded), with the attention implementation `attn`; `get` names a part (get_encoder)."""
    import transformers

    c = getattr(transformers, config_cls)(**cfg)
    c._attn_implementation = attn
    m = getattr(transformers, model_cls)(c)
    return getattr(m, get)() if get else m


def _hf(config_cls, model_cls, kind, get=None, **cfg):
    def make(attn):
        return _Hidden(hf_model(config_cls, model_cls, attn, get, **cfg), kind)
    return make


IMAGE = [("input", (3, 224, 224), "image")]
TOKENS_MASK = [("input_ids", (SEQ,), "ids"), ("attention_mask", (SEQ,), "mask")]
TOKENS = [("input_ids", (SEQ,), "ids")]

MODELS = {
    "resnet50": ("cnn", _tv("resnet50"), IMAGE, "logits", {}),
    "efficientnet_b0": ("cnn", _tv("efficientnet_b0"), IMAGE, "logits", {}),
    "mobilenet_v3_large": ("cnn", _tv("mobilenet_v3_large"), IMAGE, "logits", {}),
    "convnext_t": ("cnn", _tv("convnext_tiny"), IMAGE, "logits", {}),
    "regnet_y_1_6gf": ("cnn", _tv("regnet_y_1_6gf"), IMAGE, "logits", {}),
    "vit_b_16": ("vision-transformer", _tv("vit_b_16"), IMAGE, "logits", {}),
    "swin_t": ("vision-transformer", _tv("swin_t"), IMAGE, "logits", {}),
    # CLIP ViT-B/16's vision tower (transformers, from its config).
    "clip_vit_b16": ("vision-transformer",
                     _hf("CLIPVisionConfig", "CLIPVisionModel", "pixels", patch_size=16),
                     [("pixel_values", (3, 224, 224), "image")], "last_hidden_state", {}),
    "bert_base": ("encoder", _hf("BertConfig", "BertModel", "ids"), TOKENS_MASK,
                  "last_hidden_state", {"vocab": 30522}),
    "distilbert": ("encoder", _hf("DistilBertConfig", "DistilBertModel", "ids"), TOKENS_MASK,
                   "last_hidden_state", {"vocab": 30522}),
    "roberta_base": ("encoder", _hf("RobertaConfig", "RobertaModel", "ids", vocab_size=50265,
                                    max_position_embeddings=514, pad_token_id=1),
                     TOKENS_MASK, "last_hidden_state", {"vocab": 50265, "min_id": 3}),
    "gpt2": ("decoder", _hf("GPT2Config", "GPT2Model", "ids", use_cache=False), TOKENS,
             "last_hidden_state", {"vocab": 50257}),
    # A Llama-style decoder: RMSNorm, RoPE, SwiGLU, grouped-query attention (12 heads, 4 KV).
    "llama_768": ("decoder", _hf("LlamaConfig", "LlamaModel", "ids", hidden_size=768,
                                 intermediate_size=2048, num_hidden_layers=12,
                                 num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                                 max_position_embeddings=2048, use_cache=False),
                  TOKENS, "last_hidden_state", {"vocab": 32000}),
    # T5-base's encoder (relative position buckets, RMS-style T5LayerNorm, ReLU feed-forward).
    "t5_base_encoder": ("encoder", _hf("T5Config", "T5EncoderModel", "ids", d_model=768,
                                       d_ff=3072, num_layers=12, num_heads=12, use_cache=False),
                        TOKENS, "last_hidden_state", {"vocab": 32128}),
    # Whisper-base's encoder: two Conv1d over 80 mel bins x 3000 frames, then 6 attention layers.
    "whisper_base_encoder": ("audio", _hf("WhisperConfig", "WhisperModel", "features",
                                          get="get_encoder", d_model=512, encoder_layers=6,
                                          encoder_attention_heads=8, decoder_layers=1,
                                          decoder_attention_heads=8, encoder_ffn_dim=2048,
                                          decoder_ffn_dim=2048, num_mel_bins=80),
                             [("input_features", (80, 3000), "features")], "last_hidden_state",
                             {}),
}
CNN_LAST = {"cnn"}  # families timed channels-last in PyTorch (its fastest layout for them)


def make_model(name, attn="eager"):
    torch.manual_seed(0)
    m = MODELS[name][1](attn).eval()
    # Some constructors zero a layer on purpose (torchvision's ViT head): the output would then be
    # all zeros and the check against the reference vacuous. Such weights get seeded values.
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    calibrate_batch_norm(name, m)
    return m


def calibrate_batch_norm(name, m, passes=4, batch=8):
    """Sets BatchNorm's running statistics from seeded inputs, as training would have.

    A freshly constructed network's BatchNorm layers are identities (mean 0, variance 1), and in
    deep CNNs with squeeze-excitation the activations then shrink layer by layer: torchvision's
    EfficientNet-B0 ends near 1e-13 and MobileNetV3-Large near 1e-8, below what FP16 can hold,
    so every FP16 engine (and PyTorch's own FP16) would be "wrong" against the FP32 reference.
    With the statistics measured, activations stay in a trained network's range (checked:
    0.01-2 through every block of both)."""
    bns = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns or any(kind not in ("image", "features") for _, _, kind in input_specs(name)):
        return
    momenta = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a cumulative average over the passes
    g = torch.Generator().manual_seed(2)
    m.train()
    with torch.no_grad():
        for _ in range(passes):
            m(*(torch.randn((batch,) + shape, generator=g) for _, shape, _ in input_specs(name)))
    m.eval()
    for bn, mom in zip(bns, momenta):
        bn.momentum = mom


def input_specs(name):
    return MODELS[name][2]


def output_name(name):
    return MODELS[name][3]


def make_inputs(name, batch, seed=1):
    """Inputs as numpy arrays, never all zero: images and features ~N(0,1), token ids over the
    vocabulary, masks all ones except some padding at the end of odd rows."""
    rng = np.random.default_rng(seed + batch)
    extra = MODELS[name][4]
    out = {}
    for inp, shape, kind in input_specs(name):
        full = (batch,) + shape
        if kind in ("image", "features"):
            out[inp] = rng.standard_normal(full).astype(np.float32)
        elif kind == "ids":
            out[inp] = rng.integers(extra.get("min_id", 1), extra["vocab"], full).astype(np.int64)
        else:
            m = np.ones(full, np.int64)
            m[1::2, SEQ - 16:] = 0
            out[inp] = m
    return out


# ---------------------------------------------------------------------------------------------
# Export.


def _torch_major():
    return int(torch.__version__.split(".")[0])


def export(name, exporter, model, out_dir, sample):
    """Writes out_dir/model.onnx with a dynamic batch; returns seconds. Raises on failure."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    names = [n for n, _, _ in input_specs(name)]
    args = tuple(torch.from_numpy(sample[n]) for n in names)
    out = output_name(name)
    t0 = time.time()
    # Not under no_grad: there nn.MultiheadAttention takes its fused fast path
    # (aten::_native_multi_head_attention), which the TorchScript exporter cannot export (ViT).
    if exporter == "ts":
        kw = {"dynamo": False} if _torch_major() >= 2 else {}
        dyn = {n: {0: "batch"} for n in names + [out]}
        torch.onnx.export(model, args, path, input_names=names, output_names=[out],
                          dynamic_axes=dyn, opset_version=17, do_constant_folding=True, **kw)
    elif exporter == "dynamo":
        if _torch_major() < 2:
            raise RuntimeError(f"torch {torch.__version__} has no dynamo exporter")
        batch = torch.export.Dim("batch", min=1, max=1024)
        dyn = tuple({0: batch} for _ in names)
        # What a user gets from torch.onnx.export by default on torch 2.x (opset 18).
        torch.onnx.export(model, args, path, input_names=names, output_names=[out],
                          dynamic_shapes=dyn, dynamo=True)
    else:
        raise ValueError(f"unknown exporter {exporter}")
    if not os.path.exists(path):
        raise RuntimeError("the exporter wrote no model.onnx")
    return time.time() - t0


def write_inputs(feed, d):
    from onnx import numpy_helper

    os.makedirs(d, exist_ok=True)
    for n, arr in feed.items():
        with open(os.path.join(d, f"{n}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(arr, n).SerializeToString())


# ---------------------------------------------------------------------------------------------
# kiln.


def rel_l2(a, b):
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    if a.shape != b.shape:
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def first_error(p):
    lines = (p.stderr or p.stdout or "").strip().splitlines()
    for ln in lines:
        if "KILN-E" in ln:
            return ln.strip()[:300]
    return (lines[0] if lines else f"rc {p.returncode}")[:300]


def kiln_build(a, onnx_path, engine, profile, cache, report, extra=()):
    cmd = [a.kiln, "build", onnx_path, "-o", engine, "--backend", a.device, "--profile"]
    cmd += profile.split() + ["--timing-cache", cache, "--deadline", f"{a.deadline}s",
                              "--report", report] + list(extra)
    if a.device == "cuda":
        cmd.append("--fp16")
    # cuDNN's runtime-compiled plans go with the timing cache: a build with a fresh timing cache
    # is cold for both (compiles its plans), one with a used cache is warm for both.
    env = dict(os.environ, KILN_CUDNN_PLAN_CACHE=cache + ".plans")
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.deadline * 3 + 60,
                           env=env)
    except subprocess.TimeoutExpired:
        return time.time() - t0, f"kiln build ran past {a.deadline * 3 + 60} s"
    return time.time() - t0, (None if p.returncode == 0 else first_error(p))


def kiln_run(a, name, engine, input_dir, outdir):
    shutil.rmtree(outdir, ignore_errors=True)
    warmup = "10" if a.device == "cuda" else "1"
    cmd = [a.kiln, "run", engine, "--json", "--warmup", warmup, "--iterations", str(a.iterations),
           "--duration", "0", "--save-outputs", outdir]
    if a.layers_dir:
        # Per-layer GPU times (eager, one event pair per layer): where the time goes.
        cmd += ["--layer-iterations", "5"]
    for n, _, _ in input_specs(name):
        cmd += ["--input", f"{n}={os.path.join(input_dir, n + '.pb')}"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.run_timeout)
    except subprocess.TimeoutExpired:
        return None, None, f"kiln run ran past {a.run_timeout} s"
    if p.returncode != 0:
        return None, None, first_error(p)
    j = json.loads(p.stdout)
    f = os.path.join(outdir, re.sub(r"[^A-Za-z0-9_-]", "_", output_name(name)) + ".npy")
    return j, (np.load(f) if os.path.exists(f) else None), None


def kiln_row(a, name, exporter, batch, export_dir, ref, feed, work):
    """Build, check, time one engine; returns the row's kiln fields."""
    row = {}
    in_dir = os.path.join(work, f"in_b{batch}")
    write_inputs(feed, in_dir)
    profile = " ".join(f"{n}:{'x'.join(str(v) for v in (batch,) + tuple(s))}"
                       for n, s, _ in input_specs(name))
    engine = os.path.join(work, f"{exporter}_b{batch}.kiln")
    report = os.path.join(work, f"{exporter}_b{batch}_build.json")
    build_s, err = kiln_build(a, os.path.join(export_dir, "model.onnx"), engine, profile,
                              os.path.join(work, f"{exporter}.timing_cache"), report)
    row["kiln_build_s"] = round(build_s, 2)
    if err:
        row["kiln_error"] = f"build: {err}"
        return row
    try:
        rep = json.load(open(report))
        layers = rep.get("layers")
        row["kiln_layers"] = len(layers) if isinstance(layers, list) else layers
        row["kiln_build_report_s"] = rep.get("build_seconds")
        row["kiln_deadline_hit"] = rep.get("deadline_hit")
        # Where the build's seconds went (issue 19): phases, and inside tactics the timing share.
        row["kiln_build_phases_s"] = rep.get("phase_seconds")
        tb = rep.get("time_breakdown") or {}
        sigs = tb.get("signatures") or []
        row["kiln_build_timing_s"] = round(sum(s.get("timing_seconds", 0) for s in sigs), 3)
        row["kiln_build_signatures"] = len(sigs)
        if a.layers_dir:
            os.makedirs(a.layers_dir, exist_ok=True)
            shutil.copy(report, os.path.join(a.layers_dir, f"{name}_{exporter}_b{batch}_build.json"))
    except (OSError, ValueError):
        pass
    j, out, err = kiln_run(a, name, engine, in_dir, os.path.join(work, f"out_{exporter}_b{batch}"))
    if err:
        row["kiln_error"] = f"run: {err}"
        return row
    if a.layers_dir and j.get("layers"):
        os.makedirs(a.layers_dir, exist_ok=True)
        with open(os.path.join(a.layers_dir, f"{name}_{exporter}_b{batch}_layers.json"), "w") as f:
            json.dump({"model": name, "exporter": exporter, "batch": batch,
                       "layers": j["layers"]}, f)
    tol = FP16_TOL if a.device == "cuda" else FP32_TOL
    e = rel_l2(out, ref) if out is not None else float("inf")
    row["kiln_rel_l2_vs_torch_fp32"] = e if math.isfinite(e) else None
    row["kiln_correct"] = bool(e <= tol)
    row["kiln_ms"] = j["compute_ms"]["median"]
    row["kiln_latency_ms"] = j["latency_ms"]["median"]
    row["kiln_cuda_graph"] = j.get("cuda_graph")
    row["kiln_max_kernel_ms"] = j.get("max_kernel_ms")
    if a.build_variants:
        row.update(build_variants(a, name, exporter, batch, export_dir, profile, work, in_dir,
                                  ref, tol))
    for q in a.quant:
        row.update(quant_variant(a, name, exporter, batch, export_dir, profile, work, in_dir, ref,
                                 q))
    return row


QUANT_TOL = 5e-2  # issue 22's bar: INT8/FP8 engines within relative L2 5e-2 of FP32
# The quantized builds --quant names: fp8-noedges is FP8 with FP16 between FP8 products (kiln
# build --no-fp8-edges), the reference for what the FP8 edges save; fp8-all and int8-all keep
# every layer that has a kernel quantized (the sensitivity fallbacks and the race against the
# float tactics off), int8-all-noedges is int8-all without INT8 edges and copies (what they
# save); int8 and fp8 are what a user gets by default.
QUANT_FLAGS = {"int8": ["--int8"], "fp8": ["--fp8"],
               "fp8-noedges": ["--fp8", "--no-fp8-edges"],
               "fp8-all": ["--fp8", "--fp8-tolerance", "off", "--quantized-if-faster", "off"],
               "int8-all": ["--int8", "--int8-tolerance", "off", "--quantized-if-faster", "off"],
               "int8-all-noedges": ["--int8", "--int8-tolerance", "off", "--quantized-if-faster",
                                    "off", "--no-int8-edges"]}


def quant_variant(a, name, exporter, batch, export_dir, profile, work, in_dir, ref, q):
    """Issue 22's INT8 or FP8 engine of the same export and batch: calibrated on
    --calib-sets seeded inputs of the batch (never the timed input), checked against the FP32
    reference before it is timed; the build report's precision counts say how many layers run
    quantized and how many stayed FP16."""
    row = {}
    calib = os.path.join(work, f"calib_b{batch}")
    if not os.path.isdir(calib):
        for k in range(a.calib_sets):
            feed = make_inputs(name, batch, seed=1000 + k)
            d = os.path.join(calib, f"test_data_set_{k}")
            os.makedirs(d, exist_ok=True)
            for i, (n, _, _) in enumerate(input_specs(name)):
                write_inputs({f"input_{i}": feed[n]}, d)
    engine = os.path.join(work, f"{exporter}_b{batch}_{q}.kiln")
    report = os.path.join(work, f"{exporter}_b{batch}_{q}.json")
    build_s, err = kiln_build(a, os.path.join(export_dir, "model.onnx"), engine, profile,
                              os.path.join(work, f"{exporter}_{q}.timing_cache"), report,
                              extra=QUANT_FLAGS[q] + ["--calib-dir", calib])
    row[f"kiln_{q}_build_s"] = round(build_s, 2)
    if err:
        row[f"kiln_{q}_error"] = f"build: {err}"
        return row
    try:
        rep = json.load(open(report))
        row[f"kiln_{q}_precision_counts"] = rep.get("precision", {}).get("counts")
        row[f"kiln_{q}_calibration_s"] = rep.get("phase_seconds", {}).get("precision")
        row[f"kiln_{q}_fp8_edges"] = rep.get("precision", {}).get("fp8_edges")
        row[f"kiln_{q}_int8_edges"] = rep.get("precision", {}).get("int8_edges")
        row[f"kiln_{q}_calibration"] = rep.get("precision", {}).get("calibration")
    except (OSError, ValueError):
        pass
    if a.calib_compare:
        # The same build with calibration on the CPU reference: the device calibration's speed-up
        # as a ratio in the same run, and its engine checked like the other.
        cpu_engine = os.path.join(work, f"{exporter}_b{batch}_{q}_calib_cpu.kiln")
        cpu_report = os.path.join(work, f"{exporter}_b{batch}_{q}_calib_cpu.json")
        _, cerr = kiln_build(a, os.path.join(export_dir, "model.onnx"), cpu_engine, profile,
                             os.path.join(work, f"{exporter}_{q}.timing_cache"), cpu_report,
                             extra=QUANT_FLAGS[q] + ["--calib-dir", calib, "--calib-on-cpu"])
        if cerr:
            row[f"kiln_{q}_calib_cpu_error"] = cerr
        else:
            crep = json.load(open(cpu_report))
            row[f"kiln_{q}_calibration_cpu_s"] = crep.get("phase_seconds", {}).get("precision")
            row[f"kiln_{q}_calibration_cpu"] = crep.get("precision", {}).get("calibration")
            row[f"kiln_{q}_precision_counts_calib_cpu"] = crep.get("precision", {}).get("counts")
            _, cout, rerr = kiln_run(a, name, cpu_engine, in_dir,
                                     os.path.join(work, f"out_{exporter}_b{batch}_{q}_calib_cpu"))
            if not rerr and cout is not None:
                row[f"kiln_{q}_rel_l2_calib_cpu"] = rel_l2(cout, ref)
        log(f"  kiln {q} calibration: device {row.get(f'kiln_{q}_calibration_s')} s, CPU "
            f"{row.get(f'kiln_{q}_calibration_cpu_s')} s")
    j, out, err = kiln_run(a, name, engine, in_dir, os.path.join(work, f"out_{exporter}_b{batch}_{q}"))
    if err:
        row[f"kiln_{q}_error"] = f"run: {err}"
        return row
    if a.layers_dir and j.get("layers"):
        # Where the quantized engine's time goes, beside the FP16 engine's layers file.
        os.makedirs(a.layers_dir, exist_ok=True)
        with open(os.path.join(a.layers_dir, f"{name}_{exporter}_b{batch}_{q}_layers.json"),
                  "w") as f:
            json.dump({"model": name, "exporter": exporter, "batch": batch, "quant": q,
                       "layers": j["layers"]}, f)
    e = rel_l2(out, ref) if out is not None else float("inf")
    row[f"kiln_{q}_rel_l2_vs_torch_fp32"] = e if math.isfinite(e) else None
    row[f"kiln_{q}_correct"] = bool(e <= QUANT_TOL)
    row[f"kiln_{q}_ms"] = j["compute_ms"]["median"]
    log(f"  kiln {q} {exporter} b{batch}: {row[f'kiln_{q}_ms']:.3f} ms, rel_l2 {e:.2e}, "
        f"layers {row.get(f'kiln_{q}_precision_counts')}")
    return row


def build_variants(a, name, exporter, batch, export_dir, profile, work, in_dir, ref, tol):
    """Issue 19's other two builds of the same engine: warm (the timing cache the cold build just
    wrote) and the widest search (--opt-level 5, its own empty cache), whose engine is checked and
    timed like the default one."""
    row = {}
    onnx_path = os.path.join(export_dir, "model.onnx")
    warm_s, err = kiln_build(a, onnx_path, os.path.join(work, f"{exporter}_b{batch}_warm.kiln"),
                             profile, os.path.join(work, f"{exporter}.timing_cache"),
                             os.path.join(work, f"{exporter}_b{batch}_warm.json"))
    row["kiln_warm_build_s"] = None if err else round(warm_s, 2)
    if err:
        row["kiln_warm_error"] = err
    else:
        # The warm build's own seconds and phases (the wall time above adds process start-up and
        # CUDA initialisation), to tell the bar's "1 s plus reading the weights" apart.
        try:
            with open(os.path.join(work, f"{exporter}_b{batch}_warm.json")) as f:
                rep = json.load(f)
            row["kiln_warm_build_report_s"] = rep.get("build_seconds")
            row["kiln_warm_build_phases_s"] = rep.get("phase_seconds")
        except (OSError, ValueError):
            pass
    engine = os.path.join(work, f"{exporter}_b{batch}_widest.kiln")
    widest_s, err = kiln_build(a, onnx_path, engine, profile,
                               os.path.join(work, f"{exporter}_widest.timing_cache"),
                               os.path.join(work, f"{exporter}_b{batch}_widest.json"),
                               extra=["--opt-level", "5"])
    row["kiln_widest_build_s"] = round(widest_s, 2)
    if err:
        row["kiln_widest_error"] = f"build: {err}"
        return row
    j, out, err = kiln_run(a, name, engine, in_dir,
                           os.path.join(work, f"out_{exporter}_b{batch}_widest"))
    if err:
        row["kiln_widest_error"] = f"run: {err}"
        return row
    e = rel_l2(out, ref) if out is not None else float("inf")
    row["kiln_widest_rel_l2"] = e if math.isfinite(e) else None
    if e <= tol:
        row["kiln_widest_ms"] = j["compute_ms"]["median"]
    else:
        # Judged again beside PyTorch's own FP16 error (ratio_rows), like the default engine.
        row["kiln_widest_unchecked_ms"] = j["compute_ms"]["median"]
        row["kiln_widest_error"] = f"check: rel L2 {e:.2e}"
    return row


# ---------------------------------------------------------------------------------------------
# PyTorch.


def torch_args(name, feed, dtype, device):
    args = []
    for n, _, _ in input_specs(name):
        t = torch.from_numpy(feed[n]).to(device)
        if t.is_floating_point():
            t = t.to(dtype)
            if MODELS[name][0] in CNN_LAST and t.dim() == 4:
                t = t.contiguous(memory_format=torch.channels_last)
        args.append(t)
    return args


def time_fn(fn, iterations, warmup, device):
    """Median (ms) of one call: CUDA events on the GPU, the wall clock on the CPU."""
    for _ in range(warmup):
        fn()
    samples = []
    if device == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for _ in range(iterations):
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(iterations):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(samples))


def torch_rows(a, name, batch, fast, args, compiled):
    """PyTorch FP16 times per mode (and compile seconds: the first calls, warm-up included)."""
    row = {}
    for mode in a.modes:
        try:
            if mode == "eager":
                fn_model = fast
            else:
                if mode not in compiled:
                    kw = {} if mode == "default" else {"mode": mode}
                    compiled[mode] = torch.compile(fast, dynamic=False, **kw)
                fn_model = compiled[mode]

            def call():
                if mode == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                return fn_model(*args)
            with torch.inference_mode():
                t0 = time.time()
                call()
                if a.device == "cuda":
                    torch.cuda.synchronize()
                first_s = time.time() - t0
                warm = (5 if mode == "eager" else 10) if a.device == "cuda" else 1
                med = time_fn(call, a.iterations, warm, a.device)
            row[f"torch_{mode}_ms"] = med
            if mode != "eager":
                row[f"torch_{mode}_compile_s"] = round(first_s, 2)
            log(f"  torch {mode} b{batch}: {med:.3f} ms")
        except Exception as e:  # a failed mode is reported, the rest still runs
            row[f"torch_{mode}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            log(f"  torch {mode} b{batch} failed: {row[f'torch_{mode}_error']}")
    return row


# ---------------------------------------------------------------------------------------------
# The run.


def done(result, model, exporter, batch):
    """Whether the resumed results hold this row. kiln failures are tried again (a new bundle may
    fix them); exporter failures are the exporter's and stay."""
    return any(r.get("model") == model and r.get("exporter") == exporter and
               r.get("batch") == batch and not r.get("kiln_error") for r in result["rows"])


def bench_model(a, name, result, save, t_start):
    family = MODELS[name][0]
    work = os.path.join(a.work, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    todo = [(e, b) for e in a.exporters for b in a.batches if a.redo or not done(result, name, e, b)]
    torch_todo = [b for b in a.batches
                  if a.redo or not done(result, name, "torch", b)] if a.modes else []
    if not todo and not torch_todo:
        log(f"== {name}: all rows in the resumed results")
        return
    log(f"== {name} ({family})")
    # Rows measured again replace the old ones; a failure of the whole model from an earlier run
    # (exporter "-") goes too.
    result["rows"][:] = [r for r in result["rows"]
                         if not (r.get("model") == name and
                                 ((r.get("exporter"), r.get("batch")) in todo or
                                  r.get("exporter") == "-" or
                                  (r.get("exporter") == "torch" and r.get("batch") in torch_todo)))]
    ref_model = make_model(name, attn="eager")
    feeds = {b: make_inputs(name, b) for b in a.batches}
    refs = {}
    dev = a.device
    ref_model = ref_model.to(dev)
    for b in a.batches:
        with torch.inference_mode():
            refs[b] = ref_model(*torch_args(name, feeds[b], torch.float32, dev)).float().cpu().numpy()
        if not np.any(refs[b]):
            raise RuntimeError(f"the FP32 reference output at batch {b} is all zeros: no check")

    # Exports: one per exporter, dynamic batch, from the FP32 CPU module.
    exports = {}
    cpu_model = make_model(name, attn="eager")
    for exporter in a.exporters:
        if not any(e == exporter for e, _ in todo):
            continue
        d = os.path.join(work, f"onnx_{exporter}")
        try:
            exports[exporter] = (d, export(name, exporter, cpu_model, d, make_inputs(name, 2)), None)
            log(f"  export {exporter}: {exports[exporter][1]:.1f} s")
        except Exception as e:  # recorded as rows, never a crash
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            exports[exporter] = (None, None, msg)
            log(f"  export {exporter} failed: {msg}")
    del cpu_model

    for exporter, batch in todo:
        d, export_s, err = exports[exporter]
        row = {"model": name, "family": family, "exporter": exporter, "batch": batch,
               "export_s": round(export_s, 2) if export_s else None}
        if err:
            row["export_error"] = err
        elif a.no_kiln:
            row["kiln_error"] = "not run (--no-kiln)"
        else:
            kwork = os.path.join(work, f"kiln_{exporter}")
            os.makedirs(kwork, exist_ok=True)
            row.update(kiln_row(a, name, exporter, batch, d, refs[batch], feeds[batch], kwork))
            if "kiln_ms" in row:
                log(f"  kiln {exporter} b{batch}: {row['kiln_ms']:.3f} ms, build "
                    f"{row['kiln_build_s']} s, rel_l2 {row['kiln_rel_l2_vs_torch_fp32']:.2e}"
                    f"{'' if row['kiln_correct'] else ' WRONG'}")
            else:
                log(f"  kiln {exporter} b{batch}: {row.get('kiln_error')}")
        result["rows"].append(row)
        save()

    if torch_todo:
        fast_attn = "sdpa" if dev == "cuda" else "eager"
        fast = make_model(name, attn=fast_attn).to(dev)
        dtype = torch.float16 if dev == "cuda" else torch.float32
        fast = fast.to(dtype)
        if family in CNN_LAST:
            fast = fast.to(memory_format=torch.channels_last)
        compiled = {}
        for b in torch_todo:
            args = torch_args(name, feeds[b], dtype, dev)
            row = {"model": name, "family": family, "exporter": "torch", "batch": b}
            with torch.inference_mode():
                row["torch_fp16_rel_l2_vs_fp32"] = rel_l2(fast(*args).float().cpu().numpy(),
                                                          refs[b])
            row.update(torch_rows(a, name, b, fast, args, compiled))
            result["rows"].append(row)
            save()
        del compiled
        if hasattr(torch, "_dynamo"):
            torch._dynamo.reset()
    shutil.rmtree(work, ignore_errors=True)


def ratio_rows(result):
    """One line per (model, exporter, batch) with kiln and PyTorch side by side."""
    torch_by = {(r["model"], r["batch"]): r for r in result["rows"] if r.get("exporter") == "torch"}
    out = []
    for r in result["rows"]:
        if r.get("exporter") == "torch":
            continue
        t = torch_by.get((r["model"], r["batch"]), {})
        m = dict(r)
        for k, v in t.items():
            if k.startswith("torch_"):
                m[k] = v
        # A model whose FP16 run in PyTorch itself is off by more than FP16_TOL (random weights can
        # make it so): kiln's FP16 engine passes when it is off by at most FP16_SENSITIVE_FACTOR
        # times PyTorch's own FP16 error, and the check says why.
        tf16, ke = t.get("torch_fp16_rel_l2_vs_fp32"), r.get("kiln_rel_l2_vs_torch_fp32")
        if (not r.get("kiln_correct") and tf16 is not None and ke is not None and tf16 > FP16_TOL
                and ke <= FP16_SENSITIVE_FACTOR * tf16):
            m["kiln_correct"] = True
            m["fp16_sensitive"] = tf16
        we = r.get("kiln_widest_rel_l2")
        if (r.get("kiln_widest_unchecked_ms") and tf16 is not None and we is not None
                and tf16 > FP16_TOL and we <= FP16_SENSITIVE_FACTOR * tf16):
            m["kiln_widest_ms"] = r["kiln_widest_unchecked_ms"]
            m.pop("kiln_widest_error", None)
        ro = t.get("torch_reduce-overhead_ms")
        if ro and r.get("kiln_ms") and m.get("kiln_correct"):
            m["kiln_over_reduce_overhead"] = r["kiln_ms"] / ro
        out.append(m)
    order = list(MODELS)
    out.sort(key=lambda m: (order.index(m["model"]) if m["model"] in order else 99,
                            m["exporter"], m["batch"]))
    return out


def table(result):
    head = ("model", "exporter", "batch", "kiln ms", "eager ms", "compile ms", "reduce-ovh ms",
            "kiln / r-o", "kiln build s", "compile s (default / r-o)", "check")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(v, p=3):
        return f"{v:.{p}f}" if isinstance(v, (int, float)) else "-"
    rows = ratio_rows(result)
    for m in rows:
        if m.get("error"):
            check = "failed: " + m["error"][:80]
        elif m.get("export_error"):
            check = "export failed: " + m["export_error"][:60]
        elif "kiln_correct" in m:
            check = (f"ok ({m['kiln_rel_l2_vs_torch_fp32']:.1e})" if m["kiln_correct"] else
                     f"WRONG ({m.get('kiln_rel_l2_vs_torch_fp32')})")
            if m.get("fp16_sensitive"):
                check += f"; FP16-sensitive: PyTorch FP16 {m['fp16_sensitive']:.1e}"
        else:
            check = (m.get("kiln_error") or "-")[:80]
        check = check.replace("|", "/")
        ratio = m.get("kiln_over_reduce_overhead")
        comp = (f"{f(m.get('torch_default_compile_s'), 1)} / "
                f"{f(m.get('torch_reduce-overhead_compile_s'), 1)}")
        lines.append("| " + " | ".join([
            m["model"], m["exporter"], str(m["batch"]), f(m.get("kiln_ms")),
            f(m.get("torch_eager_ms")), f(m.get("torch_default_ms")),
            f(m.get("torch_reduce-overhead_ms")), f"{ratio:.2f}" if ratio else "-",
            f(m.get("kiln_build_s"), 1), comp, check]) + " |")
    variants = [m for m in rows if "kiln_widest_build_s" in m or "kiln_warm_build_s" in m]
    if variants:
        lines += ["", "| model | exporter | batch | cold build s | warm build s | widest build s "
                  "| default ms | widest ms | default / widest |", "|" + "---|" * 9]
        for m in variants:
            d, w = m.get("kiln_ms"), m.get("kiln_widest_ms")
            lines.append("| " + " | ".join([
                m["model"], m["exporter"], str(m["batch"]), f(m.get("kiln_build_s"), 2),
                f(m.get("kiln_warm_build_s"), 2), f(m.get("kiln_widest_build_s"), 2), f(d), f(w),
                f"{d / w:.3f}" if d and w else (m.get("kiln_widest_error") or "-")[:40]]) + " |")
    # The bars: b32 throughput ratio (r-o / kiln >= 1) and b1 latency (kiln / r-o <= 1).
    for b in sorted({m["batch"] for m in rows}):
        rs = [m["kiln_over_reduce_overhead"] for m in rows
              if m["batch"] == b and m.get("kiln_over_reduce_overhead")]
        if rs:
            geo = math.exp(sum(math.log(1 / x) for x in rs) / len(rs))
            lines.append(f"\nbatch {b}: {len(rs)} checked engines, geometric mean of "
                         f"reduce-overhead / kiln (throughput ratio) {geo:.2f}, worst "
                         f"{1 / max(rs):.2f}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiln", default="kiln")
    ap.add_argument("--out")
    ap.add_argument("--table", metavar="JSON", help="only print the table of a results file")
    ap.add_argument("--resume", metavar="JSON", help="keep the rows of an earlier run")
    ap.add_argument("--redo", action="store_true", help="measure rows the resumed file has")
    ap.add_argument("--work", default=None, help="exports and engines (default: a temp dir)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--exporters", default="ts,dynamo")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--modes", default="eager,default,reduce-overhead")
    ap.add_argument("--iterations", type=int, default=50)
    ap.add_argument("--deadline", type=int, default=60, help="kiln build --deadline, seconds")
    ap.add_argument("--budget", type=int, default=540,
                    help="seconds after which no further model is started")
    ap.add_argument("--run-timeout", type=int, default=120)
    ap.add_argument("--layers-dir", help="write each engine's per-layer GPU times here (kiln run "
                    "--layer-iterations 5)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--no-kiln", action="store_true", help="export and time PyTorch only")
    ap.add_argument("--build-variants", action="store_true",
                    help="also build each engine warm (same timing cache) and with --opt-level 5 "
                         "(checked and timed): issue 19's warm build and default-vs-widest bars")
    ap.add_argument("--quant", default="", help="also build, check and time INT8 and/or FP8 "
                    "engines of each export (int8, fp8, int8-all and fp8-all: no sensitivity fallback, "
                    "fp8-noedges: FP8 with FP16 between the FP8 products, int8-all-noedges: "
                    "int8-all without INT8 edges or copies; issue 22), calibrated on --calib-sets "
                    "seeded batches")
    ap.add_argument("--calib-sets", type=int, default=2)
    ap.add_argument("--calib-compare", action="store_true",
                    help="with --quant: build each quantized engine again with --calib-on-cpu and "
                    "report both calibrations' seconds (the device evaluator against the CPU "
                    "reference, same run)")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    a = ap.parse_args()
    if a.list:
        for n, m in MODELS.items():
            log(f"{n:24} {m[0]}")
        return 0
    if a.table:
        log(table(json.load(open(a.table))))
        return 0
    if not a.out:
        ap.error("--out is required")
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; --list shows the suite")
    a.exporters = [e for e in a.exporters.split(",") if e]
    a.quant = [q for q in a.quant.split(",") if q]
    if any(q not in QUANT_FLAGS for q in a.quant):
        ap.error(f"--quant takes {', '.join(QUANT_FLAGS)}")
    a.batches = [int(b) for b in a.batches.split(",") if b]
    a.modes = [m for m in a.modes.split(",") if m]
    if a.device == "cpu":
        a.modes = [m for m in a.modes if m == "eager"]
    # >= 50 on the GPU (the method); a few on the CPU, where only the script's logic is checked.
    a.iterations = max(a.iterations, 50) if a.device == "cuda" else min(a.iterations, 3)
    a.work = a.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), "kiln_suite_work")
    os.makedirs(a.work, exist_ok=True)
    if a.device == "cuda":
        torch.backends.cudnn.benchmark = True
        # The FP32 reference must be FP32: no TF32 in cuDNN convolutions or cuBLAS matmuls.
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
    result = {"rows": []}
    if a.resume and os.path.exists(a.resume):
        result = json.load(open(a.resume))
        log(f"resumed {len(result['rows'])} rows from {a.resume}")
    result["skipped"] = []
    result.update({
        "command": " ".join(["bench/cuda/suite.py"] + sys.argv[1:]),
        "device": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "method": "kiln: compute_ms of `kiln run --json` (CUDA events around the whole enqueue, "
                  "graph replay); torch: CUDA events around one call; median of >= 50 after "
                  "warm-up; FP16; random non-zero inputs; kiln checked against torch FP32",
    })
    tmp = a.out + ".tmp"

    def save():
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.out)
    t_start = time.time()
    for name in models:
        if time.time() - t_start > a.budget:
            log(f"== {name}: not started, past the --budget of {a.budget} s")
            result["skipped"].append(name)
            continue
        try:
            bench_model(a, name, result, save, t_start)
        except Exception as e:  # one model failing must not stop the others
            import traceback

            traceback.print_exc()
            log(f"{name} failed: {type(e).__name__}: {e}")
            result["rows"].append({"model": name, "exporter": "-", "batch": 0,
                                   "error": f"{type(e).__name__}: {str(e)[:300]}"})
        save()
    log("")
    log(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
