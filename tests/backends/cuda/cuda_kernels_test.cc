// Conformance of kiln's own CUDA kernels: every case builds a one-node graph, runs each CUDA
// tactic and the CPU backend on the same fresh random inputs (f32, f16 and bf16 storage where the
// op is a float op) and compares with tolerances by dtype. GPU cases skip where no GPU is present;
// the host-side cases (provider coverage, broadcast coalescing) run everywhere.
// KILN_CUDA_KERNELS_ON=cpu runs the same cases against the CPU providers: a check of the cases
// themselves on a machine without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda_cases.h"
#include "kiln/app/pipeline.h"
#include "kiln/backends/backend.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/builder/builder.h"
#include "kiln/builder/builder_config.h"
#include "kiln/ops/op_schema.h"
#include "op_tester.h"

namespace kiln {
namespace {

using testing::OpTester;

using namespace testing;  // cuda_cases.h: Attrs, F32, I64, kAllFloats, TargetBackend...

struct Case {
  std::string name;
  std::function<OpTester()> make;
};

std::vector<Case> Cases() {
  std::vector<Case> c;
  auto add = [&c](std::string name, std::function<OpTester()> make) {
    c.push_back({std::move(name), std::move(make)});
  };

  // ---- unary activations: odd, vector-tail, large and single-element shapes --------------------
  struct U {
    const char* op;
    double lo, hi;
    AttributeMap attrs;
  };
  std::vector<U> unary = {
      {"Relu", -2, 2, {}},
      {"LeakyRelu", -2, 2, Attrs({{"alpha", 0.1f}})},
      {"Sigmoid", -6, 6, {}},
      {"Tanh", -3, 3, {}},
      {"Erf", -2, 2, {}},
      {"Exp", -2, 2, {}},
      {"Log", 0.1, 4, {}},
      {"Sqrt", 0.01, 4, {}},
      {"Neg", -2, 2, {}},
      {"Abs", -2, 2, {}},
      {"Softplus", -3, 3, {}},
      {"Elu", -2, 2, {}},
      {"HardSigmoid", -4, 4, Attrs({{"alpha", 0.25f}, {"beta", 0.4f}})},
      {"HardSwish", -5, 5, {}},
      {"Gelu", -3, 3, {}},
      {"Gelu", -3, 3, Attrs({{"approximate", std::string("tanh")}})},
      {"Mish", -3, 3, {}},
  };
  for (const U& u : unary) {
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{2, 3, 17}, std::vector<int64_t>{4099}, std::vector<int64_t>{1}}) {
      std::string name = std::string(u.op) + (u.attrs.size() ? "_attr" : "") + "_" +
                         std::to_string(NumElements(dims));
      add(name, [u, dims] {
        OpTester t(u.op, u.attrs);
        t.Input(kF32, dims, u.lo, u.hi).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
  }
  add("Clip_min_max", [] {
    OpTester t("Clip");
    t.Input(kF32, {3, 33}).Input(F32({}, {-0.5f})).Input(F32({}, {0.75f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Clip_min_only", [] {
    OpTester t("Clip");
    t.Input(kF32, {130}).Input(F32({}, {0.1f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Not", [] {
    OpTester t("Not");
    t.Input(kBool, {5, 7});
    return t;
  });

  // ---- binary with broadcasting ---------------------------------------------------------------
  struct B {
    std::vector<int64_t> a, b;
  };
  std::vector<B> shapes = {{{3, 5, 7}, {3, 5, 7}},     {{3, 1, 7}, {5, 1}},       {{}, {2, 3}},
                           {{256, 1031}, {256, 1031}}, {{2, 3, 4, 5}, {3, 1, 1}}, {{1001}, {1}}};
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"}) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      B s = shapes[i];
      std::string sop = op;
      add(sop + "_" + std::to_string(i), [sop, s] {
        OpTester t(sop);
        double lo = sop == "Div" ? 0.5 : -2;
        t.Input(kF32, s.a).Input(kF32, s.b, lo, 2.0).FloatTypes(kAllFloats);
        return t;
      });
    }
  }
  for (const char* op : {"Add", "Mul", "Sub", "Div"}) {
    std::string sop = op;
    add(sop + "_i64", [sop] {
      OpTester t(sop);
      t.Input(kI64, {4, 3}, -9, 9).Input(kI64, {3}, 1, 5);
      return t;
    });
  }
  add("Add_i32", [] {
    OpTester t("Add");
    t.Input(kI32, {7, 5}, -50, 50).Input(kI32, {7, 1}, -50, 50);
    return t;
  });
  add("Pow_f32", [] {
    OpTester t("Pow");
    t.Input(kF32, {4, 9}, 0.5, 2).Input(kF32, {9}, -2, 3).FloatTypes(kAllFloats);
    return t;
  });
  add("Pow_square", [] {
    OpTester t("Pow");
    t.Input(kF32, {37}, -2, 2).Input(F32({}, {2.f})).FloatTypes(kAllFloats);
    return t;
  });
  add("Pow_i64_exp", [] {
    OpTester t("Pow");
    t.Input(kF32, {3, 4}, -2, 2).Input(I64({}, {3}));
    return t;
  });
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
    std::string sop = op;
    add(sop + "_f32", [sop] {
      OpTester t(sop);
      t.Input(kF32, {6, 11}, -2, 2).Input(kF32, {11}, -2, 2);
      return t;
    });
    add(sop + "_i64", [sop] {
      OpTester t(sop);
      t.Input(kI64, {5, 4}, -2, 2).Input(kI64, {5, 1}, -2, 2);
      return t;
    });
  }
  add("Equal_bool", [] {
    OpTester t("Equal");
    t.Input(kBool, {3, 8}).Input(kBool, {8});
    return t;
  });
  for (const char* op : {"And", "Or", "Xor"}) {
    std::string sop = op;
    add(sop, [sop] {
      OpTester t(sop);
      t.Input(kBool, {4, 1, 6}).Input(kBool, {5, 6});
      return t;
    });
  }
  add("Where_broadcast", [] {
    OpTester t("Where");
    t.Input(kBool, {2, 1, 5}).Input(kF32, {2, 3, 5}).Input(kF32, {5}).FloatTypes(kAllFloats);
    return t;
  });
  add("Where_i64", [] {
    OpTester t("Where");
    t.Input(kBool, {7}).Input(kI64, {7}, -9, 9).Input(kI64, {}, -9, 9);
    return t;
  });

  // ---- Cast -------------------------------------------------------------------------------------
  struct C {
    DataType from;
    int64_t to;  // ONNX type number
    double lo, hi;
  };
  for (C cc : std::vector<C>{{kF32, 7, -50, 50},
                             {kF32, 10, -4, 4},
                             {kF32, 16, -4, 4},
                             {kF32, 9, -1, 1},
                             {kI64, 1, -1000, 1000},
                             {kI32, 7, -1000, 1000},
                             {kBool, 1, 0, 1},
                             {DataType::kFloat16, 1, -4, 4},
                             {DataType::kBFloat16, 6, -100, 100}}) {
    add("Cast_" + std::string(ToString(cc.from)) + "_to_" + std::to_string(cc.to), [cc] {
      OpTester t("Cast", Attrs({{"to", cc.to}}));
      DataType stored = IsFloat(cc.from) ? kF32 : cc.from;
      t.Input(stored, {3, 67}, cc.lo, cc.hi);
      if (IsFloat(cc.from)) t.FloatTypes({cc.from});
      return t;
    });
  }

  // ---- normalisations -------------------------------------------------------------------------
  for (std::vector<int64_t> dims : {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768},
                                    std::vector<int64_t>{2, 1500}, std::vector<int64_t>{1, 1}}) {
    add("LayerNorm_" + std::to_string(dims.back()) + "_" + std::to_string(dims.size()), [dims] {
      OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
      t.Input(kF32, dims).Input(kF32, {dims.back()}).Input(kF32, {dims.back()});
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  // The warp-vec tactic's register path with several warps per row (f16 4096: 4 warps; f32 4096:
  // 8) and the 1024-halves single-warp case.
  for (int64_t n : {1024, 4096}) {
    add("LayerNorm_rows_" + std::to_string(n), [n] {
      OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
      t.Input(kF32, {5, n}).Input(kF32, {n}).Input(kF32, {n});
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  // SkipLayerNormalization (residual Add + LayerNorm): register path (768, 1024, 4096, 8 * 16),
  // general paths (33: not a multiple of 16 bytes; 1500 on f16: a block per row), with and
  // without the sum output.
  for (std::vector<int64_t> dims : {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768},
                                    std::vector<int64_t>{2, 1500}, std::vector<int64_t>{3, 1024},
                                    std::vector<int64_t>{2, 4096}, std::vector<int64_t>{9, 128}}) {
    for (int outputs : {1, 2}) {
      add("SkipLayerNorm_" + std::to_string(dims.back()) + "_out" + std::to_string(outputs),
          [dims, outputs] {
            OpTester t("SkipLayerNormalization",
                       Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
            t.Input(kF32, dims).Input(kF32, dims).Input(kF32, {dims.back()}, 0.5, 1.5);
            t.Input(kF32, {dims.back()}).Outputs(outputs);
            t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
            return t;
          });
    }
  }
  // Enough rows (>= 132 * 8 warps) for the one-warp-per-row geometry BERT/GPT-2 batch 32 get; the
  // small cases above spread rows over several warps.
  add("SkipLayerNorm_1200x768_out2", [] {
    OpTester t("SkipLayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
    t.Input(kF32, {1200, 768}).Input(kF32, {1200, 768}).Input(kF32, {768}, 0.5, 1.5);
    t.Input(kF32, {768}).Outputs(2).FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_1200x768", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-5f}}));
    t.Input(kF32, {1200, 768}).Input(kF32, {768}).Input(kF32, {768});
    t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("SkipLayerNorm_axis1_no_bias", [] {
    OpTester t("SkipLayerNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}).Outputs(2);
    t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_axis1_no_bias", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}).FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
    return t;
  });
  add("LayerNorm_stats_outputs", [] {
    OpTester t("LayerNormalization", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {5, 40}).Input(kF32, {40}).Input(kF32, {40}).Outputs(3).Tolerance(1e-4, 1e-4);
    return t;
  });
  // RMSNormalization: vector loads with a warp per row (768, Llama's hidden sizes), a block per
  // row (4096 on f32, 5120), scalar loads (33, 1500: not a multiple of 16 bytes), many rows.
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768}, std::vector<int64_t>{2, 1500},
        std::vector<int64_t>{2, 4096}, std::vector<int64_t>{2, 5120},
        std::vector<int64_t>{1200, 768}}) {
    add("RmsNorm_" + std::to_string(dims.front()) + "x" + std::to_string(dims.back()), [dims] {
      OpTester t("RMSNormalization", Attrs({{"axis", int64_t{-1}}, {"epsilon", 1e-6f}}));
      t.Input(kF32, dims, -3, 3).Input(kF32, {dims.back()}, 0.5, 1.5);
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }
  add("RmsNorm_axis1", [] {
    OpTester t("RMSNormalization", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 8}).Input(kF32, {3, 8}, 0.5, 1.5).FloatTypes(kAllFloats);
    t.Tolerance(1e-4, 1e-4);
    return t;
  });
  // GatedActivation (SwiGLU, GeGLU): two inputs (odd sizes: scalar accesses; 688: 16-byte), and
  // the packed gate/up halves of one input (Llama 7B's 11008 intermediate, an odd 35).
  for (const char* act : {"silu", "gelu", "gelu_tanh"}) {
    std::string sact = act;
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{64, 688}}) {
      add("Gated_" + sact + "_" + std::to_string(dims.back()), [sact, dims] {
        OpTester t("GatedActivation", Attrs({{"activation", sact}}));
        t.Input(kF32, dims, -4, 4).Input(kF32, dims).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{8, 2 * 11008}, std::vector<int64_t>{5, 70}}) {
      add("Gated_packed_" + sact + "_" + std::to_string(dims.back()), [sact, dims] {
        OpTester t("GatedActivation", Attrs({{"activation", sact}}));
        t.Input(kF32, dims, -4, 4).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-5);
        return t;
      });
    }
  }
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    std::string sop = op;
    for (std::vector<int64_t> dims : {std::vector<int64_t>{3, 37}, std::vector<int64_t>{2, 4, 128},
                                      std::vector<int64_t>{2, 2000}, std::vector<int64_t>{7, 1}}) {
      add(sop + "_last_" + std::to_string(dims.back()), [sop, dims] {
        OpTester t(sop, Attrs({{"axis", int64_t{-1}}}));
        t.Input(kF32, dims, -5, 5).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
        return t;
      });
    }
    add(sop + "_axis1", [sop] {
      OpTester t(sop, Attrs({{"axis", int64_t{1}}}));
      t.Input(kF32, {2, 5, 7}, -5, 5).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
      return t;
    });
  }
  add("BatchNorm", [] {
    OpTester t("BatchNormalization", Attrs({{"epsilon", 1e-3f}}));
    t.Input(kF32, {2, 3, 5, 7}).Input(kF32, {3}).Input(kF32, {3}).Input(kF32, {3});
    t.Input(kF32, {3}, 0.5, 2).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });

  // ---- pooling ----------------------------------------------------------------------------------
  add("MaxPool_3x3_s2_p1", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                                 {"strides", std::vector<int64_t>{2, 2}},
                                 {"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
    t.Input(kF32, {2, 3, 9, 11}).FloatTypes(kAllFloats);
    return t;
  });
  add("MaxPool_ceil_dilated", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{2, 3}},
                                 {"strides", std::vector<int64_t>{2, 2}},
                                 {"dilations", std::vector<int64_t>{1, 2}},
                                 {"ceil_mode", int64_t{1}}}));
    t.Input(kF32, {1, 4, 10, 13}).FloatTypes(kAllFloats);
    return t;
  });
  add("AveragePool_pad_include", [] {
    OpTester t("AveragePool", Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                                     {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                     {"count_include_pad", int64_t{1}}}));
    t.Input(kF32, {2, 2, 6, 7}).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });
  add("AveragePool_same_upper", [] {
    OpTester t("AveragePool", Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                                     {"strides", std::vector<int64_t>{2, 2}},
                                     {"auto_pad", std::string("SAME_UPPER")}}));
    t.Input(kF32, {1, 3, 7, 9}).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
    return t;
  });
  add("MaxPool_1d", [] {
    OpTester t("MaxPool", Attrs({{"kernel_shape", std::vector<int64_t>{3}}}));
    t.Input(kF32, {2, 3, 10}).FloatTypes(kAllFloats);
    return t;
  });
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{2, 3, 7, 9}, std::vector<int64_t>{1, 640, 7, 7},
        std::vector<int64_t>{2, 5, 1, 1}}) {
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
      std::string sop = op;
      add(sop + "_" + std::to_string(dims[1]) + "x" + std::to_string(dims[2]), [sop, dims] {
        OpTester t(sop);
        t.Input(kF32, dims).FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
        return t;
      });
    }
  }

  // ---- reductions -----------------------------------------------------------------------------
  struct R {
    const char* op;
    std::vector<int64_t> dims, axes;
    int64_t keepdims;
  };
  for (R r : std::vector<R>{{"ReduceMean", {3, 5, 40}, {-1}, 1},
                            {"ReduceMean", {4, 1000}, {1}, 0},
                            {"ReduceSum", {3, 50, 7}, {1}, 1},
                            {"ReduceMax", {4, 5, 6}, {0, 2}, 1},
                            {"ReduceMin", {4, 5, 6}, {0, 2}, 0},
                            {"ReduceSum", {6, 70}, {}, 0},
                            {"ReduceProd", {5, 6}, {1}, 1},
                            {"ReduceL2", {2, 3, 4}, {1, 2}, 1},
                            {"ReduceSumSquare", {3, 9}, {0}, 1},
                            {"ReduceLogSumExp", {3, 9}, {-1}, 1}}) {
    std::string name = std::string(r.op) + "_" + std::to_string(r.dims.size()) + "d_" +
                       std::to_string(r.axes.size()) + "ax_k" + std::to_string(r.keepdims) + "_" +
                       std::to_string(NumElements(r.dims));
    add(name, [r] {
      OpTester t(r.op, Attrs({{"keepdims", r.keepdims}}));
      double lo = std::string(r.op) == "ReduceProd" ? 0.8 : -2;
      double hi = std::string(r.op) == "ReduceProd" ? 1.2 : 2;
      t.Input(kF32, r.dims, lo, hi);
      if (!r.axes.empty()) t.Constant(I64({static_cast<int64_t>(r.axes.size())}, r.axes));
      t.FloatTypes(kAllFloats).Tolerance(1e-4, 1e-4);
      return t;
    });
  }

  // ---- Resize -----------------------------------------------------------------------------------
  struct Rz {
    const char* mode;
    const char* coord;
    const char* nearest;
    std::vector<int64_t> x, sizes;
  };
  for (Rz z : std::vector<Rz>{
           {"nearest", "asymmetric", "floor", {1, 2, 5, 7}, {1, 2, 10, 14}},
           {"nearest", "half_pixel", "round_prefer_floor", {2, 3, 7, 9}, {2, 3, 3, 4}},
           {"linear", "half_pixel", "round_prefer_floor", {1, 3, 6, 5}, {1, 3, 12, 10}},
           {"linear", "align_corners", "round_prefer_floor", {2, 2, 4, 9}, {2, 2, 7, 5}},
           {"linear", "pytorch_half_pixel", "round_prefer_floor", {1, 1, 9, 1}, {1, 1, 4, 1}}}) {
    std::string name = std::string("Resize_") + z.mode + "_" + z.coord + "_" +
                       std::to_string(z.sizes[2]) + "x" + std::to_string(z.sizes[3]);
    add(name, [z] {
      OpTester t("Resize", Attrs({{"mode", std::string(z.mode)},
                                  {"coordinate_transformation_mode", std::string(z.coord)},
                                  {"nearest_mode", std::string(z.nearest)}}));
      t.Input(kF32, z.x).Omitted().Omitted().Constant(I64({4}, z.sizes));
      t.FloatTypes(kAllFloats).Tolerance(1e-5, 1e-4);
      return t;
    });
  }
  add("Resize_scales_nearest_2x", [] {
    OpTester t("Resize", Attrs({{"mode", std::string("nearest")}}));
    t.Input(kF32, {1, 4, 3, 5}).Omitted().Constant(F32({4}, {1.f, 1.f, 2.f, 2.f}));
    return t;
  });

  // ---- data movement ----------------------------------------------------------------------------
  add("Gather_axis0_neg", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {5, 7}).Input(I64({3}, {0, -1, 3})).FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_axis1_i32", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {3, 6, 4})
        .Input(Tensor::FromVector(kI32, {2, 2}, std::vector<int32_t>{5, 0, 2, 2}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_embedding", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {100, 64}).Input(I64({2, 5}, {1, 99, 3, 0, 42, 7, 7, 8, 50, 61}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  add("Gather_shape_scalar", [] {
    OpTester t("Gather", Attrs({{"axis", int64_t{0}}}));
    t.Input(I64({4}, {2, 3, 5, 7})).Input(I64({}, {2}));
    return t;
  });
  add("Concat_axis1_3parts", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 5}).Input(kF32, {2, 1, 5}).Input(kF32, {2, 4, 5}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_axis0", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{0}}}));
    t.Input(kF32, {1, 64}).Input(kF32, {3, 64}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_last_odd", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {3, 3}).Input(kF32, {3, 5}).Input(kF32, {3, 1}).FloatTypes(kAllFloats);
    return t;
  });
  add("Concat_i64_shapes", [] {
    OpTester t("Concat", Attrs({{"axis", int64_t{0}}}));
    t.Input(I64({1}, {4})).Input(I64({1}, {-1})).Input(I64({2}, {8, 16}));
    return t;
  });
  add("Split_equal", [] {
    OpTester t("Split", Attrs({{"axis", int64_t{0}}, {"num_outputs", int64_t{3}}}));
    t.Input(kF32, {6, 5}).Outputs(3).FloatTypes(kAllFloats);
    return t;
  });
  add("Split_sizes_last", [] {
    OpTester t("Split", Attrs({{"axis", int64_t{-1}}}));
    t.Input(kF32, {2, 3, 12}).Constant(I64({3}, {4, 4, 4})).Outputs(3).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_const_steps", [] {
    OpTester t("Slice");
    t.Input(kF32, {10, 12}).Constant(I64({2}, {1, -4})).Constant(I64({2}, {8, 100}));
    t.Constant(I64({2}, {0, 1})).Constant(I64({2}, {2, 1})).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_negative_step", [] {
    OpTester t("Slice");
    t.Input(kF32, {4, 9}).Constant(I64({1}, {-1})).Constant(I64({1}, {-100}));
    t.Constant(I64({1}, {1})).Constant(I64({1}, {-2})).FloatTypes(kAllFloats);
    return t;
  });
  add("Slice_no_axes", [] {
    OpTester t("Slice");
    t.Input(kF32, {5, 6, 7}).Constant(I64({2}, {1, 2})).Constant(I64({2}, {4, 5}));
    t.FloatTypes(kAllFloats);
    return t;
  });
  for (std::pair<std::vector<int64_t>, std::vector<int64_t>> p :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{2, 3, 4, 5}, {0, 2, 1, 3}},
           {{7, 9}, {}},
           {{2, 3, 4}, {2, 0, 1}},
           {{64, 33, 65}, {2, 1, 0}},
           {{2, 16, 4, 32}, {0, 2, 1, 3}},
           {{2, 24, 7, 9}, {0, 2, 3, 1}},
           {{3, 9, 5, 40}, {0, 3, 1, 2}}}) {
    add("Transpose_" + std::to_string(NumElements(p.first)), [p] {
      AttributeMap at;
      if (!p.second.empty()) at.Set("perm", p.second);
      OpTester t("Transpose", at);
      t.Input(kF32, p.first).FloatTypes(kAllFloats);
      return t;
    });
  }
  add("Transpose_i64", [] {
    OpTester t("Transpose", Attrs({{"perm", std::vector<int64_t>{1, 0}}}));
    t.Input(kI64, {3, 5}, -9, 9);
    return t;
  });
  add("Expand", [] {
    OpTester t("Expand");
    t.Input(kF32, {3, 1}).Constant(I64({3}, {2, 3, 4})).FloatTypes(kAllFloats);
    return t;
  });
  add("Reshape", [] {
    OpTester t("Reshape");
    t.Input(kF32, {2, 3, 4}).Constant(I64({2}, {6, 4})).FloatTypes(kAllFloats);
    return t;
  });
  add("Flatten", [] {
    OpTester t("Flatten", Attrs({{"axis", int64_t{1}}}));
    t.Input(kF32, {2, 3, 4}).FloatTypes(kAllFloats);
    return t;
  });
  add("Squeeze", [] {
    OpTester t("Squeeze");
    t.Input(kF32, {1, 3, 1, 5}).Constant(I64({2}, {0, 2}));
    return t;
  });
  add("Unsqueeze", [] {
    OpTester t("Unsqueeze");
    t.Input(kI64, {3}, -5, 5).Constant(I64({1}, {0}));
    return t;
  });
  add("Identity", [] {
    OpTester t("Identity");
    t.Input(kF32, {17}).FloatTypes(kAllFloats);
    return t;
  });
  add("Trilu_upper", [] {
    OpTester t("Trilu");
    t.Input(kF32, {2, 5, 6}).FloatTypes(kAllFloats);
    return t;
  });
  add("Trilu_lower_k", [] {
    OpTester t("Trilu", Attrs({{"upper", int64_t{0}}}));
    t.Input(kF32, {7, 4}).Constant(I64({}, {1}));
    return t;
  });
  add("Shape", [] {
    OpTester t("Shape");
    t.Input(kF32, {2, 3, 5});
    return t;
  });
  add("Shape_start", [] {
    OpTester t("Shape", Attrs({{"start", int64_t{1}}}));
    t.Input(kF32, {2, 3, 5, 7});
    return t;
  });
  add("ConstantOfShape", [] {
    OpTester t("ConstantOfShape", Attrs({{"value", F32({1}, {1.5f})}}));
    t.Constant(I64({2}, {3, 4}));
    return t;
  });
  add("ConstantOfShape_i64", [] {
    OpTester t("ConstantOfShape", Attrs({{"value", I64({1}, {1})}}));
    t.Constant(I64({1}, {5}));
    return t;
  });
  add("Range_f32", [] {
    OpTester t("Range");
    t.Constant(F32({}, {1.f})).Constant(F32({}, {10.f})).Constant(F32({}, {1.5f}));
    return t;
  });
  add("Range_i64", [] {
    OpTester t("Range");
    t.Constant(I64({}, {0})).Constant(I64({}, {128})).Constant(I64({}, {1}));
    return t;
  });
  return c;
}

