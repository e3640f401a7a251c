// Bandwidth of kiln's own CUDA kernels on the shapes the FP16 engines of issue 4 see (ResNet-50,
// BERT-base and GPT-2 small at batch 32): each case builds a one-node graph, creates the CUDA
// provider's kernel and times launches with CUDA events. Reports effective GB/s (bytes read and
// written once) to compare with the H200's ~4.8 TB/s. Needs a GPU; cases stop with an error
// elsewhere.
//   .bundle/bin/cuda_kernels_bench --benchmark_min_time=0.2s
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/kernel.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

struct Operand {
  DataType dtype;
  std::vector<int64_t> dims;
  std::vector<int64_t> value;  // integer constant contents (empty: a random activation)
};

struct BenchCase {
  BenchCase(std::string op_type, AttributeMap attributes, std::vector<Operand> operands,
            std::string provider_id = "", int num_outputs = 1)
      : op(std::move(op_type)),
        attrs(std::move(attributes)),
        inputs(std::move(operands)),
        provider(std::move(provider_id)),
        outputs(num_outputs) {}
  std::string op;
  AttributeMap attrs;
  std::vector<Operand> inputs;
  std::string provider;  // provider id to time ("": the op's first provider)
  int outputs = 1;       // outputs of x's shape and type (SkipLayerNormalization's y and sum: 2)
  size_t tactic = 0;     // which of the provider's tactics (of those named tactic_prefix...)
  std::string tactic_prefix;  // tactics whose names start with this only ("": all)
  std::string tactic_has;     // ... and contain this
  double ops = 0;             // arithmetic operations of one launch (> 0: a TOPS counter)
  // An edge's consumer: the tactics are listed as the builder lists them, for A of this float
  // type (the edge is joined after the tactic is chosen), and the kernel made for A as given.
  std::optional<DataType> tactics_for_a;
};

AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (const auto& [k, v] : kv) m.Set(k, v);
  return m;
}

