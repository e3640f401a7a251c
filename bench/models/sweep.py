#!/usr/bin/env python3
"""Real models as a new user brings them (issue 21's second bar): exports torchvision's
classification, segmentation, detection and video models, and the transformers families of the
model suite when transformers is installed, with seeded random weights (nothing downloaded),
writes each as an ONNX backend-test case (model.onnx + test_data_set_0 with PyTorch's FP32
outputs), runs `kiln conformance` on it and lists every failure with its reason.

  python3 bench/models/sweep.py --kiln build/tools/kiln/kiln --out sweep.json
  python3 bench/models/sweep.py --models resnet18,fcn_resnet50 --backend cuda
  python3 bench/models/sweep.py --table sweep.json      # the table of an earlier run
  python3 bench/models/sweep.py --list
  python3 bench/models/sweep.py --models gpt_neox,opt,bloom --layers   # and the fused layers

With transformers installed, HF_FAMILIES adds small configurations of 38 more transformers
families (encoders, decoders, vision and audio) that are not in the GPU suite: the models users
bring beside the suite's, checked for generality. --layers records, per model, the engine's
layers by op after the graph passes: which attention layers fused (Softmax left over says which
did not), which norms and activations.

A model counts against kiln only when PyTorch could export it: an export failure is its own row
("export"), not a kiln failure. The pass rate is kiln's passes over the exported models.
Detection models return boxes, scores and labels whose count depends on the data; their outputs
are compared whole (same count, same values), which random weights make a strict test: a box
that moves across the score threshold changes the count.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def _tv(family, ctor, shape, **kw):
    """A torchvision constructor by name, random weights, its input shape (without batch)."""
    def make():
        import torchvision

        mod = torchvision.models
        for part in family:
            mod = getattr(mod, part)
        if family and family[0] in ("segmentation", "detection"):
            kw["weights_backbone"] = None
        return getattr(mod, ctor)(weights=None, **kw)
    return make, shape


IMG = (3, 224, 224)
# name -> (group, make, input shape). Detection models take a list of images; the wrapper below
# passes one image and returns the first result's tensors.
TORCHVISION = {
    "alexnet": ("classification",) + _tv((), "alexnet", IMG),
    "vgg11": ("classification",) + _tv((), "vgg11", IMG),
    "resnet18": ("classification",) + _tv((), "resnet18", IMG),
    "resnet50": ("classification",) + _tv((), "resnet50", IMG),
    "resnet101": ("classification",) + _tv((), "resnet101", IMG),
    "resnext50_32x4d": ("classification",) + _tv((), "resnext50_32x4d", IMG),
    "wide_resnet50_2": ("classification",) + _tv((), "wide_resnet50_2", IMG),
    "densenet121": ("classification",) + _tv((), "densenet121", IMG),
    "googlenet": ("classification",) + _tv((), "googlenet", IMG, aux_logits=False,
                                           init_weights=True),
    "inception_v3": ("classification",) + _tv((), "inception_v3", (3, 299, 299),
                                              aux_logits=False, init_weights=True),
    "squeezenet1_1": ("classification",) + _tv((), "squeezenet1_1", IMG),
    "shufflenet_v2_x1_0": ("classification",) + _tv((), "shufflenet_v2_x1_0", IMG),
    "mobilenet_v2": ("classification",) + _tv((), "mobilenet_v2", IMG),
    "mobilenet_v3_large": ("classification",) + _tv((), "mobilenet_v3_large", IMG),
    "mnasnet1_0": ("classification",) + _tv((), "mnasnet1_0", IMG),
    "efficientnet_b0": ("classification",) + _tv((), "efficientnet_b0", IMG),
    "efficientnet_v2_s": ("classification",) + _tv((), "efficientnet_v2_s", IMG),
    "regnet_y_400mf": ("classification",) + _tv((), "regnet_y_400mf", IMG),
    "regnet_x_1_6gf": ("classification",) + _tv((), "regnet_x_1_6gf", IMG),
    "convnext_tiny": ("classification",) + _tv((), "convnext_tiny", IMG),
    "vit_b_16": ("classification",) + _tv((), "vit_b_16", IMG),
    "swin_t": ("classification",) + _tv((), "swin_t", IMG),
    "maxvit_t": ("classification",) + _tv((), "maxvit_t", IMG),
    "fcn_resnet50": ("segmentation",) + _tv(("segmentation",), "fcn_resnet50", (3, 256, 256),
                                            aux_loss=False),
    "deeplabv3_mobilenet_v3_large": ("segmentation",) + _tv(
        ("segmentation",), "deeplabv3_mobilenet_v3_large", (3, 256, 256), aux_loss=False),
    "lraspp_mobilenet_v3_large": ("segmentation",) + _tv(
        ("segmentation",), "lraspp_mobilenet_v3_large", (3, 256, 256)),
    "fasterrcnn_mobilenet_v3_large_320_fpn": ("detection",) + _tv(
        ("detection",), "fasterrcnn_mobilenet_v3_large_320_fpn", (3, 320, 320)),
    "retinanet_resnet50_fpn": ("detection",) + _tv(("detection",), "retinanet_resnet50_fpn",
                                                   (3, 320, 320)),
    "ssdlite320_mobilenet_v3_large": ("detection",) + _tv(
        ("detection",), "ssdlite320_mobilenet_v3_large", (3, 320, 320)),
    "fcos_resnet50_fpn": ("detection",) + _tv(("detection",), "fcos_resnet50_fpn",
                                              (3, 320, 320)),
    "r3d_18": ("video",) + _tv(("video",), "r3d_18", (3, 8, 112, 112)),
}


class _Detection(torch.nn.Module):
    """One image in, the first result's tensors out (boxes, scores, labels)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        r = self.inner([x[0]])[0]
        return r["boxes"], r["scores"], r["labels"]