class CudaKernelConformance : public ::testing::TestWithParam<Case> {};

TEST_P(CudaKernelConformance, MatchesCpu) {
  OpTester t = GetParam().make();
  t.Run(TargetBackend());
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaKernelConformance, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return CaseTestName(info.param.name);
                         });

// ---- direct provider runs: cases the one-node harness cannot express -------------------------

// Runs `p`'s first tactic for `r` on `kind` with host tensors in and out.
Status RunProvider(BackendKind kind, const KernelProvider& p, const KernelRequest& r,
                   const std::vector<Tensor>& ins, std::vector<Tensor>& outs) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(kind));
  auto tactics = p.Tactics(r);
  if (tactics.empty()) return MakeError(ErrorCode::kUnimplemented, "no tactic from {}", p.id());
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, p.Create(r, tactics[0]));
  std::vector<DeviceBuffer> bufs;
  std::vector<TensorView> in_views, out_views;
  for (const Tensor& t : ins) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    if (t.size_bytes() > 0) {
      KILN_RETURN_IF_ERROR(backend->CopyToDevice(b.data(), t.raw(), t.size_bytes(), nullptr));
    }
    TensorView v = t.view();
    v.data = b.data();
    in_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  for (Tensor& t : outs) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend->Allocate(t.size_bytes()));
    TensorView v = t.view();
    v.data = b.data();
    out_views.push_back(v);
    bufs.push_back(std::move(b));
  }
  KILN_ASSIGN_OR_RETURN(size_t ws_bytes, kernel->Prepare(in_views, out_views));
  KILN_ASSIGN_OR_RETURN(DeviceBuffer ws, backend->Allocate(ws_bytes));
  KernelRunArgs args;
  args.inputs = in_views;
  args.outputs = out_views;
  args.workspace = ws.data();
  args.workspace_bytes = ws_bytes;
  KILN_RETURN_IF_ERROR(kernel->Run(args));
  KILN_RETURN_IF_ERROR(backend->Synchronize(nullptr));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].size_bytes() == 0) continue;
    KILN_RETURN_IF_ERROR(backend->CopyToHost(outs[i].mutable_raw(), out_views[i].data,
                                             outs[i].size_bytes(), nullptr));
  }
  return OkStatus();
}