void RunCase(benchmark::State& state, const BenchCase& c) {
  auto backend_or = GetBackend(BackendKind::kCuda);
  if (!backend_or.ok()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Backend& backend = **backend_or;
  Graph g;
  std::vector<Value*> ins;
  std::vector<Tensor> host;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const Operand& o = c.inputs[i];
    Tensor t(o.dtype, o.dims);
    for (int64_t k = 0; k < t.num_elements(); ++k) {
      double v = o.value.empty() ? static_cast<double>((k * 7919) % 1000) / 500.0 - 1.0
                                 : static_cast<double>(o.value[static_cast<size_t>(k)]);
      StoreFromDouble(t.view(), k, v);
    }
    std::string name = "x" + std::to_string(i);
    ins.push_back(o.value.empty() ? g.AddInput(name, o.dtype, MakeShape(o.dims))
                                  : g.AddConstant(name, t));
    host.push_back(std::move(t));
  }
  std::vector<Value*> ys;
  for (int i = 0; i < c.outputs; ++i) ys.push_back(g.AddValue("y" + std::to_string(i)));
  Value* y = ys[0];
  Node* node = g.AddNode(c.op, "n", ins, ys, c.attrs);
  for (Value* v : ys) g.MarkOutput(v);
  if (!InferShapes(g).ok()) {
    state.SkipWithError("shape inference failed");
    return;
  }
  std::vector<int64_t> y_dims = *StaticDims(y->shape());
  KernelRequest r;
  r.node = node;
  for (size_t i = 0; i < host.size(); ++i) {
    r.inputs.push_back({host[i].dtype(), MakeShape(host[i].dims()), host[i].dims(),
                        ins[i]->constant() ? ins[i]->constant() : nullptr});
  }
  for (int i = 0; i < c.outputs; ++i)
    r.outputs.push_back({y->dtype(), y->shape(), y_dims, nullptr});
  const KernelProvider* provider = nullptr;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, c.op)) {
    if (!provider && (c.provider.empty() || p->id() == c.provider)) provider = p;
  }
  std::vector<TacticConfig> tactics;
  KernelRequest listed = r;
  if (c.tactics_for_a) listed.inputs[0].dtype = *c.tactics_for_a;
  if (provider) {
    for (TacticConfig& t : provider->Tactics(listed)) {
      if (t.name.starts_with(c.tactic_prefix) && t.name.find(c.tactic_has) != std::string::npos) {
        tactics.push_back(std::move(t));
      }
    }
  }
  if (tactics.empty()) {
    state.SkipWithError("no CUDA tactic");
    return;
  }
  if (tactics.size() <= c.tactic) {
    state.SkipWithError("no such tactic");
    return;
  }
  TacticConfig tactic = tactics[c.tactic];
  auto kernel = provider->Create(r, tactic);
  if (!kernel.ok()) {
    state.SkipWithError(kernel.status().ToString().c_str());
    return;
  }
  std::vector<DeviceBuffer> bufs;
  std::vector<TensorView> in_views, out_views;
  size_t bytes = 0;
  for (const Tensor& t : host) {
    auto b = backend.Allocate(t.size_bytes());
    if (!b.ok() || !backend.CopyToDevice(b->data(), t.raw(), t.size_bytes(), nullptr).ok()) {
      state.SkipWithError("device copy failed");
      return;
    }
    TensorView v = t.view();
    v.data = b->data();
    in_views.push_back(v);
    bytes += t.size_bytes();
    bufs.push_back(std::move(*b));
  }
  Tensor out(y->dtype(), y_dims);
  for (int i = 0; i < c.outputs; ++i) {
    auto ob = backend.Allocate(out.size_bytes());
    if (!ob.ok()) {
      state.SkipWithError("allocation failed");
      return;
    }
    TensorView ov = out.view();
    ov.data = ob->data();
    out_views.push_back(ov);
    bytes += out.size_bytes();
    bufs.push_back(std::move(*ob));
  }
  auto ws_bytes = (*kernel)->Prepare(in_views, out_views);
  if (!ws_bytes.ok()) {
    state.SkipWithError(ws_bytes.status().ToString().c_str());
    return;
  }
  auto ws = backend.Allocate(*ws_bytes);
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.ok() ? ws->data() : nullptr;
  args.workspace_bytes = *ws_bytes;
  args.stream = stream;
  constexpr int kLaunches = 20;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) (void)(*kernel)->Run(args);  // warm-up
  double seconds = 0;  // device time of one launch, summed over iterations
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    for (int i = 0; i < kLaunches; ++i) {
      Status s = (*kernel)->Run(args);
      if (!s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        break;
      }
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3 / kLaunches);
    seconds += ms / 1e3 / kLaunches;
  }
  // From device time (benchmark's own rates divide by host CPU time).
  if (seconds > 0) {
    state.counters["GB/s"] = static_cast<double>(bytes) * state.iterations() / seconds / 1e9;
    if (c.ops > 0) state.counters["TOPS"] = c.ops * state.iterations() / seconds / 1e12;
  }
  state.SetLabel(tactic.name);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
}

constexpr DataType kF16 = DataType::kFloat16;
constexpr DataType kI64 = DataType::kInt64;
// kiln's warpgroup kernel's tiles: the cp.async and TMA ones, the ping-pong one and the two in
// clusters of two. A case's tN is the Nth tactic offered, in Int8WgmmaTileOrder for the case's
// shape (likeliest first; since session 34, before it the tile numbers); the label names the tile.
// Tiles not yet GPU-tested (Int8WgmmaTileGpuTested) are offered only where KILN_CUDA_WGMMA_TILES
// names them (then tN follows that list); without it their tN cases report "no such tactic".
const size_t kWgmmaTiles = static_cast<size_t>(cuda::Int8WgmmaTileCount());