class _Segmentation(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)["out"]


def _suite():
    """bench/cuda/suite.py, the GPU model suite (its models and their constructors)."""
    sys.path.insert(0, os.path.join(HERE, "..", "cuda"))
    import suite

    return suite


def transformers_models():
    """The model suite's transformers families (bench/cuda/suite.py), where transformers is
    installed: name -> (make, [(input, shape, kind)], extra)."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return {}
    out = {}
    for name, (family, make, inputs, _, extra) in _suite().MODELS.items():
        if make.__qualname__.startswith("_hf"):
            out[name] = (make, inputs, extra)
    return out


class _HfOut(torch.nn.Module):
    """A transformers model called with one named input; its last hidden state out (the first
    output where a model has no last_hidden_state)."""

    def __init__(self, inner, arg):
        super().__init__()
        self.inner = inner
        self.arg = arg

    def forward(self, x):
        out = self.inner(**{self.arg: x})
        h = getattr(out, "last_hidden_state", None)
        return h if h is not None else out[0]


def _hf_small(config_cls, model_cls, arg, shape, get=None, vocab=None, **cfg):
    """A small configuration of a transformers family that is not in the GPU suite: the families
    users bring beside the suite's, checked for kiln's generality (issue 25). Small sizes (two or
    three layers, hidden 128-256) keep the CPU sweep short; the ops and patterns are the
    family's."""
    def make(attn):
        return _HfOut(_suite().hf_model(config_cls, model_cls, attn, get, **cfg), arg)
    kind = "ids" if arg == "input_ids" else "image" if arg == "pixel_values" else "audio"
    return make, shape, kind, vocab


_DEC = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
            vocab_size=1000, max_position_embeddings=256, use_cache=False)
_ENC = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=1000)
_VIS = dict(hidden_size=192, intermediate_size=384, num_hidden_layers=2, num_attention_heads=3,
            image_size=224, patch_size=16)