Tensor RandomTensor(DataType t, std::vector<int64_t> dims, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-2, 2);
  Tensor x(t, std::move(dims));
  for (int64_t i = 0; i < x.num_elements(); ++i) StoreFromDouble(x.view(), i, dist(rng));
  return x;
}

// NCHW <-> NHWC on the host (to_nhwc picks the direction).
Tensor Relayout(const Tensor& x, bool to_nhwc) {
  const auto& d = x.dims();
  std::vector<int64_t> out_dims = to_nhwc ? std::vector<int64_t>{d[0], d[2], d[3], d[1]}
                                          : std::vector<int64_t>{d[0], d[3], d[1], d[2]};
  Tensor y(x.dtype(), out_dims);
  int64_t n = d[0];
  int64_t c = to_nhwc ? d[1] : d[3], h = to_nhwc ? d[2] : d[1], w = to_nhwc ? d[3] : d[2];
  for (int64_t in = 0; in < n; ++in)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t ih = 0; ih < h; ++ih)
        for (int64_t iw = 0; iw < w; ++iw) {
          int64_t nchw = ((in * c + ic) * h + ih) * w + iw;
          int64_t nhwc = ((in * h + ih) * w + iw) * c + ic;
          StoreFromDouble(y.view(), to_nhwc ? nhwc : nchw, x.GetDouble(to_nhwc ? nchw : nhwc));
        }
  return y;
}