const bool kRegistered = [] {
  // The INT8/FP8 tactics are off by default until they have run on a GPU (cublaslt_util.h,
  // QuantTacticsEnabled); the INT8 cases below time them.
  setenv("KILN_CUDA_QUANT_TACTICS", "1", 0);
  setenv("KILN_CUDA_INT8_KERNEL", "all", 0);  // every family of INT8 tactics, wgmma's included
  setenv("KILN_CUDA_FP8_KERNEL", "all", 0);   // and of FP8 tactics
  std::vector<std::pair<std::string, BenchCase>> cases = {
      // BERT-base / GPT-2 small, batch 32, sequence 128: rows of 768.
      {"layernorm_f16_4096x768",
       {"LayerNormalization",
        Attrs({{"axis", int64_t{-1}}}),
        {{kF16, {32, 128, 768}, {}}, {kF16, {768}, {}}, {kF16, {768}, {}}}}},
      {"layernorm_f16_4096x768_warpvec",
       {"LayerNormalization",
        Attrs({{"axis", int64_t{-1}}}),
        {{kF16, {32, 128, 768}, {}}, {kF16, {768}, {}}, {kF16, {768}, {}}},
        "cuda.layer-normalization.warp-vec"}},
      // Residual Add + LayerNorm fused: BERT (y only) and GPT-2 (y and the residual sum).
      {"skiplayernorm_f16_4096x768",
       {"SkipLayerNormalization",
        Attrs({{"axis", int64_t{-1}}}),
        {{kF16, {32, 128, 768}, {}},
         {kF16, {32, 128, 768}, {}},
         {kF16, {768}, {}},
         {kF16, {768}, {}}}}},
      {"skiplayernorm_f16_4096x768_sum",
       {"SkipLayerNormalization",
        Attrs({{"axis", int64_t{-1}}}),
        {{kF16, {32, 128, 768}, {}},
         {kF16, {32, 128, 768}, {}},
         {kF16, {768}, {}},
         {kF16, {768}, {}}},
        "",
        2}},
      {"layernorm_f16_4096x4096_warpvec",
       {"LayerNormalization",
        Attrs({{"axis", int64_t{-1}}}),
        {{kF16, {4096, 4096}, {}}, {kF16, {4096}, {}}, {kF16, {4096}, {}}},
        "cuda.layer-normalization.warp-vec"}},
      {"add_f16_residual_4096x768",
       {"Add", {}, {{kF16, {32, 128, 768}, {}}, {kF16, {32, 128, 768}, {}}}}},
      {"add_f16_bias_4096x3072", {"Add", {}, {{kF16, {32, 128, 3072}, {}}, {kF16, {3072}, {}}}}},
      {"gelu_f16_4096x3072", {"Gelu", {}, {{kF16, {32, 128, 3072}, {}}}}},
      {"softmax_f16_32x12x128x128",
       {"Softmax", Attrs({{"axis", int64_t{-1}}}), {{kF16, {32, 12, 128, 128}, {}}}}},
      {"transpose_f16_heads",
       {"Transpose",
        Attrs({{"perm", std::vector<int64_t>{0, 2, 1, 3}}}),
        {{kF16, {32, 128, 12, 64}, {}}}}},
      {"gather_f16_embedding",
       {"Gather",
        Attrs({{"axis", int64_t{0}}}),
        {{kF16, {30522, 768}, {}}, {kI64, {32, 128}, std::vector<int64_t>(32 * 128, 17)}}}},
      // ResNet-50 batch 32: the layout transposes, the stem pool and the head.
      {"transpose_f16_nchw_to_nhwc",
       {"Transpose",
        Attrs({{"perm", std::vector<int64_t>{0, 2, 3, 1}}}),
        {{kF16, {32, 64, 112, 112}, {}}}}},
      {"maxpool_f16_3x3s2",
       {"MaxPool",
        Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
               {"strides", std::vector<int64_t>{2, 2}},
               {"pads", std::vector<int64_t>{1, 1, 1, 1}}}),
        {{kF16, {32, 64, 112, 112}, {}}}}},
      {"globalavgpool_f16_2048x7x7", {"GlobalAveragePool", {}, {{kF16, {32, 2048, 7, 7}, {}}}}},
      {"concat_f16_channels",
       {"Concat",
        Attrs({{"axis", int64_t{1}}}),
        {{kF16, {32, 128, 56, 56}, {}}, {kF16, {32, 128, 56, 56}, {}}}}},
  };
  // Attention at batch 32 (heads interleaved in rows, as the layout pass leaves it), every
  // tactic: BERT-base (12 heads of 64, 128 tokens, the padding mask [B, 1, 1, S]; "bert4d": the
  // [B, 1, S, S] mask an eager export of newer transformers materializes), GPT-2 (causal), ViT-B/16
  // (197 tokens, no mask) and Whisper-base's encoder (8 heads, 1500 frames).
  struct AttnBench {
    std::string name;
    int64_t seq, heads;
    std::string mask;
  };
  for (const AttnBench& a : std::vector<AttnBench>{{"bert", 128, 12, "additive"},
                                                   {"bert4d", 128, 12, "additive"},
                                                   {"gpt2", 128, 12, "causal"},
                                                   {"vit", 197, 12, "none"},
                                                   {"whisper", 1500, 8, "none"}}) {
    const int64_t b = a.name == "whisper" ? 8 : 32, e = a.heads * 64;
    std::vector<Operand> ops(3, Operand{kF16, {b, a.seq, e}, {}});
    if (a.mask == "additive") {
      ops.push_back({kF16, {b, 1, a.name == "bert4d" ? a.seq : 1, a.seq}, {}});
    }
    AttributeMap attrs =
        Attrs({{"layout", std::string("bsd")}, {"num_heads", a.heads}, {"mask_kind", a.mask}});
    for (size_t t = 0; t < 8; ++t) {
      BenchCase c{"Attention", attrs, ops};
      c.tactic = t;
      cases.emplace_back(fmt::format("attention_{}_b{}_t{}", a.name, b, t), std::move(c));
    }
  }
  // CLIP's fc1 at batch 32 (197 tokens, 768 -> 3072) with its QuickGELU (swish, alpha 1.702;
  // cuBLASLt has no such epilogue, so a pass over the output follows), beside GELU (cuBLASLt's
  // epilogue) and no activation; and Llama's SwiGLU over the packed gate/up projection.
  for (std::string act : {"swish", "gelu_tanh", "none"}) {
    AttributeMap attrs = Attrs({{"activation", act}});
    if (act == "swish") attrs.Set("activation_alpha", 1.702f);
    cases.emplace_back(
        "fusedmatmul_f16_6304x768x3072_" + act,
        BenchCase{"FusedMatMul",
                  attrs,
                  {{kF16, {32, 197, 768}, {}}, {kF16, {768, 3072}, {}}, {kF16, {3072}, {}}}});
  }
  // BERT-base's four products at batch 32 (4096 rows) with their bias (and fc1's GELU): the FP16
  // product (the cuBLASLt heuristic's algorithm) beside the INT8 ones from float activations
  // (quantized on the way in) in every family: cuBLASLt's IMMA, kiln's mma.sync kernel (its
  // first tile) and kiln's warpgroup kernel (Hopper; each tile); and the FP8 ones: cuBLASLt's
  // direct plan (its epilogue writes Y) with promoted and with fast accumulation, and kiln's
  // warpgroup kernel in each tile. Compare within one run.
  struct Product {
    std::string name;
    int64_t k, n;
    std::string act;
  };
  for (const Product& pr : std::vector<Product>{{"qkv", 768, 2304, "none"},
                                                {"attn_out", 768, 768, "none"},
                                                {"fc1", 768, 3072, "gelu"},
                                                {"fc2", 3072, 768, "none"}}) {
    std::vector<int64_t> weights(static_cast<size_t>(pr.k * pr.n));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<int64_t>(i * 7919 % 5) - 2;
    const std::vector<Operand> ops = {
        {kF16, {32, 128, pr.k}, {}}, {kF16, {pr.k, pr.n}, weights}, {kF16, {pr.n}, {}}};
    const double flops = 2.0 * 4096 * static_cast<double>(pr.k) * static_cast<double>(pr.n);
    AttributeMap attrs = Attrs({{"activation", pr.act}});
    BenchCase fp16{"FusedMatMul", attrs, ops, "cuda.fused_matmul.cublaslt"};
    fp16.tactic_prefix = "f16-";
    fp16.ops = flops;
    cases.emplace_back(fmt::format("bert_{}_f16", pr.name), fp16);
    attrs.Set("kiln_int8_input_amax", 1.f);
    for (const auto& [family, tiles] : std::vector<std::pair<std::string, size_t>>{
             {"cublaslt", 1}, {"mma", 1}, {"wgmma", kWgmmaTiles}}) {
      for (size_t t = 0; t < tiles; ++t) {
        BenchCase i8{"FusedMatMul", attrs, ops, "cuda.fused_matmul.cublaslt.i8"};
        i8.tactic_prefix = "i8-matmul-cuda-" + family + "-";
        i8.tactic = t;
        i8.ops = flops;
        cases.emplace_back(fmt::format("bert_{}_i8_{}_t{}", pr.name, family, t), std::move(i8));
      }
    }
    // The same products reading A already quantized (an INT8 edge's consumer: no quantization
    // launch), so the difference to the cases above is what quantizing A costs.
    {
      AttributeMap edge = attrs;
      edge.Set("kiln_int8_input_edge", int64_t{1});
      std::vector<Operand> edge_ops = ops;
      edge_ops[0].dtype = DataType::kInt8;
      for (const auto& [family, tiles] :
           std::vector<std::pair<std::string, size_t>>{{"mma", 1}, {"wgmma", kWgmmaTiles}}) {
        for (size_t t = 0; t < tiles; ++t) {
          BenchCase i8{"FusedMatMul", edge, edge_ops, "cuda.fused_matmul.cublaslt.i8"};
          i8.tactics_for_a = kF16;
          i8.tactic_prefix = "i8-matmul-cuda-" + family + "-";
          i8.tactic = t;
          i8.ops = flops;
          cases.emplace_back(fmt::format("bert_{}_i8in_{}_t{}", pr.name, family, t), std::move(i8));
        }
      }
      // Reading and writing int8 (a product between two edges, as BERT's fc1 between its norm's
      // copy and fc2): the epilogue quantizes Y by the INT8 contract.
      edge.Set("kiln_int8_output_scale", 0.05f);
      for (size_t t = 0; t < kWgmmaTiles; ++t) {
        BenchCase i8{"FusedMatMul", edge, edge_ops, "cuda.fused_matmul.cublaslt.i8"};
        i8.tactics_for_a = kF16;
        i8.tactic_prefix = "i8-matmul-cuda-wgmma-";
        i8.tactic = t;
        i8.ops = flops;
        cases.emplace_back(fmt::format("bert_{}_i8io_wgmma_t{}", pr.name, t), std::move(i8));
      }
    }
    attrs.Erase("kiln_int8_input_amax");
    attrs.Set("kiln_fp8_input_amax", 1.f);
    struct Fp8Family {
      std::string name, prefix, has;
      size_t tiles;
    };
    for (const Fp8Family& f : std::vector<Fp8Family>{
             {"cublaslt", "f8-matmul-cuda-cublaslt-", "-lt-epilogue", 1},
             {"cublaslt_fast", "f8-matmul-cuda-cublaslt-", "-lt-epilogue-fast-accum", 1},
             {"wgmma", "f8-matmul-cuda-wgmma-", "", kWgmmaTiles}}) {
      for (size_t t = 0; t < f.tiles; ++t) {
        BenchCase f8{"FusedMatMul", attrs, ops, "cuda.fused_matmul.cublaslt.f8"};
        f8.tactic_prefix = f.prefix;
        f8.tactic_has = f.has;
        f8.tactic = t;
        f8.ops = flops;
        cases.emplace_back(fmt::format("bert_{}_f8_{}_t{}", pr.name, f.name, t), std::move(f8));
      }
    }
  }
  // ResNet-50's convolutions at batch 32, channels-last (the layout pass's NHWC) with their bias
  // and ReLU: cuDNN's FP16 convolution (the heuristic's first engine) beside kiln's INT8 implicit
  // GEMM (conv_int8.cc) on the warpgroup kernel (Hopper; each gathering tile) and on the mma.sync
  // kernel (each tile), X quantized on the way in. The 1x1 stride-1 layer is a plain product.
  // stem_s2d: the stem as the stem_space_to_depth pass leaves it (2 x 2 blocks of 3 channels as
  // 12, 4 x 4 taps, stride 1, pads 2 before and 1 after): the same outputs as stem7x7's.
  struct ConvLayer {
    std::string name;
    int64_t hw, c, k, window, stride;
    std::vector<int64_t> pads = {};  // default: window / 2 on every side
  };
  for (const ConvLayer& l : std::vector<ConvLayer>{{"stem7x7", 224, 3, 64, 7, 2},
                                                   {"stem_s2d", 112, 12, 64, 4, 1, {2, 2, 1, 1}},
                                                   {"l1_3x3", 56, 64, 64, 3, 1},
                                                   {"l1_1x1_up", 56, 64, 256, 1, 1},
                                                   {"l1_1x1_down", 56, 256, 64, 1, 1},
                                                   {"l2_1x1_down", 28, 512, 128, 1, 1},
                                                   {"l3_3x3", 14, 256, 256, 3, 1},
                                                   {"l4_3x3", 7, 512, 512, 3, 1}}) {
    std::vector<int64_t> weights(static_cast<size_t>(l.k * l.c * l.window * l.window));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<int64_t>(i * 7919 % 5) - 2;
    std::vector<int64_t> bias(static_cast<size_t>(l.k));
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = static_cast<int64_t>(i % 3) - 1;
    const int64_t pad = l.window / 2;
    const std::vector<int64_t> pads = l.pads.empty() ? std::vector<int64_t>(4, pad) : l.pads;
    const int64_t out = (l.hw + pads[0] + pads[2] - l.window) / l.stride + 1;
    AttributeMap attrs = Attrs({{"activation", std::string("relu")},
                                {"kernel_shape", std::vector<int64_t>{l.window, l.window}},
                                {"strides", std::vector<int64_t>{l.stride, l.stride}},
                                {"pads", pads},
                                {"kiln_layout", std::string("NHWC")}});
    const std::vector<Operand> ops = {{kF16, {32, l.hw, l.hw, l.c}, {}},
                                      {kF16, {l.k, l.c, l.window, l.window}, weights},
                                      {kF16, {l.k}, bias}};
    const double flops = 2.0 * 32 * static_cast<double>(out * out) * static_cast<double>(l.k) *
                         static_cast<double>(l.c * l.window * l.window);
    BenchCase fp16{"FusedConv", attrs, ops, "cuda.fused_conv.cudnn"};
    fp16.tactic_prefix = "f16-";
    fp16.ops = flops;
    cases.emplace_back(fmt::format("resnet_{}_f16", l.name), fp16);
    attrs.Set("kiln_int8_input_amax", 1.f);
    // A 1x1 stride-1 convolution is a plain product: every tile of the warpgroup kernel, the
    // TMA ones too; the others gather with its cp.async tiles.
    const size_t wgmma_tiles = l.window == 1 && l.stride == 1
                                   ? kWgmmaTiles
                                   : static_cast<size_t>(cuda::Int8WgmmaConvTileCount());
    for (const auto& [family, tiles] :
         std::vector<std::pair<std::string, size_t>>{{"wgmma", wgmma_tiles}, {"mma", 5}}) {
      for (size_t t = 0; t < tiles; ++t) {
        BenchCase i8{"FusedConv", attrs, ops, "cuda.fused_conv.i8"};
        i8.tactic_prefix = "i8-fused-conv-cuda-" + family + "-";
        i8.tactic = t;
        i8.ops = flops;
        cases.emplace_back(fmt::format("resnet_{}_i8_{}_t{}", l.name, family, t), std::move(i8));
      }
    }
  }
  cases.emplace_back("gated_silu_f16_4096x2x2048",
                     BenchCase{"GatedActivation",
                               Attrs({{"activation", std::string("silu")}}),
                               {{kF16, {32, 128, 4096}, {}}}});
  for (auto& [name, c] : cases) {
    benchmark::RegisterBenchmark(name.c_str(), [c = c](benchmark::State& s) { RunCase(s, c); })
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  return true;
}();

}  // namespace
}  // namespace kiln

BENCHMARK_MAIN();