TOK = (128,)
HF_FAMILIES = {
    # Encoders
    "albert": _hf_small("AlbertConfig", "AlbertModel", "input_ids", TOK, vocab=1000,
                        embedding_size=64, **_ENC),
    "electra": _hf_small("ElectraConfig", "ElectraModel", "input_ids", TOK, vocab=1000,
                         embedding_size=128, **_ENC),
    "deberta_v2": _hf_small("DebertaV2Config", "DebertaV2Model", "input_ids", TOK, vocab=1000,
                            **_ENC),
    "mpnet": _hf_small("MPNetConfig", "MPNetModel", "input_ids", TOK, vocab=1000, **_ENC),
    "bart_encoder": _hf_small("BartConfig", "BartModel", "input_ids", TOK, get="get_encoder",
                              vocab=1000, d_model=256, encoder_layers=2, decoder_layers=1,
                              encoder_attention_heads=4, decoder_attention_heads=4,
                              encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=1000),
    "squeezebert": _hf_small("SqueezeBertConfig", "SqueezeBertModel", "input_ids", TOK,
                             vocab=1000, embedding_size=256, **_ENC),
    # Decoders (Mistral without its sliding window: torch 1.13 cannot export the window's
    # bitwise_or)
    "mistral": _hf_small("MistralConfig", "MistralModel", "input_ids", TOK, vocab=1000,
                         num_key_value_heads=2, sliding_window=None, **_DEC),
    "qwen2": _hf_small("Qwen2Config", "Qwen2Model", "input_ids", TOK, vocab=1000,
                       num_key_value_heads=2, **_DEC),
    "gemma": _hf_small("GemmaConfig", "GemmaModel", "input_ids", TOK, vocab=1000,
                       num_key_value_heads=1, head_dim=32, **_DEC),
    "phi": _hf_small("PhiConfig", "PhiModel", "input_ids", TOK, vocab=1000,
                     partial_rotary_factor=0.5, **_DEC),
    "gpt_neox": _hf_small("GPTNeoXConfig", "GPTNeoXModel", "input_ids", TOK, vocab=1000,
                          rotary_pct=0.25, **_DEC),
    "gptj": _hf_small("GPTJConfig", "GPTJModel", "input_ids", TOK, vocab=1000, n_embd=256,
                      n_layer=2, n_head=8, rotary_dim=16, vocab_size=1000, n_positions=256),
    "opt": _hf_small("OPTConfig", "OPTModel", "input_ids", TOK, vocab=1000, hidden_size=256,
                     ffn_dim=512, num_hidden_layers=2, num_attention_heads=8, vocab_size=1000,
                     word_embed_proj_dim=256, max_position_embeddings=256),
    "bloom": _hf_small("BloomConfig", "BloomModel", "input_ids", TOK, vocab=1000, hidden_size=256,
                       n_layer=2, n_head=8, vocab_size=1000),
    "falcon": _hf_small("FalconConfig", "FalconModel", "input_ids", TOK, vocab=1000,
                        hidden_size=256, num_hidden_layers=2, num_attention_heads=8,
                        vocab_size=1000, new_decoder_architecture=True, num_kv_heads=2),
    "gpt_neo": _hf_small("GPTNeoConfig", "GPTNeoModel", "input_ids", TOK, vocab=1000,
                         hidden_size=256, num_layers=2, num_heads=8, vocab_size=1000,
                         attention_types=[[["global", "local"], 1]], window_size=32,
                         max_position_embeddings=256),
    # Vision
    "deit": _hf_small("DeiTConfig", "DeiTModel", "pixel_values", IMG, **_VIS),
    "beit": _hf_small("BeitConfig", "BeitModel", "pixel_values", IMG,
                      use_relative_position_bias=True, **_VIS),
    "dinov2": _hf_small("Dinov2Config", "Dinov2Model", "pixel_values", IMG, hidden_size=192,
                        num_hidden_layers=2, num_attention_heads=3, image_size=224,
                        patch_size=14),
    "segformer": _hf_small("SegformerConfig", "SegformerModel", "pixel_values", IMG,
                           depths=[1, 1, 1, 1]),
    "mobilevit": _hf_small("MobileViTConfig", "MobileViTModel", "pixel_values", IMG),
    "convnextv2": _hf_small("ConvNextV2Config", "ConvNextV2Model", "pixel_values", IMG,
                            depths=[1, 1, 2, 1]),
    "levit": _hf_small("LevitConfig", "LevitModel", "pixel_values", IMG),
    "poolformer": _hf_small("PoolFormerConfig", "PoolFormerModel", "pixel_values", IMG,
                            depths=[1, 1, 1, 1]),
    # Audio: raw waveform through a convolutional feature encoder
    "wav2vec2": _hf_small("Wav2Vec2Config", "Wav2Vec2Model", "input_values", (16000,),
                          hidden_size=192, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=384),
    "hubert": _hf_small("HubertConfig", "HubertModel", "input_values", (16000,),
                        hidden_size=192, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=384),
    # More encoders and decoders: full BART (its decoder with cross-attention), RoFormer's rotary
    # BERT, XLM-R, CodeGen, GPT-BigCode's multi-query attention, BioGPT, StableLM
    "bart": _hf_small("BartConfig", "BartModel", "input_ids", TOK, vocab=1000, d_model=256,
                      encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                      decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512,
                      vocab_size=1000),
    "roformer": _hf_small("RoFormerConfig", "RoFormerModel", "input_ids", TOK, vocab=1000,
                          embedding_size=256, **_ENC),
    "xlm_roberta": _hf_small("XLMRobertaConfig", "XLMRobertaModel", "input_ids", TOK, vocab=1000,
                             **_ENC),
    "codegen": _hf_small("CodeGenConfig", "CodeGenModel", "input_ids", TOK, vocab=1000, n_embd=256,
                         n_layer=2, n_head=8, rotary_dim=16, vocab_size=1000, n_positions=256,
                         n_ctx=256),
    "gpt_bigcode": _hf_small("GPTBigCodeConfig", "GPTBigCodeModel", "input_ids", TOK, vocab=1000,
                             n_embd=256, n_layer=2, n_head=8, vocab_size=1000, n_positions=256,
                             multi_query=True),
    "biogpt": _hf_small("BioGptConfig", "BioGptModel", "input_ids", TOK, vocab=1000, **_DEC),
    "stablelm": _hf_small("StableLmConfig", "StableLmModel", "input_ids", TOK, vocab=1000,
                          num_key_value_heads=2, **_DEC),
    # More vision: Swin V2, YOLOS (detection tokens), ConvNeXt (HF),
    # MobileNetV2 and ResNet (HF implementations)
    "swinv2": _hf_small("Swinv2Config", "Swinv2Model", "pixel_values", IMG, embed_dim=48,
                        depths=[1, 1, 1, 1], num_heads=[2, 2, 4, 4]),
    "yolos": _hf_small("YolosConfig", "YolosModel", "pixel_values", IMG, num_detection_tokens=10,
                       **dict(_VIS, image_size=[224, 224])),
    "convnext_hf": _hf_small("ConvNextConfig", "ConvNextModel", "pixel_values", IMG,
                             depths=[1, 1, 2, 1]),
    "mobilenet_v2_hf": _hf_small("MobileNetV2Config", "MobileNetV2Model", "pixel_values", IMG),
    "resnet_hf": _hf_small("ResNetConfig", "ResNetModel", "pixel_values", IMG, depths=[1, 1, 1, 1]),
}