void ExpectNear(const Tensor& got, const Tensor& want, double tol) {
  ASSERT_EQ(got.dims(), want.dims());
  int bad = 0;
  for (int64_t i = 0; i < want.num_elements() && bad < 5; ++i) {
    double g = got.GetDouble(i), w = want.GetDouble(i);
    if (!(std::fabs(g - w) <= tol + tol * std::fabs(w))) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": got " << g << ", want " << w;
    }
  }
}

// A pool in kiln_layout=NHWC on CUDA agrees with the CPU's NCHW pool, relaid out.
void CheckNhwcPool(const std::string& op, AttributeMap attrs, std::vector<int64_t> x_dims,
                   DataType t) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no CUDA device";
  Tensor x = RandomTensor(t, x_dims, 7);
  // CPU reference in NCHW.
  Graph g;
  Value* xv = g.AddInput("x", t, MakeShape(x_dims));
  Value* yv = g.AddValue("y");
  Node* n = g.AddNode(op, "pool", {xv}, {yv}, attrs);
  g.MarkOutput(yv);
  ASSERT_TRUE(InferShapes(g).ok());
  std::vector<int64_t> y_dims = *StaticDims(yv->shape());
  KernelRequest r;
  r.node = n;
  r.inputs = {{t, MakeShape(x_dims), x_dims, nullptr}};
  r.outputs = {{t, MakeShape(y_dims), y_dims, nullptr}};
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, op);
  ASSERT_FALSE(cpu.empty());
  std::vector<Tensor> want = {Tensor(t, y_dims)};
  Status s = RunProvider(BackendKind::kCpu, *cpu[0], r, {x}, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // The same pool on CUDA in NHWC.
  Graph g2;
  std::vector<int64_t> xn = {x_dims[0], x_dims[2], x_dims[3], x_dims[1]};
  std::vector<int64_t> yn = {y_dims[0], y_dims[2], y_dims[3], y_dims[1]};
  attrs.Set("kiln_layout", std::string("NHWC"));
  Value* xv2 = g2.AddInput("x", t, MakeShape(xn));
  Value* yv2 = g2.AddValue("y", t);
  Node* n2 = g2.AddNode(op, "pool_nhwc", {xv2}, {yv2}, attrs);
  KernelRequest r2;
  r2.node = n2;
  r2.inputs = {{t, MakeShape(xn), xn, nullptr}};
  r2.outputs = {{t, MakeShape(yn), yn, nullptr}};
  auto cuda_providers = KernelRegistry::Get().Providers(BackendKind::kCuda, op);
  ASSERT_EQ(cuda_providers.size(), 1u);
  std::vector<Tensor> got = {Tensor(t, yn)};
  s = RunProvider(BackendKind::kCuda, *cuda_providers[0], r2, {Relayout(x, true)}, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectNear(Relayout(got[0], false), want[0], t == DataType::kFloat32 ? 1e-5 : 1e-2);
}

TEST(CudaNhwcPool, MaxPool) {
  for (DataType t : kAllFloats) {
    SCOPED_TRACE(std::string(ToString(t)));
    CheckNhwcPool("MaxPool",
                  Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                         {"strides", std::vector<int64_t>{2, 2}},
                         {"pads", std::vector<int64_t>{1, 1, 1, 1}}}),
                  {2, 5, 9, 11}, t);
  }
}
TEST(CudaNhwcPool, AveragePool) {
  CheckNhwcPool("AveragePool",
                Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                       {"strides", std::vector<int64_t>{2, 2}}}),
                {1, 8, 6, 7}, DataType::kFloat32);
}
TEST(CudaNhwcPool, GlobalAveragePool) {
  for (DataType t : kAllFloats) {
    SCOPED_TRACE(std::string(ToString(t)));
    CheckNhwcPool("GlobalAveragePool", {}, {2, 24, 7, 5}, t);
  }
}

// Slice whose bounds are run-time tensors: the kernel reads them on the device.
TEST(CudaDeviceSlice, RuntimeBoundsMatchCpu) {
  if (!GetBackend(BackendKind::kCuda).ok()) GTEST_SKIP() << "no CUDA device";
  Tensor x = RandomTensor(DataType::kFloat32, {6, 10, 4}, 3);
  Tensor starts = I64({2}, {-2, 1}), ends = I64({2}, {-100, 9}), axes = I64({2}, {1, 0}),
         steps = I64({2}, {-3, 2});
  // Axis 1: 8, 5, 2 (3 values); axis 0: 1, 3, 5, 7 clipped to 6 -> 1, 3, 5 (3 values).
  std::vector<int64_t> y_dims = {3, 3, 4};
  Graph g;
  std::vector<Value*> ins = {g.AddInput("x", DataType::kFloat32, MakeShape({6, 10, 4}))};
  for (const char* name : {"starts", "ends", "axes", "steps"}) {
    ins.push_back(g.AddInput(name, kI64, MakeShape({2})));
  }
  Value* y = g.AddValue("y", DataType::kFloat32);
  Node* n = g.AddNode("Slice", "slice", ins, {y}, {});
  KernelRequest r;
  r.node = n;
  r.inputs.push_back({DataType::kFloat32, MakeShape({6, 10, 4}), {6, 10, 4}, nullptr});
  for (int i = 0; i < 4; ++i) r.inputs.push_back({kI64, MakeShape({2}), {2}, nullptr});
  r.outputs = {{DataType::kFloat32, MakeShape(y_dims), y_dims, nullptr}};
  std::vector<Tensor> in_tensors = {x, starts, ends, axes, steps};
  std::vector<Tensor> want = {Tensor(DataType::kFloat32, y_dims)};
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, "Slice");
  ASSERT_FALSE(cpu.empty());
  Status s = RunProvider(BackendKind::kCpu, *cpu[0], r, in_tensors, want);
  ASSERT_TRUE(s.ok()) << s.ToString();
  std::vector<Tensor> got = {Tensor(DataType::kFloat32, y_dims)};
  auto cuda_providers = KernelRegistry::Get().Providers(BackendKind::kCuda, "Slice");
  ASSERT_EQ(cuda_providers.size(), 1u);
  s = RunProvider(BackendKind::kCuda, *cuda_providers[0], r, in_tensors, got);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ExpectNear(got[0], want[0], 0.0);
  // Spot-check one element by hand: y[0][0][0] = x[1][8][0].
  EXPECT_EQ(got[0].GetDouble(0), x.GetDouble((1 * 10 + 8) * 4));
}