def all_models():
    rows = {n: (g, "torchvision") for n, (g, _, _) in TORCHVISION.items()}
    for n in transformers_models():
        rows[n] = ("transformers", "transformers")
    if transformers_models():
        for n in HF_FAMILIES:
            rows[n] = ("transformers-more", "transformers")
    return rows


def seeded(m):
    """Eval mode, and weights a constructor zeroed on purpose (heads) get seeded values, so that
    no output is identically zero and the comparison is never vacuous."""
    m = m.eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2 and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    return m


def make_case(name, case_dir, seq, exporter="ts"):
    """Exports NAME into case_dir (model.onnx, test_data_set_0). Returns the input description.
    Raises on an export failure."""
    from onnx import numpy_helper

    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    if name in TORCHVISION:
        group, make, shape = TORCHVISION[name]
        m = seeded(make())
        if group == "detection":
            m = _Detection(m)
        elif group == "segmentation":
            m = _Segmentation(m)
        feed = {"input": rng.standard_normal((1,) + shape).astype(np.float32)}
        if group == "detection":
            feed["input"] = rng.uniform(0, 1, (1,) + shape).astype(np.float32)
    elif name in HF_FAMILIES:
        make, shape, kind, vocab = HF_FAMILIES[name]
        m = seeded(make("eager"))
        full = (1,) + tuple(seq if s == 128 else s for s in shape)
        arg = m.arg
        if kind == "ids":
            feed = {arg: rng.integers(1, vocab, full).astype(np.int64)}
        else:
            feed = {arg: rng.standard_normal(full).astype(np.float32)}
    else:
        make, inputs, extra = transformers_models()[name]
        m = seeded(make("eager"))
        feed = {}
        for inp, shp, kind in inputs:
            full = (1,) + tuple(seq if s == 128 else s for s in shp)
            if kind in ("image", "features"):
                feed[inp] = rng.standard_normal(full).astype(np.float32)
            elif kind == "ids":
                feed[inp] = rng.integers(extra.get("min_id", 1), extra["vocab"],
                                         full).astype(np.int64)
            else:
                feed[inp] = np.ones(full, np.int64)
    names = list(feed)
    args = tuple(torch.from_numpy(feed[n]) for n in names)
    with torch.no_grad():
        ref = m(*args)
    refs = list(ref) if isinstance(ref, (tuple, list)) else [ref]
    out_names = [f"output_{i}" for i in range(len(refs))]
    os.makedirs(case_dir, exist_ok=True)
    path = os.path.join(case_dir, "model.onnx")
    if exporter == "dynamo":
        # torch 2.x's default exporter, as a user calls it (static shapes, its default opset).
        if int(torch.__version__.split(".")[0]) < 2:
            raise RuntimeError(f"torch {torch.__version__} has no dynamo exporter")
        torch.onnx.export(m, args, path, input_names=names, output_names=out_names, dynamo=True)
    else:
        kw = {"dynamo": False} if int(torch.__version__.split(".")[0]) >= 2 else {}
        # Not under no_grad: nn.MultiheadAttention's fused fast path is not exportable.
        torch.onnx.export(m, args, path, input_names=names, output_names=out_names,
                          opset_version=17, do_constant_folding=True, **kw)
    d = os.path.join(case_dir, "test_data_set_0")
    os.makedirs(d, exist_ok=True)
    for i, n in enumerate(names):
        with open(os.path.join(d, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(feed[n], n).SerializeToString())
    for i, (n, r) in enumerate(zip(out_names, refs)):
        with open(os.path.join(d, f"output_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(r.detach().numpy(), n).SerializeToString())
    return {n: list(v.shape) for n, v in feed.items()}


def run_kiln(a, case_dir):
    """kiln conformance on one case: (passed, reason, seconds)."""
    js = os.path.join(case_dir, "result.json")
    cmd = [a.kiln, "conformance", case_dir, "--backend", a.backend, "--timeout",
           str(a.timeout), "--json", js]
    if a.rel_l2:
        cmd += ["--rel-l2", str(a.rel_l2)]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout + 60)
    except subprocess.TimeoutExpired:
        return False, f"kiln conformance did not finish in {a.timeout + 60} s", a.timeout + 60
    secs = time.time() - t0
    reason = ""
    passed = False
    try:
        with open(js) as f:
            c = json.load(f)[0]
        passed = bool(c["passed"])
        if not passed:
            reason = " ".join(x for x in (c.get("stage", ""), c.get("code", ""), c.get("error", ""))
                              if x)
            if c.get("stage") == "compare" or (not c.get("error") and "rel_l2" in c):
                reason += f" rel L2 {c.get('rel_l2', float('nan')):.3g}"
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        pass
    if not passed and not reason:
        text = (p.stdout + p.stderr).strip().splitlines()
        reason = next((l for l in text if "KILN-E" in l), text[-1] if text else f"rc {p.returncode}")
    return passed, first_line(reason), secs


def fused_layers(a, case_dir):
    """The engine's layers after kiln's graph passes, by op (`kiln build --json`): what the
    fusions left of the model. {"layers": n, "ops": {op: count}, "softmax": n} or None."""
    engine = os.path.join(case_dir, "layers.kiln")
    cmd = [a.kiln, "build", os.path.join(case_dir, "model.onnx"), "--backend", a.backend, "-o",
           engine, "--json"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout + 60)
        report = json.loads(p.stdout)
    except (subprocess.TimeoutExpired, ValueError):
        return None
    finally:
        if os.path.exists(engine):
            os.remove(engine)
    ops = {}
    for layer in report.get("layer_reports", []):
        ops[layer["op"]] = ops.get(layer["op"], 0) + 1
    return {"layers": sum(ops.values()), "ops": dict(sorted(ops.items(), key=lambda kv: -kv[1]))}


def ort_arbitration(a, case_dir):
    """A case kiln fails at compare: does ONNX Runtime disagree with PyTorch too, and does kiln
    equal ONNX Runtime? (Detection heads with random weights tie their scores, and the order
    among ties decides the boxes; that is no kiln bug when ONNX Runtime, running the same ONNX
    model, lands where kiln does.) Returns (ort_vs_torch_rel_l2, kiln_matches_ort) or None when
    onnxruntime is missing or fails."""
    try:
        import onnxruntime as ort
        from onnx import load_tensor, numpy_helper
    except ImportError:
        return None
    data = os.path.join(case_dir, "test_data_set_0")
    ins = sorted(f for f in os.listdir(data) if f.startswith("input_"))
    outs = sorted(f for f in os.listdir(data) if f.startswith("output_"))
    try:
        sess = ort.InferenceSession(os.path.join(case_dir, "model.onnx"),
                                    providers=["CPUExecutionProvider"])
        feed = {}
        for f in ins:
            t = load_tensor(os.path.join(data, f))
            feed[t.name] = numpy_helper.to_array(t)
        got = sess.run(None, feed)
    except Exception:  # noqa: BLE001 -- no arbitration then
        return None
    worst = 0.0
    # A fresh directory of its own (never an existing path beside the case), removed after.
    alt = os.path.join(tempfile.mkdtemp(prefix="kiln_sweep_ort_"), os.path.basename(case_dir))
    shutil.copytree(case_dir, alt, ignore=shutil.ignore_patterns("result.json"))
    for f, g in zip(outs, got):
        t = load_tensor(os.path.join(data, f))
        want = numpy_helper.to_array(t).astype(np.float64)
        g64 = np.asarray(g).astype(np.float64)
        if g64.shape != want.shape:
            worst = float("inf")
        else:
            worst = max(worst, float(np.linalg.norm(g64 - want) / max(np.linalg.norm(want), 1e-30)))
        with open(os.path.join(alt, "test_data_set_0", f), "wb") as out:
            out.write(numpy_helper.from_array(np.asarray(g), t.name).SerializeToString())
    matches, _, _ = run_kiln(a, alt)
    shutil.rmtree(os.path.dirname(alt), ignore_errors=True)
    return worst, matches


def first_line(s):
    """A reason on one line: the lines joined, the catalog code once, at most 300 characters."""
    s = "; ".join(l.strip() for l in str(s).strip().splitlines() if l.strip())
    s = re.sub(r"(KILN-E\d+) \1", r"\1", s)
    return s[:300]


def table(result):
    rows = result["rows"]
    with_layers = any(r.get("fused") for r in rows)
    head = "| model | group | export | kiln | seconds | reason |"
    rule = "|---|---|---|---|---:|---|"
    if with_layers:
        head += " layers | Attention | Softmax left | most common ops |"
        rule += "---:|---:|---:|---|"
    lines = [head, rule]
    for r in rows:
        line = (f"| {r['model']} | {r['group']} | {'ok' if r['exported'] else 'failed'} | "
                f"{'pass' if r.get('passed') else ('-' if not r['exported'] else 'FAIL')} | "
                f"{r.get('kiln_seconds', 0):.1f} | {r.get('reason', '')} |")
        if with_layers:
            f = r.get("fused") or {}
            ops = f.get("ops", {})
            common = ", ".join(f"{op} {n}" for op, n in list(ops.items())[:5])
            line += (f" {f.get('layers', '')} | {ops.get('Attention', 0) if f else ''} | "
                     f"{ops.get('Softmax', 0) if f else ''} | {common} |")
        lines.append(line)
    exported = [r for r in rows if r["exported"]]
    passed = [r for r in exported if r.get("passed")]
    lines.append("")
    lines.append(f"{len(passed)} of {len(exported)} exported models pass on {result['backend']} "
                 f"({100.0 * len(passed) / max(1, len(exported)):.1f}%); "
                 f"{len(rows) - len(exported)} did not export")
    ort = [r for r in exported if not r.get("passed") and r.get("matches_ort")]
    if ort:
        lines.append(f"{len(ort)} more ({', '.join(r['model'] for r in ort)}) fail against PyTorch "
                     "but equal ONNX Runtime's outputs on the same ONNX model, which differ from "
                     "PyTorch's as much")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kiln", default="build/tools/kiln/kiln")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--models", help="comma-separated (default: all; --list names them)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--work", help="keep the cases here (default: a temporary directory)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per kiln case")
    ap.add_argument("--rel-l2", type=float, default=1e-3,
                    help="kiln conformance's bound (FP32; ONNX Runtime itself is above 1e-4 on "
                         "some deep models)")
    ap.add_argument("--seq", type=int, default=32, help="sequence length of the text models")
    ap.add_argument("--budget", type=float, default=0, help="start no model after this many s")
    ap.add_argument("--table", help="print the table of a results file and exit")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--exporter", default="ts", choices=["ts", "dynamo"],
                    help="TorchScript (opset 17) or torch 2.x's dynamo exporter")
    ap.add_argument("--layers", action="store_true",
                    help="also build each model once more and record its layers by op after the "
                         "graph passes (attention, norms, activations fused or not)")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            print(table(json.load(f)))
        return 0
    models = all_models()
    if a.list:
        for n, (g, src) in models.items():
            print(f"{n:40s} {g:15s} {src}")
        return 0
    names = a.models.split(",") if a.models else list(models)
    unknown = [n for n in names if n not in models]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; --list names them"
                 + ("" if transformers_models() else " (transformers is not installed)"))
    work = a.work or tempfile.mkdtemp(prefix="kiln_sweep_")
    result = {"command": " ".join(sys.argv), "backend": a.backend, "torch": torch.__version__,
              "exporter": a.exporter,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    try:
        import torchvision
        result["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    t_start = time.time()
    for n in names:
        if a.budget and time.time() - t_start > a.budget:
            print(f"{n}: not started (budget)", flush=True)
            continue
        row = {"model": n, "group": models[n][0], "exported": False}
        case = os.path.join(work, n)
        try:
            row["inputs"] = make_case(n, case, a.seq, a.exporter)
            row["exported"] = True
        except Exception as e:  # noqa: BLE001 -- any exporter failure is a row
            row["reason"] = "export: " + first_line(f"{type(e).__name__}: {e}")
        if row["exported"]:
            row["passed"], row["reason"], row["kiln_seconds"] = run_kiln(a, case)
            if a.layers:
                row["fused"] = fused_layers(a, case)
            if row["passed"]:
                row["reason"] = ""
            elif "compare" in row["reason"]:
                arb = ort_arbitration(a, case)
                if arb is not None:
                    ort_l2, same = arb
                    row["ort_vs_torch_rel_l2"] = ort_l2
                    row["matches_ort"] = same
                    if same and ort_l2 > a.rel_l2:
                        row["reason"] += (f"; ONNX Runtime is {ort_l2:.3g} from PyTorch too, and "
                                          "kiln matches ONNX Runtime")
        print(f"{n}: {'pass' if row.get('passed') else 'FAIL'} {row.get('reason', '')}",
              flush=True)
        result["rows"].append(row)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(result, f, indent=1)
        if not a.work:
            shutil.rmtree(case, ignore_errors=True)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