// ---- host-side checks: run without a GPU
// ---------------------------------------------------------

// The op types the zoo models' engines contain after the builder's passes (collected with
// `kiln build zoo/<m>/model.onnx --report`), minus the library-backed ones (GEMM, convolution,
// attention), plus the rest of the op set issue 4 names.
TEST(CudaKernelCoverage, EveryRuntimeOpHasACudaProvider) {
  for (const char* op : {"Add",
                         "Sub",
                         "Mul",
                         "Div",
                         "Pow",
                         "Relu",
                         "Sigmoid",
                         "Tanh",
                         "Erf",
                         "Gelu",
                         "Sqrt",
                         "Exp",
                         "Clip",
                         "HardSwish",
                         "HardSigmoid",
                         "Where",
                         "Equal",
                         "Less",
                         "Greater",
                         "Cast",
                         "LayerNormalization",
                         "SkipLayerNormalization",
                         "RMSNormalization",
                         "GatedActivation",
                         "Softmax",
                         "MaxPool",
                         "AveragePool",
                         "GlobalAveragePool",
                         "BatchNormalization",
                         "Resize",
                         "Gather",
                         "Concat",
                         "Slice",
                         "Split",
                         "Transpose",
                         "Reshape",
                         "Flatten",
                         "Squeeze",
                         "Unsqueeze",
                         "Identity",
                         "Expand",
                         "ReduceMean",
                         "ReduceSum",
                         "ReduceMax",
                         "Trilu",
                         "Shape",
                         "ConstantOfShape",
                         "Range"}) {
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, op);
    EXPECT_FALSE(providers.empty()) << op;
    for (const KernelProvider* p : providers) {
      EXPECT_EQ(p->backend(), BackendKind::kCuda);
      EXPECT_EQ(p->id().substr(0, 5), "cuda.") << p->id();
    }
  }
}

// Tactics are offered (and named by dtype) without touching the device: the builder asks for
// them on machines that only build.
TEST(CudaKernelCoverage, TacticNamesCarryTheStorageType) {
  for (DataType t : kAllFloats) {
    Graph g;
    Value* a = g.AddInput("a", t, MakeShape({2, 8}));
    Value* b = g.AddInput("b", t, MakeShape({8}));
    Value* y = g.AddValue("y");
    Node* n = g.AddNode("Add", "add", {a, b}, {y}, {});
    g.MarkOutput(y);
    ASSERT_TRUE(InferShapes(g).ok());
    KernelRequest r;
    r.node = n;
    r.inputs = {{t, MakeShape({2, 8}), {2, 8}, nullptr}, {t, MakeShape({8}), {8}, nullptr}};
    r.outputs = {{t, MakeShape({2, 8}), {2, 8}, nullptr}};
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, "Add");
    ASSERT_EQ(providers.size(), 1u);
    auto tactics = providers[0]->Tactics(r);
    ASSERT_EQ(tactics.size(), 1u);
    EXPECT_EQ(tactics[0].name, std::string(ToString(t)) + "-add-cuda");
  }
}

// LayerNormalization offers both kernels to the builder's timing (warp-vec only without the
// statistics outputs); SkipLayerNormalization has its own.
std::vector<std::string> CudaTacticNames(const std::string& op, int inputs, int outputs,
                                         DataType t) {
  Graph g;
  std::vector<Value*> ins = {g.AddInput("x", t, MakeShape({4, 768}))};
  if (op == "SkipLayerNormalization") ins.push_back(g.AddInput("s", t, MakeShape({4, 768})));
  while (static_cast<int>(ins.size()) < inputs) {
    ins.push_back(g.AddInput("p" + std::to_string(ins.size()), t, MakeShape({768})));
  }
  std::vector<Value*> outs;
  for (int i = 0; i < outputs; ++i) outs.push_back(g.AddValue("y" + std::to_string(i)));
  Node* n = g.AddNode(op, "n", ins, outs, {});
  for (Value* v : outs) g.MarkOutput(v);
  EXPECT_TRUE(InferShapes(g).ok());
  KernelRequest r;
  r.node = n;
  for (Value* v : ins)
    r.inputs.push_back({v->dtype(), v->shape(), *StaticDims(v->shape()), nullptr});
  for (Value* v : outs) {
    r.outputs.push_back({v->dtype(), v->shape(), *StaticDims(v->shape()), nullptr});
  }
  std::vector<std::string> names;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, op)) {
    for (const TacticConfig& c : p->Tactics(r)) names.push_back(c.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(CudaKernelCoverage, LayerNormTacticsIncludeWarpVec) {
  using V = std::vector<std::string>;
  EXPECT_EQ(CudaTacticNames("LayerNormalization", 3, 1, DataType::kFloat16),
            (V{"f16-layer-normalization-cuda-row", "f16-layer-normalization-cuda-warp-vec"}));
  EXPECT_EQ(CudaTacticNames("LayerNormalization", 3, 3, DataType::kFloat16),
            V{"f16-layer-normalization-cuda-row"});
  EXPECT_EQ(CudaTacticNames("SkipLayerNormalization", 4, 2, DataType::kBFloat16),
            V{"bf16-skip-layer-normalization-cuda-warp-vec"});
  EXPECT_EQ(CudaTacticNames("SkipLayerNormalization", 3, 1, DataType::kFloat32),
            V{"f32-skip-layer-normalization-cuda-warp-vec"});
}

TEST(CudaKernelCoverage, PoolsRunChannelsLastNodes) {
  for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool"}) {
    auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, op);
    ASSERT_EQ(providers.size(), 1u) << op;
    auto* p = dynamic_cast<const cuda::CudaOpProvider*>(providers[0]);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(p->SupportsLayout("NHWC")) << op;
    EXPECT_TRUE(p->SupportsLayout("")) << op;
  }
  auto add = KernelRegistry::Get().Providers(BackendKind::kCuda, "Add");
  ASSERT_EQ(add.size(), 1u);
  EXPECT_FALSE(dynamic_cast<const cuda::CudaOpProvider*>(add[0])->SupportsLayout("NHWC"));
}

TEST(CudaKernelCoverage, UnsupportedRequestsGetNoTactics) {
  Graph g;
  Value* x = g.AddInput("x", kF32, MakeShape({4, 4}));
  Value* y = g.AddValue("y");
  AttributeMap at;
  // Cubic runs on CUDA now (cuda_ops_more_test.cc); antialiasing still does not.
  at.Set("mode", std::string("linear"));
  at.Set("antialias", int64_t{1});
  Node* n = g.AddNode("Resize", "resize", {x}, {y}, at);
  KernelRequest r;
  r.node = n;
  r.inputs = {{kF32, MakeShape({4, 4}), {4, 4}, nullptr}};
  r.outputs = {{kF32, MakeShape({8, 8}), {8, 8}, nullptr}};
  auto providers = KernelRegistry::Get().Providers(BackendKind::kCuda, "Resize");
  ASSERT_EQ(providers.size(), 1u);
  EXPECT_TRUE(providers[0]->Tactics(r).empty());
}

TEST(CudaBroadcastSpace, MergesContiguousAndBroadcastDims) {
  // [2,3,4,5] + [3,1,1]: a's dims 2..3 merge (both dense), b is broadcast over them.
  std::vector<int64_t> a = {2, 3, 4, 5}, b = {3, 1, 1}, out = {2, 3, 4, 5};
  std::span<const int64_t> ins[2] = {a, b};
  auto s = cuda::BroadcastSpace(ins, out);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(s->rank, 3);
  EXPECT_EQ(s->dims[0], 2);
  EXPECT_EQ(s->dims[1], 3);
  EXPECT_EQ(s->dims[2], 20);
  EXPECT_EQ(s->strides[0][0], 60);
  EXPECT_EQ(s->strides[0][1], 20);
  EXPECT_EQ(s->strides[0][2], 1);
  EXPECT_EQ(s->strides[1][0], 0);
  EXPECT_EQ(s->strides[1][1], 1);
  EXPECT_EQ(s->strides[1][2], 0);
}

TEST(CudaBroadcastSpace, SameShapesCollapseToOneDim) {
  std::vector<int64_t> a = {7, 1, 9, 11};
  std::span<const int64_t> ins[2] = {a, a};
  auto s = cuda::BroadcastSpace(ins, a);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->rank, 1);
  EXPECT_EQ(s->dims[0], 7 * 9 * 11);
  EXPECT_EQ(s->strides[0][0], 1);
  EXPECT_EQ(s->strides[1][0], 1);
}

TEST(CudaBroadcastSpace, RejectsIncompatibleDims) {
  std::vector<int64_t> a = {3, 4}, out = {3, 5};
  std::span<const int64_t> ins[1] = {a};
  auto s = cuda::BroadcastSpace(ins, out);
  EXPECT_FALSE(s.ok());
}

TEST(CudaBroadcastSpace, TransposeStridesStayUnmerged) {
  // [2,3,4] -> perm (2,0,1): out dims [4,2,3], source strides [1,12,4]; dims 1 and 2 merge
  // (12 == 4 * 3), dim 0 does not.
  std::vector<int64_t> out = {4, 2, 3}, strides = {1, 12, 4};
  cuda::Strided s = cuda::CoalesceOne(out, strides, 0);
  ASSERT_EQ(s.rank, 2);
  EXPECT_EQ(s.dims[0], 4);
  EXPECT_EQ(s.dims[1], 6);
  EXPECT_EQ(s.strides[0][0], 1);
  EXPECT_EQ(s.strides[0][1], 4);
}

// The index plans the copy and broadcast kernels execute, checked on the host: applying a plan's
// Strided space to the input (what StridedCopyKernel / BinaryStridedKernel do per element) must
// reproduce the CPU backend's result, for many shapes and permutations.
std::vector<double> ApplySpace(const cuda::Strided& s, const Tensor& x, int operand, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int64_t r = i, off = s.offset[operand];
    for (int d = s.rank - 1; d >= 0; --d) {
      off += (r % s.dims[d]) * s.strides[operand][d];
      r /= s.dims[d];
    }
    out[static_cast<size_t>(i)] = x.GetDouble(off);
  }
  return out;
}

Tensor RunCpuOp(const std::string& op, const AttributeMap& attrs, const std::vector<Tensor>& ins,
                const std::vector<bool>& constant) {
  Graph g;
  std::vector<Value*> vals;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = std::string(constant[i] ? "c" : "x").append(std::to_string(i));
    vals.push_back(constant[i] ? g.AddConstant(name, ins[i])
                               : g.AddInput(name, ins[i].dtype(), MakeShape(ins[i].dims())));
  }
  Value* y = g.AddValue("y");
  Node* n = g.AddNode(op, "n", vals, {y}, attrs);
  g.MarkOutput(y);
  EXPECT_TRUE(InferShapes(g).ok());
  std::vector<int64_t> y_dims = *StaticDims(y->shape());
  KernelRequest r;
  r.node = n;
  for (size_t i = 0; i < ins.size(); ++i) {
    r.inputs.push_back({ins[i].dtype(), MakeShape(ins[i].dims()), ins[i].dims(),
                        constant[i] ? vals[i]->constant() : nullptr});
  }
  r.outputs = {{y->dtype(), y->shape(), y_dims, nullptr}};
  std::vector<Tensor> outs = {Tensor(y->dtype(), y_dims)};
  auto cpu = KernelRegistry::Get().Providers(BackendKind::kCpu, op);
  EXPECT_FALSE(cpu.empty());
  Status s = RunProvider(BackendKind::kCpu, *cpu[0], r, ins, outs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return outs[0];
}

void ExpectSame(const std::vector<double>& got, const Tensor& want) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.num_elements());
  for (int64_t i = 0; i < want.num_elements(); ++i) {
    ASSERT_EQ(got[static_cast<size_t>(i)], want.GetDouble(i)) << "element " << i;
  }
}

TEST(CudaCopyPlans, TransposeMatchesCpuForEveryPermutation) {
  uint32_t seed = 1;
  for (std::vector<int64_t> dims :
       {std::vector<int64_t>{5, 7}, std::vector<int64_t>{2, 3, 4}, std::vector<int64_t>{2, 1, 4, 3},
        std::vector<int64_t>{3, 2, 1, 2, 5}}) {
    std::vector<int64_t> perm(dims.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    do {
      SCOPED_TRACE(::testing::PrintToString(dims) + " perm " + ::testing::PrintToString(perm));
      Tensor x = RandomTensor(DataType::kFloat32, dims, seed++);
      AttributeMap at;
      at.Set("perm", perm);
      Tensor want = RunCpuOp("Transpose", at, {x}, {false});
      auto space = cuda::TransposeSpace(dims, perm, want.dims());
      ASSERT_TRUE(space.ok()) << space.status().ToString();
      ExpectSame(ApplySpace(*space, x, 0, want.num_elements()), want);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
}

TEST(CudaCopyPlans, SliceMatchesCpu) {
  struct S {
    std::vector<int64_t> dims, starts, ends, axes, steps;
  };
  uint32_t seed = 100;
  for (const S& c : std::vector<S>{{{10, 12}, {1, -4}, {8, 100}, {0, 1}, {2, 1}},
                                   {{4, 9}, {-1}, {-100}, {1}, {-2}},
                                   {{5, 6, 7}, {1, 2}, {4, 5}, {}, {}},
                                   {{6, 10, 4}, {-2, 1}, {-100, 9}, {1, 0}, {-3, 2}},
                                   {{3, 8, 5}, {0, 7, 0}, {3, 0, 5}, {0, 1, 2}, {1, -1, 2}},
                                   {{9}, {100}, {200}, {0}, {1}}}) {
    SCOPED_TRACE(::testing::PrintToString(c.dims) + " starts " +
                 ::testing::PrintToString(c.starts));
    Tensor x = RandomTensor(DataType::kFloat32, c.dims, seed++);
    int64_t k = static_cast<int64_t>(c.starts.size());
    std::vector<Tensor> ins = {x, I64({k}, c.starts), I64({k}, c.ends)};
    std::vector<bool> constant = {false, true, true};
    if (!c.axes.empty()) {
      ins.push_back(I64({k}, c.axes));
      constant.push_back(true);
      if (!c.steps.empty()) {
        ins.push_back(I64({k}, c.steps));
        constant.push_back(true);
      }
    }
    Tensor want = RunCpuOp("Slice", {}, ins, constant);
    auto space = cuda::SliceSpace(c.starts, c.axes, c.steps, c.dims, want.dims());
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    ExpectSame(ApplySpace(*space, x, 0, want.num_elements()), want);
  }
}

TEST(CudaCopyPlans, BroadcastAddMatchesCpu) {
  uint32_t seed = 200;
  for (std::pair<std::vector<int64_t>, std::vector<int64_t>> p :
       std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{3, 5, 7}, {3, 5, 7}},
           {{3, 1, 7}, {5, 1}},
           {{}, {2, 3}},
           {{2, 3, 4, 5}, {3, 1, 1}},
           {{4, 1, 6, 1}, {1, 5, 1, 2}},
           {{1}, {7, 1, 3}},
           {{2, 1, 1, 3, 1}, {2, 4, 1, 3, 5}}}) {
    SCOPED_TRACE(::testing::PrintToString(p.first) + " + " + ::testing::PrintToString(p.second));
    Tensor a = RandomTensor(DataType::kFloat32, p.first, seed++);
    Tensor b = RandomTensor(DataType::kFloat32, p.second, seed++);
    Tensor want = RunCpuOp("Add", {}, {a, b}, {false, false});
    std::span<const int64_t> ins[2] = {a.dims(), b.dims()};
    auto space = cuda::BroadcastSpace(ins, want.dims());
    ASSERT_TRUE(space.ok()) << space.status().ToString();
    std::vector<double> va = ApplySpace(*space, a, 0, want.num_elements());
    std::vector<double> vb = ApplySpace(*space, b, 1, want.num_elements());
    for (int64_t i = 0; i < want.num_elements(); ++i) {
      float sum = static_cast<float>(va[i]) + static_cast<float>(vb[i]);
      ASSERT_EQ(sum, static_cast<float>(want.GetDouble(i))) << "element " << i;
    }
  }
}

// The builder's requests for every layer of the zoo models' engines (after its passes; built
// for the CPU here, where no GPU can time CUDA tactics): each layer that is not library-backed
// (GEMM, convolution, attention) gets a CUDA tactic, in FP32 and with float operands as FP16.
bool LibraryBacked(const std::string& op) {
  for (const char* lib : {"Conv", "FusedConv", "ConvTranspose", "Gemm", "FusedGemm", "MatMul",
                          "FusedMatMul", "Attention"}) {
    if (op == lib) return true;
  }
  return false;
}

TEST(CudaZooCoverage, EveryZooLayerGetsACudaTactic) {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  std::string zoo = std::string(root ? root : ".") + "/zoo";
  if (!std::filesystem::exists(zoo + "/resnet_tiny/model.onnx"))
    GTEST_SKIP() << "no zoo at " << zoo;
  int layers_checked = 0;
  for (const char* model : {"resnet_tiny", "mobilenetv3_tiny", "efficientnet_tiny",
                            "squeezenet_tiny", "vit_tiny", "bert_tiny", "gpt_tiny", "unet_tiny"}) {
    SCOPED_TRACE(model);
    std::string dir = zoo + "/" + model;
    std::ifstream info_file(dir + "/info.json");
    ASSERT_TRUE(info_file.good());
    nlohmann::json info = nlohmann::json::parse(info_file);
    BuilderConfig config;
    config.backend = BackendKind::kCpu;
    for (const auto& [name, p] : info["profile"].items()) {
      // "name:1x3x64x64,4x3x64x64,16x3x64x64" (appends: GCC 12 warns falsely on + chains).
      std::string spec = name;
      spec.append(":");
      for (const char* which : {"min", "opt", "max"}) {
        bool first = true;
        for (const auto& d : p[which]) {
          if (!first) spec.append("x");
          spec.append(std::to_string(d.get<int64_t>()));
          first = false;
        }
        if (std::string_view(which) != "max") spec.append(",");
      }
      ASSERT_TRUE(ParseProfileSpec(spec, &config.profile).ok()) << spec;
    }
    auto built = app::BuildFromOnnxFile(dir + "/model.onnx", config);
    ASSERT_TRUE(built.ok()) << built.status().ToString();
    const EngineDesc& desc = *built->desc;
    std::vector<Node*> order;
    for (const LayerDesc& l : desc.layers) order.push_back(const_cast<Node*>(l.node));
    auto dims = ConcreteDims(*desc.graph, order, desc.profile, 2);
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    for (const LayerDesc& l : desc.layers) {
      const std::string& op = l.node->op_type();
      if (LibraryBacked(op)) continue;
      KernelRequest r = MakeKernelRequest(*l.node, *dims);
      for (bool half : {false, true}) {
        KernelRequest q = r;
        if (half) {
          for (auto& d : q.inputs) {
            if (d.dtype == DataType::kFloat32) d.dtype = DataType::kFloat16;
          }
          for (auto& d : q.outputs) {
            if (d.dtype == DataType::kFloat32) d.dtype = DataType::kFloat16;
          }
        }
        bool offered = false;
        for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, op)) {
          offered |= !p->Tactics(q).empty();
        }
        EXPECT_TRUE(offered) << "no CUDA tactic for layer '" << l.node->name() << "' (" << op
                             << (half ? ", f16" : ", f32") << ")";
        ++layers_checked;
      }
    }
  }
  EXPECT_GT(layers_checked, 100);
}

TEST(CudaKernelNames, KebabCaseAndTacticName) {
  EXPECT_EQ(cuda::KebabCase("LayerNormalization"), "layer-normalization");
  EXPECT_EQ(cuda::KebabCase("GlobalAveragePool"), "global-average-pool");
  EXPECT_EQ(cuda::TacticName(DataType::kBFloat16, "Softmax", "warp"), "bf16-softmax-cuda-warp");
}

}  // namespace
}  // namespace kiln
